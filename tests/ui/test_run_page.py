"""The run page: facts, outcome, the step tree, live polling, intended steps."""

import datetime as dt
import fractions
import json
import re
import sys
import types

import pytest
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from everystep import database, registry
from everystep.models import Workflow
from tests.helpers import run_once

from . import control_workflows as flows
from .conftest import CHECKOUT, HTMX

SCRIPT = "<script>alert(1)</script>"


def run_page(run):
    return f"/admin/everystep/workflow/{run.pk}/run/"


def tree_paths(response) -> list[str]:
    return re.findall(r'<code class="es-path">([^<]+)</code>', response.text)


def test_the_page_shows_the_run_in_the_admin_frame(admin_client, make_run):
    created = timezone.now() - dt.timedelta(hours=1)
    run = make_run(
        status="completed",
        claimed_by="worker-3",
        idempotency_key="order-42",
        args=[{"order_id": 42}, "eu"],
        result={"charged": 1999},
        created_at=created,
        completed_at=created + dt.timedelta(seconds=5),
    )
    response = admin_client.get(run_page(run))
    assert response.status_code == 200
    html = response.text
    assert "Django administration" in html  # extends admin/base_site.html
    assert f"Run {run.pk}" in html
    assert CHECKOUT in html and "worker-3" in html and "order-42" in html
    assert '<span class="es-badge es-status-completed">completed</span>' in html
    assert "5.0 s" in html
    assert "[\n  {\n    &quot;order_id&quot;: 42\n  },\n  &quot;eu&quot;\n]" in html
    assert "{\n  &quot;charged&quot;: 1999\n}" in html
    assert f'href="/admin/everystep/workflow/{run.pk}/history/"' in html


def test_htmx_is_served_from_static_files_only(admin_client, make_run):
    html = admin_client.get(run_page(make_run())).text
    assert '<script src="/static/django_htmx/htmx-2.min.js" defer></script>' in html
    assert not re.search(r'(src|href)="(https?:)?//', html), "no asset from another host"


def test_a_failed_run_shows_its_decoded_error(admin_client, make_run):
    error = {"type": "shop.errors.PaymentDeclined", "message": "card declined", "args": ["card declined", 51]}
    html = admin_client.get(run_page(make_run(status="failed", error=error))).text
    assert "shop.errors.PaymentDeclined" in html
    assert "card declined" in html
    assert "[\n  &quot;card declined&quot;,\n  51\n]" in html
    assert "Result" not in html


def test_a_stopped_run_shows_the_terminal_reason_and_payload(admin_client, make_run):
    error = {
        "type": "everystep.errors.Terminal",
        "message": "customer cancelled",
        "args": ["customer cancelled", {"ticket": 7}],
    }
    html = admin_client.get(run_page(make_run(status="stopped", error=error))).text
    assert "<h3>Stopped</h3>" in html
    assert '<th scope="row">Reason</th><td>customer cancelled</td>' in html
    assert "{\n  &quot;ticket&quot;: 7\n}" in html


def test_a_blocked_run_tells_how_to_resolve_it(admin_client, make_run):
    error = {"type": "everystep.errors.EffectUncertain", "message": "step 2 uncertain", "args": []}
    run = make_run(
        status="blocked",
        error=error,
        steps=[{"step_id": "1"}, {"step_id": "2", "status": "started", "name": "shop.steps.ship"}],
    )
    html = admin_client.get(run_page(run)).text
    assert (
        f"python manage.py everystep_resolve_step {run.pk} 2 (--result JSON | --error MESSAGE | --discard)"
    ) in html
    assert "started (uncertain)" in html


def test_a_waiting_runs_wait_shows_as_waiting_not_uncertain(admin_client, make_run):
    run = make_run(
        status="waiting",
        steps=[{"step_id": "1"}, {"step_id": "2", "status": "started", "name": "everystep.sleep"}],
    )
    html = admin_client.get(run_page(run)).text
    assert "started (uncertain)" not in html
    assert "everystep_resolve_step" not in html
    assert "es-status-waiting" in html


