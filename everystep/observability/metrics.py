"""Prometheus metrics (``everystep[metrics]``), on prometheus_client's default registry.

Labels are bounded: workflow and step function names come from code, runner
names from configuration. A run id is never a label.

The gauges read from the database (runs per status, age of the oldest
pending run) are computed only when ``everystep.views.metrics_view`` is
scraped, so a worker's own endpoint never queries the database.
"""

import functools

from django.utils import timezone
from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

from ..statuses import RunStatus

# Runs and steps are often long (remote calls, human waits): the default
# buckets stop at 10s.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
# A slot starts within milliseconds while a worker is up; after downtime, hours late.
CRON_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 60, 300, 3600, 86400)
RUN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

runs_ended = Counter(
    "everystep_runs_ended",
    "Runs that reached a terminal status, by the worker that ended them.",
    ["workflow", "status", "runner"],
)
run_duration = Histogram(
    "everystep_run_duration_seconds",
    "Wall time of the pass that ended a run (earlier passes of a resumed run not included).",
    ["workflow", "status", "runner"],
    buckets=RUN_BUCKETS,
)
steps_executed = Counter(
    "everystep_steps_executed",
    "Step functions executed (replayed steps are not counted), by outcome.",
    ["workflow", "step", "outcome", "runner"],
)
step_duration = Histogram(
    "everystep_step_duration_seconds",
    "Time spent in an executed step's function.",
    ["workflow", "step", "outcome", "runner"],
    buckets=STEP_BUCKETS,
)
runs_claimed = Counter("everystep_runs_claimed", "Runs claimed by a worker.", ["runner"])
runs_requeued = Counter(
    "everystep_runs_requeued",
    "Runs a worker handed back to scheduled (drain, database outage).",
    ["runner"],
)
reconnects = Counter(
    "everystep_worker_database_reconnects",
    "Times a worker got the database back after losing it (its claim loop or its LISTEN connection).",
    ["runner"],
)
runs_recovered = Counter(
    "everystep_runs_recovered",
    "Runs a worker requeued from a worker whose heartbeat went stale (EVERYSTEP_RECOVER_STALE_AFTER).",
    ["runner"],
)
last_heartbeat = Gauge(
    "everystep_worker_last_heartbeat_seconds",
    "When the worker last wrote its heartbeat, as a Unix time.",
    ["runner"],
)
cron_slots_started = Counter(
    "everystep_cron_slots_started",
    "Cron slots started, by the worker whose insert won the slot (one per slot across the fleet).",
    ["workflow", "runner"],
)
cron_slots_skipped = Counter(
    "everystep_cron_slots_skipped",
    "Missed cron slots passed over by the catch-up policy (only the latest missed slot starts).",
    ["workflow", "runner"],
)
cron_start_delay = Histogram(
    "everystep_cron_start_delay_seconds",
    "Time from a cron slot to the insert of its run.",
    ["workflow", "runner"],
    buckets=CRON_BUCKETS,
)
runs_suspended = Counter(
    "everystep_runs_suspended",
    "Runs that left their worker as waiting (a durable sleep, an event or child run wait), by kind of wait.",
    ["workflow", "kind", "runner"],
)
runs_woken = Counter(
    "everystep_runs_woken",
    "Waiting runs a worker put back to scheduled because their wake time came.",
    ["runner"],
)
children_started = Counter(
    "everystep_children_started",
    "Child runs started with start_child, by the parent's workflow and the child's.",
    ["workflow", "child", "runner"],
)
events_sent = Counter(
    "everystep_events_sent",
    "Events stored by send_event (a repeated key is not counted), once the sending transaction committed.",
    ["workflow"],
)
pool_size = Gauge("everystep_worker_pool_size", "Runs a worker executes at once at most.", ["runner"])
runs_in_flight = Gauge("everystep_worker_in_flight", "Runs a worker is executing now.", ["runner"])
start_time = Gauge(
    "everystep_worker_start_time_seconds", "When the worker started, as a Unix time.", ["runner"]
)

_TERMINAL = frozenset(RunStatus.terminal_values())


class _Series(dict):
    """The labelled children of ``metrics`` (sharing their label names), by
    label values, made once: ``labels()`` validates and locks on every call,
    which is most of what an update costs on a worker's path per run and per
    step."""

    def __init__(self, *metrics):
        super().__init__()
        self.metrics = metrics

    def __missing__(self, labels: tuple) -> tuple:
        children = self[labels] = tuple(metric.labels(*labels) for metric in self.metrics)
        return children


_run_series = _Series(runs_ended, run_duration)
_step_series = _Series(steps_executed, step_duration)
_claimed_series = _Series(runs_claimed)


def run_ended(workflow: str, status: str | None, runner: str, seconds: float) -> None:
    """``status`` as the runner wrote it; only a terminal one counts here. A
    ``scheduled`` run was counted where it was requeued (``requeued``): not every
    one is (a wait over already when the run suspended is back in the queue at once)."""
    if status in _TERMINAL:
        ended, duration = _run_series[workflow, status, runner]
        ended.inc()
        duration.observe(seconds)


def step_executed(workflow: str, step: str, outcome: str, runner: str, seconds: float) -> None:
    executed, duration = _step_series[workflow, step, outcome, runner]
    executed.inc()
    duration.observe(seconds)


