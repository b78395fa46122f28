"""Runs and users for the UI tests (rows are inserted with the ORM, as a worker
would leave them), and the headless browser of the end-to-end tests."""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connections
from django.test import Client

from everystep import registry
from everystep.models import Step, Workflow

from . import control_workflows as flows

CHECKOUT = "shop.workflows.checkout"
FETCH = registry.qualified_name(flows.fetch)
FLAKY = registry.qualified_name(flows.flaky_sync)
CHARGE = registry.qualified_name(flows.charge)
UNCERTAIN = {"type": "everystep.errors.EffectUncertain", "message": "step 1 uncertain", "args": []}


@pytest.fixture
def make_run(db):
    """``make_run(status=..., steps=[{"step_id": "1", ...}], **workflow_fields)``."""

    def make(*, name=CHECKOUT, status=Workflow.Status.SCHEDULED, steps=(), **fields):
        run = Workflow.objects.create(name=name, status=status, **fields)
        for step in steps:
            Step.objects.create(workflow=run, **{"name": "shop.steps.charge", "status": "done", **step})
        return run

    return make


@pytest.fixture
def run_in(make_run):
    """A run in ``status`` as the engine leaves it there."""

    def make(status, **fields):
        if status == "running":
            fields.setdefault("claimed_by", "worker-1")
        if status == "blocked":
            fields.setdefault("error", UNCERTAIN)
            fields.setdefault("steps", [{"step_id": "1", "name": CHARGE, "status": "started"}])
        if status == "failed":
            fields.setdefault("error", {"type": "builtins.ConnectionError", "message": "timeout", "args": []})
            fields.setdefault(
                "steps",
                [
                    {"step_id": "1", "name": FETCH, "status": "done"},
                    {"step_id": "2", "name": FLAKY, "status": "failed"},
                ],
            )
        return make_run(status=status, **fields)

    return make


def _user(username, *, staff, permissions=()):
    user = User.objects.create_user(username, password="secret", is_staff=staff)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="everystep", codename__in=permissions)
    )
    return user


@pytest.fixture
def viewer_client(client, db):
    """A staff user who may view runs (and so their steps), nothing more."""
    client.force_login(_user("viewer", staff=True, permissions=["view_workflow"]))
    return client


@pytest.fixture
def operator_client(db):
    """``operator_client("retry_workflow", ...)``: a client logged in as a staff user
    who may view runs (and so their steps) and has these permissions."""

    def make(*permissions):
        client = Client()
        name = "operator-" + "-".join(permissions) if permissions else "operator"
        client.force_login(_user(name, staff=True, permissions=["view_workflow", *permissions]))
        return client

    return make


@pytest.fixture
def unpermitted_staff_client(client, db):
    client.force_login(_user("staff", staff=True))
    return client


@pytest.fixture
def non_staff_client(client, db):
    client.force_login(_user("customer", staff=False, permissions=["view_workflow"]))
    return client


HTMX = {"HTTP_HX_REQUEST": "true"}


# The end-to-end tests' browser: Debian's Chromium, driven by Playwright.

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def sync_playwright():
    """Playwright's ``sync_playwright``; skips (or fails with
    EVERYSTEP_REQUIRE_BROWSER=1) without /usr/bin/chromium or playwright."""
    problem = None
    if not os.path.exists(CHROMIUM):
        problem = f"{CHROMIUM} is missing"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        problem = "playwright is not installed"
    if problem:
        if os.environ.get("EVERYSTEP_REQUIRE_BROWSER") == "1":
            pytest.fail(f"EVERYSTEP_REQUIRE_BROWSER=1 but {problem}")
        pytest.skip(f"no browser for the end-to-end test: {problem}")
    return sync_playwright


def off_the_browser_loop(func):
    """Run ORM work on a thread of its own: Playwright's sync API keeps an asyncio
    loop running on the test thread, where Django refuses ORM calls."""

    def work():
        try:
            return func()
        finally:
            connections.close_all()  # else the test database cannot be dropped

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(work).result()