def blocked_by_a_crash() -> Workflow:
    """A run whose worker died right after an unsafe step, replayed into blocked by the engine."""
    from everystep import operations, runner, schedule
    from everystep.errors import SimulatedCrash
    from tests.helpers import claim

    run = schedule(flows.checkout, "order-7", 1999)

    def crash(ctx, step_id):
        raise SimulatedCrash("the test pulls the plug after the charge")

    runner.fault = crash
    try:
        runner.execute(claim(run, "crashed-worker"), "crashed-worker")
    finally:
        runner.fault = None
    operations.release_run(run.pk, "crashed-worker")
    assert run_once(run).status == "blocked"
    return run


def test_a_blocked_run_says_once_what_is_uncertain_and_how_to_resolve_it(admin_client):
    run = blocked_by_a_crash()
    command = f"everystep_resolve_step {run.pk} 1 (--result JSON | --error MESSAGE | --discard)"
    html = admin_client.get(run_page(run)).text
    assert html.count(command) == 1
    assert html.count("never recorded") == 1
    assert f"Step <code>1</code> (<code>{registry.qualified_name(flows.charge)}</code>)" in html
    # The stored EffectUncertain is one link away, not shown again.
    assert f'href="/admin/everystep/workflow/{run.pk}/run/json/error/" download' in html
    assert "<h4>Exception arguments</h4>" not in html

    # Opening the step's panel, or the Resolve confirmation, does not say it again.
    step = run.steps.get(step_id="1")
    panel = admin_client.get(f"{run_page(run)}steps/{step.pk}/", **HTMX).text
    assert "everystep_resolve_step" not in panel and "never recorded" not in panel
    assert "under Status" in panel
    confirmation = admin_client.get(f"{run_page(run)}resolve/", **HTMX).text
    assert "everystep_resolve_step" not in confirmation


def test_a_blocked_run_is_blocked_since_not_completed(admin_client, run_in):
    created = timezone.now() - dt.timedelta(minutes=3)
    run = run_in("blocked", created_at=created, completed_at=created + dt.timedelta(seconds=4))
    html = admin_client.get(run_page(run)).text
    assert '<th scope="row">Completed</th>' not in html
    since = timezone.localtime(run.completed_at).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f'<tr><th scope="row">Blocked since</th><td>{since}</td></tr>' in html


@pytest.mark.parametrize(("status", "label"), [("completed", "Completed"), ("failed", "Failed at"),
                                               ("stopped", "Stopped at")])
def test_the_end_of_a_run_is_named_by_how_it_ended(admin_client, make_run, status, label):
    run = make_run(status=status, completed_at=timezone.now())
    assert f'<tr><th scope="row">{label}</th><td>' in admin_client.get(run_page(run)).text


def test_an_unreadable_error_payload_is_shown_as_stored(admin_client, make_run):
    html = admin_client.get(run_page(make_run(status="failed", error="just a string"))).text
    assert "&quot;just a string&quot;" in html


def test_a_run_whose_module_failed_to_import_shows_that_error_and_where(admin_client, scratch_modules):
    module = f"{scratch_modules.prefix}_flows"
    path = scratch_modules.write(f"{module}.py", "from everystep import workflow\n\nTIMEOUT = int('ten')\n")
    run = run_once(Workflow.objects.create(name=f"{module}.flow", args=[]))  # failed as a worker fails it
    html = admin_client.get(run_page(run)).text
    assert '<span class="es-badge es-status-failed">failed</span>' in html
    assert "<code>builtins.ValueError</code>" in html
    assert "invalid literal for int() with base 10: &#x27;ten&#x27;" in html
    assert (
        f'<th scope="row">Where</th><td>raised while importing <code>{module}</code>, '
        f"at <code>{path}</code>, line 3</td>"
    ) in html
    # No pending steps, and why.
    assert f"its module &#x27;{module}&#x27; failed to import: ValueError" in html


def test_stored_script_renders_inert(admin_client, make_run):
    run = make_run(
        name=f"evil.{SCRIPT}",
        status="failed",
        claimed_by=SCRIPT,
        idempotency_key=SCRIPT,
        args=[SCRIPT, {SCRIPT: SCRIPT}],
        error={"type": SCRIPT, "message": SCRIPT, "args": [SCRIPT]},
        steps=[{"step_id": "1", "name": SCRIPT}, {"step_id": SCRIPT}],
    )
    for url in (run_page(run), "/admin/everystep/workflow/", f"/everystep/{run.pk}/run/"):
        html = admin_client.get(url).text
        assert SCRIPT not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