def suspended(workflow: str, kind: str, runner: str) -> None:
    runs_suspended.labels(workflow, kind, runner).inc()


def event_sent(workflow: str) -> None:
    events_sent.labels(workflow).inc()


def woken(name: str, n: int) -> None:
    runs_woken.labels(name).inc(n)


def child_started(workflow: str, child: str, runner: str) -> None:
    children_started.labels(workflow, child, runner).inc()


def worker_started(name: str, size: int) -> None:
    pool_size.labels(name).set(size)
    runs_in_flight.labels(name).set(0)
    start_time.labels(name).set_to_current_time()


def claimed(name: str, n: int) -> None:
    (claimed_runs,) = _claimed_series[name,]
    claimed_runs.inc(n)


def requeued(name: str, n: int) -> None:
    runs_requeued.labels(name).inc(n)


def in_flight(name: str, delta: int) -> None:
    runs_in_flight.labels(name).inc(delta)


def reconnected(name: str) -> None:
    reconnects.labels(name).inc()


def heartbeat(name: str) -> None:
    last_heartbeat.labels(name).set_to_current_time()


def recovered(name: str, n: int) -> None:
    runs_recovered.labels(name).inc(n)


def cron_started(workflow: str, runner: str, late: float, skipped: int) -> None:
    cron_slots_started.labels(workflow, runner).inc()
    cron_start_delay.labels(workflow, runner).observe(max(0.0, late))
    if skipped:
        cron_slots_skipped.labels(workflow, runner).inc(skipped)


def serve_worker_metrics(port: int, bind: str):
    return start_http_server(port, addr=bind)


# ---------------------------------------------------------------- scrape time


def database_families():
    """Gauges read from the database now: two cheap queries on indexes, one on the
    heartbeats (a row per worker), and two per cron schedule."""
    from django.db.models import Count

    from ..models import Workflow

    shown = [RunStatus.SCHEDULED, RunStatus.RUNNING, RunStatus.BLOCKED, RunStatus.WAITING]
    counts = dict(
        Workflow.objects.filter(status__in=shown)  # the status index
        .order_by()
        .values_list("status")
        .annotate(n=Count("id"))
    )
    runs = GaugeMetricFamily(
        "everystep_runs",
        "Runs in a non-terminal status (scheduled = pending, waiting = asleep or awaiting an event) "
        "or blocked, read at scrape time.",
        labels=["status"],
    )
    for status in shown:
        runs.add_metric([status], counts.get(status, 0))
    oldest = Workflow.objects.claimable().values_list("created_at", flat=True).first()  # the claim index
    age = GaugeMetricFamily(
        "everystep_oldest_pending_run_age_seconds",
        "Seconds since the oldest scheduled run was created (0 when none), read at scrape time.",
        value=max(0.0, (timezone.now() - oldest).total_seconds()) if oldest else 0.0,
    )
    return [runs, age, *worker_families(), cron_missed_family()]


def worker_families():
    """Workers by their heartbeats: how many are live and stale, and each one's silence."""
    from ..heartbeats import shown_stale_after
    from ..models import Heartbeat

    limit = shown_stale_after()
    rows = Heartbeat.objects.with_age().values_list("name", "age")
    ages = [(name, age.total_seconds()) for name, age in rows]
    states = GaugeMetricFamily(
        "everystep_workers",
        "Workers by heartbeat: live, or stale (silent longer than EVERYSTEP_RECOVER_STALE_AFTER), "
        "read at scrape time.",
        labels=["state"],
    )
    stale = sum(age > limit for _, age in ages)
    states.add_metric(["live"], len(ages) - stale)
    states.add_metric(["stale"], stale)
    silence = GaugeMetricFamily(
        "everystep_worker_heartbeat_age_seconds",
        "Seconds since each worker's last heartbeat, read at scrape time.",
        labels=["worker"],
    )
    for name, age in ages:
        silence.add_metric([name], max(0.0, age))
    return [states, silence]


@functools.cache
def _discover_schedules() -> None:
    """Import the apps' workflows modules, once per process: a web process without
    everystep_ui (gunicorn: no system checks) may not have, and would know no
    schedule. Once, because they stay imported, and a module that raises is not
    run again at every scrape."""
    from .. import registry

    registry.autodiscover()


def cron_missed_family():
    """Per cron schedule, whether its latest slot older than 30 s has no run
    (two index lookups per schedule; no schedule, no query)."""
    from .. import cron, registry

    _discover_schedules()
    family = GaugeMetricFamily(
        "everystep_cron_missed",
        "1 when a cron schedule's latest slot (older than 30 s) has no run, read at scrape time.",
        labels=["workflow"],
    )
    now = timezone.now()
    for schedule in registry.schedules():
        family.add_metric([schedule.workflow], 1 if cron.state(schedule, now).missed else 0)
    return family


class _AtScrape:
    """This process's metrics followed by the database gauges."""

    def collect(self):
        yield from REGISTRY.collect()
        yield from database_families()


def exposition(accept: str) -> tuple[bytes, str]:
    """The scrape body and its content type, in the format the scraper asked for."""
    encoder, content_type = choose_encoder(accept)
    return encoder(_AtScrape()), content_type
