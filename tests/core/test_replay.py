import asyncio
import math

import pytest
from django.db import transaction

from everystep import database, parallel, runner, sleep, start_child, step, wait_for_event, workflow
from everystep.api import schedule
from everystep.errors import EverystepError, SimulatedCrash
from everystep.models import Step, Workflow
from tests.core import workflows as w
from tests.helpers import CLAIMER, claim, crash_before_end, run_workflow

pytestmark = pytest.mark.django_db(transaction=True)


def crash_at(target):
    def fault(ctx, step_id):
        if step_id == target:
            runner.fault = None  # the process dies once
            raise SimulatedCrash(step_id)

    runner.fault = fault


@pytest.mark.parametrize("position", [1, 2, 3, 4])
def test_crash_at_every_position_reruns_exactly_the_unrecorded_step(position):
    crash_at(str(position))
    row = run_workflow(w.sequential, 4)
    assert row.status == "running" and row.claimed_by == CLAIMER  # left as a dead process leaves it
    assert row.steps.count() == position - 1
    runner.execute(Workflow.objects.get(id=row.id), CLAIMER)  # the restarted worker resumes it
    row.refresh_from_db()
    assert row.status == "completed"
    assert row.result == ["s1", "s2", "s3", "s4"]
    expected = {f"s{i}": 2 if i == position else 1 for i in range(1, 5)}
    assert dict(w.effects) == expected
    assert row.steps.count() == 4


def test_recorded_steps_are_served_without_running_again():
    row = run_workflow(w.three_steps)
    Workflow.objects.filter(id=row.id).update(status="running", claimed_by=CLAIMER)
    runner.execute(Workflow.objects.get(id=row.id), CLAIMER)
    assert dict(w.effects) == {"a": 1, "b": 1, "c": 1}
    assert Step.objects.filter(workflow_id=row.id).count() == 3


def test_failure_is_recorded_and_the_run_fails_with_it():
    row = run_workflow(w.failing)
    assert row.status == "failed"
    assert row.error == {"type": "builtins.ValueError", "message": "nope", "args": ["nope"]}
    assert row.completed_at is not None
    failed = row.steps.get(status="failed")
    assert failed.error["message"] == "nope"


NOT_EXCEPTIONS = {"CancelledError": asyncio.CancelledError, "SystemExit": SystemExit}


@step
def raises_a_base_exception(name):
    raise NOT_EXCEPTIONS[name](f"{name} from the step's code")


@workflow
def calls_a_step_raising(name, catch):
    try:
        return raises_a_base_exception(name)
    except BaseException as exc:
        if not catch:
            raise
        return type(exc).__name__


@pytest.mark.parametrize(
    "name, stored_type",
    [("CancelledError", "asyncio.exceptions.CancelledError"), ("SystemExit", "builtins.SystemExit")],
)
def test_a_step_raising_cancelled_error_or_system_exit_fails_like_any_exception(name, stored_type):
    row = run_workflow(calls_a_step_raising, name, False)
    assert (row.status, row.error["type"]) == ("failed", stored_type)
    assert row.steps.get().error["type"] == stored_type
    row = run_workflow(calls_a_step_raising, name, True)  # the body may catch it
    assert (row.status, row.result) == ("completed", name)


def test_cleanup_in_except_is_durable_across_a_crash():
    crash_at("3")  # crash while recording the cleanup step
    row = run_workflow(w.cleanup_on_failure)
    assert row.status == "running"
    runner.execute(Workflow.objects.get(id=row.id), CLAIMER)
    row.refresh_from_db()
    assert row.status == "completed"
    assert row.result == "cleaned up after payment declined"
    # the failed payment replays as the same exception: it is not attempted again
    assert w.effects["boom:payment declined"] == 1
    assert w.effects["reserve"] == 1
    assert w.effects["release"] == 2


def test_divergence_fails_the_run_naming_step_and_functions():
    row = run_workflow(w.three_steps)
    Step.objects.filter(workflow_id=row.id, step_id="2").update(name="tests.core.workflows.other")
    Workflow.objects.filter(id=row.id).update(status="running", claimed_by=CLAIMER)
    runner.execute(Workflow.objects.get(id=row.id), CLAIMER)
    row.refresh_from_db()
    assert row.status == "failed"
    assert row.error["type"] == "everystep.errors.WorkflowCodeError"
    for part in ("step 2", "tests.core.workflows.other", "tests.core.workflows.record", str(row.id)):
        assert part in row.error["message"]
    assert w.effects["c"] == 1  # nothing after the divergence ran on the second pass