# The step tree


def test_step_ids_nest_as_forks_branches_and_steps(admin_client, make_run):
    run = make_run(
        status="running",
        steps=[
            {"step_id": "1"},
            {"step_id": "2"},
            {"step_id": "3.1.1"},
            {"step_id": "3.0.1"},
            {"step_id": "3.0.2", "status": "failed"},
            {"step_id": "fanout.0.1"},
            {"step_id": "fanout.1.1.0.1"},
            {"step_id": "10"},
            {"step_id": "charge", "status": "started", "name": "shop.steps.charge_card"},
        ],
    )
    response = admin_client.get(run_page(run))
    assert tree_paths(response) == [
        "1",
        "2",
        "3",
        "3.0",
        "3.0.1",
        "3.0.2",
        "3.1",
        "3.1.1",
        "fanout",
        "fanout.0",
        "fanout.0.1",
        "fanout.1",
        "fanout.1.1",
        "fanout.1.1.0",
        "fanout.1.1.0.1",
        "10",
        "charge",
    ]
    html = response.text
    assert '<li class="es-node es-fork">' in html and '<li class="es-node es-branch">' in html
    assert "branch 1" in html
    assert '<span class="es-badge es-status-in_flight">in flight</span>' in html
    assert '<span class="es-badge es-status-failed">failed</span>' in html
    assert "9 recorded" in html


def test_the_tree_query_leaves_step_payloads_out(admin_client, make_run):
    run = make_run(steps=[{"step_id": "1", "args": ["x" * 10_000], "result": "y" * 10_000}])
    with CaptureQueriesContext(database.connection()) as queries:
        response = admin_client.get(run_page(run))
    assert "x" * 100 not in response.text
    table = database.connection().ops.quote_name("everystep_step")
    step_queries = [q["sql"] for q in queries.captured_queries if f"FROM {table}" in q["sql"]]
    assert step_queries
    for column in ("args", "kwargs", "result", "error"):
        selected = f"{table}.{database.connection().ops.quote_name(column)}"
        assert not any(selected in sql for sql in step_queries)


def test_the_page_costs_the_same_queries_for_one_step_or_many(admin_client, make_run):
    def queries_for(run):
        admin_client.get(run_page(run))
        with CaptureQueriesContext(database.connection()) as queries:
            admin_client.get(run_page(run))
        return len(queries.captured_queries)

    one = make_run(status="running", steps=[{"step_id": "1"}])
    many = make_run(
        status="running",
        steps=[{"step_id": f"{i}.{b}.1"} for i in range(1, 30) for b in range(2)],
    )
    assert queries_for(many) == queries_for(one)


def test_each_recorded_step_expands_by_htmx_or_by_link(admin_client, make_run):
    run = make_run(steps=[{"step_id": "1"}])
    step = run.steps.get()
    url = f"/admin/everystep/workflow/{run.pk}/run/steps/{step.pk}/"
    html = admin_client.get(run_page(run)).text
    assert f'hx-get="{url}" hx-trigger="toggle once"' in html
    assert f'<a href="{url}">' in html


def test_a_run_without_steps_says_so(admin_client, make_run):
    assert "No step recorded yet." in admin_client.get(run_page(make_run())).text


# Live updates


@pytest.mark.parametrize("status", ["scheduled", "running"])
def test_a_live_run_polls_its_status_and_tree(admin_client, make_run, status):
    run = make_run(status=status)
    html = admin_client.get(run_page(run)).text
    assert f'hx-get="{run_page(run)}" hx-trigger="every 2s" hx-swap="outerHTML"' in html

    poll = admin_client.get(run_page(run), **HTMX)
    assert poll.status_code == 200
    assert poll.text.lstrip().startswith('<div id="es-run-live"')
    assert "<html" not in poll.text and "Arguments" not in poll.text
    assert 'hx-trigger="every 2s"' in poll.text


