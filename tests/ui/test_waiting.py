"""Waiting runs in the UI: what they wait for (a time, an event, a child run),
Wake now and Send event (permission-gated, audited, guarded against a run
that moved on), and their count on the overview."""

import datetime as dt
import re

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.messages import WARNING, get_messages
from django.utils import timezone

from everystep import waits
from everystep.models import ChildRun, Event, Step, Wait, Workflow

from .test_actions import history, messages_of, run_page, seen_mark, url

pytestmark = pytest.mark.django_db

LATER = timezone.now().replace(microsecond=0) + dt.timedelta(hours=2)


@pytest.fixture
def waiting_run(make_run):
    """``waiting_run(kind)``: a run the engine left waiting at step 2 for a
    time, an event (``orders.approved``, with or without a timeout) or a child."""

    def make(kind, *, timeout=True):
        run = make_run(status="waiting", steps=[{"step_id": "1", "status": "done"}])
        name = {"time": waits.SLEEP, "event": waits.WAIT_FOR_EVENT, "child": "everystep.child_result"}[kind]
        key, wake_at = None, LATER
        if kind == "event":
            key, wake_at = "orders.approved", LATER if timeout else None
        if kind == "child":
            child = make_run(name="shop.workflows.ship", status="running", claimed_by="worker-9")
            ChildRun.objects.create(parent_id=run.pk, child_id=child.pk, step_id="2")
            key, wake_at = str(child.pk), None
        params = {"kind": kind, "key": key, "wake_at": wake_at}
        Step.objects.create(workflow=run, step_id="2", name=name, status="started", kwargs=params)
        Wait.objects.create(run=run, step_id="2", kind=kind, key=key, wake_at=wake_at)
        return run

    return make


def status_of(run) -> str:
    return Workflow.objects.values_list("status", flat=True).get(pk=run.pk)


def waiting_for(html: str) -> str:
    return " ".join(html.split('class="es-waiting-for"')[1].split("</tr>")[0].split())


# What a waiting run waits for


def test_a_sleeping_run_shows_its_wake_time(admin_client, waiting_run):
    shown = waiting_for(admin_client.get(run_page(waiting_run("time"))).text)
    assert f"the time {LATER:%Y-%m-%d %H:%M:%S} UTC" in shown
    assert "at step <code>2</code>" in shown


def test_an_event_wait_shows_its_key_and_timeout(admin_client, waiting_run):
    shown = waiting_for(admin_client.get(run_page(waiting_run("event"))).text)
    assert "event <code>orders.approved</code>" in shown
    assert f"until {LATER:%Y-%m-%d %H:%M:%S} UTC (then it times out)" in shown
    shown = waiting_for(admin_client.get(run_page(waiting_run("event", timeout=False))).text)
    assert "event <code>orders.approved</code>" in shown and "times out" not in shown


def test_a_child_wait_links_the_child_with_its_status(admin_client, waiting_run):
    run = waiting_run("child")
    child = Workflow.objects.get(parent_link__parent_id=run.pk)
    shown = waiting_for(admin_client.get(run_page(run)).text)
    assert f'the end of child run <a href="{run_page(child)}">' in shown
    assert '<span class="es-badge es-status-running">running</span>' in shown


def test_only_a_waiting_run_shows_what_it_waits_for(admin_client, run_in):
    for status in ("scheduled", "running", "completed", "failed", "blocked"):
        assert 'class="es-waiting-for"' not in admin_client.get(run_page(run_in(status))).text


# Send event


def send(client, run, key="orders.approved", value='{"by": "ann"}', seen="waiting"):
    return client.post(url(run, "send_event"), {"seen_status": seen, "key": key, "value": value})


def test_send_event_wakes_a_run_waiting_for_it_and_logs_it(admin_client, waiting_run):
    run = waiting_run("event")
    page = " ".join(admin_client.get(url(run, "send_event")).text.split())
    assert 'name="key" value="orders.approved"' in page  # the awaited key, filled in
    assert "Waits for event <code>orders.approved</code>" in page
    response = send(admin_client, run)
    assert response.status_code == 302 and response["Location"] == run_page(run)
    assert status_of(run) == "scheduled"
    assert Event.objects.get(run_id=run.pk, key="orders.approved").value == {"by": "ann"}
    change = """Sent event 'orders.approved' with the value {"by": "ann"}: waiting -> scheduled."""
    [entry] = history(run)
    assert (entry.action_flag, entry.change_message, entry.user.username) == (CHANGE, change, "admin")
    assert messages_of(response) == [f"Run {run.pk}: {change}"]



