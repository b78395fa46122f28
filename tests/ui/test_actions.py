"""The run page's actions: Retry, Stop, Resolve, Requeue, for every permission and status."""

import html
import re
import uuid

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.messages import get_messages
from django.test import Client

from everystep import operations
from everystep.errors import EverystepError
from everystep.models import Step, Workflow

from .conftest import CHARGE, FETCH, FLAKY, HTMX, UNCERTAIN

# (action, from, to): every transition the UI offers.
TRANSITIONS = [
    ("retry", "failed", "scheduled"),
    ("retry", "stopped", "scheduled"),
    ("stop", "scheduled", "stopped"),
    ("stop", "running", "stopped"),
    ("stop", "blocked", "stopped"),
    ("stop", "waiting", "stopped"),
    ("requeue", "running", "scheduled"),
    ("resolve", "blocked", "scheduled"),
]
ACTIONS = ["retry", "stop", "resolve", "requeue"]
STATUSES = [status for status, _ in Workflow.Status.choices]
REFUSED = [
    (action, status)
    for action in ACTIONS
    for status in STATUSES
    if not any(t[:2] == (action, status) for t in TRANSITIONS)
]
EXTRA = {"resolve": {"step_id": "1", "resolution": "discard"}}


def url(run, action, mount="/admin/everystep/workflow/"):
    return f"{mount}{run.pk}/run/{action}/"


def run_page(run, mount="/admin/everystep/workflow/"):
    return f"{mount}{run.pk}/run/"


def seen_mark(client, run, action, mount="/admin/everystep/workflow/") -> dict:
    """The rows the action's confirmation shows now, as its form posts them back
    (empty when it shows no form or carries no rows)."""
    if action not in ("retry", "resolve", "wake"):
        return {}
    found = re.search(r'name="seen_mark" value="([^"]*)"', client.get(url(run, action, mount)).text)
    return {"seen_mark": html.unescape(found.group(1))} if found else {}


def post(client, run, action, seen=None, **extra):
    """Post the action's form as the confirmation page fills it in."""
    data = {"seen_status": seen or run.status, **EXTRA.get(action, {}), **seen_mark(client, run, action)}
    data.update(extra)
    if action == "requeue":
        data.setdefault("seen_claimer", run.claimed_by or "")
    return client.post(url(run, action), data)