@pytest.mark.parametrize("status", ["completed", "failed", "stopped", "blocked"])
def test_polling_stops_once_the_run_is_terminal(admin_client, make_run, status):
    run = make_run(status=status)
    assert "hx-trigger" not in admin_client.get(run_page(run)).text.split("es-run-live")[1][:200]
    poll = admin_client.get(run_page(run), **HTMX)
    assert poll.status_code == 286
    assert f'<span class="es-badge es-status-{status}">' in poll.text
    assert 'hx-trigger="every 2s"' not in poll.text


def test_a_waiting_run_keeps_polling_less_often_and_goes_on_when_it_runs_again(admin_client, make_run):
    # A wait ends (a sleep's time, an event) and the run runs on: an open page
    # that stopped polling when the run began to wait would show it waiting.
    run = make_run(status="running", claimed_by="worker-1")
    run.status, run.claimed_by = "waiting", None
    run.save(update_fields=["status", "claimed_by"])
    assert 'hx-trigger="every 15s"' in admin_client.get(run_page(run)).text
    poll = admin_client.get(run_page(run), **HTMX)
    assert poll.status_code == 200 and 'hx-trigger="every 15s"' in poll.text

    run.status, run.claimed_by = "running", "worker-2"
    run.save(update_fields=["status", "claimed_by"])
    poll = admin_client.get(run_page(run), **HTMX)
    assert poll.status_code == 200 and 'hx-trigger="every 2s"' in poll.text


# Intended structure


@pytest.fixture
def registered_checkout(monkeypatch):
    def checkout(order_id):  # the body is what the (fake) analysis reads
        pass

    spec = registry.Spec(name=CHECKOUT, func=checkout, kind="workflow")
    monkeypatch.setitem(registry._workflows, CHECKOUT, spec)
    return checkout


def fake_graph(monkeypatch, *, step_ids=(), reason=None):
    analysed = []

    def intended_steps(func):
        analysed.append(func)
        return types.SimpleNamespace(step_ids=list(step_ids), reason=reason)

    module = types.ModuleType("everystep.graph")
    module.intended_steps = intended_steps
    monkeypatch.setitem(sys.modules, "everystep.graph", module)
    return analysed


def test_steps_not_run_yet_show_as_pending(admin_client, make_run, registered_checkout, monkeypatch):
    analysed = fake_graph(
        monkeypatch,
        step_ids=[
            ("1", "shop.steps.reserve"),
            ("2.0.1", "shop.steps.charge"),
            ("2.1.1", "shop.steps.email"),
            ("3", "shop.steps.ship"),
        ],
    )
    run = make_run(status="running", steps=[{"step_id": "1", "name": "shop.steps.reserve"}])
    response = admin_client.get(run_page(run))
    assert analysed == [registered_checkout]
    assert tree_paths(response) == ["1", "2", "2.0", "2.0.1", "2.1", "2.1.1", "3"]
    html = response.text
    assert html.count('<span class="es-badge es-status-pending">pending</span>') == 3
    assert "shop.steps.ship" in html
    assert "Only recorded steps are shown" not in html


def test_the_fallback_reason_is_shown(admin_client, make_run, registered_checkout, monkeypatch):
    fake_graph(monkeypatch, reason="the body has a for loop at line 12")
    run = make_run(status="running", steps=[{"step_id": "1"}])
    html = admin_client.get(run_page(run)).text
    assert "Only recorded steps are shown" in html
    assert "the body has a for loop at line 12" in html
    assert "es-status-pending" not in html


def test_an_unregistered_workflow_falls_back_to_recorded_steps(admin_client, make_run, monkeypatch):
    fake_graph(monkeypatch, step_ids=[("1", "x.y")])
    run = make_run(name="gone.module.old_flow", status="failed", steps=[{"step_id": "1"}])
    html = admin_client.get(run_page(run)).text
    assert "no workflow named gone.module.old_flow is registered in this process" in html


def test_a_broken_analysis_does_not_break_the_page(admin_client, make_run, registered_checkout, monkeypatch):
    module = types.ModuleType("everystep.graph")

    def intended_steps(func):
        raise RuntimeError("boom")

    module.intended_steps = intended_steps
    monkeypatch.setitem(sys.modules, "everystep.graph", module)
    response = admin_client.get(run_page(make_run(status="running")))
    assert response.status_code == 200
    assert "the analysis failed (RuntimeError: boom)" in response.text