def test_the_awaited_key_is_sent_as_it_is_trailing_space_and_all(admin_client, waiting_run):
    # The engine keeps "approved " and "approved" apart: the key filled in is
    # the one the run waits for, and the form must send it unchanged.
    run = waiting_run("event")
    Wait.objects.filter(run=run).update(key="approved ")
    awaited = {"kind": "event", "key": "approved ", "wake_at": None}
    Step.objects.filter(workflow=run, step_id="2").update(kwargs=awaited)
    assert 'name="key" value="approved "' in admin_client.get(url(run, "send_event")).text
    assert send(admin_client, run, key="approved ").status_code == 302
    assert list(Event.objects.filter(run_id=run.pk).values_list("key", flat=True)) == ["approved "]
    assert status_of(run) == "scheduled"

def test_an_event_the_run_does_not_wait_for_is_kept(admin_client, waiting_run):
    run = waiting_run("time")
    response = send(admin_client, run, key="later", value="42")
    assert status_of(run) == "waiting"
    assert Event.objects.get(run_id=run.pk, key="later").value == 42
    [message] = messages_of(response)
    assert message.endswith("Sent event 'later' with the value 42; the run does not wait for it yet, "
                            "it is kept until it does.")


def test_a_second_value_for_a_key_is_not_stored_nor_logged_and_warns(admin_client, waiting_run):
    run = waiting_run("time")
    send(admin_client, run, key="k", value='"first"')
    response = send(admin_client, run, key="k", value='"second"')  # or the first, posted twice
    assert Event.objects.get(run_id=run.pk, key="k").value == "first"
    last = list(get_messages(response.wsgi_request))[-1]
    assert (last.level, str(last)) == (
        WARNING, f"Run {run.pk}: event 'k' was sent before: the first value is kept, this one was not stored."
    )
    assert [entry.change_message for entry in history(run)] == [
        """Sent event 'k' with the value "first"; the run does not wait for it yet, """
        "it is kept until it does."
    ]


@pytest.mark.parametrize(
    "key, value, field, problem",
    [
        ("k", "{not json", "value", "Not valid JSON"),
        ("k", "", "value", "This field is required."),
        ("k", '"\\u0000"', "value", "Cannot be stored"),  # valid JSON everystep does not store
        ("k", '"\\ud800"', "value", "Cannot be stored"),
        ("", "1", "key", "This field is required."),
        ("k" * 256, "1", "key", "Ensure this value has at most 255 characters"),
    ],
)
def test_bad_input_is_a_form_error_and_changes_nothing(admin_client, waiting_run, key, value, field, problem):
    run = waiting_run("event")
    response = send(admin_client, run, key=key, value=value)
    assert response.status_code == 200
    errors = re.search(rf'es-field-{field}">.*?</div>\s*(<ul class="errorlist".*?</ul>)', response.text, re.S)
    assert errors and problem in errors.group(1)
    assert status_of(run) == "waiting"
    assert not Event.objects.exists()
    assert history(run) == []


def test_send_event_to_a_run_that_moved_on_changes_nothing(admin_client, waiting_run):
    run = waiting_run("event")
    Workflow.objects.filter(pk=run.pk).update(status="scheduled")  # a worker's wake_due, meanwhile
    response = send(admin_client, run)
    assert not Event.objects.exists()
    assert history(run) == []
    [message] = messages_of(response)
    assert "moved on: it is scheduled now, not waiting; nothing was changed" in message


def test_send_event_is_offered_only_to_waiting_runs(admin_client, run_in):
    run = run_in("running")
    assert "es-action-send_event" not in admin_client.get(run_page(run)).text
    response = send(admin_client, run, seen="running")
    assert "only a waiting run can be sent an event" in messages_of(response)[0]
    assert not Event.objects.exists()


