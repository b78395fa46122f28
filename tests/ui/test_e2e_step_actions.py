"""Re-run from a step and Fork from a step, clicked in a real headless Chromium,
with an embedded worker running the runs against the same test database."""

from collections import Counter

import pytest
from django.contrib.admin.models import LogEntry

from everystep import schedule
from everystep.models import RunFork, Step, Workflow
from tests.worker.support import wait_for

from . import step_action_workflows as flows
from .conftest import off_the_browser_loop
from .test_e2e_actions import browser, run_page, start_worker, status_of, wait_for_badge  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def completed_order(start_worker, order):  # noqa: F811  (the fixture, passed in)
    flows.counts.clear()
    start_worker()
    run = off_the_browser_loop(lambda: schedule(flows.order_flow, order))
    wait_for(lambda: status_of(run) == "completed", what="the order to complete")
    assert flows.counts == Counter(["pick", "charge_card", "pack", "ship"])
    return run


def open_step(page, run, step_id):
    """Expand a recorded step in the run page's tree; returns its panel."""
    pk = off_the_browser_loop(lambda: Step.objects.get(workflow=run, step_id=step_id).pk)
    panel = page.locator(f"#es-step-{pk}")
    panel.locator("summary").click()
    panel.locator(".es-step-payloads").wait_for()
    return panel


def test_rerun_from_the_first_step_confirming_the_unsafe_charge(browser, start_worker):  # noqa: F811
    run = completed_order(start_worker, "order-11")
    browser.open(run_page(run))
    hint = "Re-run from here, Fork from here: open a recorded step below."
    assert hint in browser.inner_text("#es-run-live")
    open_step(browser, run, "1").locator(".es-action-rerun").click()

    confirm = browser.locator("#es-action-panel .es-confirm-rerun")
    confirm.wait_for()
    discarded = confirm.locator("table.es-cut tbody tr").all_inner_texts()
    assert [row.split("\t")[0] for row in discarded][0] == "1" and len(discarded) == 4
    assert {row.split("\t")[0] for row in discarded} == {"1", "prepare.0.1", "prepare.1.1", "3"}
    warning = confirm.locator(".es-unsafe-warning").inner_text()
    assert "1 unsafe-to-repeat step will run again" in warning and "charge_card" in warning

    # The first confirmation alone is refused inline; nothing changes.
    confirm.locator("input[type=submit]").click()
    browser.locator("#es-action-panel .es-field-confirm_unsafe .errorlist").wait_for()
    assert status_of(run) == "completed"
    assert off_the_browser_loop(lambda: Step.objects.filter(workflow=run).count()) == 4

    browser.locator("#es-action-panel input[name=confirm_unsafe]").check()
    browser.locator("#es-action-panel input[type=submit]").click()
    done = browser.locator(".messagelist .success")
    done.filter(has_text="Re-ran from step 1: completed -> scheduled").wait_for()
    wait_for_badge(browser, "completed")
    assert flows.counts == Counter({"pick": 2, "charge_card": 2, "pack": 2, "ship": 2})
    [entry] = off_the_browser_loop(lambda: list(LogEntry.objects.values_list("change_message", flat=True)))
    assert entry.startswith("Re-ran from step 1: completed -> scheduled; discarded 4 step rows: 1 ")
    assert "charge_card (done, unsafe to repeat)" in entry


def test_fork_from_the_last_step_and_follow_the_links(browser, start_worker):  # noqa: F811
    run = completed_order(start_worker, "order-12")
    browser.open(run_page(run))
    open_step(browser, run, "3").locator(".es-action-fork").click()
    confirm = browser.locator("#es-action-panel .es-confirm-fork")
    confirm.wait_for()
    assert "3 step rows recorded before this step" in confirm.inner_text()
    assert confirm.locator("table.es-cut tbody tr").all_inner_texts()[0].split("\t")[:2] == [
        "3", "tests.ui.step_action_workflows.ship",
    ]
    assert confirm.locator(".es-unsafe-warning").count() == 0
    confirm.locator("input[type=submit]").click()

    # The browser lands on the fork's page, which the worker finishes.
    browser.locator(".es-forked-from").wait_for()
    fork = off_the_browser_loop(lambda: RunFork.objects.get(origin=run).run)
    assert browser.url.endswith(run_page(fork))
    wait_for_badge(browser, "completed")
    assert flows.counts == Counter({"pick": 1, "charge_card": 1, "pack": 1, "ship": 2})
    assert "at step 3" in browser.inner_text(".es-forked-from")

    browser.click(".es-forked-from a")
    browser.wait_for_url(f"**{run_page(run)}")
    forks = browser.locator(".es-forks")
    assert "from step 3" in forks.inner_text() and "completed" in forks.inner_text()
    forks.locator("a").click()
    browser.wait_for_url(f"**{run_page(fork)}")
    assert off_the_browser_loop(lambda: Workflow.objects.get(pk=fork.pk).result) == "shipped order-12"
