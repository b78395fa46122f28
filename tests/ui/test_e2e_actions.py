"""Retry, Stop and Resolve clicked in a real headless Chromium, with an embedded
worker running the runs against the same test database. (The screenshots in
docs/images/ come from ./scripts/screenshots, which drives the demo itself.)
"""

import datetime as dt
import random
import threading
import time

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.utils import timezone

from everystep import operations, runner, schedule
from everystep.errors import SimulatedCrash
from everystep.models import Step, Workflow
from everystep.worker import Worker
from tests.helpers import claim, run_once
from tests.worker.support import wait_for

from . import control_workflows as flows
from .conftest import CHROMIUM, CHROMIUM_ARGS, off_the_browser_loop

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def start_worker():
    """Start an embedded worker on a thread; it is stopped at the end of the test."""
    started = []

    def start() -> Worker:
        worker = Worker(install_signals=False, poll=0.1, name="e2e-worker", drain=5, pool_size=2)
        worker.thread = threading.Thread(target=worker.run, name="e2e-worker")
        worker.thread.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        stop(worker)


def stop(worker):
    worker.stop()
    worker.thread.join(30)
    assert not worker.thread.is_alive(), "the embedded worker did not stop"


@pytest.fixture
def browser(sync_playwright, live_server):
    """A logged-in superuser's page on the live server; ``page.open(path)`` goes there.
    While it is open, ORM calls go through ``off_the_browser_loop``."""
    User.objects.create_superuser("root", "root@example.com", "pw")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = chromium.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{live_server.url}/admin/login/")
            page.fill("#id_username", "root")
            page.fill("#id_password", "pw")
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/")

            def open_page(path):
                page.goto(f"{live_server.url}{path}")
                page.wait_for_function("() => window.htmx !== undefined")

            page.open = open_page
            yield page
        finally:
            chromium.close()


def run_page(run):
    return f"/admin/everystep/workflow/{run.pk}/run/"


def status_of(run):
    return off_the_browser_loop(lambda: Workflow.objects.get(pk=run.pk).status)


def wait_for_badge(page, status, timeout=20_000):
    page.locator("#es-run-live .es-badge").first.filter(has_text=status).wait_for(timeout=timeout)


def test_retry_a_failed_run_and_watch_it_complete(browser, start_worker):
    start_worker()
    run = off_the_browser_loop(lambda: schedule(flows.inventory_sync, "order-1"))
    wait_for(lambda: status_of(run) == "failed", what="the first attempt to fail")

    browser.open(run_page(run))
    browser.click(".es-action-retry")
    panel = browser.locator("#es-action-panel .es-confirm-retry")
    panel.wait_for()
    discarded = panel.locator("table.es-discarded").inner_text()
    assert "flaky_sync" in discarded and "failed" in discarded
    panel.locator("input[type=submit]").click()

    # The browser is sent back to the run page, which polls until the worker is done.
    browser.locator(".messagelist .success").filter(has_text="Retried: failed -> scheduled").wait_for()
    wait_for_badge(browser, "completed")
    assert '"notified order-1"' in browser.locator("#es-run-live").inner_text()
    entries = off_the_browser_loop(lambda: list(LogEntry.objects.values_list("change_message", flat=True)))
    flaky = "tests.ui.control_workflows.flaky_sync"
    assert entries == [f"Retried: failed -> scheduled; discarded 1 step row: 2 {flaky} (failed)."]


def test_stop_a_running_run_and_the_worker_stops_at_the_next_step_boundary(browser, start_worker):
    flows.events.clear()
    start_worker()
    run = off_the_browser_loop(lambda: schedule(flows.slow_steps, 30))
    wait_for(lambda: flows.events, what="the first step to start")

    browser.open(run_page(run))
    browser.click(".es-action-stop")
    panel = browser.locator("#es-action-panel .es-confirm-stop")
    panel.wait_for()
    panel.locator("input[type=submit]").click()
    wait_for_badge(browser, "stopped", timeout=5_000)

    # Let the worker finish the step it was executing, and then some.
    def settled():
        starts = sum(1 for event in flows.events if event[0] == "start")
        ends = sum(1 for event in flows.events if event[0] == "end")
        return starts == ends and time.time() - flows.events[-1][2] > 3 * flows.PACE

    wait_for(settled, what="the worker to leave the run")
    stopped = off_the_browser_loop(lambda: Workflow.objects.get(pk=run.pk))
    assert stopped.status == "stopped"
    assert "stopped by an operator (root)" in stopped.error["message"]
    stopped_at = stopped.completed_at.timestamp()
    started_after = [n for kind, n, at in flows.events if kind == "start" and at > stopped_at]
    assert len(started_after) <= 1, f"steps {started_after} started after the stop"
    recorded = off_the_browser_loop(
        lambda: list(Step.objects.filter(workflow=run).values_list("args", flat=True))
    )
    started_before = {n for kind, n, at in flows.events if kind == "start" and at <= stopped_at}
    assert {args[0] for args in recorded} <= started_before, "a step that began after the stop was recorded"
    assert len(recorded) < 30


