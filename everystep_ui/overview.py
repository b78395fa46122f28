"""The overview page: runs per status, the dead-letter depth, the age of the
oldest scheduled run, throughput over the last hour, the workers, the cron
schedules and the concurrency limits.

Every figure is one query an index serves, so the page stays cheap on a table
of millions of runs: the status index for the counts of the statuses that
stay small (scheduled, running, blocked) and the runners (status =
'running'), the claim index for the oldest scheduled run, the completed_at
index for the throughput chart, and the unique (name, idempotency_key) index
for each schedule's last run and missed slot (two lookups per schedule). The
workers are the heartbeat table, a row per worker.
The concurrency limits are one query for all limited workflows
(``everystep.limits.peek``: index probes per workflow).

The counts of the history (completed, failed, stopped) grow with every run
ever made: counting them exactly reads every one of their index entries, a
cost that grows with the table (about 120 ms at a million runs). Above
``ESTIMATE_ABOVE`` rows, on PostgreSQL, they are the planner's statistics
instead (the table's row estimate times each status's share, kept by
ANALYZE), shown as estimates; a status too rare to be in the statistics is
counted exactly, which is cheap because it is rare.
"""

import datetime as dt
from dataclasses import dataclass
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied
from django.db import connections
from django.db.models import Count
from django.db.models.functions import TruncMinute
from django.utils import timezone

from everystep import cron, heartbeats, limits, registry
from everystep.models import Heartbeat, Workflow

from . import display, views
from .paginators import EstimatedCountPaginator

Status = Workflow.Status
# The statuses history accumulates in; the others stay small and are always exact.
HISTORY = [Status.COMPLETED, Status.FAILED, Status.STOPPED]
ESTIMATE_ABOVE = EstimatedCountPaginator.estimate_threshold
CHART_MINUTES = 60
CHART_WIDTH, CHART_HEIGHT = 600, 120


# ---------------------------------------------------------------- the queries


def status_counts_query():
    return Workflow.objects.order_by().values_list("status").annotate(n=Count("*"))


def table_statistics(queryset) -> tuple[int, dict[str, float]] | None:
    """PostgreSQL's statistics of the runs table, in one query: its estimated
    rows (``pg_class.reltuples``) and each frequent status's share of them
    (``pg_stats``; empty before the first ANALYZE). None off PostgreSQL, or
    for a table never analysed."""
    connection = connections[queryset.db]
    if connection.vendor != "postgresql":
        return None
    table = queryset.model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.reltuples, s.most_common_vals::text::text[], s.most_common_freqs "
            "FROM pg_class AS c LEFT JOIN pg_stats AS s ON s.schemaname = current_schema() "
            "AND s.tablename = %s AND s.attname = 'status' WHERE c.oid = to_regclass(%s)",
            [table, connection.ops.quote_name(table)],
        )
        row = cursor.fetchone()
    if row is None or row[0] is None or row[0] < 0:
        return None
    return int(row[0]), dict(zip(row[1], row[2], strict=True)) if row[1] else {}


def status_counts() -> tuple[dict[str, int], bool]:
    """Runs per status, and whether the history's counts are estimates."""
    statistics = table_statistics(Workflow.objects.all())
    if statistics is None or statistics[0] <= ESTIMATE_ABOVE:
        return dict(status_counts_query()), False
    rows, shares = statistics
    estimated = {status: round(rows * shares[status]) for status in HISTORY if status in shares}
    # A positive list, which the status index serves (a NOT IN would read the table).
    rest = [status for status in Status.values if status not in estimated]
    exact = dict(status_counts_query().filter(status__in=rest))
    return {**exact, **estimated}, bool(estimated)


def oldest_scheduled_query():
    return Workflow.objects.claimable().values_list("created_at", flat=True)[:1]


