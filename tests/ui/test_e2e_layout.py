"""The run list's columns fit a laptop screen in a real headless Chromium.

Needs Debian's /usr/bin/chromium (never ``playwright install``); skips without
it, unless EVERYSTEP_REQUIRE_BROWSER=1.
"""

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from everystep.models import Step, Workflow

from .conftest import CHROMIUM, CHROMIUM_ARGS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Names as long as real projects have them.
NAMES = [
    "demo_project.demo.workflows.checkout_with_cleanup",
    "billing.workflows.charge_invoice_and_notify_customer",
    "shop.workflows.fulfil_order",
]


def make_runs():
    now = timezone.now()
    for i, status in enumerate(["completed", "failed", "running", "blocked", "scheduled", "stopped"] * 3):
        created = now - dt.timedelta(hours=i, minutes=7 * i)
        claimer = f"demo-embedded-worker-{i % 3}@web-host-{i}.example.com"
        run = Workflow.objects.create(
            name=NAMES[i % len(NAMES)],
            status=status,
            claimed_by=None if status == "scheduled" else claimer,
            idempotency_key=f"order-{1000 + i}",
            created_at=created,
            completed_at=created + dt.timedelta(minutes=i, seconds=13) if status != "running" else None,
        )
        Step.objects.bulk_create(
            Step(workflow=run, step_id=str(n), name="shop.steps.reserve", status="done") for n in range(1, 12)
        )


@pytest.mark.parametrize("width", [1280, 1366, 1400])
def test_every_column_of_the_run_list_is_visible_with_the_filters_open(live_server, sync_playwright, width):
    User.objects.create_superuser("root", "root@example.com", "pw")
    make_runs()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(f"{live_server.url}/admin/login/?next=/admin/everystep/workflow/")
            page.fill("#id_username", "root")
            page.fill("#id_password", "pw")
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/everystep/workflow/")
            assert page.locator("#changelist-filter").is_visible()
            filters_left = page.locator("#changelist-filter").bounding_box()["x"]
            results = page.locator("#changelist .results")
            # Nothing scrolls sideways inside the list: every column is on screen.
            assert results.evaluate("e => e.scrollWidth <= e.clientWidth"), "the list scrolls sideways"
            visible_right = min(width, filters_left, box_right(results))
            for column in ("short_id", "workflow", "status_badge", "claimer", "created", "completed",
                           "duration", "steps_recorded"):
                header = page.locator(f"#result_list thead th.column-{column}")
                assert box_right(header) <= visible_right, f"the {column} column is cut off at {width} px"
                for cell in page.locator(f"#result_list tbody td.field-{column}").all():
                    assert box_right(cell) <= visible_right, f"a {column} cell is cut off at {width} px"
        finally:
            browser.close()


def box_right(locator) -> float:
    box = locator.bounding_box()
    return box["x"] + box["width"]