def test_a_recorded_terminal_stays_final_on_replay():
    """The worker died after the Terminal step was recorded and before the run's
    end was written: the replay serves the Terminal, the body swallows it again,
    and still no further step starts."""
    row = run_workflow(w.terminal_then_more)
    assert row.status == "stopped" and w.effects["never"] == 0
    Workflow.objects.filter(id=row.id).update(status="running", error=None, completed_at=None)
    runner.execute(Workflow.objects.get(id=row.id), CLAIMER)
    row.refresh_from_db()
    assert (row.status, row.error["message"]) == ("stopped", "customer cancelled")
    assert (w.effects["start"], w.effects["stop_here"], w.effects["never"]) == (1, 1, 0)
    assert list(row.steps.values_list("step_id", flat=True)) == ["1", "2"]


def test_non_serializable_argument_fails_before_the_step_runs():
    row = run_workflow(w.unserializable_argument)
    assert row.status == "failed"
    assert "arguments are not serializable" in row.error["message"]
    assert row.steps.count() == 0


def test_non_serializable_result_is_not_recorded_and_the_step_reruns_on_resume():
    row = run_workflow(w.unserializable_result)
    assert row.status == "failed"
    assert "return value is not serializable" in row.error["message"]
    assert row.steps.count() == 0
    assert w.effects["make_object"] == 1


@pytest.fixture
def mariadb():
    connection = database.connection()
    if connection.vendor != "mysql" or not connection.mysql_is_mariadb:
        pytest.skip("only MariaDB's JSON check refuses a value every other backend stores")


@pytest.mark.usefixtures("mariadb")
def test_a_result_the_database_refuses_fails_the_run_instead_of_replaying_the_step_forever():
    # Taken for a row another pass wrote, the refusal requeued the run, and
    # every replay ran the step again.
    row = run_workflow(w.refused_result)
    assert row.status == "failed"
    assert "the database refused its record, so it was not recorded" in row.error["message"]
    assert row.steps.count() == 0
    assert w.effects["make_deep"] == 1


@pytest.mark.usefixtures("mariadb")
def test_an_unsafe_steps_argument_the_database_refuses_fails_before_the_step_runs():
    row = run_workflow(w.refused_unsafe_argument)  # not blocked: nothing started
    assert row.status == "failed"
    assert "the database refused its record, so the step did not run" in row.error["message"]
    assert row.steps.count() == 0
    assert w.effects["charge_deep"] == 0


@step
def raises_deep(depth):
    raise ValueError(w.nested(depth))


@workflow
def catches_a_deep_failure(depth):
    try:
        raises_deep(depth)
    except ValueError:
        return "caught"


@workflow
def fails_deep(depth):
    raise ValueError(w.nested(depth))


def test_a_failure_whose_arguments_nest_deep_is_recorded_and_ends_the_run():
    # Its arguments fit the 100 levels, its stored error (a level deeper, its
    # tags encoded again) did not: the step was not recorded, the run ended
    # with everystep's error, or execute() raised.
    assert run_workflow(catches_a_deep_failure, 99).result == "caught"
    row = run_workflow(fails_deep, 99)
    assert (row.status, row.error["type"]) == ("failed", "builtins.ValueError")


def test_unregistered_workflow_name_fails_clearly():
    row = Workflow.objects.create(name="tests.core.workflows.removed_long_ago", args=[])
    claim(row)
    runner.execute(Workflow.objects.get(id=row.id), CLAIMER)
    row.refresh_from_db()
    assert row.status == "failed"
    assert "no @workflow is registered" in row.error["message"]


def test_typed_values_round_trip_through_the_store():
    import datetime as dt
    import uuid

    payload = {"when": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "id": uuid.uuid4(),
               "raw": b"\x00\xff", "color": w.Color.RED, "span": dt.timedelta(hours=1), "pair": (1, 2)}
    row = run_workflow(w.typed_values, payload)
    assert row.result == payload
    assert Workflow.objects.get(id=row.id).args == [payload]
    assert row.steps.get().result == payload


@step
def negative_zero():
    return -0.0


signs = []


@workflow
def sign_of_a_step_result():
    signs.append(math.copysign(1.0, negative_zero()))


