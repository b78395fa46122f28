"""EVERYSTEP_UI_READ_DATABASE: the UI's pages (GET) read from a streaming
replica's alias, its actions (POST) write to everystep's database.

The "replica" here is a second alias of the test database itself, with a
connection of its own: what is checked is which connection each of
everystep's queries goes to. (A real replica also refuses writes and lags;
docs/scaling.md says what that means for the pages.)"""

import pytest
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from everystep import database
from everystep.models import Workflow

REPLICA = "replica"
BASE = "/admin/everystep/workflow/"
pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture
def replica():
    engine = connections[database.alias()]
    connections.settings[REPLICA] = {**engine.settings_dict}  # the same database, another connection
    # Connected here: the test case only lets aliases it knew at its start connect lazily.
    connections[REPLICA].connect()
    try:
        with override_settings(EVERYSTEP_UI_READ_DATABASE=REPLICA):
            yield connections[REPLICA]
    finally:
        connections[REPLICA].close()
        del connections[REPLICA]
        del connections.settings[REPLICA]


def everystep_queries(context) -> list[str]:
    return [query["sql"] for query in context.captured_queries if "everystep_" in query["sql"]]


def requests_on_both(admin_client, method: str, url: str, **data):
    """The response, and everystep's queries on its database and on the replica."""
    with (
        CaptureQueriesContext(connections[database.alias()]) as engine,
        CaptureQueriesContext(connections[REPLICA]) as replica,
    ):
        response = getattr(admin_client, method)(url, data)
    return response, everystep_queries(engine), everystep_queries(replica)


def test_the_pages_read_from_the_replica(admin_client, replica, run_in):
    run = run_in("failed")
    step = run.steps.get(step_id="1")
    pages = [
        BASE,
        f"{BASE}?status=failed",
        f"{BASE}overview/",
        f"{BASE}{run.id}/run/",
        f"{BASE}{run.id}/run/steps/{step.pk}/",
        f"{BASE}{run.id}/run/json/error/",
        f"{BASE}{run.id}/run/retry/",  # an action's form
        f"/everystep/{run.id}/run/",  # the pages outside the admin
        "/everystep/",
    ]
    for url in pages:
        response, on_engine, on_replica = requests_on_both(admin_client, "get", url)
        assert response.status_code == 200, url
        assert on_engine == [], url
        assert any("everystep_workflow" in sql for sql in on_replica), url
    assert str(run.id) in admin_client.get(f"{BASE}{run.id}/run/").text


def test_an_action_writes_to_everystep_database(admin_client, replica, run_in):
    run = run_in("scheduled")
    response, on_engine, on_replica = requests_on_both(
        admin_client, "post", f"{BASE}{run.id}/run/stop/", seen_status="scheduled"
    )
    assert response.status_code == 302
    assert Workflow.objects.get(id=run.id).status == "stopped"
    assert any(sql.startswith("UPDATE") for sql in on_engine)
    assert on_replica == []


def test_a_bulk_action_writes_to_everystep_database(admin_client, replica, run_in):
    run = run_in("failed")
    response, on_engine, on_replica = requests_on_both(
        admin_client, "post", BASE, action="retry_selected", _selected_action=[str(run.id)], post="yes"
    )
    assert response.status_code in (200, 302)
    assert on_replica == []
    assert any("everystep_workflow" in sql for sql in on_engine)


def test_without_the_setting_the_pages_read_everystep_database(admin_client, run_in):
    run = run_in("failed")
    with CaptureQueriesContext(connections[database.alias()]) as engine:
        assert admin_client.get(f"{BASE}{run.id}/run/").status_code == 200
    assert any("everystep_workflow" in sql for sql in everystep_queries(engine))


def test_reading_from_is_undone_after_the_block():
    outside = database.alias()
    with database.reading_from(REPLICA):
        assert database.alias() == REPLICA
    assert database.alias() == outside


def test_the_history_page_linked_from_the_run_page_reads_from_the_replica(admin_client, replica, run_in):
    run = run_in("failed")
    page = admin_client.get(f"{BASE}{run.id}/run/").text
    history_url = f"{BASE}{run.id}/history/"
    assert history_url in page  # the run page's "History" link
    response, on_engine, on_replica = requests_on_both(admin_client, "get", history_url)
    assert response.status_code == 200
    assert on_engine == []
    assert any("everystep_workflow" in sql for sql in on_replica)
