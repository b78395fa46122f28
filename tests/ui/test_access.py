"""Who may open which page, and what malformed or unknown ids answer."""

import importlib
import sys
import types
import uuid
from urllib.parse import quote

import pytest
from django.contrib import admin
from django.core.exceptions import ImproperlyConfigured
from django.urls import include, path

import everystep_ui.urls
from everystep.models import Workflow
from everystep_ui.admin import WorkflowAdmin

from .conftest import HTMX, _user
from .test_actions import seen_mark

UNKNOWN = uuid.UUID("01900000-0000-7000-8000-000000000000")


@pytest.fixture
def pages(make_run):
    """Every page, on both mounts."""
    run = make_run(steps=[{"step_id": "1"}])
    step = run.steps.get()
    urls = []
    for mount in ("/admin/everystep/workflow/", "/everystep/"):
        urls += [mount, f"{mount}{run.pk}/run/", f"{mount}{run.pk}/run/steps/{step.pk}/"]
    return urls


def each_page(pages, client, **extra):
    return [(url, client.get(url, **extra)) for url in pages]


def test_anonymous_users_are_sent_to_the_admin_login(client, pages):
    for url, response in each_page(pages, client):
        assert response.status_code == 302, url
        assert response["Location"] == f"/admin/login/?next={quote(url)}", url


def test_non_staff_users_get_the_login_page(non_staff_client, pages):
    for url, response in each_page(pages, non_staff_client):
        assert response.status_code == 302, url
        login = non_staff_client.get(response["Location"])
        assert login.status_code == 200
        assert 'id="login-form"' in login.text
        assert "You are authenticated as customer" in login.text


def test_staff_without_the_view_permission_is_forbidden(unpermitted_staff_client, pages):
    for url, response in each_page(pages, unpermitted_staff_client):
        assert response.status_code == 403, url


def test_the_step_view_permission_alone_shows_nothing(client, make_run, pages):
    # Steps hold the same personal data as their runs: every page needs view_workflow.
    make_run(steps=[{"step_id": "1", "name": "shop.steps.charge_card", "args": ["4242 4242"]}])
    client.force_login(_user("step-viewer", staff=True, permissions=["view_step"]))
    for url, response in each_page(pages, client):
        assert response.status_code == 403, url
    for url in ("/admin/everystep/step/", "/admin/everystep/step/1/change/", "/admin/everystep/"):
        assert client.get(url).status_code == 404, url
    index = client.get("/admin/").text
    assert "everystep" not in index and "Steps" not in index


def test_steps_are_not_an_admin_list_of_their_own(admin_client, make_run):
    # A step is read on its run's page; a list of every step of every run would
    # be a second way in, needing a permission of its own.
    run = make_run(steps=[{"step_id": "1"}])
    step = run.steps.get()
    assert admin_client.get("/admin/everystep/step/").status_code == 404
    assert admin_client.get(f"/admin/everystep/step/{step.pk}/change/").status_code == 404
    app = admin_client.get("/admin/everystep/").text
    assert '<a href="/admin/everystep/workflow/">Runs</a>' in app
    assert "/admin/everystep/step/" not in app


def test_staff_with_the_view_permission_can_look(viewer_client, pages):
    for url, response in each_page(pages, viewer_client):
        assert response.status_code == 200, url


def test_superusers_can_look(admin_client, pages):
    for url, response in each_page(pages, admin_client):
        assert response.status_code == 200, url


def test_an_expired_session_sends_htmx_to_the_login_page(client, make_run):
    run = make_run(status="running")
    page = f"/admin/everystep/workflow/{run.pk}/run/"
    response = client.get(page, HTTP_HX_CURRENT_URL=f"http://testserver{page}", **HTMX)
    assert response.status_code == 200
    assert response["HX-Redirect"] == f"/admin/login/?next={quote(page, safe='')}"
    assert response.content == b""


@pytest.mark.parametrize("mount", ["/admin/everystep/workflow/", "/everystep/"])
@pytest.mark.parametrize(
    "path",
    [
        "not-a-uuid/run/",
        f"{UNKNOWN}/run/",
        "{run}/run/steps/not-a-number/",
        "{run}/run/steps/999999/",
        "{run}/run/steps/99999999999999999999999999/",
        "{run}x/run/steps/1/",
        f"{UNKNOWN}/run/steps/1/",
    ],
)
def test_malformed_and_unknown_ids_are_not_found(admin_client, make_run, mount, path):
    run = make_run()
    response = admin_client.get(mount + path.format(run=run.pk))
    assert response.status_code == 404


