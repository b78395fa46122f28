"""Send event and child runs clicked in a real headless Chromium, with an
embedded worker running the runs against the same test database."""

import json

import pytest
from django.contrib.admin.models import LogEntry

from everystep import schedule
from everystep.models import Workflow
from tests.core import child_workflows as cw
from tests.waits import workflows as waiting
from tests.worker.support import wait_for

from .conftest import off_the_browser_loop
from .test_e2e_actions import browser, run_page, start_worker, status_of, wait_for_badge  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_send_an_event_to_a_waiting_run_and_watch_it_complete(browser, start_worker):  # noqa: F811
    start_worker()
    run = off_the_browser_loop(lambda: schedule(waiting.awaits, "approval"))
    wait_for(lambda: status_of(run) == "waiting", what="the run to wait for its event")

    browser.open(run_page(run))
    assert "event approval" in browser.locator("#es-run-live .es-waiting-for").inner_text()
    browser.click(".es-action-send_event")
    panel = browser.locator("#es-action-panel .es-confirm-send_event")
    panel.wait_for()
    assert panel.locator("input[name=key]").input_value() == "approval"  # the awaited key

    panel.locator("textarea[name=value]").fill("{not json")
    panel.locator("input[type=submit]").click()
    errors = browser.locator("#es-action-panel .es-field-value .errorlist")
    errors.filter(has_text="Not valid JSON").wait_for()
    assert status_of(run) == "waiting"

    browser.locator("#es-action-panel textarea[name=value]").fill('{"by": "ann"}')
    browser.locator("#es-action-panel input[type=submit]").click()
    browser.locator(".messagelist .success").filter(has_text="waiting -> scheduled").wait_for()
    wait_for_badge(browser, "completed")
    done = off_the_browser_loop(lambda: Workflow.objects.get(pk=run.pk))
    assert done.result == {"by": "ann"}
    entries = off_the_browser_loop(lambda: list(LogEntry.objects.values_list("change_message", flat=True)))
    value = json.dumps({"by": "ann"})
    assert entries == [f"Sent event 'approval' with the value {value}: waiting -> scheduled."]


def test_a_parent_page_links_its_child_and_the_child_links_back(browser, start_worker):  # noqa: F811
    start_worker()
    parent = off_the_browser_loop(lambda: schedule(cw.parent_of, "ok", "p"))
    wait_for(lambda: status_of(parent) == "completed", what="the parent to get its child's result")

    browser.open(run_page(parent))
    children = browser.locator(".es-children")
    assert "tests.core.child_workflows.child_of" in children.inner_text()
    assert "completed" in children.inner_text()
    children.locator("a").first.click()
    browser.locator(".es-parent").wait_for()
    assert "at step 1" in browser.locator(".es-parent").inner_text()
    browser.locator(".es-parent a").click()
    browser.wait_for_url(f"**{run_page(parent)}")
