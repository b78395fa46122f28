"""Retry and Stop as bulk actions of the run list, with a confirmation page."""

import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.test import Client

from everystep.models import Step, Workflow
from everystep_ui.admin import WorkflowAdmin

from .conftest import CHARGE, FETCH, FLAKY

LIST = "/admin/everystep/workflow/"


def choose(client, action, runs, path=LIST, **extra):
    """What the run list posts when runs are ticked and an action is chosen."""
    data = {"action": action, "_selected_action": [str(run.pk) for run in runs], "index": "0"}
    return client.post(path, data, **extra)


def confirm(client, page, path=LIST):
    """Post the confirmation page's form as it is (to the list's URL, with its filters)."""
    form = page.text.split('<form method="post">')[1].split("</form>")[0]
    data = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form):
        data.setdefault(name, []).append(value)
    return client.post(path, data)


def statuses(*runs):
    return [Workflow.objects.get(pk=run.pk).status for run in runs]


def messages_of(response):
    return [str(message) for message in get_messages(response.wsgi_request)]


def logged(run):
    return list(LogEntry.objects.filter(object_id=str(run.pk)).values_list("change_message", flat=True))


def test_bulk_retry_confirms_first_and_lists_what_it_discards(admin_client, run_in):
    failed = run_in(
        "failed",
        steps=[
            {"step_id": "1", "name": FETCH, "status": "done"},
            {"step_id": "2", "name": FLAKY, "status": "failed"},
            {"step_id": "3", "name": CHARGE, "status": "done"},
        ],
    )
    stopped, completed = run_in("stopped"), run_in("completed")
    page = choose(admin_client, "retry_selected", [failed, stopped, completed])
    assert page.status_code == 200
    html = page.text
    assert "Retry 2 runs?" in html
    assert "left alone: it is completed" in html
    assert f"<code>2</code> <code>{FLAKY}</code> (failed)" in html
    assert f"<code>3</code> <code>{CHARGE}</code> (done) — <strong>unsafe to repeat:</strong>" in html
    assert f'name="seen-{failed.pk}" value="failed"' in html
    assert f'name="seen-{completed.pk}"' not in html
    assert statuses(failed, stopped, completed) == ["failed", "stopped", "completed"]  # nothing yet

    response = confirm(admin_client, page)
    assert response.status_code == 302
    assert statuses(failed, stopped, completed) == ["scheduled", "scheduled", "completed"]
    assert list(Step.objects.filter(workflow=failed).values_list("step_id", flat=True)) == ["1"]
    assert logged(failed) == [
        f"Retried: failed -> scheduled; discarded 2 step rows: 2 {FLAKY} (failed), "
        f"3 {CHARGE} (done, unsafe to repeat)."
    ]
    assert logged(stopped) == ["Retried: stopped -> scheduled; no step row discarded."]
    assert logged(completed) == []
    assert messages_of(response) == ["Retried 2 runs."]


def test_bulk_stop_stops_what_it_can(admin_client, run_in):
    runs = [run_in(status) for status in ("scheduled", "running", "blocked", "failed")]
    page = choose(admin_client, "stop_selected", runs)
    assert "Stop 3 runs?" in page.text
    response = confirm(admin_client, page)
    assert statuses(*runs) == ["stopped", "stopped", "stopped", "failed"]
    assert logged(runs[1]) == ["Stopped: running -> stopped."]
    assert "stopped by an operator (admin)" in Workflow.objects.get(pk=runs[0].pk).error["message"]
    assert messages_of(response) == ["Stopped 3 runs."]


def test_runs_that_moved_on_after_the_confirmation_are_left_alone(admin_client, run_in):
    first, second = run_in("failed"), run_in("failed")
    page = choose(admin_client, "retry_selected", [first, second])
    Workflow.objects.filter(pk=second.pk).update(status="running", claimed_by="worker-9")
    response = confirm(admin_client, page)
    assert statuses(first, second) == ["scheduled", "running"]
    assert logged(second) == []
    assert messages_of(response) == [
        "Retried 1 run.",
        f"run {second.pk} moved on: it is running now, not failed; nothing was changed",
    ]


def test_bulk_retry_does_not_discard_rows_its_confirmation_did_not_show(admin_client, run_in):
    """Retried by another operator and failed again meanwhile, with an
    unsafe-to-repeat charge recorded: the rows listed were others."""
    run = run_in(
        "failed",
        steps=[
            {"step_id": "1", "name": FETCH, "status": "done"},
            {"step_id": "2", "name": FLAKY, "status": "failed"},
        ],
    )
    page = choose(admin_client, "retry_selected", [run])
    assert "es-unsafe" not in page.text
    Step.objects.filter(workflow=run, step_id="2").update(status="done")
    Step.objects.create(workflow=run, step_id="3.0.1", name=FLAKY, status="failed")
    Step.objects.create(workflow=run, step_id="3.1.1", name=CHARGE, status="done")
    response = confirm(admin_client, page)
    assert Step.objects.filter(workflow=run, step_id="3.1.1").exists()
    assert statuses(run) == ["failed"] and logged(run) == []
    assert messages_of(response) == [
        f"run {run.pk} moved on: the step rows to discard or the run's end changed since they were "
        "shown; nothing was changed"
    ]