def test_send_event_needs_its_permission(operator_client, waiting_run):
    run = waiting_run("event")
    for client in (operator_client(), operator_client("wake_workflow", "stop_workflow", "retry_workflow")):
        assert "es-action-send_event" not in client.get(run_page(run)).text
        assert client.get(url(run, "send_event")).status_code == 403
        assert send(client, run).status_code == 403
    assert not Event.objects.exists() and status_of(run) == "waiting"
    allowed = operator_client("send_event_workflow")
    assert "es-action-send_event" in allowed.get(run_page(run)).text
    assert send(allowed, run).status_code == 302
    assert status_of(run) == "scheduled"
    [entry] = LogEntry.objects.filter(object_id=str(run.pk))
    assert entry.user.username == "operator-send_event_workflow"


def test_send_event_with_a_deeply_nested_value_is_stored_or_refused_truthfully(admin_client, waiting_run):
    """SQLite and PostgreSQL store it; MariaDB refuses it (JSON nested past 32 levels)."""
    run = waiting_run("event")
    response = send(admin_client, run, value="[" * 40 + "1" + "]" * 40)
    stored = Event.objects.filter(run_id=run.pk, key="orders.approved").exists()
    if stored:
        assert status_of(run) == "scheduled"
    else:
        # Never sent before: the message must not claim it was, and a run
        # must not be woken for an event that was not stored.
        assert not any("was sent before" in message for message in messages_of(response))
        assert status_of(run) == "waiting"
        row = response.text.split('es-field-value"')[1].split("es-form-row")[0]
        assert "the database refused the value, nothing was stored" in row
        assert history(run) == []


# Wake now


def wake(client, run, seen="waiting", **mark):
    return client.post(url(run, "wake"), {"seen_status": seen, **(mark or seen_mark(client, run, "wake"))})


def test_wake_now_ends_a_sleep_and_logs_it(admin_client, waiting_run):
    run = waiting_run("time")
    page = " ".join(admin_client.get(url(run, "wake")).text.split())
    assert f"Waits for the time {LATER:%Y-%m-%d %H:%M:%S} UTC" in page
    response = wake(admin_client, run)
    assert response.status_code == 302
    assert status_of(run) == "scheduled"
    assert Step.objects.get(workflow=run, step_id="2").status == "done"  # the sleep returns at once
    assert not Wait.objects.filter(run=run).exists()
    [entry] = history(run)
    assert entry.change_message == "Woken now: waiting -> scheduled."
    assert messages_of(response) == [f"Run {run.pk}: Woken now: waiting -> scheduled."]


@pytest.mark.parametrize(
    "kind, timeout, refusal",
    [
        ("child", True, "waits for a child, which only its end wakes; nothing was changed"),
        ("event", False, "without a timeout: send it the event (send_event) instead; nothing was changed"),
    ],
)
def test_wake_now_refuses_a_wait_only_its_event_or_child_ends(
    admin_client, waiting_run, kind, timeout, refusal
):
    run = waiting_run(kind, timeout=timeout)
    response = wake(admin_client, run)
    assert status_of(run) == "waiting"
    assert Step.objects.get(workflow=run, step_id="2").status == "started"
    assert history(run) == []
    [message] = messages_of(response)
    assert refusal in message


def test_wake_now_of_a_run_that_moved_on_changes_nothing(admin_client, waiting_run):
    run = waiting_run("time")
    Workflow.objects.filter(pk=run.pk).update(status="stopped")
    response = wake(admin_client, run)
    assert status_of(run) == "stopped"
    assert history(run) == []
    assert "moved on: it is stopped now, not waiting; nothing was changed" in messages_of(response)[0]