def messages_of(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def status_of(run) -> str:
    return Workflow.objects.values_list("status", flat=True).get(pk=run.pk)


def history(run):
    return list(LogEntry.objects.filter(object_id=str(run.pk)).order_by("id"))


# Allowed


@pytest.mark.parametrize("action,before,after", TRANSITIONS)
def test_an_allowed_action_changes_the_run_logs_it_and_says_so(admin_client, run_in, action, before, after):
    run = run_in(before)
    response = post(admin_client, run, action)
    assert response.status_code == 302
    assert response["Location"] == run_page(run)
    assert status_of(run) == after
    [entry] = history(run)
    assert entry.user.username == "admin"
    assert entry.action_flag == CHANGE
    assert f"{before} -> {after}" in entry.change_message
    [message] = messages_of(response)
    assert message.startswith(f"Run {run.pk}: ") and f"{before} -> {after}" in message


@pytest.mark.parametrize("action,before,after", TRANSITIONS)
def test_a_get_shows_the_confirmation_and_changes_nothing(admin_client, run_in, action, before, after):
    run = run_in(before)
    steps = list(Step.objects.filter(workflow=run).values_list("step_id", "status"))
    response = admin_client.get(url(run, action))
    assert response.status_code == 200
    assert f'<input type="hidden" name="seen_status" value="{before}"' in response.text
    assert 'name="csrfmiddlewaretoken"' in response.text
    assert "Django administration" in response.text  # a full page without htmx
    assert status_of(run) == before
    assert list(Step.objects.filter(workflow=run).values_list("step_id", "status")) == steps
    assert history(run) == []


@pytest.mark.parametrize("action,status", REFUSED)
def test_an_action_the_status_does_not_allow_is_refused(admin_client, run_in, action, status):
    run = run_in(status)
    page = admin_client.get(url(run, action))
    assert page.status_code == 200
    assert "<form" not in page.text.split('id="es-action-panel"')[1]
    assert f"is {status}: only a" in page.text
    response = post(admin_client, run, action)
    assert response.status_code == 302
    assert status_of(run) == status
    assert history(run) == []
    [message] = messages_of(response)
    assert "Nothing was changed" in message


# Moved on


@pytest.mark.parametrize("action,before,after", TRANSITIONS)
def test_a_run_that_moved_on_is_left_alone(admin_client, run_in, action, before, after):
    run = run_in(before)
    Workflow.objects.filter(pk=run.pk).update(status="completed")
    response = post(admin_client, run, action, seen=before)
    assert response.status_code == 302
    assert status_of(run) == "completed"
    assert history(run) == []
    [message] = messages_of(response)
    assert f"moved on: it is completed now, not {before}; nothing was changed" in message


def test_a_run_that_moves_on_during_the_action_is_left_alone(admin_client, run_in, monkeypatch):
    """The view's own check passed; the operation's guarded UPDATE refuses."""
    run = run_in("failed")
    retry_run = operations.retry_run

    def racing(run_id, **kwargs):
        Workflow.objects.filter(pk=run_id).update(status="running", claimed_by="worker-2")
        return retry_run(run_id, **kwargs)

    monkeypatch.setattr(operations, "retry_run", racing)
    response = post(admin_client, run, "retry")
    assert status_of(run) == "running"
    assert Step.objects.filter(workflow=run).count() == 2
    assert history(run) == []
    [message] = messages_of(response)
    assert "moved on: it is running now, not failed" in message


# Permissions


@pytest.mark.parametrize("action,before,after", TRANSITIONS)
def test_each_action_needs_its_own_permission(operator_client, run_in, action, before, after):
    run = run_in(before)
    others = [f"{other}_workflow" for other in ACTIONS if other != action]
    for client in (operator_client(), operator_client(*others)):
        assert client.get(url(run, action)).status_code == 403
        assert post(client, run, action).status_code == 403
        assert status_of(run) == before
    assert history(run) == []
    allowed = operator_client(f"{action}_workflow")
    assert allowed.get(url(run, action)).status_code == 200
    assert post(allowed, run, action).status_code == 302
    assert status_of(run) == after


def test_viewers_see_no_buttons_and_get_403(viewer_client, run_in):
    run = run_in("failed")
    assert "es-actions" not in viewer_client.get(run_page(run)).text
    assert post(viewer_client, run, "retry").status_code == 403
    assert status_of(run) == "failed"


def test_staff_without_view_permission_and_anonymous_users_cannot_act(unpermitted_staff_client, run_in):
    run = run_in("failed")
    assert post(unpermitted_staff_client, run, "retry").status_code == 403
    response = post(Client(), run, "retry")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert status_of(run) == "failed"


def test_a_post_without_csrf_token_is_refused(run_in, django_user_model):
    run = run_in("failed")
    client = Client(enforce_csrf_checks=True)
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", "pw"))
    assert client.post(url(run, "retry"), {"seen_status": "failed"}).status_code == 403
    assert status_of(run) == "failed"
    # The confirmation's own form carries the token.
    page = client.get(url(run, "retry")).text
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    mark = seen_mark(client, run, "retry")
    response = client.post(url(run, "retry"), {"seen_status": "failed", "csrfmiddlewaretoken": token, **mark})
    assert response.status_code == 302
    assert status_of(run) == "scheduled"


@pytest.mark.parametrize("action", ACTIONS)
def test_malformed_and_unknown_run_ids_are_not_found(admin_client, action):
    for run_id in ("nope", uuid.UUID(int=7)):
        assert admin_client.get(f"/admin/everystep/workflow/{run_id}/run/{action}/").status_code == 404
    assert admin_client.post(f"/admin/everystep/workflow/nope/run/{action}/").status_code == 404


@pytest.mark.parametrize("extra", [{}, HTMX], ids=["plain", "htmx"])
def test_confirming_an_action_on_a_run_deleted_meanwhile_says_so(admin_client, run_in, extra):
    run = run_in("failed")
    Workflow.objects.filter(pk=run.pk).delete()  # pruned while the confirmation was shown
    response = admin_client.post(url(run, "retry"), {"seen_status": "failed"}, **extra)
    # htmx swaps no 404: the Confirm button would silently do nothing.
    location = response["HX-Redirect"] if extra else response["Location"]
    assert location == "/admin/everystep/workflow/"
    assert messages_of(response) == [f"Run {run.pk} no longer exists; nothing was changed."]


# The run page's buttons


@pytest.mark.parametrize(
    "status,buttons",
    [
        ("scheduled", ["stop"]),
        ("running", ["stop", "requeue"]),
        ("failed", ["retry"]),
        ("stopped", ["retry"]),
        ("blocked", ["stop", "resolve"]),
        ("completed", []),
    ],
)
def test_the_run_page_offers_the_actions_its_status_allows(admin_client, run_in, status, buttons):
    run = run_in(status)
    html = admin_client.get(run_page(run)).text
    found = re.findall(r'class="button es-action-(\w+)" href="([^"]+)"', html)
    assert found == [(name, url(run, name)) for name in buttons]


def test_buttons_follow_the_users_permissions(operator_client, run_in):
    run = run_in("running")
    html = operator_client("requeue_workflow").get(run_page(run)).text
    assert re.findall(r'class="button es-action-(\w+)"', html) == ["requeue"]


# htmx


def test_htmx_gets_the_confirmation_as_a_partial_and_a_client_redirect(admin_client, run_in):
    run = run_in("failed")
    partial = admin_client.get(url(run, "retry"), **HTMX)
    assert partial.status_code == 200
    assert "<html" not in partial.text
    assert f'hx-post="{url(run, "retry")}" hx-target="#es-action-panel" hx-swap="innerHTML"' in partial.text
    data = {"seen_status": "failed", **seen_mark(admin_client, run, "retry")}
    response = admin_client.post(url(run, "retry"), data, **HTMX)
    assert response.status_code == 200
    assert response["HX-Redirect"] == run_page(run)
    assert status_of(run) == "scheduled"


def test_the_run_page_loads_confirmations_into_a_preserved_panel(admin_client, run_in):
    run = run_in("failed")
    html = admin_client.get(run_page(run)).text
    assert f'hx-get="{url(run, "retry")}" hx-target="#es-action-panel" hx-swap="innerHTML"' in html
    assert '<div id="es-action-panel" hx-preserve="true"></div>' in html
    # Polls of a live run carry the buttons too, so that they follow the status.
    running = run_in("running")
    poll = admin_client.get(run_page(running), **HTMX).text
    assert "es-action-stop" in poll and 'id="es-action-panel"' in poll


# Retry


def test_retry_lists_exactly_the_rows_it_discards_and_flags_unsafe_ones(admin_client, run_in):
    run = run_in(
        "failed",
        steps=[
            {"step_id": "1", "name": FETCH, "status": "done"},
            {"step_id": "2.0.1", "name": FLAKY, "status": "failed"},
            {"step_id": "2.1.1", "name": CHARGE, "status": "done"},
        ],
    )
    page = admin_client.get(url(run, "retry")).text
    rows = re.findall(r"<tr( class=\"es-unsafe\")?>\s*<td><code>([^<]+)</code></td>", page)
    assert rows == [("", "2.0.1"), (' class="es-unsafe"', "2.1.1")]
    assert "2 step rows will be discarded" in page
    assert "unsafe to repeat:</strong> its effect will happen again" in page

    post(admin_client, run, "retry")
    assert list(Step.objects.filter(workflow=run).values_list("step_id", flat=True)) == ["1"]
    [entry] = history(run)
    assert entry.change_message == (
        f"Retried: failed -> scheduled; discarded 2 step rows: 2.0.1 {FLAKY} (failed), "
        f"2.1.1 {CHARGE} (done, unsafe to repeat)."
    )


def test_retrying_a_run_without_failed_step_discards_nothing(admin_client, run_in):
    run = run_in("stopped", steps=[{"step_id": "1", "name": FETCH, "status": "done"}])
    assert "No step row will be discarded" in admin_client.get(url(run, "retry")).text
    post(admin_client, run, "retry")
    assert Step.objects.filter(workflow=run).count() == 1
    assert history(run)[0].change_message == "Retried: stopped -> scheduled; no step row discarded."


def test_retry_does_not_discard_rows_its_confirmation_did_not_show(admin_client, run_in):
    """Retried by another operator and failed again meanwhile, with an
    unsafe-to-repeat charge recorded alongside the failure: confirming what
    was shown (one safe row) must not discard the charge."""
    run = run_in(
        "failed",
        steps=[
            {"step_id": "1", "name": FETCH, "status": "done"},
            {"step_id": "2", "name": FLAKY, "status": "failed"},
        ],
    )
    page = admin_client.get(url(run, "retry")).text
    assert "1 step row will be discarded" in page and "es-unsafe" not in page
    shown = seen_mark(admin_client, run, "retry")
    Step.objects.filter(workflow=run, step_id="2").update(status="done")
    Step.objects.create(workflow=run, step_id="3.0.1", name=FLAKY, status="failed")
    Step.objects.create(workflow=run, step_id="3.1.1", name=CHARGE, status="done")
    Workflow.objects.filter(pk=run.pk).update(status="failed")
    response = post(admin_client, run, "retry", seen="failed", **shown)
    assert Step.objects.filter(workflow=run, step_id="3.1.1").exists(), messages_of(response)
    assert status_of(run) == "failed" and history(run) == []
    [message] = messages_of(response)
    assert "moved on: the step rows to discard or the run's end changed since they were shown" in message


# Stop and requeue


def test_stop_names_the_operator(admin_client, run_in):
    run = run_in("running")
    post(admin_client, run, "stop")
    run.refresh_from_db()
    assert run.error["type"] == "everystep.errors.Terminal"
    assert "stopped by an operator (admin)" in run.error["message"]
    assert run.completed_at is not None


def test_requeue_warns_that_a_live_claimer_is_fenced_out(admin_client, run_in):
    run = run_in("running", claimed_by="worker-7@host-b")
    page = admin_client.get(url(run, "requeue")).text
    assert "<code>worker-7@host-b</code> is alive and still" in page
    assert "it is fenced out" in page
    post(admin_client, run, "requeue")
    run.refresh_from_db()
    assert (run.status, run.claimed_by) == ("scheduled", None)
    assert history(run)[0].change_message == (
        "Requeued: running -> scheduled (claimer worker-7@host-b fenced out)."
    )


def test_requeue_leaves_alone_a_run_another_worker_claimed_since(admin_client, run_in):
    run = run_in("running", claimed_by="worker-dead")
    assert 'name="seen_claimer" value="worker-dead"' in admin_client.get(url(run, "requeue")).text
    Workflow.objects.filter(pk=run.pk).update(claimed_by="worker-alive")
    response = post(admin_client, run, "requeue", seen_claimer="worker-dead")
    [message] = messages_of(response)
    assert "moved on: it is running under worker-alive now, not worker-dead; nothing was changed" in message
    assert Workflow.objects.get(pk=run.pk).claimed_by == "worker-alive"
    assert history(run) == []


def test_a_requeue_post_without_the_claimer_seen_is_refused(admin_client, run_in):
    """Only a hand-made request leaves the field out: requeueing whoever runs
    the run now is not what the operator confirmed."""
    run = run_in("running", claimed_by="worker-alive")
    response = admin_client.post(url(run, "requeue"), {"seen_status": "running"})
    assert response.status_code == 200
    assert "The form does not say which worker you saw running the run; nothing was changed." in response.text
    assert Workflow.objects.get(pk=run.pk).claimed_by == "worker-alive" and history(run) == []


def test_requeue_is_guarded_on_the_claimer_seen(run_in):
    """The guarded UPDATE itself, for a worker that claims the run after the page's check."""
    run = run_in("running", claimed_by="worker-alive")
    with pytest.raises(EverystepError, match="running under worker-alive now, not worker-dead"):
        operations.requeue_run(run.pk, expected_claimer="worker-dead")
    assert status_of(run) == "running"
    operations.requeue_run(run.pk, expected_claimer="worker-alive")
    assert status_of(run) == "scheduled"


def test_requeue_a_run_whose_claimer_name_ends_with_a_space(admin_client, run_in):
    """A worker may be named with a trailing space; the name seen is posted back as it is."""
    run = run_in("running", claimed_by="worker-1 ")
    page = admin_client.get(url(run, "requeue")).text
    assert 'name="seen_claimer" value="worker-1 "' in page  # as the confirmation posts it
    response = post(admin_client, run, "requeue", seen_claimer="worker-1 ")
    assert status_of(run) == "scheduled", messages_of(response)
    assert len(history(run)) == 1


# Resolve


def resolve(client, run, headers=None, **data):
    data = {"seen_status": "blocked", "step_id": "1", **seen_mark(client, run, "resolve"), **data}
    return client.post(url(run, "resolve"), data, **(headers or {}))


def started_step(run):
    return Step.objects.get(workflow=run, step_id="1")


def test_resolve_shows_the_started_steps_and_the_three_choices(admin_client, run_in):
    run = run_in("blocked")
    page = admin_client.get(url(run, "resolve")).text
    assert f'<option value="1" selected>1 ({CHARGE})</option>' in page
    for choice in ("result", "error", "discard"):
        assert f'name="resolution" value="{choice}"' in page
    # The run page shows the error; its confirmation does not repeat it.
    assert "step 1 uncertain" not in page


def test_resolve_with_a_result_records_the_step_done(admin_client, run_in):
    run = run_in("blocked")
    response = resolve(admin_client, run, resolution="result", result='{"charged": 1999}')
    assert response.status_code == 302
    step = started_step(run)
    assert (step.status, step.result) == ("done", {"charged": 1999})
    assert status_of(run) == "scheduled"
    assert history(run)[0].change_message == (
        'Resolved step 1: recorded as done with the result {"charged": 1999}; blocked -> scheduled.'
    )


def test_resolve_with_an_error_records_the_step_failed(admin_client, run_in):
    run = run_in("blocked")
    resolve(admin_client, run, resolution="error", error="card was not charged")
    step = started_step(run)
    assert step.status == "failed"
    assert step.error["type"] == "everystep.errors.StepFailure"
    assert step.error["message"] == "card was not charged"
    assert "recorded as failed with the message 'card was not charged'" in history(run)[0].change_message


def test_resolve_by_discarding_deletes_the_started_row(admin_client, run_in):
    run = run_in("blocked")
    resolve(admin_client, run, resolution="discard")
    assert not Step.objects.filter(workflow=run).exists()
    assert status_of(run) == "scheduled"
    assert "its started row discarded" in history(run)[0].change_message


@pytest.mark.parametrize(
    "data,field,error",
    [
        ({"resolution": "result", "result": "{not json"}, "result", "Not valid JSON"),
        ({"resolution": "result", "result": ""}, "result", "Not valid JSON"),
        # Valid JSON everystep does not store (nor PostgreSQL's jsonb).
        ({"resolution": "result", "result": '"\\u0000"'}, "result", "Cannot be stored"),
        ({"resolution": "result", "result": '{"note": "\\ud800"}'}, "result", "Cannot be stored"),
        ({"resolution": "error", "error": "   "}, "error", "Enter the message to record"),
        ({}, "resolution", "This field is required."),
        ({"resolution": "discard", "step_id": "2"}, "step_id", "Select a valid choice."),
    ],
)
def test_resolve_shows_bad_input_inline_and_changes_nothing(admin_client, run_in, data, field, error):
    run = run_in("blocked")
    for extra in ({}, HTMX):
        response = resolve(admin_client, run, extra, **data)
        assert response.status_code == 200
        row = response.text.split(f'es-field-{field}"')[1].split("es-form-row")[0]
        assert error in row
        assert ("<html" in response.text) == (not extra)  # htmx gets the partial
    assert status_of(run) == "blocked"
    assert started_step(run).status == "started"
    assert history(run) == []


def test_resolve_keeps_what_was_typed(admin_client, run_in):
    run = run_in("blocked")
    response = resolve(admin_client, run, resolution="result", result='{"charged": <script>')
    assert "{&quot;charged&quot;: &lt;script&gt;</textarea>" in response.text


def test_resolve_refuses_a_run_that_is_not_blocked(admin_client, run_in):
    run = run_in("failed")
    response = admin_client.post(
        url(run, "resolve"), {"seen_status": "failed", "step_id": "2", "resolution": "discard"}
    )
    assert response.status_code == 302
    [message] = messages_of(response)
    assert "only a blocked run can be resolved" in message
    assert Step.objects.filter(workflow=run).count() == 2
    assert status_of(run) == "failed"


def test_resolve_accepts_everysteps_tagged_json(admin_client, run_in):
    run = run_in("blocked")
    resolve(
        admin_client,
        run,
        resolution="result",
        result='{"at": {"$es": "date", "v": "2024-05-01"}}',
    )
    assert started_step(run).status == "done"


def test_a_resolution_of_an_attempt_another_operator_resolved_is_not_applied_to_the_next(
    admin_client, run_in
):
    """Another operator discarded the started row shown, the step ran again and
    blocked again at the same step id: what was found out about the first
    attempt is not recorded on the new one."""
    run = run_in("blocked")
    shown = seen_mark(admin_client, run, "resolve")  # started step 1, this attempt
    operations.resolve_step(run.pk, "1", discard=True)
    Step.objects.create(workflow=run, step_id="1", name=CHARGE, status="started")
    Workflow.objects.filter(pk=run.pk).update(status="blocked", error=UNCERTAIN)
    response = resolve(admin_client, run, resolution="result", result='{"charged": 1999}', **shown)
    assert Step.objects.get(workflow=run, step_id="1").status == "started", messages_of(response)
    assert Workflow.objects.get(pk=run.pk).status == "blocked"
    assert "moved on: its started steps changed since they were shown" in messages_of(response)[0]


DEEP = "[" * 40 + "1" + "]" * 40  # valid JSON, deeper than MariaDB's JSON check takes (32 levels)


def test_resolve_with_a_deeply_nested_result_is_stored_or_a_form_error_not_a_500(admin_client, run_in):
    """SQLite and PostgreSQL store it; MariaDB refuses it: next to the field, nothing changed."""
    run = run_in("blocked")
    admin_client.raise_request_exception = False
    response = resolve(admin_client, run, resolution="result", result=DEEP)
    assert response.status_code != 500
    step = Step.objects.get(workflow=run, step_id="1")
    if step.status == "done":  # stored: the backend took it
        assert status_of(run) == "scheduled"
    else:  # refused: next to the field, nothing changed
        assert response.status_code == 200 and "es-field-result" in response.text
        row = response.text.split('es-field-result"')[1].split("es-form-row")[0]
        assert "the database refused the result" in row
        assert status_of(run) == "blocked" and history(run) == []


# History


def test_the_history_page_shows_the_trail(admin_client, run_in, operator_client):
    run = run_in("failed")
    post(admin_client, run, "retry")
    Workflow.objects.filter(pk=run.pk).update(status="running", claimed_by="worker-1")
    post(admin_client, run, "stop", seen="running")
    response = admin_client.get(f"/admin/everystep/workflow/{run.pk}/history/")
    assert response.status_code == 200
    html = response.text
    assert "Retried: failed -&gt; scheduled; discarded 1 step row: 2" in html
    assert "Stopped: running -&gt; stopped." in html
    assert html.index("Retried") < html.index("Stopped")
    assert ">admin<" in html
    # Anyone who may look at the run may read its trail.
    assert operator_client().get(f"/admin/everystep/workflow/{run.pk}/history/").status_code == 200


def test_the_history_page_of_a_run_without_actions_opens(admin_client, run_in):
    run = run_in("completed")
    response = admin_client.get(f"/admin/everystep/workflow/{run.pk}/history/")
    assert response.status_code == 200
    assert "This object doesn’t have a change history" in response.text


# The standalone mount


def test_the_standalone_mount_serves_the_same_actions(admin_client, viewer_client, run_in):
    run = run_in("failed")
    mount = "/everystep/"
    assert viewer_client.post(url(run, "retry", mount), {"seen_status": "failed"}).status_code == 403
    page = admin_client.get(url(run, "retry", mount)).text
    assert f'action="{url(run, "retry", mount)}"' in page
    response = admin_client.post(
        url(run, "retry", mount), {"seen_status": "failed", **seen_mark(admin_client, run, "retry", mount)}
    )
    assert response["Location"] == run_page(run, mount)
    assert status_of(run) == "scheduled"
    assert f'href="{url(run, "stop", mount)}"' in admin_client.get(run_page(run, mount)).text


def _retried_and_stopped_again_by_others(run):
    """Another operator retries the run; it runs on (a charge recorded); a
    third operator stops it again: it is back to the status first shown."""
    operations.retry_run(run.pk, expected_status="stopped")
    Step.objects.create(workflow=run, step_id="2", name=CHARGE, status="done")
    operations.stop_run(run.pk, actor="carol", expected_status="scheduled")
    assert status_of(run) == "stopped"


def test_retry_of_a_run_stopped_again_by_another_operator_meanwhile_is_refused(admin_client, run_in):
    # No row to discard before or after: the run's end tells the two stops apart.
    run = run_in("stopped", steps=[{"step_id": "1", "name": FETCH, "status": "done"}])
    shown = seen_mark(admin_client, run, "retry")
    _retried_and_stopped_again_by_others(run)
    response = admin_client.post(url(run, "retry"), {"seen_status": "stopped", **shown})
    assert status_of(run) == "stopped", messages_of(response)
    assert history(run) == []
    assert "moved on" in messages_of(response)[0]


def test_a_confirmation_posted_without_its_mark_writes_nothing_and_says_to_reload(admin_client, run_in):
    # A tab opened before confirmations carried their rows: not applied unchecked,
    # and not a bare "This field is required." on a hidden field, again at each confirm.
    run = run_in("failed")
    response = admin_client.post(url(run, "retry"), {"seen_status": "failed"})
    assert response.status_code == 200
    assert status_of(run) == "failed" and history(run) == []
    assert "Reload the page and confirm again" in html.unescape(response.text)