def test_a_replay_sees_a_negative_zero_step_result_with_its_sign():
    # jsonb has no negative zero: stored as a plain number, -0.0 replays as 0.0.
    signs.clear()
    row = run_workflow(sign_of_a_step_result)
    Workflow.objects.filter(id=row.id).update(status="running", claimed_by=CLAIMER)
    runner.execute(Workflow.objects.get(id=row.id), CLAIMER)
    assert signs == [-1.0, -1.0]


def test_stale_claimer_writes_nothing():
    run = schedule(w.three_steps)
    claim(run)
    Workflow.objects.filter(id=run.id).update(claimed_by="someone-else")
    result = runner.execute(Workflow.objects.get(id=run.id), CLAIMER)
    assert result is None
    assert Step.objects.filter(workflow_id=run.id).count() == 0
    assert Workflow.objects.get(id=run.id).status == "running"
    assert w.effects["b"] == 0  # no further step started after the fenced write


def test_step_arguments_are_stored_with_their_types():
    import datetime as dt

    payload = {"when": dt.date(2024, 1, 2), "pair": (1, 2), "$es": "user data"}
    row = run_workflow(w.typed_values, payload)
    step = row.steps.get()
    assert step.args == [payload]
    assert type(step.args[0]["pair"]) is tuple


def test_megabyte_payloads_round_trip():
    big = {"blob": "x" * (4 * 1024 * 1024), "raw": bytes(range(256)) * 4096}
    row = run_workflow(w.typed_values, big)
    assert row.status == "completed"
    assert row.result == big
    assert row.steps.get().result == big


def test_deeply_nested_argument_is_refused_by_schedule_and_nothing_is_written():
    nested = []
    for _ in range(5000):
        nested = [nested]
    with pytest.raises(EverystepError, match=r"\$\[0\]\[0\].*\.\.\..*: the value is nested more than 100"):
        schedule(w.typed_values, nested)
    assert not Workflow.objects.exists()


@pytest.mark.parametrize("workflow", [w.terminal_then_more, w.terminal_in_branch_caught])
def test_a_recorded_terminal_stops_the_run_again_on_replay(workflow):
    """The body catches the Terminal; a crash after its record and before the
    run's end must not let the resumed run go on past it."""
    run = schedule(workflow)
    with crash_before_end(), pytest.raises(SimulatedCrash):
        runner.execute(claim(run), CLAIMER)
    row = Workflow.objects.get(id=run.id)
    assert row.status == "running"
    failed = [step.error["type"] for step in row.steps.filter(status="failed")]
    assert failed == ["everystep.errors.Terminal"]
    recorded = sorted(row.steps.values_list("step_id", "status"))
    runner.execute(row, CLAIMER)  # the restarted worker resumes it
    row.refresh_from_db()
    assert row.status == "stopped"
    assert row.error["type"] == "everystep.errors.Terminal"
    assert w.effects["never"] == 0
    assert w.effects["stop_here"] == 1
    now = set(row.steps.values_list("step_id", "status"))
    assert set(recorded) <= now
    # Only the parallel sibling may be new: if the first pass's stop came before
    # it started, the replayed stop and the sibling race again.
    assert now - set(recorded) <= {("1.1.1", "done")}


@step(unsafe_to_repeat=True)
def charge():
    w.effect("charge")
    return "charged"


@workflow
def charges_then_waits_in_a_transaction():
    with transaction.atomic(using=database.alias()):
        charge()
        return wait_for_event("approval")  # its Suspended would roll the charge's rows back


@workflow
def sleeps_in_a_transaction():
    with transaction.atomic(using=database.alias()):
        sleep(60)


@workflow
def forks_in_a_transaction():
    with transaction.atomic(using=database.alias()):
        parallel(lambda: w.record("branch"))


@workflow
def starts_a_child_in_a_transaction():
    with transaction.atomic(using=database.alias()):
        start_child(w.sequential, 1)


