"""Values one backend stores and another refuses, or stores as another type,
are refused alike before anything runs, so a run behaves the same on its
first pass, on replay and on every backend. (PostgreSQL's jsonb and text
columns refuse NUL and lone surrogates, libpq cuts text at a NUL, and jsonb
prints 1e+16 back as an integer; SQLite and MariaDB keep all of them.)"""

import collections
import enum

import pytest
from django.db import transaction

from everystep import runner
from everystep.api import schedule, step, workflow
from everystep.errors import EverystepError, SimulatedCrash
from everystep.models import Step, Workflow
from tests.helpers import CLAIMER, run_workflow

pytestmark = pytest.mark.django_db(transaction=True)

effects = []
Point = collections.namedtuple("Point", "x y")


@step
def act(value):
    effects.append(value)
    return value


@step
def raises():
    raise ValueError("bad record: a\x00b")


@step
def locate():
    return Point(1, 2)


@step
def local_enum():
    class Mood(enum.Enum):
        HAPPY = 1

    return Mood.HAPPY


@step
def measure():
    return 6.02e23


@step
def count():
    return 10**5000  # more digits than Python writes as text (4300)


@workflow
def passes(value):
    return value


# Built in the body: schedule() would refuse them as the run's own arguments.
UNSTORABLE = {"nul": "a\x00b", "lone surrogate": ["ok", "\ud800"], "nul in a key": {"k\x00": 1}}


@workflow
def passes_built(kind):
    return act(UNSTORABLE[kind])


@workflow
def named():
    return act("once", everystep_id="a\x00b")


@workflow
def catches():
    try:
        raises()
    except ValueError:
        return act("cleaned up")


@workflow
def calls(step_name):
    return {"locate": locate, "local_enum": local_enum, "count": count}[step_name]()


@workflow
def measures_twice():
    return [measure(), act("after")]


@pytest.fixture(autouse=True)
def no_effects():
    effects.clear()
    yield
    runner.fault = None


@pytest.mark.parametrize("kind", UNSTORABLE)
def test_an_argument_no_backend_stores_alike_fails_the_run_before_the_step_runs(kind):
    row = run_workflow(passes_built, kind)
    assert row.status == "failed"
    assert row.error["type"] == "everystep.errors.EverystepError"
    assert "the step did not run" in row.error["message"]
    assert effects == []
    assert not Step.objects.filter(workflow_id=row.id).exists()


def test_a_step_id_holding_a_nul_is_refused_before_the_step_runs():
    # libpq would store "a\x00b" as "a": two names would collide, and a replay
    # would not find the recorded step and run it again.
    row = run_workflow(named)
    assert row.status == "failed"
    assert "cannot be stored: it holds a NUL character" in row.error["message"]
    assert effects == []


def test_a_failure_whose_message_holds_a_nul_is_recorded_and_caught_by_the_body():
    row = run_workflow(catches)
    assert row.status == "completed", row.error
    assert effects == ["cleaned up"]
    failed = Step.objects.get(workflow_id=row.id, status="failed")
    assert failed.error["message"] == "bad record: a\\x00b"


def test_schedule_refuses_such_an_argument_and_writes_nothing():
    with transaction.atomic():
        with pytest.raises(EverystepError, match="NUL character"):
            schedule(passes, "a\x00b")
        assert Workflow.objects.count() == 0  # and the transaction is still usable


def test_schedule_refuses_an_int_too_long_to_write_as_json_and_writes_nothing():
    with pytest.raises(EverystepError, match="arguments are not serializable: .* more than 4300 digits"):
        schedule(passes, 10**5000)  # not a bare ValueError from the JSON writer
    assert not Workflow.objects.exists()


@pytest.mark.parametrize(
    "step_name, problem",
    [("locate", "would come back as a plain tuple"), ("local_enum", "cannot be imported back")],
)
def test_a_result_that_would_replay_as_another_value_is_refused_on_the_first_pass(step_name, problem):
    row = run_workflow(calls, step_name)
    assert row.status == "failed"
    assert problem in row.error["message"]
    assert not Step.objects.filter(workflow_id=row.id).exists()


def test_a_step_result_too_long_to_write_as_json_fails_the_run_with_the_documented_error():
    row = run_workflow(calls, "count")
    assert row.status == "failed"
    assert row.error["type"] == "everystep.errors.EverystepError"  # not builtins.ValueError
    assert "the return value is not serializable" in row.error["message"]
    assert not Step.objects.filter(workflow_id=row.id).exists()


def test_a_large_float_result_is_a_float_on_the_first_pass_on_replay_and_as_the_run_result():
    def crash_after_the_first_step(ctx, step_id):
        if step_id == "2":
            runner.fault = None
            raise SimulatedCrash(step_id)

    runner.fault = crash_after_the_first_step
    row = run_workflow(measures_twice)
    assert row.status == "running"
    runner.execute(Workflow.objects.get(id=row.id), CLAIMER)  # the restarted worker's replay
    row.refresh_from_db()
    assert row.status == "completed", row.error
    assert row.result == [6.02e23, "after"] and type(row.result[0]) is float
    assert type(Step.objects.get(workflow_id=row.id, step_id="1").result) is float