def chart_query(start: dt.datetime):
    """Runs completed or failed per minute since ``start``."""
    return (
        Workflow.objects.filter(
            completed_at__gte=start,
            status__in=[Status.COMPLETED, Status.FAILED],
        )
        # Minutes in UTC: on MySQL any other zone needs the server's time zone tables.
        .annotate(minute=TruncMinute("completed_at", tzinfo=dt.UTC))
        .order_by()
        .values_list("minute", "status")
        .annotate(n=Count("*"))
    )


def runners_query():
    return (
        Workflow.objects.filter(status=Status.RUNNING)
        .order_by()
        .values_list("claimed_by")
        .annotate(n=Count("*"))
        .order_by("-n", "claimed_by")
    )


def workers_query():
    return Heartbeat.objects.with_age().order_by("name")


# ---------------------------------------------------------------- the figures


@dataclass
class WorkerRow:
    """A worker as the overview lists it. ``state``: ``live``, ``stale`` (silent
    longer than the stale limit) or ``no heartbeat`` (a claimer of running runs
    that writes none: an older worker, or one whose row was deleted)."""

    name: str
    state: str
    claimed: int  # runs running under its name
    heartbeat: Heartbeat | None = None
    age: str = ""


def worker_rows(runners: list[tuple[str, int]]) -> list[WorkerRow]:
    """Live workers first, then stale ones, then claimers without a heartbeat."""
    claimed = dict(runners)
    limit = heartbeats.shown_stale_after()
    rows = []
    for beat in workers_query():
        seconds = beat.age.total_seconds()
        rows.append(
            WorkerRow(
                name=beat.name,
                state="stale" if seconds > limit else "live",
                claimed=claimed.pop(beat.name, 0),
                heartbeat=beat,
                age=display.format_duration(max(beat.age, dt.timedelta(0))),
            )
        )
    rows.sort(key=lambda row: row.state != "live")  # stable: by name within each state
    rows += [WorkerRow(name=name, state="no heartbeat", claimed=n) for name, n in claimed.items()]
    return rows



@dataclass
class Bar:
    x: float
    width: float
    completed_y: float
    completed_height: float
    failed_y: float
    failed_height: float
    title: str


@dataclass
class Chart:
    bars: list[Bar]
    completed: int
    failed: int
    peak: int
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT


def chart_start(now: dt.datetime) -> dt.datetime:
    """The first minute of the chart: the current minute is its last."""
    return now.replace(second=0, microsecond=0) - dt.timedelta(minutes=CHART_MINUTES - 1)


