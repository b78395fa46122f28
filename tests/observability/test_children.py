"""Child runs in the metrics and traces: a counter of children started (not
of replays that find them again), an event on the parent's run span, and the
wait for a child counted as a suspension of kind ``child``."""

import uuid

import pytest
from prometheus_client import REGISTRY

from everystep import operations, runner
from everystep.api import schedule
from everystep.errors import SimulatedCrash
from everystep.models import Workflow
from tests.core import child_workflows as cw
from tests.helpers import run_once
from tests.observability import workflows as ow

pytestmark = pytest.mark.django_db(transaction=True)

PARENT = "tests.core.child_workflows.starts_one_child"
CHILD = "tests.core.child_workflows.child_of"


def value(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0


def test_a_child_is_counted_once_when_started_not_when_a_replay_finds_it():
    name = f"runner-{uuid.uuid4().hex[:8]}"

    def crash_after_the_insert(ctx, step_id):
        runner.fault = None
        raise SimulatedCrash("crash after the child's insert")

    runner.fault = crash_after_the_insert
    parent = run_once(schedule(cw.starts_one_child, 1), name)
    labels = dict(workflow=PARENT, child=CHILD, runner=name)
    assert value("everystep_children_started_total", **labels) == 1
    operations.release_run(parent.id, name)
    assert run_once(Workflow.objects.get(id=parent.id), name).status == "completed"
    assert value("everystep_children_started_total", **labels) == 1  # found again, not started


def test_a_wait_for_a_child_is_a_suspension_of_kind_child():
    name = f"runner-{uuid.uuid4().hex[:8]}"
    assert run_once(schedule(cw.parent_of, "ok", "m"), name).status == "waiting"
    labels = dict(workflow="tests.core.child_workflows.parent_of", kind="child", runner=name)
    assert value("everystep_runs_suspended_total", **labels) == 1


def test_the_parents_run_span_names_each_child_it_started(spans):
    parent = run_once(schedule(cw.starts_two_children))
    [run] = [span for span in spans.get_finished_spans() if span.parent is None]
    events = [event for event in run.events if event.name == "everystep.child_started"]
    links = Workflow.objects.filter(parent_link__parent_id=parent.id)
    children = dict(links.values_list("parent_link__step_id", "id"))
    assert [dict(event.attributes) for event in events] == [
        {"everystep.step_id": step, "everystep.workflow": CHILD, "everystep.run_id": str(children[step])}
        for step in ("1", "second")
    ]


def test_children_started_in_parallel_branches_are_events_of_the_run_span(spans):
    # Not of the fork's span, which is the current one in the branch threads.
    assert run_once(schedule(ow.starts_children_in_branches)).status == "completed"
    [run] = [span for span in spans.get_finished_spans() if span.parent is None]
    started = [event for event in run.events if event.name == "everystep.child_started"]
    assert len(started) == 2
