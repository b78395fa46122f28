"""The overview page: its figures after known data, who may see it, and its query plans."""

import datetime as dt
import random
import re

import pytest
from django.test import Client, override_settings
from django.utils import timezone

from everystep import database
from everystep.models import Workflow
from everystep_ui import overview

from .conftest import HTMX

PAGE = "/admin/everystep/workflow/overview/"
NOW = dt.datetime(2024, 5, 1, 12, 30, 20, tzinfo=dt.UTC)
SCRIPT = "<script>alert(1)</script>"


def ago(**delta):
    return NOW - dt.timedelta(**delta)


@pytest.fixture
def known_runs(make_run):
    def ended(status, *, minutes_ago, took=dt.timedelta(seconds=30)):
        end = ago(minutes=minutes_ago)
        return make_run(status=status, created_at=end - took, completed_at=end)

    for minutes in (10, 5, 0):
        make_run(status="scheduled", created_at=ago(minutes=minutes))
    for claimer in ("worker-a", "worker-a", "worker-b"):
        make_run(status="running", claimed_by=claimer, created_at=ago(minutes=1))
    ended("completed", minutes_ago=1)
    ended("completed", minutes_ago=1)
    ended("completed", minutes_ago=30)
    ended("completed", minutes_ago=120)  # before the chart's hour
    ended("failed", minutes_ago=1)
    ended("failed", minutes_ago=59)
    # A long run: created hours ago, ended in the chart's hour, so it counts there.
    ended("failed", minutes_ago=10, took=dt.timedelta(hours=3))
    ended("blocked", minutes_ago=3)
    ended("stopped", minutes_ago=3)


def test_the_figures_after_known_data(known_runs):
    figures = overview.figures(NOW)
    assert figures["counts"] == [
        ("scheduled", 3),
        ("running", 3),
        ("completed", 4),
        ("failed", 3),
        ("stopped", 1),
        ("blocked", 1),
        ("waiting", 0),
    ]
    assert figures["total"] == 15
    assert figures["blocked"] == 1
    assert figures["oldest_scheduled"] == ago(minutes=10)
    assert figures["oldest_scheduled_age"] == "10 min 0 s"
    assert figures["runners"] == [("worker-a", 2), ("worker-b", 1)]
    chart = figures["chart"]
    assert (chart.completed, chart.failed, chart.peak) == (3, 3, 3)
    titled = {bar.title: bar for bar in chart.bars if not bar.title.endswith("0 completed, 0 failed")}
    assert list(titled) == [
        "11:31 UTC: 0 completed, 1 failed",
        "12:00 UTC: 1 completed, 0 failed",
        "12:20 UTC: 0 completed, 1 failed",
        "12:29 UTC: 2 completed, 1 failed",
    ]
    assert len(chart.bars) == 60
    assert chart.bars[0].title.startswith("11:31 UTC") and chart.bars[-1].title.startswith("12:30 UTC")
    # The busiest minute fills the height: completed at the bottom, failed on top.
    busiest = titled["12:29 UTC: 2 completed, 1 failed"]
    assert (busiest.completed_y, busiest.completed_height) == (40, 80)
    assert (busiest.failed_y, busiest.failed_height) == (0, 40)


def test_an_empty_table(db):
    figures = overview.figures(NOW)
    assert figures["total"] == 0 and figures["oldest_scheduled"] is None and figures["runners"] == []
    assert figures["chart"].peak == 0
    assert all(bar.completed_height == bar.failed_height == 0 for bar in figures["chart"].bars)


def test_the_page_shows_the_figures(admin_client, make_run):
    now = timezone.now()
    make_run(status="scheduled", created_at=now - dt.timedelta(minutes=3))
    make_run(status="blocked")
    make_run(status="running", claimed_by="worker-a")
    make_run(status="completed", created_at=now - dt.timedelta(seconds=5), completed_at=now)
    response = admin_client.get(PAGE)
    assert response.status_code == 200
    html = response.text
    assert "Django administration" in html
    counts = dict(re.findall(r'data-status="(\w+)">(\d+)<', html))
    assert counts == {
        "scheduled": "1",
        "running": "1",
        "completed": "1",
        "failed": "0",
        "stopped": "0",
        "blocked": "1",
        "waiting": "0",
        "all": "4",
    }
    assert re.search(r'id="es-blocked"><a href="/admin/everystep/workflow/\?status=blocked">1</a>', html)
    assert "waiting 3 min" in html
    runner = "/admin/everystep/workflow/?status=running&amp;claimed_by=worker-a"
    assert f'<a href="{runner}"><code>worker-a</code>' in html
    assert html.count('class="es-chart-completed"') == 1
    assert '<svg class="es-chart"' in html
    assert 'hx-trigger="every 15s"' in html