def test_wake_now_does_not_end_a_wait_the_confirmation_did_not_show(admin_client, waiting_run):
    """The sleep shown ended meanwhile and the run waits at step 3 for an
    event with a timeout: confirming must not time out that wait."""
    run = waiting_run("time")  # sleeping at step 2
    page = " ".join(admin_client.get(url(run, "wake")).text.split())
    assert "Waits for the time" in page
    shown = seen_mark(admin_client, run, "wake")
    Wait.objects.filter(run=run).delete()
    Step.objects.filter(workflow=run, step_id="2").update(status="done")
    params = {"kind": "event", "key": "orders.approved", "wake_at": LATER.isoformat()}
    Step.objects.create(workflow=run, step_id="3", name=waits.WAIT_FOR_EVENT, status="started", kwargs=params)
    Wait.objects.create(run=run, step_id="3", kind="event", key="orders.approved", wake_at=LATER)
    Workflow.objects.filter(pk=run.pk).update(status="waiting")
    response = wake(admin_client, run, **shown)
    assert Step.objects.get(workflow=run, step_id="3").status == "started", messages_of(response)
    assert Workflow.objects.get(pk=run.pk).status == "waiting" and history(run) == []
    [message] = messages_of(response)
    assert "moved on: the waits changed since they were shown; nothing was changed" in message


def test_wake_now_does_not_end_a_new_wait_at_the_same_step_after_a_re_run(admin_client, waiting_run):
    """ABA: the confirmation showed the sleep at step 2. Meanwhile another
    operator stopped the run and re-ran it from step 2, and it sleeps at step 2
    again, until another time: a wait the confirmation never showed."""
    from everystep import history as runs_history
    from everystep import operations

    run = waiting_run("time")
    shown = seen_mark(admin_client, run, "wake")
    operations.stop_run(run.pk)
    runs_history.rerun_from_step(run.pk, "2", expected_status="stopped")
    again = LATER + dt.timedelta(days=1)  # the worker replays it to step 2: a new row and wait
    params = {"kind": "time", "key": None, "wake_at": again.isoformat()}
    Step.objects.create(workflow=run, step_id="2", name=waits.SLEEP, status="started", kwargs=params)
    Wait.objects.create(run=run, step_id="2", kind="time", wake_at=again)
    Workflow.objects.filter(pk=run.pk).update(status="waiting")
    response = wake(admin_client, run, **shown)
    assert status_of(run) == "waiting", messages_of(response)
    assert Step.objects.get(workflow=run, step_id="2").status == "started"
    assert "moved on" in messages_of(response)[0]


@pytest.mark.parametrize("everystep_id", ["cooldown ", " cooldown", " "])
def test_wake_now_of_a_wait_whose_step_id_has_edge_spaces(admin_client, make_run, everystep_id):
    # sleep(60, everystep_id="cooldown ") is a step id of its own: its wait was
    # refused as moved on at every confirm (the mark named it, stripped).
    run = make_run(status="waiting", steps=[{"step_id": "1", "status": "done"}])
    params = {"kind": "time", "key": None, "wake_at": LATER.isoformat()}
    Step.objects.create(workflow=run, step_id=everystep_id, name=waits.SLEEP, status="started", kwargs=params)
    Wait.objects.create(run=run, step_id=everystep_id, kind="time", wake_at=LATER)
    response = wake(admin_client, run, **seen_mark(admin_client, run, "wake"))
    assert status_of(run) == "scheduled", messages_of(response)
    assert Step.objects.get(workflow=run, step_id=everystep_id).status == "done"


def test_wake_now_needs_its_permission(operator_client, waiting_run):
    run = waiting_run("time")
    for client in (operator_client(), operator_client("send_event_workflow", "stop_workflow")):
        assert "es-action-wake" not in client.get(run_page(run)).text
        assert wake(client, run).status_code == 403
    assert status_of(run) == "waiting"
    allowed = operator_client("wake_workflow")
    assert "es-action-wake" in allowed.get(run_page(run)).text
    assert wake(allowed, run).status_code == 302
    assert status_of(run) == "scheduled"


# The overview


def test_the_overview_counts_waiting_runs(admin_client, waiting_run):
    waiting_run("time")
    waiting_run("event")
    html = admin_client.get("/admin/everystep/workflow/overview/").text
    counts = dict(re.findall(r'data-status="(\w+)">(\d+)<', html))
    assert counts["waiting"] == "2"
    assert '<a href="/admin/everystep/workflow/?status=waiting">' in html