def build_chart(start: dt.datetime, rows) -> Chart:
    """Stacked bars, one per minute: completed at the bottom, failed above."""
    counts = {}
    for minute, status, n in rows:
        index = int((minute - start).total_seconds() // 60)
        if 0 <= index < CHART_MINUTES:
            counts.setdefault(index, {})[status] = n
    totals = [sum(counts.get(i, {}).values()) for i in range(CHART_MINUTES)]
    peak = max(totals, default=0)
    scale = CHART_HEIGHT / peak if peak else 0
    slot = CHART_WIDTH / CHART_MINUTES
    bars = []
    for i in range(CHART_MINUTES):
        completed = counts.get(i, {}).get(Status.COMPLETED, 0)
        failed = counts.get(i, {}).get(Status.FAILED, 0)
        completed_height, failed_height = completed * scale, failed * scale
        minute = start + dt.timedelta(minutes=i)
        bars.append(
            Bar(
                x=round(i * slot + 1, 2),
                width=round(slot - 2, 2),
                completed_y=round(CHART_HEIGHT - completed_height, 2),
                completed_height=round(completed_height, 2),
                failed_y=round(CHART_HEIGHT - completed_height - failed_height, 2),
                failed_height=round(failed_height, 2),
                title=f"{minute:%H:%M} UTC: {completed} completed, {failed} failed",
            )
        )
    return Chart(
        bars=bars,
        completed=sum(c.get(Status.COMPLETED, 0) for c in counts.values()),
        failed=sum(c.get(Status.FAILED, 0) for c in counts.values()),
        peak=peak,
    )


def figures(now: dt.datetime | None = None) -> dict:
    now = now or timezone.now()
    counts, estimated = status_counts()
    runners = list(runners_query())
    oldest = next(iter(oldest_scheduled_query()), None)
    start = chart_start(now)
    return {
        "counts": [(status, counts.get(status, 0)) for status in Status.values],
        "total": sum(counts.values()),
        "estimated": estimated,
        "blocked": counts.get(Status.BLOCKED, 0),
        "oldest_scheduled": oldest,
        "oldest_scheduled_age": display.format_duration(now - oldest) if oldest else None,
        "chart": build_chart(start, chart_query(start)),
        "runners": runners,
        "workers": worker_rows(runners),
        "stale_after": heartbeats.shown_stale_after(),
        "recovery_on": heartbeats.stale_after() is not None,
        "schedules": [cron.state(schedule, now) for schedule in registry.schedules()],
        "limits": limits.peek(registry.concurrency_limits()),
        "now": now,
    }


@dataclass
class ScheduleRow:
    """A cron schedule as the overview lists it; times in the schedule's zone."""

    workflow: str
    expression: str
    timezone: str
    next_slot: dt.datetime | None
    next_in: str
    last_slot: dt.datetime | None  # the slot of the last run
    last_status: str | None
    latest_slot: dt.datetime | None  # the most recent slot due
    missed: bool
    runs_url: str
    last_run_url: str | None


def schedule_row(state: cron.ScheduleState, now: dt.datetime, *, runs_url: str, last_run_url) -> ScheduleRow:
    schedule, last = state.schedule, state.last_run
    last_slot = cron.slot_of(last.idempotency_key) if last else None

    def local(slot):
        return schedule.argument(slot) if slot else None

    return ScheduleRow(
        workflow=schedule.workflow,
        expression=schedule.expression,
        timezone=schedule.timezone,
        next_slot=local(state.next_slot),
        next_in=display.format_duration(state.next_slot - now) if state.next_slot else "never",
        last_slot=local(last_slot),
        last_status=last.status if last else None,
        latest_slot=local(state.latest_slot),
        missed=state.missed,
        runs_url=runs_url,
        last_run_url=last_run_url,
    )


# ---------------------------------------------------------------- the page


def overview(request, *, model_admin):
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    changelist_url = model_admin.page_url(request, "changelist")

    def listed(**params):
        return f"{changelist_url}?{urlencode(params)}"

    data = figures()
    context = {
        **data,
        "counts": [(status, n, listed(status=status)) for status, n in data["counts"]],
        "runners": [(name, n, listed(status=Status.RUNNING, claimed_by=name)) for name, n in data["runners"]],
        "workers": [(row, listed(status=Status.RUNNING, claimed_by=row.name)) for row in data["workers"]],
        "schedules": [
            schedule_row(
                state,
                data["now"],
                runs_url=listed(name=state.schedule.workflow),
                last_run_url=state.last_run and model_admin.page_url(request, "run", state.last_run.id),
            )
            for state in data["schedules"]
        ],
        "limits": [
            (
                usage,
                listed(name=usage.name, status=Status.RUNNING),
                usage.oldest_waiting and display.format_duration(data["now"] - usage.oldest_waiting),
                listed(name=usage.name, status=Status.SCHEDULED),
            )
            for usage in data["limits"]
        ],
        "blocked_url": listed(status=Status.BLOCKED),
        "scheduled_url": listed(status=Status.SCHEDULED),
        "overview_url": model_admin.page_url(request, "overview"),
        "changelist_url": changelist_url,
        "overview_live_template": model_admin.overview_live_template,
        "title": "Overview",
        "opts": Workflow._meta,
    }
    return views.page_or_fragment(
        request, model_admin, context,
        fragment=model_admin.overview_live_template, page=model_admin.overview_template,
    )