def test_htmx_gets_the_figures_only(admin_client, db):
    response = admin_client.get(PAGE, **HTMX)
    assert response.status_code == 200
    assert response.text.lstrip().startswith("<div id=\"es-overview-live\"")


def test_stored_names_are_escaped(admin_client, make_run):
    make_run(status="running", claimed_by=SCRIPT)
    html = admin_client.get(PAGE).text
    assert SCRIPT not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_who_may_see_the_overview(operator_client, unpermitted_staff_client):
    viewer = operator_client()  # view permission only
    for url in (PAGE, "/everystep/overview/"):
        assert viewer.get(url).status_code == 200
        assert unpermitted_staff_client.get(url).status_code == 403
        response = Client().get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_the_run_list_and_the_run_page_link_to_the_overview(admin_client, make_run):
    run = make_run()
    assert f'<a href="{PAGE}">Overview</a>' in admin_client.get("/admin/everystep/workflow/").text
    run_page = admin_client.get(f"/admin/everystep/workflow/{run.pk}/run/").text
    assert f'<a href="{PAGE}">Overview</a>' in run_page
    assert '<a href="/everystep/overview/">Overview</a>' in admin_client.get("/everystep/").text


# The workers


def heartbeat(name, *, seconds_ago=0.0, **values):
    from django.db.models.functions import Now

    from everystep import heartbeats
    from everystep.models import Heartbeat

    row = {"hostname": "host-a", "pid": 4242, "version": "0.1.0", "pool_size": 4, "in_flight": 0,
           "executing": {}, "started_at": dt.datetime(2026, 12, 1, 8, 0, tzinfo=dt.UTC), **values}
    heartbeats.beat(name, **row)
    Heartbeat.objects.filter(name=name).update(last_seen=Now() - dt.timedelta(seconds=seconds_ago))


def worker_rows(html) -> list[list[str]]:
    """The workers table as text: one list of cell texts per row."""
    body = html.split('<table class="es-workers es-runners">')[1].split("</table>")[0].split("<tbody>")[1]
    cells = r"<td[^>]*>(.*?)</td>"
    return [
        [" ".join(re.sub(r"<[^>]+>", " ", cell).split()) for cell in re.findall(cells, tr, re.S)]
        for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
    ]


def test_live_and_stale_workers_and_claimers_without_a_heartbeat(admin_client, make_run):
    heartbeat("zeta", seconds_ago=20, in_flight=2, pool_size=8, hostname="box-1", pid=101)
    heartbeat("alpha", seconds_ago=125, in_flight=1, hostname="box-2", pid=202, version="0.0.9")
    heartbeat("idle", seconds_ago=10)
    for claimer in ("zeta", "zeta", "alpha", "legacy"):
        make_run(status="running", claimed_by=claimer)
    response = admin_client.get(PAGE)
    rows = worker_rows(response.text)
    started = "2026-12-01 08:00:00 UTC"
    assert [row[:2] + row[3:] for row in rows] == [
        ["idle", "live", "0", "0", "4", "host-a", "4242", "0.1.0", started],
        ["zeta", "live", "2", "2", "8", "box-1", "101", "0.1.0", started],
        ["alpha", "stale", "1", "1", "4", "box-2", "202", "0.0.9", started],
        ["legacy", "no heartbeat", "1", "writes no heartbeat (a worker older than heartbeats?)"],
    ]
    # Ages by the database's clock, as of the request (which takes a moment).
    assert seconds(rows[0][2]) in range(10, 15) and seconds(rows[1][2]) in range(20, 25)
    assert seconds(rows[2][2]) in range(125, 130) and rows[3][2] == "—"
    # Each claimer's runs are a click away: the run list filtered by claimer.
    for name in ("zeta", "alpha", "legacy"):
        url = f"/admin/everystep/workflow/?status=running&amp;claimed_by={name}"
        assert f'<a href="{url}"><code>{name}</code></a>' in response.text
    assert "/admin/everystep/workflow/?status=running&amp;claimed_by=idle" not in response.text
    assert "one silent for longer than 60 s is stale" in response.text
    assert "The next live worker to look requeues a stale worker's claimed runs" in response.text


def seconds(age: str) -> int:
    found = re.fullmatch(r"(?:(\d+) min )?(\d+) s ago", age)
    assert found, age
    return int(found[1] or 0) * 60 + int(found[2])