@pytest.mark.parametrize(
    "body, what",
    [
        (charges_then_waits_in_a_transaction, "step tests.core.test_replay.charge"),
        (sleeps_in_a_transaction, "the wait everystep.sleep"),
        (forks_in_a_transaction, "parallel()"),
        (starts_a_child_in_a_transaction, "start_child(tests.core.workflows.sequential)"),
    ],
)
def test_a_step_or_wait_inside_a_body_transaction_fails_the_run_before_running_anything(body, what):
    row = run_workflow(body)
    assert row.status == "failed"
    assert row.error["type"] == "everystep.errors.EverystepError"
    assert f"{what} was called inside transaction.atomic()" in row.error["message"]
    assert "Commit the transaction before the call" in row.error["message"]
    assert not w.effects and not row.steps.exists()
    assert Workflow.objects.count() == 1  # no child either


@step
def books_in_a_transaction():
    with transaction.atomic(using=database.alias()):
        return w.record("booked")  # inside a step: a plain call


@workflow
def books():
    return books_in_a_transaction()


def test_a_steps_own_function_may_use_transactions():
    row = run_workflow(books)
    assert (row.status, row.result) == ("completed", "booked")


@pytest.mark.django_db(transaction=False)
def test_a_run_inside_a_django_test_cases_transaction_records_its_steps():
    row = run_workflow(w.sequential, 2)
    assert (row.status, row.result) == ("completed", ["s1", "s2"])


# A step's stored exception replays as the first pass raised it, also when its
# __init__ takes other arguments than it keeps in ``args``.


@step
def parse_json(text):
    import json

    return json.loads(text)


@step
def note_bad_input(message):
    return f"noted: {message}"


@workflow
def parse_or_note(text):
    try:
        return parse_json(text)
    except ValueError as exc:  # json.JSONDecodeError(msg, doc, pos)
        return note_bad_input(str(exc))


def test_a_caught_json_decode_error_is_caught_again_after_a_crash():
    uninterrupted = run_workflow(parse_or_note, "{not json")
    crash_at("2")
    row = run_workflow(parse_or_note, "{not json")
    assert row.status == "running"
    runner.execute(Workflow.objects.get(id=row.id), CLAIMER)
    row.refresh_from_db()
    assert (row.status, row.result) == (uninterrupted.status, uninterrupted.result) == (
        "completed",
        "noted: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
    )


class CardError(Exception):
    pass


class PaymentDeclined(CardError):
    def __init__(self, order_id, code):
        super().__init__(f"order {order_id}: card declined ({code})")
        self.order_id = order_id
        self.code = code


class Declined(CardError):
    def __init__(self, code):
        super().__init__(f"card declined: {code}")
        self.code = code


@step
def charge_card(kind):
    raise PaymentDeclined(7, "fraud") if kind == "PaymentDeclined" else Declined("fraud")


@step
def alert_fraud_team():
    return "alerted"


@step
def retry_later():
    return "retry scheduled"


@step
def close_order():
    return "closed"


@workflow
def charge_or_alert(kind):
    try:
        charge_card(kind)
    except CardError as exc:
        alert_fraud_team() if exc.code == "fraud" else retry_later()
    return close_order()


@pytest.mark.parametrize("kind", ["PaymentDeclined", "Declined"])
def test_a_caught_exception_with_its_own_init_replays_with_its_attributes(kind):
    """Rebuilt by calling the class with its stored args, ``PaymentDeclined``
    failed (``StepFailure``, not caught) and ``Declined`` got the message as its
    ``code`` (another branch: a false divergence)."""
    crash_at("3")
    row = run_workflow(charge_or_alert, kind)
    assert row.status == "running"
    runner.execute(Workflow.objects.get(id=row.id), CLAIMER)
    row.refresh_from_db()
    assert (row.status, row.result, row.error) == ("completed", "closed", None)
    assert row.steps.get(step_id="2").name.endswith("alert_fraud_team")


@step
def read_config(path):
    with open(path) as f:
        return f.read()


@workflow
def load_config(path):
    return read_config(path)


def test_an_uncaught_oserror_ends_the_resumed_run_with_the_same_error(tmp_path):
    missing = str(tmp_path / "missing.toml")
    uninterrupted = run_workflow(load_config, missing)
    run = schedule(load_config, missing)
    with crash_before_end(), pytest.raises(SimulatedCrash):
        runner.execute(claim(run), CLAIMER)
    row = Workflow.objects.get(id=run.id)
    runner.execute(row, CLAIMER)  # the restarted worker resumes it
    row.refresh_from_db()
    assert (row.status, row.error) == (uninterrupted.status, uninterrupted.error)
    assert row.error["message"] == f"[Errno 2] No such file or directory: {missing!r}"
