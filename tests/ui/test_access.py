"""Who may open which page, and what malformed or unknown ids answer."""

import uuid
from urllib.parse import quote

import pytest

from .conftest import HTMX

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