def test_a_completed_run_is_not_analysed(admin_client, make_run, registered_checkout, monkeypatch):
    analysed = fake_graph(monkeypatch, step_ids=[("1", "a"), ("2", "b")])
    run = make_run(status="completed", steps=[{"step_id": "1"}])
    html = admin_client.get(run_page(run)).text
    assert analysed == []
    assert "es-status-pending" not in html


def test_the_real_analysis_adds_pending_steps(admin_client, make_run):
    pytest.importorskip("everystep.graph")
    from . import sample_workflows as flows

    run = make_run(
        name=f"{flows.__name__}.checkout",
        status="running",
        steps=[{"step_id": "1", "name": f"{flows.__name__}.reserve"}],
    )
    response = admin_client.get(run_page(run))
    assert tree_paths(response) == ["1", "2", "2.0", "2.0.1", "2.1", "2.1.1", "3"]
    assert response.text.count("es-status-pending") == 3
    assert f"{flows.__name__}.ship" in response.text


def test_the_real_analysis_explains_a_loop(admin_client, make_run):
    pytest.importorskip("everystep.graph")
    from . import sample_workflows as flows

    run = make_run(name=f"{flows.__name__}.ship_each", status="running")
    html = admin_client.get(run_page(run)).text
    assert "Only recorded steps are shown" in html
    assert "a for loop" in html
    assert "es-status-pending" not in html


# The steps running now (from the claimer's heartbeat)


def heartbeat(name, *, executing, seconds_ago=0.0):
    """The heartbeat row of worker ``name``, as it wrote it ``seconds_ago``."""
    from django.db.models.functions import Now

    from everystep import heartbeats
    from everystep.models import Heartbeat

    heartbeats.beat(
        name, hostname="host-a", pid=7, version="0.1.0", pool_size=4, started_at=timezone.now(),
        in_flight=len(executing), executing=executing,
    )
    Heartbeat.objects.filter(name=name).update(last_seen=Now() - dt.timedelta(seconds=seconds_ago))


def executing_paths(html) -> list[str]:
    badge = '<span class="es-badge es-status-executing">running now</span>'
    return re.findall(rf'<code class="es-path">([^<]+)</code> {badge}', html)


def test_the_steps_running_now_are_marked_one_per_branch(admin_client, make_run):
    pytest.importorskip("everystep.graph")
    from . import sample_workflows as flows

    run = make_run(
        name=f"{flows.__name__}.checkout",
        status="running",
        claimed_by="worker-a",
        steps=[{"step_id": "1", "name": f"{flows.__name__}.reserve"}],
    )
    heartbeat("worker-a", executing={str(run.pk): ["2.0.1", "2.1.1"]}, seconds_ago=30)
    html = admin_client.get(run_page(run)).text
    assert executing_paths(html) == ["2.0.1", "2.1.1"]
    assert html.count("es-status-pending") == 1  # step 3 runs later
    assert "Running now: <code>2.0.1</code>, <code>2.1.1</code>" in html
    reported = re.search(r"as worker <code>worker-a</code> reported (\d+) s ago \(it reports every 5 s", html)
    assert reported and 30 <= int(reported[1]) < 35
    # The live refresh carries the mark.
    poll = admin_client.get(run_page(run), **HTMX)
    assert poll.status_code == 200 and executing_paths(poll.text) == ["2.0.1", "2.1.1"]


def test_a_step_recorded_since_the_report_is_not_marked(admin_client, make_run):
    run = make_run(status="running", claimed_by="worker-a", steps=[{"step_id": "1"}])
    heartbeat("worker-a", executing={str(run.pk): ["1"]})
    html = admin_client.get(run_page(run)).text
    assert executing_paths(html) == []
    assert "es-status-done" in html


def test_only_the_report_of_the_runs_claimer_about_this_run_counts(admin_client, make_run):
    run = make_run(status="running", claimed_by="worker-a")
    other = make_run(status="running", claimed_by="worker-b")
    heartbeat("worker-a", executing={str(other.pk): ["1"]})
    heartbeat("worker-b", executing={str(run.pk): ["1"], str(other.pk): ["1"]})
    assert executing_paths(admin_client.get(run_page(run)).text) == []
    assert executing_paths(admin_client.get(run_page(other)).text) == ["1"]


