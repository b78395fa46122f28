"""Re-run from here and Fork from here: offered on each recorded step, previewed
exactly, the unsafe second confirmation, permissions, CSRF, moved-on refusals,
the audit trail, and the links between a fork and its origin."""

import re
import uuid

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.messages import get_messages
from django.test import Client

from everystep import history
from everystep.errors import EverystepError
from everystep.models import RunFork, Step, Workflow

from .conftest import CHARGE, FETCH, FLAKY, HTMX

MOUNT = "/admin/everystep/workflow/"
RECEIPT = "tests.ui.control_workflows.receipt"
CHECKOUT = "tests.ui.control_workflows.checkout"
STATUSES = [status for status, _ in Workflow.Status.choices]
ALLOWED = {"rerun": {"completed", "failed", "stopped"}, "fork": {"completed", "failed", "stopped", "blocked"}}
PERMISSIONS = ["retry_workflow", "stop_workflow", "resolve_workflow", "requeue_workflow"]


@pytest.fixture
def fanned(make_run):
    """``fanned(status)``: a run with a fork whose branch 2.1 holds an unsafe charge
    recorded after step 2.0.1, then a step after the fork."""

    def make(status="completed", **fields):
        steps = [
            {"step_id": "1", "name": FETCH},
            {"step_id": "2.0.1", "name": FLAKY},
            {"step_id": "2.1.1", "name": CHARGE, "result": {"charged": 5}},
            {"step_id": "2.0.2", "name": FETCH},
            {"step_id": "3", "name": RECEIPT, "result": "receipt"},
        ]
        if status == "running":
            fields.setdefault("claimed_by", "worker-1")
        return make_run(name=CHECKOUT, status=status, steps=steps, **fields)

    return make


def step_of(run, step_id) -> Step:
    return Step.objects.get(workflow=run, step_id=step_id)


def url(run, step, action, mount=MOUNT):
    return f"{mount}{run.pk}/run/steps/{step.pk}/{action}/"


def run_page(run, mount=MOUNT):
    return f"{mount}{run.pk}/run/"


def seen(run, action="rerun", step_id="2.0.1") -> dict:
    if action == "rerun":
        return {"seen_status": run.status, "seen_mark": history.rerun_preview(run.pk, step_id).mark}
    # A fork's confirmation also names the run it makes.
    return {"seen_status": run.status, "seen_mark": history.fork_preview(run.pk, step_id).mark,
            "fork_id": str(uuid.uuid4())}


def post(client, run, step_id, action="rerun", **data):
    form = {**seen(run, action, step_id), **data}
    return client.post(url(run, step_of(run, step_id), action), form)


def step_ids(run) -> list[str]:
    return list(Step.objects.filter(workflow=run).order_by("id").values_list("step_id", flat=True))


def status_of(run) -> str:
    return Workflow.objects.values_list("status", flat=True).get(pk=run.pk)