def test_the_stale_limit_is_the_recovery_setting(admin_client, db):
    heartbeat("slow", seconds_ago=20)
    with override_settings(EVERYSTEP_RECOVER_STALE_AFTER=15):
        html = admin_client.get(PAGE).text
        assert worker_rows(html)[0][:2] == ["slow", "stale"]
        assert "one silent for longer than 15 s is stale" in html
    with override_settings(EVERYSTEP_RECOVER_STALE_AFTER=None):
        html = admin_client.get(PAGE).text
        assert worker_rows(html)[0][:2] == ["slow", "live"]  # shown stale after the default, 60 s
        assert "Automatic recovery is off" in html


def test_worker_names_and_hosts_are_escaped(admin_client, db):
    heartbeat(SCRIPT, hostname=SCRIPT)
    html = admin_client.get(PAGE).text
    assert SCRIPT not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 2


# The query plans on a big table (PostgreSQL)

STATUS_MIX = ["completed"] * 90 + ["failed"] * 5 + ["stopped"] * 2 + ["blocked", "running", "scheduled"]


@pytest.mark.django_db(transaction=True)
def test_the_overview_queries_use_indexes_on_a_big_table(monkeypatch, admin_client):
    if database.connection().vendor != "postgresql":
        pytest.skip("the plans checked are PostgreSQL's")
    rng = random.Random(7)
    now = timezone.now()
    runs = []
    for i in range(20_000):
        status = rng.choice(STATUS_MIX)
        created = now - dt.timedelta(days=30) * rng.random()
        runs.append(
            Workflow(
                name=f"shop.workflows.flow_{i % 7}",
                args=[{"order_id": i, "note": "x" * 40}],
                status=status,
                claimed_by=f"worker-{i % 5}" if status == "running" else None,
                created_at=created,
                completed_at=created + dt.timedelta(seconds=2)
                if status not in ("scheduled", "running")
                else None,
            )
        )
    Workflow.objects.bulk_create(runs, batch_size=2_000)
    with database.connection().cursor() as cursor:
        # A real table is vacuumed by autovacuum: the visibility map lets the
        # counts be read from the status index alone.
        cursor.execute("VACUUM ANALYZE everystep_workflow")

    start = overview.chart_start(now)
    queries = {
        "counts": overview.status_counts_query(),
        "oldest scheduled": overview.oldest_scheduled_query(),
        "chart": overview.chart_query(start),
        "runners": overview.runners_query(),
    }
    for what, queryset in queries.items():
        plan = queryset.explain()
        assert "Seq Scan on everystep_workflow" not in plan, f"{what}:\n{plan}"
        assert "everystep_workflow" in plan, f"{what}:\n{plan}"
    # And the figures still add up.
    assert overview.figures(now)["total"] == 20_000
    exact = dict(overview.status_counts_query())

    # Above the threshold the history's counts are the statistics' estimates,
    # the statuses that stay small are still counted, by the status index.
    monkeypatch.setattr(overview, "ESTIMATE_ABOVE", 10_000)
    counts, estimated = overview.status_counts()
    assert estimated
    for status in overview.HISTORY:
        assert counts[status] == pytest.approx(exact[status], rel=0.25), status
    for status in ("scheduled", "running", "blocked"):
        assert counts[status] == exact[status], status
    rest = overview.status_counts_query().filter(status__in=["scheduled", "running", "blocked"])
    assert "Seq Scan" not in rest.explain()
    response = admin_client.get(PAGE)
    assert 'id="es-counts-estimated"' in response.text

    monkeypatch.setattr(overview, "ESTIMATE_ABOVE", 100_000)
    assert overview.status_counts() == (exact, False)


# The cron schedules


def test_the_schedules_with_their_next_and_last_runs(cron_workflow, make_run):
    daily = cron_workflow("daily", cron="0 9 * * *", timezone="Europe/Paris").__everystep__.name
    often = cron_workflow("often", cron="*/10 * * * *").__everystep__.name
    hourly = cron_workflow("hourly", cron="0 * * * *").__everystep__.name
    fresh = cron_workflow("fresh", cron="0 0 1 1 *").__everystep__.name
    # NOW is 2024-05-01 12:30:20 UTC: daily's latest slot is 07:00 UTC (09:00 CEST), and it ran.
    ran = make_run(name=daily, status="completed", idempotency_key="cron:2024-05-01T07:00:00Z")
    # often's 12:20 slot ran; its 12:30 slot has no run yet, but is only 20 s old.
    make_run(name=often, status="failed", idempotency_key="cron:2024-05-01T12:20:00Z")
    # hourly's 12:00 slot has no run: missed.
    make_run(name=hourly, status="completed", idempotency_key="cron:2024-05-01T11:00:00Z")
    make_run(name=hourly, status="completed", idempotency_key="order-7")  # not a slot's run

    states = {state.schedule.workflow: state for state in overview.figures(NOW)["schedules"]}
    assert list(states) == sorted([daily, often, hourly, fresh])
    assert states[daily].last_run.id == ran.id and not states[daily].missed
    assert states[daily].next_slot == dt.datetime(2024, 5, 2, 7, 0, tzinfo=dt.UTC)
    assert states[often].last_run.idempotency_key == "cron:2024-05-01T12:20:00Z"
    assert states[often].latest_slot == dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC)
    assert not states[often].missed
    assert states[hourly].last_run.idempotency_key == "cron:2024-05-01T11:00:00Z"
    assert states[hourly].missed
    assert states[fresh].last_run is None and not states[fresh].missed  # it never ran: nothing missed
    assert states[fresh].next_slot == dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def schedule_row(html, name):
    match = re.search(rf'<tr data-workflow="{re.escape(name)}">(.*?)</tr>', html, re.S)
    assert match, html
    return " ".join(match[1].split())


