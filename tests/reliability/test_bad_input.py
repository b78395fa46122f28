"""Bad input gets a clear error or a 4xx, never a 500, a dead worker or a
half-written run. (Invalid JSON text cannot reach the payload columns: jsonb on
PostgreSQL and JSON_VALID checks on SQLite and MariaDB refuse it.)"""

import pytest
from django.urls import reverse

from everystep import runner
from everystep.models import Step, Workflow
from tests.core import workflows as w
from tests.helpers import CLAIMER, claim, run_workflow

pytestmark = pytest.mark.django_db(transaction=True)

CORRUPT_ERRORS = ["just text", 42, [1, 2], {"type": 5}, {"message": None}, {"type": "os.system",
                  "args": ["rm -rf /"]}, {"type": "builtins.ValueError", "args": {"not": "a list"}}]


def run_page(run):
    return reverse("admin:everystep_workflow_run", args=[run.id])


@pytest.mark.parametrize("error", CORRUPT_ERRORS)
def test_corrupt_stored_error_replays_as_step_failure(error):
    row = run_workflow(w.failing)
    Step.objects.filter(workflow_id=row.id, status="failed").update(error=error)
    Workflow.objects.filter(id=row.id).update(status="running", claimed_by=CLAIMER)
    runner.execute(Workflow.objects.get(id=row.id), CLAIMER)
    row.refresh_from_db()
    assert row.status == "failed"
    assert row.error["type"] == "everystep.errors.StepFailure"


@pytest.mark.parametrize("error", CORRUPT_ERRORS)
def test_corrupt_stored_error_renders(admin_client, error):
    run = Workflow.objects.create(name="gone.workflow", status="failed", error=error, args=[])
    Step.objects.create(workflow=run, step_id="1", name="gone.step", status="failed", error=error)
    assert admin_client.get(run_page(run)).status_code == 200


def test_unknown_workflow_name_in_the_table(admin_client):
    run = Workflow.objects.create(name="no.such.module.flow", args=[1])
    assert admin_client.get(run_page(run)).status_code == 200
    claim(run)
    runner.execute(Workflow.objects.get(id=run.id), CLAIMER)
    assert Workflow.objects.get(id=run.id).status == "failed"


@pytest.mark.parametrize(
    "query",
    [
        "status=bogus", "status=", "created_after=yesterday", "created_before=2024-13-45",
        "args=%7Bbroken", "args=%00", "args=" + "%5B" * 3000, "q=%00", "q=" + "x" * 5000,
        "o=999", "o=-x", "p=-1", "p=abc", "p=99999", "claimer=%FF%FE", "has_key=maybe",
        "all=", "e=1", "name=%3Cscript%3E",
    ],
)
def test_garbage_query_strings_on_the_run_list_never_500(admin_client, query):
    Workflow.objects.create(name="x", args=[{"order_id": 1}])
    response = admin_client.get("/admin/everystep/workflow/?" + query)
    assert response.status_code in (200, 302, 400, 404)


@pytest.mark.parametrize(
    "path",
    [
        "/admin/everystep/workflow/not-a-uuid/run/",
        "/admin/everystep/workflow/%00/run/",
        "/admin/everystep/workflow/00000000-0000-0000-0000-000000000000/run/",
        "/admin/everystep/workflow/00000000-0000-0000-0000-000000000000/run/steps/abc/",
        "/admin/everystep/workflow/" + "9" * 400 + "/run/",
        "/admin/everystep/workflow/not-a-uuid/change/",
        "/everystep/not-a-uuid/run/",
    ],
)
def test_malformed_ids_are_404(admin_client, path):
    assert admin_client.get(path).status_code == 404


def test_post_without_csrf_or_permission_changes_nothing(client, django_user_model):
    run = Workflow.objects.create(name="x", args=[], status="failed", error={"type": "a", "message": "b"})
    staff = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    client.force_login(staff)
    for action in ("retry", "stop", "requeue", "resolve"):
        response = client.post(f"/admin/everystep/workflow/{run.id}/run/{action}/", {"seen": "failed"})
        assert response.status_code in (403, 404)
    assert Workflow.objects.get(id=run.id).status == "failed"