def test_a_run_that_left_a_filtered_list_after_the_confirmation_is_reported(admin_client, run_in):
    # Django hands the action only the selected runs still matching the list's filters.
    first, second, third = run_in("failed"), run_in("failed"), run_in("failed")
    page = choose(admin_client, "retry_selected", [first, second, third], path=f"{LIST}?status=failed")
    Workflow.objects.filter(pk=second.pk).update(status="running", claimed_by="worker-9")
    Workflow.objects.filter(pk=third.pk).delete()
    response = confirm(admin_client, page, path=f"{LIST}?status=failed")
    assert statuses(first, second) == ["scheduled", "running"]
    assert messages_of(response) == [
        "Retried 1 run.",
        f"run {second.pk} moved on: it is running now, not failed; nothing was changed",
        f"Run {third.pk} no longer exists; nothing was changed.",
    ]


def test_a_selection_with_nothing_to_do_offers_no_button(admin_client, run_in):
    page = choose(admin_client, "retry_selected", [run_in("completed")])
    assert "None of the selected runs can be retried" in page.text
    assert 'type="submit"' not in page.text.split('<form method="post">')[1]


@pytest.mark.parametrize("action", ["retry_selected", "stop_selected"])
def test_bulk_actions_need_their_permission(viewer_client, operator_client, run_in, action):
    run = run_in("failed" if action == "retry_selected" else "running")
    before = statuses(run)
    assert choose(viewer_client, action, [run]).status_code == 403
    other = "stop_workflow" if action == "retry_selected" else "retry_workflow"
    client = operator_client(other)
    assert choose(client, action, [run]).status_code == 403
    assert confirm_data_post(client, action, run).status_code == 403
    assert statuses(run) == before
    allowed = operator_client(action.replace("_selected", "_workflow"))
    assert choose(allowed, action, [run]).status_code == 200


def confirm_data_post(client, action, run):
    """A forged confirmation post, skipping the page."""
    data = {"action": action, "_selected_action": [str(run.pk)], "post": "yes", f"seen-{run.pk}": run.status}
    return client.post(LIST, data)


@pytest.mark.parametrize("action", ["retry_selected", "stop_selected"])
@pytest.mark.parametrize("malformed", ["not-a-uuid", "1"])
def test_a_malformed_run_id_in_the_selection_is_not_found(admin_client, run_in, action, malformed):
    # Only a tampered or hand-written post holds one: 404, never 500 (UI.md).
    run = run_in("failed" if action == "retry_selected" else "running")
    before = statuses(run)
    selected = {"action": action, "_selected_action": [str(run.pk), malformed]}
    listed = {"index": "0"}
    confirmed = {"post": "yes", f"seen-{run.pk}": run.status}
    for post in (listed, confirmed):
        assert admin_client.post(LIST, {**selected, **post}).status_code == 404
    assert statuses(run) == before


def test_the_run_list_offers_only_the_actions_the_user_may_take(operator_client, viewer_client, make_run):
    make_run()
    html = operator_client("stop_workflow").get(LIST).text
    actions = html.split('<select name="action"')[1].split("</select>")[0]
    assert re.findall(r'<option value="(\w*)"', actions) == ["", "stop_selected"]
    assert 'name="_selected_action"' not in viewer_client.get(LIST).text


def test_a_confirmation_without_csrf_token_is_refused(run_in, django_user_model):
    run = run_in("failed")
    client = Client(enforce_csrf_checks=True)
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", "pw"))
    assert confirm_data_post(client, "retry_selected", run).status_code == 403
    assert statuses(run) == ["failed"]


def test_too_big_a_selection_is_refused(admin_client, run_in, monkeypatch):
    monkeypatch.setattr(WorkflowAdmin, "bulk_action_limit", 2)
    runs = [run_in("failed") for _ in range(3)]
    response = choose(admin_client, "retry_selected", runs)
    assert response.status_code == 302
    assert messages_of(response) == ["Select at most 2 runs for one retry; nothing was changed."]
    assert statuses(*runs) == ["failed"] * 3


def test_bulk_actions_work_on_the_standalone_mount(admin_client, run_in):
    run = run_in("running")
    data = {"action": "stop_selected", "_selected_action": [str(run.pk)], "index": "0"}
    page = admin_client.post("/everystep/", data)
    assert page.status_code == 200 and "Stop 1 run?" in page.text
    form = page.text.split('<form method="post">')[1].split("</form>")[0]
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form))
    assert admin_client.post("/everystep/", fields).status_code == 302
    assert statuses(run) == ["stopped"]


def test_bulk_retry_of_a_run_stopped_again_by_another_operator_meanwhile_is_refused(admin_client, run_in):
    from everystep import operations

    run = run_in("stopped", steps=[{"step_id": "1", "name": FETCH, "status": "done"}])
    page = choose(admin_client, "retry_selected", [run])
    operations.retry_run(run.pk, expected_status="stopped")  # another operator; it runs on
    Step.objects.create(workflow=run, step_id="2", name=CHARGE, status="done")
    operations.stop_run(run.pk, actor="carol", expected_status="scheduled")  # a third stops it
    response = confirm(admin_client, page)
    assert Workflow.objects.get(pk=run.pk).status == "stopped"
    assert any("moved on" in str(message) for message in get_messages(response.wsgi_request))

