"""The run page in a real headless Chromium: log in, expand a step, watch the run finish.

Needs Debian's /usr/bin/chromium (never ``playwright install``). Without it the
test skips, unless EVERYSTEP_REQUIRE_BROWSER=1 makes a missing browser a failure.
(The screenshots in docs/ are taken from demo runs by test_e2e_actions.py.)
"""

import datetime as dt
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from everystep.models import Step, Workflow

from .conftest import CHROMIUM, CHROMIUM_ARGS, off_the_browser_loop

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def make_checkout_run() -> Workflow:
    started = timezone.now() - dt.timedelta(seconds=12)
    run = Workflow.objects.create(
        name="shop.workflows.checkout",
        status=Workflow.Status.RUNNING,
        claimed_by="worker-1@host-a",
        idempotency_key="order-42",
        args=[{"order_id": 42, "customer": "ada@example.com"}],
        created_at=started,
    )
    steps = [
        ("1", "shop.steps.reserve_stock", [42], {"receipt": "res-7"}),
        ("2.0.1", "shop.steps.charge_card", [42, 1999], {"charge": "ch_1Nx"}),
        ("2.1.1", "shop.steps.email_receipt", ["ada@example.com"], None),
    ]
    for step_id, name, args, result in steps:
        Step.objects.create(
            workflow=run,
            step_id=step_id,
            name=name,
            args=args,
            kwargs={"currency": "EUR"} if step_id == "2.0.1" else {},
            status=Step.Status.DONE,
            result=result,
        )
    return run


def test_run_page_in_a_browser(live_server, sync_playwright):
    User.objects.create_superuser("root", "root@example.com", "pw")
    run = make_checkout_run()
    charge = Step.objects.get(workflow=run, step_id="2.0.1")
    run_url = f"/admin/everystep/workflow/{run.pk}/run/"
    server = urlsplit(live_server.url).netloc
    other_hosts = []

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on(
                "request",
                lambda request: urlsplit(request.url).netloc == server or other_hosts.append(request.url),
            )
            page.goto(f"{live_server.url}/admin/login/?next={run_url}")
            page.fill("#id_username", "root")
            page.fill("#id_password", "pw")
            page.click("input[type=submit]")
            page.wait_for_url(f"**{run_url}")
            page.wait_for_function("() => window.htmx !== undefined")

            # Expanding a step loads its payloads by htmx.
            panel = page.locator(f"#es-step-{charge.pk}")
            panel.locator("summary").click()
            payload = panel.locator(".es-step-payloads")
            payload.wait_for()
            text = payload.inner_text()
            assert "shop.steps.charge_card" in text
            assert '"charge": "ch_1Nx"' in text
            assert '"currency": "EUR"' in text

            # The live block polls; once the run is terminal polling stops and
            # the opened panel survives the swap.
            off_the_browser_loop(
                lambda: Workflow.objects.filter(pk=run.pk).update(
                    status=Workflow.Status.COMPLETED,
                    completed_at=timezone.now(),
                    result={"order_id": 42, "state": "paid"},
                )
            )
            badge = page.locator("#es-run-live .es-badge").first
            badge.filter(has_text="completed").wait_for(timeout=10_000)
            assert page.locator("#es-run-live[hx-trigger]").count() == 0
            assert '"state": "paid"' in page.locator("#es-run-live").inner_text()
            assert payload.is_visible()
        finally:
            browser.close()

    assert other_hosts == [], "the page must not reach any other host"