def messages_of(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def history_of(run):
    return list(LogEntry.objects.filter(object_id=str(run.pk)).order_by("id"))


# ---------------------------------------------------------------- offered on each recorded step


@pytest.mark.parametrize("status", STATUSES)
def test_each_recorded_step_offers_the_actions_the_run_status_allows(admin_client, fanned, status):
    run = fanned(status)
    for step_id in ("1", "2.0.1", "3"):
        step = step_of(run, step_id)
        for page in (admin_client.get(f"{MOUNT}{run.pk}/run/steps/{step.pk}/", **HTMX).text,
                     admin_client.get(f"{MOUNT}{run.pk}/run/steps/{step.pk}/").text):
            found = re.findall(r'class="button es-action-(\w+)" href="([^"]+)"', page)
            expected = [name for name in ("rerun", "fork") if status in ALLOWED[name]]
            assert found == [(name, url(run, step, name)) for name in expected]
    hint = "Re-run from here, Fork from here:" if status in ALLOWED["rerun"] else "Fork from here:"
    page = admin_client.get(run_page(run)).text
    assert (hint in page) == (status in ALLOWED["fork"])


def test_the_step_buttons_load_the_confirmation_into_the_action_panel(admin_client, fanned):
    run = fanned()
    step = step_of(run, "2.0.1")
    panel = admin_client.get(f"{MOUNT}{run.pk}/run/steps/{step.pk}/", **HTMX).text
    target = 'hx-target="#es-action-panel" hx-swap="innerHTML show:top"'
    assert f'hx-get="{url(run, step, "rerun")}" {target}' in panel
    # The step page has an action panel of its own for them.
    page = admin_client.get(f"{MOUNT}{run.pk}/run/steps/{step.pk}/").text
    assert '<div id="es-action-panel"></div>' in page


# ---------------------------------------------------------------- the preview


def test_rerun_previews_exactly_what_it_discards_and_what_it_keeps(admin_client, fanned):
    run = fanned()
    page = admin_client.get(url(run, step_of(run, "2.0.1"), "rerun")).text
    assert "Django administration" in page and 'name="csrfmiddlewaretoken"' in page
    assert f"Re-run run <code title=\"{run.pk}\">" in page and "from step <code>2.0.1</code>?" in page
    cut, alongside = page.split('class="es-discarded es-cut"')[1].split('class="es-discarded es-alongside"')
    code = r"<td><code>([^<]+)</code></td>\s*"
    cells = code + code + r"<td>(\w+)</td>\s*<td>([^<]+)</td>"
    rows = re.findall(r"<tr( class=\"es-unsafe\")?>\s*" + cells, cut)
    assert rows == [
        ("", "2.0.1", FLAKY, "done", "the chosen step"),
        ("", "2.0.2", FETCH, "done", "later in branch 2.0"),
        ("", "3", RECEIPT, "done", "after parallel 2, which holds the chosen step"),
    ]
    assert "3 step rows\n    will be discarded and run again" in cut
    kept = re.findall(r"<tr><td><code>([^<]+)</code></td>.*?<td>([^<]+)</td></tr>", alongside)
    assert kept == [("2.1.1", "branch 2.1 runs alongside branch 2.0: kept")]
    assert "1 step row recorded later but kept" in alongside
    assert "unsafe-to-repeat step" not in page.split("es-alongside")[1].split("<form")[0]
    assert 'name="confirm_unsafe"' not in page
    mark = history.rerun_preview(run.pk, "2.0.1").mark
    assert f'<input type="hidden" name="seen_mark" value="{mark}"' in page
    assert '<input type="hidden" name="seen_status" value="completed"' in page
    assert step_ids(run) == ["1", "2.0.1", "2.1.1", "2.0.2", "3"] and history_of(run) == []


def test_unsafe_steps_are_named_and_need_a_second_confirmation(admin_client, fanned):
    run = fanned()
    page = admin_client.get(url(run, step_of(run, "1"), "rerun")).text
    warning = page.split('class="es-note es-unsafe-warning"')[1].split("</div>")[0]
    assert "1 unsafe-to-repeat step will run again" in warning
    assert f"<li><code>{CHARGE}</code> (step <code>2.1.1</code>, done)</li>" in warning
    label = "Yes, run this unsafe-to-repeat step again, although its effect may happen twice"
    assert f"{label}: {CHARGE} (step 2.1.1)" in page
    assert 'type="checkbox" name="confirm_unsafe"' in page

    for extra in ({}, HTMX):  # the first confirmation alone changes nothing
        response = admin_client.post(url(run, step_of(run, "1"), "rerun"), seen(run, step_id="1"), **extra)
        assert response.status_code == 200
        field = response.text.split('es-field-confirm_unsafe"')[1].split("es-form-buttons")[0]
        assert "Tick this to confirm that these unsafe-to-repeat steps run again" in field
        assert ("<html" in response.text) == (not extra)
    assert status_of(run) == "completed" and len(step_ids(run)) == 5 and history_of(run) == []

    response = post(admin_client, run, "1", confirm_unsafe="on")
    assert response.status_code == 302 and response["Location"] == run_page(run)
    assert status_of(run) == "scheduled" and step_ids(run) == []
    [entry] = history_of(run)
    assert f"2.1.1 {CHARGE} (done, unsafe to repeat)" in entry.change_message


def test_a_step_whose_function_cannot_be_found_here_is_confirmed_as_unsafe(admin_client, make_run):
    """The web process may not import every worker module: nothing then says
    the step is safe to repeat, and the operator is asked as for an unsafe one."""
    gone = "gone.module.charge"
    steps = [{"step_id": "1", "name": FETCH}, {"step_id": "2", "name": gone}]
    run = make_run(name=CHECKOUT, status="completed", steps=steps)
    unknown = "may be unsafe to repeat (its function cannot be found here)"
    page = admin_client.get(url(run, step_of(run, "1"), "fork")).text
    assert f"<td><strong>{unknown}:</strong> its effect will happen again</td>" in page
    warning = page.split('class="es-note es-unsafe-warning"')[1].split("</div>")[0]
    assert f"<li><code>{gone}</code> (step <code>2</code>, done, {unknown})</li>" in warning
    assert f"its effect may happen twice: {gone}, {unknown} (step 2)" in page

    response = post(admin_client, run, "1", "fork")
    assert response.status_code == 200 and "Tick this to confirm" in response.text
    assert not RunFork.objects.exists() and history_of(run) == []
    response = post(admin_client, run, "1", "fork", confirm_unsafe="on")
    assert response.status_code == 302 and RunFork.objects.filter(origin_id=run.pk).count() == 1


# ---------------------------------------------------------------- acting


def test_rerun_discards_the_rows_logs_it_and_says_so(admin_client, fanned):
    run = fanned("failed", error={"type": "builtins.ValueError", "message": "x", "args": []})
    response = post(admin_client, run, "2.0.1")
    assert response.status_code == 302 and response["Location"] == run_page(run)
    row = Workflow.objects.get(pk=run.pk)
    assert (row.status, row.error, row.completed_at) == ("scheduled", None, None)
    assert step_ids(run) == ["1", "2.1.1"]
    [entry] = history_of(run)
    assert entry.action_flag == CHANGE and entry.user.username == "admin"
    assert entry.change_message == (
        f"Re-ran from step 2.0.1: failed -> scheduled; discarded 3 step rows: 2.0.1 {FLAKY} (done), "
        f"2.0.2 {FETCH} (done), 3 {RECEIPT} (done)."
    )
    [message] = messages_of(response)
    assert message == f"Run {run.pk}: {entry.change_message}"


def test_htmx_posts_get_a_client_redirect(admin_client, fanned):
    run = fanned()
    partial = admin_client.get(url(run, step_of(run, "3"), "rerun"), **HTMX)
    assert "<html" not in partial.text and 'hx-target="#es-action-panel"' in partial.text
    response = admin_client.post(url(run, step_of(run, "3"), "rerun"), seen(run, step_id="3"), **HTMX)
    assert response["HX-Redirect"] == run_page(run)
    assert status_of(run) == "scheduled"


def test_fork_creates_the_run_links_both_ways_and_logs_on_both(admin_client, fanned):
    run = fanned("completed", idempotency_key="order-9", args=[{"order": 9}])
    response = post(admin_client, run, "2.0.2", "fork")
    fork = Workflow.objects.exclude(pk=run.pk).get()
    assert response.status_code == 302 and response["Location"] == run_page(fork)
    assert (fork.name, fork.args, fork.status) == (CHECKOUT, [{"order": 9}], "scheduled")
    assert fork.idempotency_key is None
    assert step_ids(fork) == ["1", "2.0.1", "2.1.1"]
    assert status_of(run) == "completed" and len(step_ids(run)) == 5
    assert RunFork.objects.get(run=fork).origin_step_id == "2.0.2"
    [on_origin] = history_of(run)
    assert on_origin.action_flag == CHANGE
    assert on_origin.change_message == (
        f"Forked from step 2.0.2 into run {fork.pk}: copied 3 step rows; left out 2 step rows: "
        f"2.0.2 {FETCH} (done), 3 {RECEIPT} (done)."
    )
    [on_fork] = history_of(fork)
    assert on_fork.action_flag == ADDITION
    assert on_fork.change_message == f"Forked from run {run.pk} at step 2.0.2."
    [message] = messages_of(response)
    assert message == f"Run {run.pk}: {on_origin.change_message}"

    fork_page = admin_client.get(run_page(fork)).text
    origin_row = fork_page.split('class="es-forked-from"')[1].split("</tr>")[0]
    assert f'<a href="{run_page(run)}"><code title="{run.pk}">' in origin_row
    assert "at step <code>2.0.2</code>" in origin_row
    origin_page = admin_client.get(run_page(run)).text
    forks_row = origin_page.split('class="es-forks"')[1].split("</tr>")[0]
    assert f'<a href="{run_page(fork)}"><code title="{fork.pk}">' in forks_row
    assert "from step <code>2.0.2</code>" in forks_row and "es-status-scheduled" in forks_row


def test_a_fork_confirmation_posted_twice_makes_one_fork(admin_client, fanned):
    """A double click, or the browser sending the form again: the confirmation
    names the run it makes, so the second post finds it and goes there."""
    run = fanned()
    page = admin_client.get(url(run, step_of(run, "3"), "fork")).text
    fork_id = re.search(r'<input type="hidden" name="fork_id" value="([^"]+)"', page)[1]
    form = {**seen(run, "fork", "3"), "fork_id": fork_id}
    first = admin_client.post(url(run, step_of(run, "3"), "fork"), form)
    again = admin_client.post(url(run, step_of(run, "3"), "fork"), form, **HTMX)

    fork = Workflow.objects.exclude(pk=run.pk).get()
    assert str(fork.pk) == fork_id and RunFork.objects.count() == 1
    assert first["Location"] == run_page(fork) and again["HX-Redirect"] == run_page(fork)
    # The fork's page then says both: what the first post did, and that the second did nothing.
    forked, already = messages_of(again)
    assert forked.startswith(f"Run {run.pk}: Forked from step 3 into run {fork.pk}")
    assert already == (
        f"run {run.pk} was already forked into run {fork.pk} by this request; nothing was changed"
    )
    assert len(history_of(run)) == 1 and len(history_of(fork)) == 1
    # Another confirmation makes another fork.
    assert post(admin_client, run, "3", "fork").status_code == 302
    assert RunFork.objects.filter(origin_id=run.pk).count() == 2


def test_a_fork_whose_origin_was_deleted_says_so(admin_client, fanned):
    run = fanned()
    fork, _ = history.fork_from_step(run.pk, "3")
    Workflow.objects.filter(pk=run.pk).delete()
    page = admin_client.get(run_page(fork)).text
    assert "a run since deleted" in page.split('class="es-forked-from"')[1].split("</tr>")[0]


def test_the_origin_lists_its_first_forks_and_counts_the_others(admin_client, fanned, monkeypatch):
    from everystep_ui import views

    monkeypatch.setattr(views, "FORKS_SHOWN", 2)
    run = fanned()
    forks = [history.fork_from_step(run.pk, "3")[0] for _ in range(3)]
    row = admin_client.get(run_page(run)).text.split('class="es-forks"')[1].split("</tr>")[0]
    assert re.findall(r'<code title="([^"]+)">', row) == [str(f.pk) for f in forks[:2]]
    assert "and 1 more" in row


# ---------------------------------------------------------------- refusals


REFUSED = [(action, status) for action in ALLOWED for status in STATUSES if status not in ALLOWED[action]]


@pytest.mark.parametrize("action,status", REFUSED)
def test_a_status_that_does_not_allow_it_is_refused(admin_client, fanned, action, status):
    run = fanned(status)
    page = admin_client.get(url(run, step_of(run, "3"), action)).text
    assert "<form" not in page.split('id="es-action-panel"')[1]
    assert f"Run {run.pk} is {status}: only a" in page
    data = {"seen_status": status, "seen_mark": "5:0"}
    response = admin_client.post(url(run, step_of(run, "3"), action), data)
    assert response.status_code == 302
    [message] = messages_of(response)
    assert "Nothing was changed" in message
    assert status_of(run) == status and len(step_ids(run)) == 5
    assert Workflow.objects.count() == 1 and history_of(run) == []


@pytest.mark.parametrize("action", ["rerun", "fork"])
def test_a_run_whose_status_moved_on_is_left_alone(admin_client, fanned, action):
    run = fanned()
    data = {**seen(run, action, "3"), "seen_status": "failed"}
    response = admin_client.post(url(run, step_of(run, "3"), action), data)
    [message] = messages_of(response)
    assert "moved on: it is completed now, not failed; nothing was changed" in message
    assert status_of(run) == "completed" and len(step_ids(run)) == 5 and Workflow.objects.count() == 1


@pytest.mark.parametrize("action", ["rerun", "fork"])
def test_a_run_whose_steps_changed_since_the_preview_is_left_alone(admin_client, fanned, action):
    run = fanned()
    data = seen(run, action, "2.0.1")
    # Another operator re-ran it from step 3, and it completed again.
    history.rerun_from_step(run.pk, "3")
    Step.objects.create(workflow=run, step_id="3", name=RECEIPT, status="done")
    Workflow.objects.filter(pk=run.pk).update(status="completed")
    response = admin_client.post(url(run, step_of(run, "2.0.1"), action), data)
    [message] = messages_of(response)
    assert "moved on: its recorded steps changed since they were shown; nothing was changed" in message
    assert len(step_ids(run)) == 5 and Workflow.objects.count() == 1 and history_of(run) == []


def test_a_step_row_gone_since_the_preview_is_reported(admin_client, fanned):
    run = fanned()
    step = step_of(run, "3")
    target = url(run, step, "rerun")
    data = seen(run, "rerun", "3")
    step.delete()
    response = admin_client.post(target, data)
    [message] = messages_of(response)
    assert "the step row you chose is no longer recorded; nothing was changed" in message
    assert status_of(run) == "completed" and admin_client.get(target).status_code == 404


def test_the_operation_refuses_a_run_that_moves_on_during_the_request(admin_client, fanned, monkeypatch):
    """The view's own checks passed; the operation's locked re-check refuses."""
    run = fanned()
    rerun = history.rerun_from_step

    def racing(run_id, step_id, **kwargs):
        Workflow.objects.filter(pk=run_id).update(status="running", claimed_by="worker-2")
        return rerun(run_id, step_id, **kwargs)

    monkeypatch.setattr(history, "rerun_from_step", racing)
    response = post(admin_client, run, "3")
    [message] = messages_of(response)
    assert "moved on: it is running now, not completed" in message
    assert len(step_ids(run)) == 5 and history_of(run) == []


@pytest.mark.parametrize("action", ["rerun", "fork"])
def test_unknown_and_malformed_ids_are_not_found(admin_client, fanned, make_run, action):
    run = fanned()
    other = make_run(status="completed", steps=[{"step_id": "1"}])
    foreign = step_of(other, "1").pk
    for path in (
        f"{MOUNT}{run.pk}/run/steps/{foreign}/{action}/",
        f"{MOUNT}{run.pk}/run/steps/nope/{action}/",
        f"{MOUNT}nope/run/steps/1/{action}/",
        f"{MOUNT}{uuid.UUID(int=9)}/run/steps/1/{action}/",
    ):
        assert admin_client.get(path).status_code == 404, path
    unknown = uuid.UUID(int=9)
    for path in (f"{MOUNT}{run.pk}/run/steps/nope/{action}/", f"{MOUNT}{unknown}/run/steps/nope/{action}/"):
        assert admin_client.post(path, {}).status_code == 404, path
    # A well-formed id of a run deleted since its confirmation was shown: a message, not a 404.
    response = admin_client.post(f"{MOUNT}{unknown}/run/steps/1/{action}/", {})
    assert response.status_code == 302 and response["Location"] == MOUNT
    assert messages_of(response) == [f"Run {unknown} no longer exists; nothing was changed."]


# ---------------------------------------------------------------- permissions and CSRF


@pytest.mark.parametrize("action", ["rerun", "fork"])
def test_each_needs_its_own_permission(operator_client, fanned, action):
    run = fanned()
    step = step_of(run, "3")
    other = "fork_workflow" if action == "rerun" else "rerun_workflow"
    for client in (operator_client(), operator_client(*PERMISSIONS, other)):
        assert client.get(url(run, step, action)).status_code == 403
        assert client.post(url(run, step, action), seen(run, action, "3")).status_code == 403
        panel = client.get(f"{MOUNT}{run.pk}/run/steps/{step.pk}/", **HTMX).text
        assert f"es-action-{action}" not in panel
    assert status_of(run) == "completed" and Workflow.objects.count() == 1 and history_of(run) == []
    allowed = operator_client(f"{action}_workflow")
    assert f"es-action-{action}" in allowed.get(f"{MOUNT}{run.pk}/run/steps/{step.pk}/", **HTMX).text
    assert allowed.get(url(run, step, action)).status_code == 200
    assert allowed.post(url(run, step, action), seen(run, action, "3")).status_code == 302
    assert len(history_of(run)) == 1


def test_viewers_see_neither_buttons_nor_hint(viewer_client, fanned):
    run = fanned()
    assert "es-step-actions-hint" not in viewer_client.get(run_page(run)).text
    step = step_of(run, "3")
    assert "es-step-actions" not in viewer_client.get(f"{MOUNT}{run.pk}/run/steps/{step.pk}/", **HTMX).text


def test_anonymous_users_go_to_the_login_page(fanned):
    run = fanned()
    response = Client().post(url(run, step_of(run, "3"), "rerun"), {})
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert status_of(run) == "completed"


@pytest.mark.parametrize("action", ["rerun", "fork"])
def test_a_post_without_csrf_token_is_refused(fanned, django_user_model, action):
    run = fanned()
    client = Client(enforce_csrf_checks=True)
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", "pw"))
    target = url(run, step_of(run, "3"), action)
    assert client.post(target, seen(run, action, "3")).status_code == 403
    assert status_of(run) == "completed" and Workflow.objects.count() == 1
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', client.get(target).text).group(1)
    assert client.post(target, {**seen(run, action, "3"), "csrfmiddlewaretoken": token}).status_code == 302
    assert Workflow.objects.count() == (2 if action == "fork" else 1)


# ---------------------------------------------------------------- the trail and the standalone mount


def test_the_history_page_shows_the_rerun_and_the_fork(admin_client, fanned):
    run = fanned()
    post(admin_client, run, "3")
    Workflow.objects.filter(pk=run.pk).update(status="completed")
    post(admin_client, run, "2.0.2", "fork")
    html = admin_client.get(f"{MOUNT}{run.pk}/history/").text
    assert "Re-ran from step 3: completed -&gt; scheduled; discarded 1 step row" in html
    assert "Forked from step 2.0.2 into run" in html
    assert html.index("Re-ran") < html.index("Forked")


def test_the_standalone_mount_serves_both(admin_client, fanned):
    run = fanned()
    step = step_of(run, "3")
    page = admin_client.get(url(run, step, "rerun", "/everystep/")).text
    assert f'action="{url(run, step, "rerun", "/everystep/")}"' in page
    response = admin_client.post(url(run, step, "fork", "/everystep/"), seen(run, "fork", "3"))
    fork = Workflow.objects.exclude(pk=run.pk).get()
    assert response["Location"] == run_page(fork, "/everystep/")
    panel = admin_client.get(f"/everystep/{run.pk}/run/steps/{step.pk}/", **HTMX).text
    assert f'href="{url(run, step, "rerun", "/everystep/")}"' in panel


def test_engine_refusals_are_shown_not_raised(admin_client, fanned, monkeypatch):
    run = fanned()

    def refuse(*args, **kwargs):
        raise EverystepError("refused for a reason")

    monkeypatch.setattr(history, "fork_from_step", refuse)
    response = post(admin_client, run, "3", "fork")
    assert messages_of(response) == ["refused for a reason"]
    assert Workflow.objects.count() == 1


def test_no_hint_for_a_run_without_recorded_steps(admin_client, make_run):
    run = make_run(status="failed")
    assert "es-step-actions-hint" not in admin_client.get(run_page(run)).text
