import datetime as dt
import os
import re
import socket
import textwrap
import urllib.request
import uuid

import pytest
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from everystep import database, observability, registry
from everystep.cron import CronStarter
from everystep.models import Workflow
from tests.core import workflows as w
from tests.helpers import run_workflow
from tests.observability import support
from tests.observability import workflows as ow
from tests.observability.workflows import branch_fails

pytestmark = pytest.mark.django_db(transaction=True)

RECORD = "tests.core.workflows.record"
BOOM = "tests.core.workflows.boom"
TIMED = "everystep_step_duration_seconds_count"


def value(name, **labels):
    """A sample of the default registry, 0 when the series does not exist yet."""
    return REGISTRY.get_sample_value(name, labels) or 0


def runner_name():
    # Counters are process-wide: a runner name of its own isolates each test.
    return f"runner-{uuid.uuid4().hex[:8]}"


def ended(workflow, status, runner):
    return value(
        "everystep_runs_ended_total", workflow=workflow.__everystep__.name, status=status, runner=runner
    )


def steps(workflow, step, outcome, runner, name="everystep_steps_executed_total"):
    return value(name, workflow=workflow.__everystep__.name, step=step, outcome=outcome, runner=runner)


def test_a_completed_run_counts_its_end_and_each_step():
    runner = runner_name()
    row = run_workflow(w.three_steps, claimer=runner)
    assert row.status == "completed"
    assert ended(w.three_steps, "completed", runner) == 1
    labels = dict(workflow=w.three_steps.__everystep__.name, status="completed", runner=runner)
    assert value("everystep_run_duration_seconds_count", **labels) == 1
    assert value("everystep_run_duration_seconds_sum", **labels) > 0
    assert steps(w.three_steps, RECORD, "done", runner) == 3
    assert steps(w.three_steps, RECORD, "done", runner, TIMED) == 3
    assert steps(w.three_steps, RECORD, "failed", runner) == 0


def test_a_failed_run_counts_the_failed_step_and_the_failed_end():
    runner = runner_name()
    assert run_workflow(w.failing, claimer=runner).status == "failed"
    assert ended(w.failing, "failed", runner) == 1
    assert steps(w.failing, RECORD, "done", runner) == 1
    assert steps(w.failing, BOOM, "failed", runner) == 1
    assert steps(w.failing, BOOM, "failed", runner, TIMED) == 1


def test_branch_steps_are_counted():
    runner = runner_name()
    assert run_workflow(w.forked, claimer=runner).status == "completed"
    assert steps(w.forked, RECORD, "done", runner) == 5


def test_stopped_and_blocked_runs_are_counted_by_status():
    runner = runner_name()
    assert run_workflow(w.terminal_then_more, claimer=runner).status == "stopped"
    assert ended(w.terminal_then_more, "stopped", runner) == 1
    # The Terminal step's row is recorded failed.
    assert steps(w.terminal_then_more, "tests.core.workflows.stop_here", "failed", runner) == 1
    assert support.blocked_run(runner).status == "blocked"
    assert ended(w.pays, "blocked", runner) == 1
    assert steps(w.pays, "tests.core.workflows.charge", "done", runner) == 0  # it did not run


def test_a_run_the_worker_fails_before_its_body_counts_its_failed_end(monkeypatch):
    runner = runner_name()
    support.run_with_an_unreadable_step(monkeypatch, runner)
    assert ended(ow.picks_a_shade, "failed", runner) == 1


def test_replayed_steps_are_not_counted_and_a_drained_pass_is_a_requeue():
    runner = runner_name()
    row = run_workflow(w.three_steps, claimer=runner, leave_check=support.drain_after(1))
    assert row.status == "scheduled"
    assert value("everystep_runs_requeued_total", runner=runner) == 1
    assert ended(w.three_steps, "completed", runner) == 0
    assert steps(w.three_steps, RECORD, "done", runner) == 1
    assert support.resume(row, runner).status == "completed"
    assert steps(w.three_steps, RECORD, "done", runner) == 3  # step 1 was served from the store
    assert ended(w.three_steps, "completed", runner) == 1


def test_a_crashed_pass_ends_nothing():
    runner = runner_name()
    support.crash_at("2")
    row = run_workflow(w.three_steps, claimer=runner)
    assert row.status == "running"
    assert ended(w.three_steps, "completed", runner) == 0
    assert value("everystep_runs_requeued_total", runner=runner) == 0
    assert support.resume(row, runner).status == "completed"
    assert ended(w.three_steps, "completed", runner) == 1


def test_worker_functions_set_the_worker_series():
    runner = runner_name()
    observability.worker_started(runner, 8)
    observability.claimed(runner, 3)
    observability.in_flight(runner, 3)
    observability.in_flight(runner, -1)
    observability.requeued(runner, 2)
    assert value("everystep_worker_pool_size", runner=runner) == 8
    assert value("everystep_runs_claimed_total", runner=runner) == 3
    assert value("everystep_worker_in_flight", runner=runner) == 2
    assert value("everystep_runs_requeued_total", runner=runner) == 2
    started = value("everystep_worker_start_time_seconds", runner=runner)
    assert abs(started - timezone.now().timestamp()) < 60


