"""Child runs on the run pages: the parent's link, the children with their
statuses, and Stop offering to stop the unfinished children too."""

import pytest
from django.contrib.admin.models import LogEntry

from everystep.models import ChildRun, Workflow

from .test_actions import messages_of, run_page, url

pytestmark = pytest.mark.django_db

CHILD = "shop.workflows.ship"


@pytest.fixture
def family(run_in, make_run):
    """A running parent with three children: scheduled (itself the parent of a
    scheduled grandchild), running, and completed."""

    def link(parent, child, step_id):
        ChildRun.objects.create(parent_id=parent.pk, child_id=child.pk, step_id=step_id)
        return child

    parent = run_in("running")
    scheduled = link(parent, make_run(name=CHILD, status="scheduled"), "1")
    running = link(parent, make_run(name=CHILD, status="running", claimed_by="worker-2"), "2")
    done = link(parent, make_run(name=CHILD, status="completed"), "3")
    grandchild = link(scheduled, make_run(name=CHILD, status="scheduled"), "1")
    return {
        "parent": parent, "scheduled": scheduled, "running": running, "done": done, "grandchild": grandchild,
    }


def status_of(run):
    return Workflow.objects.values_list("status", flat=True).get(pk=run.pk)


def test_the_parent_lists_its_children_with_statuses_and_each_child_links_back(admin_client, family):
    page = admin_client.get(run_page(family["parent"])).text
    children = page.split('class="es-children"')[1].split("</tr>")[0]
    for name, step_id in (("scheduled", "1"), ("running", "2"), ("done", "3")):
        child = family[name]
        assert f'href="{run_page(child)}"' in children
        status = status_of(child)
        badge = f'<span class="es-badge es-status-{status}">{status}</span>'
        assert f"from step <code>{step_id}</code> {badge}" in children
    assert run_page(family["grandchild"]) not in children  # its own parent lists it
    child_page = admin_client.get(run_page(family["running"])).text
    started_by = child_page.split('class="es-parent"')[1].split("</tr>")[0]
    assert f'href="{run_page(family["parent"])}"' in started_by
    assert "at step <code>2</code>" in started_by and "es-status-running" in started_by
    assert 'class="es-parent"' not in admin_client.get(run_page(family["parent"])).text


def test_stop_offers_to_stop_the_unfinished_children_and_grandchildren(admin_client, family):
    page = admin_client.get(url(family["parent"], "stop")).text
    assert 'name="stop_children"' in page
    assert "Also stop its 3 unfinished child runs" in page  # scheduled, running and the grandchild
    assert 'checked' not in page.split('name="stop_children"')[0].rsplit("<input", 1)[1]


def test_a_run_without_unfinished_children_is_stopped_without_the_offer(admin_client, family, run_in):
    assert 'name="stop_children"' not in admin_client.get(url(run_in("running"), "stop")).text
    assert 'name="stop_children"' not in admin_client.get(url(family["running"], "stop")).text


def test_stopping_with_the_children_stops_each_and_logs_it_in_its_history(admin_client, family):
    parent = family["parent"]
    response = admin_client.post(url(parent, "stop"), {"seen_status": "running", "stop_children": "on"})
    assert response.status_code == 302
    assert [status_of(family[name]) for name in ("parent", "scheduled", "running", "grandchild", "done")] == [
        "stopped", "stopped", "stopped", "stopped", "completed",
    ]
    [message] = messages_of(response)
    assert message == f"Run {parent.pk}: Stopped: running -> stopped; also stopped 3 child runs."
    for name, before in (("scheduled", "scheduled"), ("running", "running"), ("grandchild", "scheduled")):
        [entry] = LogEntry.objects.filter(object_id=str(family[name].pk))
        assert entry.change_message == f"Stopped with run {parent.pk}: {before} -> stopped."
        assert entry.user.username == "admin"
    assert not LogEntry.objects.filter(object_id=str(family["done"].pk)).exists()


def test_stopping_without_the_box_ticked_leaves_the_children_running(admin_client, family):
    response = admin_client.post(url(family["parent"], "stop"), {"seen_status": "running"})
    assert response.status_code == 302
    assert status_of(family["parent"]) == "stopped"
    assert [status_of(family[name]) for name in ("scheduled", "running", "grandchild")] == [
        "scheduled", "running", "scheduled",
    ]
    assert LogEntry.objects.filter(object_id=str(family["running"].pk)).count() == 0


@pytest.mark.parametrize("moved_to, stopped", [("completed", False), ("running", True)])
def test_a_child_that_moved_on_after_it_was_read_is_stopped_only_if_it_has_not_ended(
    admin_client, family, monkeypatch, moved_to, stopped
):
    from everystep import children

    real, reads = children.unfinished_descendants, []
    child = family["scheduled"]

    def then_it_moves_on(run_id):
        found = real(run_id)
        reads.append(found)
        if len(reads) == 2:  # the stop's own read: a worker claims or ends the child right after it
            Workflow.objects.filter(pk=child.pk).update(status=moved_to, claimed_by="worker-3")
        return found

    monkeypatch.setattr(children, "unfinished_descendants", then_it_moves_on)
    stop_all = {"seen_status": "running", "stop_children": "on"}
    response = admin_client.post(url(family["parent"], "stop"), stop_all)
    assert (child.pk, "scheduled") in reads[1]  # it was read as scheduled
    assert status_of(child) == ("stopped" if stopped else moved_to)
    assert [status_of(family[name]) for name in ("running", "grandchild")] == ["stopped", "stopped"]
    [message] = messages_of(response)
    assert message.endswith(f"also stopped {3 if stopped else 2} child runs.")
    entries = [entry.change_message for entry in LogEntry.objects.filter(object_id=str(child.pk))]
    assert entries == ([f"Stopped with run {family['parent'].pk}: running -> stopped."] if stopped else [])


def test_stopping_the_children_needs_the_stop_permission(operator_client, family):
    client = operator_client("retry_workflow")
    response = client.post(url(family["parent"], "stop"), {"seen_status": "running", "stop_children": "on"})
    assert response.status_code == 403
    assert status_of(family["parent"]) == "running" and status_of(family["scheduled"]) == "scheduled"