def test_a_malformed_id_in_the_admin_change_url_is_not_found(admin_client):
    assert admin_client.get("/admin/everystep/workflow/nope/change/").status_code == 404


# The standalone mount serves the WorkflowAdmin the project registered


class ProjectAdmin(WorkflowAdmin):
    """A project's own: nobody stops runs from the UI, and one workflow's runs are hidden."""

    def has_stop_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).exclude(name="secret.payroll")


@pytest.fixture
def project(settings, monkeypatch):
    """``project(admin_class)``: the project registers ``admin_class`` for Workflow
    (None: nothing) in its admin.py, then its URLconf mounts the admin and everystep_ui.urls."""
    original = type(admin.site.get_model_admin(Workflow))

    def load(admin_class):
        admin.site.unregister(Workflow)
        if admin_class is not None:
            admin.site.register(Workflow, admin_class)
        urls = importlib.reload(everystep_ui.urls)
        urlconf = types.ModuleType("project_urls")
        urlconf.urlpatterns = [path("admin/", admin.site.urls), path("everystep/", include(urls))]
        monkeypatch.setitem(sys.modules, urlconf.__name__, urlconf)
        settings.ROOT_URLCONF = urlconf.__name__

    yield load
    if admin.site.is_registered(Workflow):
        admin.site.unregister(Workflow)
    admin.site.register(Workflow, original)
    importlib.reload(everystep_ui.urls)


def test_the_standalone_mount_withholds_what_the_registered_admin_withholds(admin_client, run_in, project):
    project(ProjectAdmin)
    run = run_in("running")
    for mount in ("/admin/everystep/workflow/", "/everystep/"):
        response = admin_client.post(f"{mount}{run.pk}/run/stop/", {"seen_status": "running"})
        assert response.status_code == 403, mount
    assert Workflow.objects.get(pk=run.pk).status == "running"


def test_the_standalone_mount_hides_the_runs_the_registered_admin_hides(admin_client, make_run, project):
    project(ProjectAdmin)
    hidden = make_run(name="secret.payroll", args=[{"iban": "DE00 1234"}])
    for mount in ("/admin/everystep/workflow/", "/everystep/"):
        assert admin_client.get(f"{mount}{hidden.pk}/run/").status_code == 404, mount
        assert str(hidden.pk) not in admin_client.get(mount).text, mount


def test_the_standalone_mount_needs_a_workflow_admin_if_any_is_registered(project):
    project(None)
    assert type(everystep_ui.urls.mounted_admin()) is WorkflowAdmin
    admin.site.register(Workflow, admin.ModelAdmin)
    with pytest.raises(ImproperlyConfigured, match="ModelAdmin is not a WorkflowAdmin"):
        everystep_ui.urls.mounted_admin()


def test_the_standalone_mount_works_with_nothing_registered_for_workflow(admin_client, run_in, project):
    """A project that unregisters Workflow from the admin keeps the pages at
    everystep_ui.urls: they link to neither the app page nor the history page,
    which the admin then does not have."""
    project(None)
    run = run_in("failed")
    step = run.steps.get(step_id="2")
    run_page = f"/everystep/{run.pk}/run/"
    pages = ["/everystep/", "/everystep/overview/", run_page, f"{run_page}steps/{step.pk}/"]
    for page in pages:
        response = admin_client.get(page)
        assert response.status_code == 200, page
        assert "/admin/everystep/" not in response.text, page
    confirm = admin_client.post("/everystep/", {"action": "retry_selected", "_selected_action": [run.pk]})
    assert confirm.status_code == 200 and "Retry selected runs" in confirm.text
    mark = seen_mark(admin_client, run, "retry", "/everystep/")
    retried = admin_client.post(f"/everystep/{run.pk}/run/retry/", {"seen_status": "failed", **mark})
    assert retried.status_code == 302
    assert Workflow.objects.get(pk=run.pk).status == "scheduled"