# ---------------------------------------------------------------- the endpoints


def scrape(text):
    """{(name, frozenset(labels)): value} of a text exposition."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def db_gauges(samples):
    runs = {
        dict(labels)["status"]: v for (name, labels), v in samples.items() if name == "everystep_runs"
    }
    return runs, samples[("everystep_oldest_pending_run_age_seconds", frozenset())]


@pytest.mark.urls("tests.observability.urls")
def test_metrics_view_reads_the_run_counts_from_the_database_at_scrape_time(client):
    runs, oldest = db_gauges(scrape(client.get("/metrics").content.decode()))
    assert runs == {"scheduled": 0, "running": 0, "blocked": 0, "waiting": 0} and oldest == 0
    hour_ago = timezone.now() - dt.timedelta(hours=1)
    Workflow.objects.create(name="a.flow", created_at=hour_ago)
    Workflow.objects.create(name="a.flow")
    Workflow.objects.create(name="a.flow", status="running", claimed_by="w1")
    Workflow.objects.create(name="a.flow", status="blocked", created_at=hour_ago - dt.timedelta(hours=1))
    Workflow.objects.create(name="a.flow", status="waiting", created_at=hour_ago - dt.timedelta(hours=1))
    Workflow.objects.create(name="a.flow", status="completed", created_at=hour_ago - dt.timedelta(hours=1))
    runs, oldest = db_gauges(scrape(client.get("/metrics").content.decode()))
    assert runs == {"scheduled": 2, "running": 1, "blocked": 1, "waiting": 1}
    assert 3600 <= oldest < 3660  # the oldest *scheduled* run, not the older blocked one


@pytest.mark.urls("tests.observability.urls")
def test_metrics_view_serves_the_run_metrics_without_run_ids(client):
    runner = runner_name()
    failed = run_workflow(branch_fails, claimer=runner)
    done = run_workflow(w.three_steps, claimer=runner)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    samples = scrape(text)
    key = {"workflow": branch_fails.__everystep__.name, "status": "failed", "runner": runner}
    assert samples[("everystep_runs_ended_total", frozenset(key.items()))] == 1
    assert str(failed.id) not in text and str(done.id) not in text
    assert failed.id.hex not in text and done.id.hex not in text
    assert "process_cpu_seconds_total" in text or "python_info" in text  # the registry's own


@pytest.mark.urls("tests.observability.urls")
def test_metrics_view_costs_three_queries(client, django_assert_num_queries):
    # Runs per status, the oldest pending run, the heartbeats.
    with django_assert_num_queries(3, connection=database.connection()):
        client.get("/metrics")


@pytest.mark.urls("tests.observability.urls")
def test_metrics_view_reads_the_workers_heartbeats_at_scrape_time(client):
    from django.db.models.functions import Now

    from everystep import heartbeats
    from everystep.models import Heartbeat

    for name in ("live-1", "live-2", "gone"):
        heartbeats.beat(
            name, hostname="h", pid=1, version="v", pool_size=4, started_at=timezone.now(),
            in_flight=0, executing={},
        )
    Heartbeat.objects.filter(name="gone").update(last_seen=Now() - dt.timedelta(seconds=300))
    samples = scrape(client.get("/metrics").content.decode())
    assert samples[("everystep_workers", frozenset({("state", "live")}))] == 2
    assert samples[("everystep_workers", frozenset({("state", "stale")}))] == 1
    silence = {
        dict(labels)["worker"]: seconds
        for (name, labels), seconds in samples.items()
        if name == "everystep_worker_heartbeat_age_seconds"
    }
    assert set(silence) == {"live-1", "live-2", "gone"}
    assert 300 <= silence["gone"] < 330 and silence["live-1"] < 30


@pytest.mark.urls("tests.observability.urls")
def test_metrics_view_speaks_openmetrics_when_asked(client):
    response = client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().rstrip().endswith("# EOF")
    assert "everystep_oldest_pending_run_age_seconds" in response.content.decode()


@pytest.mark.urls("tests.observability.urls")
def test_metrics_view_refuses_writes(client):
    assert client.post("/metrics").status_code == 405
    assert client.head("/metrics").status_code == 200


# ---------------------------------------------------------------- cron schedules


def at(*args):
    return dt.datetime(*args, tzinfo=dt.UTC)


def cron_series(name, workflow, runner):
    return value(name, workflow=workflow, runner=runner)


def test_a_won_cron_slot_counts_its_start_delay_and_the_slots_it_skipped(cron_workflow):
    name = cron_workflow(cron="*/5 * * * *").__everystep__.name
    schedule = registry.schedules()[0]
    winner, loser = runner_name(), runner_name()
    clock = {"now": at(2026, 3, 6, 7, 58)}
    first = CronStarter([schedule], runner=winner, now=lambda: clock["now"])
    first.start_due()
    clock["now"] = at(2026, 3, 6, 8, 0, 0, 250_000)
    first.start_due()
    assert cron_series("everystep_cron_slots_started_total", name, winner) == 1
    assert cron_series("everystep_cron_start_delay_seconds_sum", name, winner) == pytest.approx(0.25)
    assert cron_series("everystep_cron_slots_skipped_total", name, winner) == 0

    # Back after downtime at 09:07: 09:05 starts, the 12 slots before it are skipped.
    CronStarter([schedule], runner=winner, now=lambda: at(2026, 3, 6, 9, 7)).start_due()
    assert cron_series("everystep_cron_slots_started_total", name, winner) == 2
    assert cron_series("everystep_cron_slots_skipped_total", name, winner) == 12
    assert value("everystep_cron_start_delay_seconds_bucket", workflow=name, runner=winner, le="300.0") == 2
    assert value("everystep_cron_start_delay_seconds_bucket", workflow=name, runner=winner, le="60.0") == 1

    # Another worker finding the slot started counts nothing.
    clock["now"] = at(2026, 3, 6, 9, 4)  # a worker whose clock lags behind
    late = CronStarter([schedule], runner=loser, now=lambda: clock["now"])
    late.start_due()
    clock["now"] = at(2026, 3, 6, 9, 5, 1)
    assert late.start_due() == 0
    assert cron_series("everystep_cron_slots_started_total", name, loser) == 0
    assert cron_series("everystep_cron_slots_skipped_total", name, loser) == 0


@pytest.mark.urls("tests.observability.urls")
def test_metrics_view_says_which_schedules_missed_their_latest_slot(client, cron_workflow):
    hourly = cron_workflow("hourly", cron="0 * * * *").__everystep__.name
    fresh = cron_workflow("fresh", cron="0 * * * *").__everystep__.name
    schedule = registry.get_workflow(hourly).cron
    now = timezone.now()
    latest = schedule.latest_at(now - dt.timedelta(seconds=30))
    Workflow.objects.create(name=hourly, idempotency_key=schedule.key(latest - dt.timedelta(hours=1)))

    def missed():
        samples = scrape(client.get("/metrics").content.decode())
        return {
            dict(labels)["workflow"]: v
            for (name, labels), v in samples.items()
            if name == "everystep_cron_missed"
        }

    assert missed() == {hourly: 1, fresh: 0}  # fresh never ran: nothing to miss
    Workflow.objects.create(name=hourly, idempotency_key=schedule.key(latest))
    assert missed() == {hourly: 0, fresh: 0}


CRON_APP_WORKFLOWS = textwrap.dedent(
    """
    from everystep import workflow


    @workflow(cron="*/5 * * * *")
    def every_five_minutes(slot):
        return None
    """
)

SETTINGS_WITHOUT_THE_UI = textwrap.dedent(
    """
    from tests.settings import *  # noqa: F401,F403

    INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "everystep_ui"] + ["obs_cron_app"]
    """
)

# As a WSGI server's process: django.setup(), then a request to the mounted view.
SCRAPE_CRON_MISSED = textwrap.dedent(
    """
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)

    from django.test import RequestFactory
    from prometheus_client.parser import text_string_to_metric_families

    from everystep.views import metrics_view

    response = metrics_view(RequestFactory().get("/metrics"))
    assert response.status_code == 200, response.status_code
    for family in text_string_to_metric_families(response.content.decode()):
        if family.name == "everystep_cron_missed":
            print(sorted((sample.labels["workflow"], sample.value) for sample in family.samples))
    """
)


def test_metrics_view_in_a_web_process_without_the_ui_knows_the_cron_schedules(tmp_path):
    # Nothing there imports the apps' workflows modules (no everystep_ui, no
    # system checks under a WSGI server): the view does. A fresh process,
    # because this one has every workflow registered already.
    app = tmp_path / "obs_cron_app"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "workflows.py").write_text(CRON_APP_WORKFLOWS)
    (tmp_path / "obs_cron_settings.py").write_text(SETTINGS_WITHOUT_THE_UI)
    done = support.run_script(
        SCRAPE_CRON_MISSED,
        tmp_path,
        DJANGO_SETTINGS_MODULE="obs_cron_settings",
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(support.ROOT)]),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The schedule never ran: its series is there, at 0.
    assert done.stdout.strip() == "[('obs_cron_app.workflows.every_five_minutes', 0.0)]"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_worker_metrics_serves_the_process_metrics_over_http():
    runner = runner_name()
    observability.worker_started(runner, 4)
    run_workflow(w.three_steps, claimer=runner)
    port = free_port()
    server, thread = observability.serve_worker_metrics(port, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert response.status == 200
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    samples = scrape(text)
    assert samples[("everystep_worker_pool_size", frozenset({"runner": runner}.items()))] == 4
    key = {"workflow": w.three_steps.__everystep__.name, "status": "completed", "runner": runner}
    assert samples[("everystep_runs_ended_total", frozenset(key.items()))] == 1
    # A worker's own endpoint never queries the database.
    assert not re.search(r"^everystep_runs\{", text, re.M)
