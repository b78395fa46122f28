"""Runs and users for the UI tests. Rows are inserted with the ORM, as a worker would leave them."""

import pytest
from django.contrib.auth.models import Permission, User

from everystep.models import Step, Workflow

CHECKOUT = "shop.workflows.checkout"


@pytest.fixture
def make_run(db):
    """``make_run(status=..., steps=[{"step_id": "1", ...}], **workflow_fields)``."""

    def make(*, name=CHECKOUT, status=Workflow.Status.SCHEDULED, steps=(), **fields):
        run = Workflow.objects.create(name=name, status=status, **fields)
        for step in steps:
            Step.objects.create(workflow=run, **{"name": "shop.steps.charge", "status": "done", **step})
        return run

    return make


def _user(username, *, staff, permissions=()):
    user = User.objects.create_user(username, password="secret", is_staff=staff)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="everystep", codename__in=permissions)
    )
    return user


@pytest.fixture
def viewer_client(client, db):
    """A staff user who may view runs and steps, nothing more."""
    client.force_login(_user("viewer", staff=True, permissions=["view_workflow", "view_step"]))
    return client


@pytest.fixture
def unpermitted_staff_client(client, db):
    client.force_login(_user("staff", staff=True))
    return client


@pytest.fixture
def non_staff_client(client, db):
    client.force_login(_user("customer", staff=False, permissions=["view_workflow"]))
    return client


HTMX = {"HTTP_HX_REQUEST": "true"}
