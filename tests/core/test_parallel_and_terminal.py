import pytest

from everystep import parallel
from everystep.errors import Terminal
from tests.core import workflows as w
from tests.helpers import run_workflow

pytestmark = pytest.mark.django_db(transaction=True)


def test_terminal_in_a_step_stops_the_run_and_no_further_step_starts():
    row = run_workflow(w.terminal_then_more)
    assert row.status == "stopped"
    assert row.error["type"] == "everystep.errors.Terminal"
    assert row.error["args"] == ["customer cancelled", {"why": "customer cancelled"}]
    assert row.completed_at is not None
    assert w.effects["never"] == 0  # even though the body swallowed the Terminal
    step = row.steps.get(step_id="2")
    assert step.status == "failed" and step.error["type"] == "everystep.errors.Terminal"


def test_terminal_in_a_branch_wins_and_siblings_are_still_recorded():
    row = run_workflow(w.terminal_in_branch)
    assert row.status == "stopped"
    assert row.error["message"] == "branch says stop"
    assert w.effects["never"] == 0
    # a sibling step that was in flight finishes and is recorded; none starts after the stop
    assert w.effects["sibling"] == row.steps.filter(step_id="1.1.1", status="done").count()


def test_several_branch_failures_raise_an_exception_group_and_healthy_ones_finish():
    row = run_workflow(w.two_branch_failures)
    assert row.status == "completed", row.error
    assert row.result == ["one", "two"]
    assert row.steps.get(step_id="1.2.1").status == "done"
    # on replay the group is rebuilt from the store: nothing runs again
    from everystep import runner
    from everystep.models import Workflow

    Workflow.objects.filter(id=row.id).update(status="running", claimed_by="again")
    runner.execute(Workflow.objects.get(id=row.id), "again")
    assert w.effects["boom:one"] == w.effects["boom:two"] == w.effects["healthy"] == 1


def test_a_single_branch_failure_is_raised_as_is():
    row = run_workflow(w.one_branch_failure)
    assert row.result == "caught only"


def test_branches_run_concurrently():
    import threading

    barrier = threading.Barrier(3, timeout=5)
    # each branch waits for the other two: this only finishes if they overlap
    assert parallel(barrier.wait, barrier.wait, barrier.wait) is not None


def test_parallel_outside_a_run_keeps_the_same_error_rules():
    def stop():
        raise Terminal("stop")

    def fail():
        raise ValueError("x")

    with pytest.raises(Terminal):
        parallel(fail, stop, fail)
    with pytest.raises(ExceptionGroup):
        parallel(fail, fail)
    assert parallel(lambda: 1, [lambda: 2, lambda: 3]) == (1, (2, 3))


def test_a_branch_that_is_not_callable_is_refused():
    with pytest.raises(TypeError, match="branch 1"):
        parallel(lambda: 1, 42)
