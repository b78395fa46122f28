"""The intended step structure around waits and child runs: a sleep or an
event wait takes one step id, as at run time (checked against recorded runs);
a body that starts a child run is refused by name, since the wait of its
handle's result() is not followed."""

import datetime as dt

import pytest

from everystep import graph, waits
from everystep.api import schedule
from everystep.models import Step
from tests.core import child_workflows as cw
from tests.helpers import run_once
from tests.waits import workflows as w

pytestmark = pytest.mark.django_db(transaction=True)


def recorded(run) -> list[tuple[str, str]]:
    return list(Step.objects.filter(workflow_id=run.id).order_by("id").values_list("step_id", "name"))


def test_a_sleep_takes_one_step_id_as_at_run_time():
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).isoformat()
    run = run_once(schedule(w.naps_until, past))
    assert run.status == "completed"
    assert graph.intended_steps(w.naps_until).steps == recorded(run) == [
        ("1", waits.SLEEP), ("2", "tests.waits.workflows.note"),
    ]
    twice = graph.intended_steps(w.naps_twice).steps
    assert [name for _, name in twice].count(waits.SLEEP) == 2
    assert [step_id for step_id, _ in twice] == ["1", "2", "3", "second", "5"]


def test_an_event_wait_takes_one_step_id_as_at_run_time():
    run = schedule(w.awaits, "k")
    waits.send_event(run.id, "k", "v")
    run = run_once(run)
    assert run.status == "completed"
    assert graph.intended_steps(w.awaits).steps == recorded(run)


def test_everystep_id_given_to_a_wait_by_position_is_refused():
    def body():
        waits.sleep(1, "named")

    assert "given everystep_id by position" in graph.intended_steps(body).reason


def test_a_body_that_starts_a_child_is_refused_naming_start_child():
    reason = graph.intended_steps(cw.starts_one_child).reason
    assert reason == (
        "line 14: start_child() starts a child run: the wait of its handle's result() is not followed"
    )