def test_a_stale_claimer_marks_nothing_and_the_page_says_so(admin_client, make_run):
    run = make_run(status="running", claimed_by="worker-a")
    heartbeat("worker-a", executing={str(run.pk): ["1"]}, seconds_ago=90)
    html = admin_client.get(run_page(run)).text
    assert executing_paths(html) == []
    silent = r"Worker <code>worker-a</code> has written no heartbeat for 1 min 3\d s: it is dead or paused"
    assert re.search(silent, html)


def test_a_claimer_without_a_heartbeat_shows_no_mark_and_no_note(admin_client, make_run):
    run = make_run(status="running", claimed_by="old-worker")
    html = admin_client.get(run_page(run)).text
    assert executing_paths(html) == [] and "es-claimer-heartbeat" not in html


@pytest.mark.parametrize("status", ["completed", "failed", "stopped", "blocked", "scheduled"])
def test_a_run_that_is_not_running_marks_nothing(admin_client, make_run, status):
    run = make_run(status=status, claimed_by="worker-a")
    heartbeat("worker-a", executing={str(run.pk): ["1"]})
    response = admin_client.get(run_page(run), **HTMX)
    assert executing_paths(response.text) == [] and "es-claimer-heartbeat" not in response.text
    assert response.status_code == (200 if status == "scheduled" else 286)  # polling stops at the end


def test_reported_step_ids_are_escaped(admin_client, make_run):
    run = make_run(status="running", claimed_by="worker-a")
    heartbeat("worker-a", executing={str(run.pk): [SCRIPT]})
    html = admin_client.get(run_page(run)).text
    assert SCRIPT not in html and "&lt;script&gt;" in html


@pytest.mark.parametrize("executing", [["RUN"], {"RUN": 1}, {"RUN": ["1", 2]}, "text"])
def test_a_heartbeat_of_another_shape_breaks_no_page(admin_client, make_run, executing):
    # This version's worker writes {run id: [step ids]}; a row written by
    # anything else must not take the page of every run of that worker down.
    run = make_run(status="running", claimed_by="worker-a", steps=[{"step_id": "1"}])
    heartbeat("worker-a", executing=json.loads(json.dumps(executing).replace("RUN", str(run.pk))))
    page, poll = admin_client.get(run_page(run)), admin_client.get(run_page(run), **HTMX)
    assert (page.status_code, poll.status_code) == (200, 200)
    assert "es-claimer-heartbeat" in poll.text


def test_a_heartbeat_interval_of_any_real_type_the_checks_accept_is_shown(admin_client, make_run, settings):
    settings.EVERYSTEP_HEARTBEAT_INTERVAL = fractions.Fraction(1, 2)  # not formattable with :g
    settings.EVERYSTEP_RECOVER_STALE_AFTER = None
    run = make_run(status="running", claimed_by="worker-a")
    heartbeat("worker-a", executing={str(run.pk): []})
    assert "(it reports every 0.5 s;" in admin_client.get(run_page(run)).text


def test_an_error_nested_as_deep_as_json_can_read_still_opens_the_page(admin_client, make_run):
    # display.stored_error reads the payload, then writes its args out again one
    # level deeper: somewhere below the recursion limit a depth can be read and
    # not written. Every depth around it opens, shown raw when not decodable.
    if database.connection().vendor == "mysql":
        pytest.skip("MariaDB's JSON_VALID check refuses JSON nested this deep: no such row can exist")
    failing = []
    for depth in range(sys.getrecursionlimit() - 200, sys.getrecursionlimit() + 1):
        run = make_run(status=Workflow.Status.FAILED)
        nested = "[" * depth + "]" * depth
        store_raw_error(run, '{"type": "builtins.ValueError", "message": "deep", "args": ' + nested + "}")
        status = admin_client.get(run_page(run)).status_code
        if status != 200:
            failing.append((depth, status))
    assert failing == []


def store_raw_error(run, text):
    """Store ``text`` as the run's error as it is: the ORM's field would go through serde."""
    connection = database.connection()  # everystep's database, also when it is not default's
    value = run.pk.hex if connection.vendor in ("sqlite", "mysql") else str(run.pk)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE everystep_workflow SET error = %s WHERE id = %s", [text, value])