def test_the_page_lists_the_schedules(admin_client, cron_workflow, make_run):
    yearly = cron_workflow("yearly", cron="0 0 1 1 *").__everystep__.name
    paris = cron_workflow("morning", cron="0 9 * * *", timezone="Europe/Paris").__everystep__.name
    year = timezone.now().year
    # Last year's slot ran; this year's has no run: missed.
    last = make_run(name=yearly, status="completed", idempotency_key=f"cron:{year - 1}-01-01T00:00:00Z")

    html = admin_client.get(PAGE).text
    assert "<h2>Schedules</h2>" in html
    row = schedule_row(html, yearly)
    changelist = f"/admin/everystep/workflow/?name={yearly}"
    assert f'<a href="{changelist}"><code>{yearly}</code></a>' in row
    assert "<code>0 0 1 1 *</code> <span class=\"es-quiet\">UTC</span>" in row
    assert f"{year + 1}-01-01 00:00:00 UTC" in row  # the next slot
    assert f'<a href="/admin/everystep/workflow/{last.pk}/run/">{year - 1}-01-01 00:00:00 UTC</a>' in row
    assert '<span class="es-badge es-status-completed">completed</span>' in row
    assert f'<td class="es-latest es-alert">{year}-01-01 00:00:00 UTC missed</td>' in row

    row = schedule_row(html, paris)
    assert "<code>0 9 * * *</code> <span class=\"es-quiet\">Europe/Paris</span>" in row
    assert re.search(r"\d{4}-\d\d-\d\d 09:00:00 CES?T", row)  # in the schedule's zone
    assert "not run yet" in row and "missed" not in row

    # The slot's run appears: started, no longer missed.
    make_run(name=yearly, status="running", claimed_by="w1", idempotency_key=f"cron:{year}-01-01T00:00:00Z")
    row = schedule_row(admin_client.get(PAGE, **HTMX).text, yearly)
    assert f'<td class="es-latest">{year}-01-01 00:00:00 UTC started</td>' in row
    assert '<span class="es-badge es-status-running">running</span>' in row


def test_no_schedules_section_without_schedules(admin_client, db):
    assert "Schedules" not in admin_client.get(PAGE).text


def test_the_page_lists_the_concurrency_limits(admin_client, cron_workflow, make_run):
    full = cron_workflow("exports", max_concurrent=2).__everystep__.name
    idle = cron_workflow("mailer", max_concurrent=5).__everystep__.name
    for _ in range(2):
        make_run(name=full, status="running", claimed_by="w1")
    make_run(name=full, status="scheduled", created_at=timezone.now() - dt.timedelta(minutes=3))
    make_run(name=idle, status="completed")

    html = admin_client.get(PAGE).text
    assert "<h2>Concurrency limits</h2>" in html
    row = schedule_row(html, full)
    running = f"/admin/everystep/workflow/?name={full}&amp;status=running"
    waiting = f"/admin/everystep/workflow/?name={full}&amp;status=scheduled"
    assert f'<td class="es-number es-full"><a href="{running}">2</a></td> <td class="es-number">2</td>' in row
    assert re.search(rf'<a href="{re.escape(waiting)}">waiting 3 min( \d+ s)?</a>', row), row
    row = schedule_row(admin_client.get(PAGE, **HTMX).text, idle)
    assert '<td class="es-number"><a href' in row and ">0</a></td> <td class=\"es-number\">5</td>" in row
    assert "none waiting" in row


def test_no_limits_section_without_limits(admin_client, db):
    assert "Concurrency limits" not in admin_client.get(PAGE).text