def test_the_steps_running_now_are_marked_live(browser):
    """Each parallel branch's step is marked while it runs; the mark follows the
    worker's heartbeat, leaves a step once it is recorded, and the page stops
    polling when the run ends."""
    flows.gates.clear()
    worker = Worker(install_signals=False, poll=0.1, name="e2e-beating", drain=5, heartbeat_interval=0.2)
    worker.thread = threading.Thread(target=worker.run, name="e2e-beating")
    worker.thread.start()
    try:
        run = off_the_browser_loop(lambda: schedule(flows.gated_pair, "order-5"))
        browser.open(run_page(run))
        running_now = browser.locator("#es-run-live .es-status-executing")
        branch = "#es-run-live li.es-node:has(> .es-node-line > code.es-path:text-is('{}')) .es-badge"
        browser.locator(branch.format("2.0.1")).filter(has_text="running now").wait_for()
        browser.locator(branch.format("2.1.1")).filter(has_text="running now").wait_for()
        assert running_now.count() == 2
        assert browser.locator(branch.format("3")).inner_text() == "pending"

        flows.gates["a"].set()
        browser.locator(branch.format("2.0.1")).filter(has_text="done").wait_for()
        assert browser.locator(branch.format("2.1.1")).inner_text() == "running now"

        flows.gates["b"].set()
        wait_for_badge(browser, "completed")
        assert running_now.count() == 0
        # The final answer (286) replaced the polling block by one without a trigger.
        assert browser.locator("#es-run-live").get_attribute("hx-trigger") is None
    finally:
        for gate in flows.gates.values():
            gate.set()
        stop(worker)


def blocked_checkout(key):
    """A checkout whose worker 'died' right after the charge, replayed into ``blocked``."""
    run = schedule(flows.checkout, key, 1999)

    def crash(ctx, step_id):
        if step_id == "1":
            raise SimulatedCrash("the test pulls the plug after the charge")

    runner.fault = crash
    try:
        runner.execute(claim(run, "crashed-worker"), "crashed-worker")
    finally:
        runner.fault = None
    operations.release_run(run.pk, "crashed-worker")
    assert run_once(run).status == "blocked"
    return run


def test_resolve_a_blocked_run_through_the_form(browser, start_worker):
    run = off_the_browser_loop(lambda: blocked_checkout("order-3"))
    start_worker()

    browser.open(run_page(run))
    browser.click(".es-action-resolve")
    panel = browser.locator("#es-action-panel .es-confirm-resolve")
    panel.wait_for()
    panel.locator("input[name=resolution][value=result]").check()
    panel.locator("textarea[name=result]").fill("{charged: 1999}")
    panel.locator("input[type=submit]").click()
    # Invalid JSON comes back inline, in the panel; nothing changed.
    error = browser.locator("#es-action-panel .es-field-result .errorlist")
    error.filter(has_text="Not valid JSON").wait_for()
    assert status_of(run) == "blocked"

    browser.locator("#es-action-panel textarea[name=result]").fill('{"charged": 1999}')
    browser.locator("#es-action-panel input[type=submit]").click()
    browser.locator(".messagelist .success").filter(has_text="Resolved step 1").wait_for()
    wait_for_badge(browser, "completed")
    charge = off_the_browser_loop(lambda: Step.objects.get(workflow=run, step_id="1"))
    assert (charge.status, charge.result) == ("done", {"charged": 1999})
    assert '"receipt for order-3"' in browser.locator("#es-run-live").inner_text()


def test_a_demo_run_page_and_the_overview(browser, start_worker):
    """The pages as the demo shows them."""
    from demo_project.demo import workflows as demo

    worker = start_worker()
    run = off_the_browser_loop(lambda: schedule(demo.fan_out, 7))
    wait_for(lambda: status_of(run) == "completed", what="the demo run")

    browser.open(run_page(run))
    paths = browser.locator("code.es-path").all_inner_texts()
    assert paths == ["1", "fulfil", "fulfil.0", "fulfil.0.1", "fulfil.1", "fulfil.1.1", "fulfil.1.2"]
    pack_pk = off_the_browser_loop(lambda: Step.objects.get(workflow=run, step_id="fulfil.1.1").pk)
    pack = browser.locator(f"#es-step-{pack_pk}")
    pack.locator("summary").click()
    pack.locator(".es-step-payloads").wait_for()
    assert '"packed 7"' in pack.inner_text()

    stop(worker)  # it would claim the waiting runs below
    off_the_browser_loop(busy_hour)
    browser.open("/admin/everystep/workflow/overview/")
    assert browser.locator('[data-status="blocked"]').inner_text() == "1"
    assert browser.locator("svg.es-chart rect.es-chart-failed").count() > 0
    assert "worker-a@host-1" in browser.locator(".es-runners").inner_text()


def busy_hour():
    """An hour of runs ending, a few running on two workers, one blocked, some waiting."""
    rng = random.Random(3)
    now = timezone.now()
    runs = []
    for minute in range(60):
        for _ in range(rng.randint(2, 9)):
            end = now - dt.timedelta(minutes=minute, seconds=rng.randint(0, 59))
            status = "failed" if rng.random() < 0.12 else "completed"
            runs.append(
                Workflow(
                    name="demo_project.demo.workflows.sequential_order",
                    status=status,
                    created_at=end - dt.timedelta(seconds=rng.randint(1, 30)),
                    completed_at=end,
                )
            )
    for claimer in ["worker-a@host-1"] * 3 + ["worker-b@host-2"] * 2:
        runs.append(
            Workflow(name="demo_project.demo.workflows.fan_out", status="running", claimed_by=claimer)
        )
    runs.append(Workflow(name="demo_project.demo.workflows.checkout_with_cleanup", status="blocked"))
    for seconds in (95, 40, 3):
        runs.append(
            Workflow(
                name="demo_project.demo.workflows.inventory_sync",
                created_at=now - dt.timedelta(seconds=seconds),
            )
        )
    Workflow.objects.bulk_create(runs)
