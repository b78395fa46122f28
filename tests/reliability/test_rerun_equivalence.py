"""Property: a run re-run in place from any of its recorded steps, or forked from
it, ends exactly as the uninterrupted run of the same shape, and runs again
exactly the steps the cut left out, once each.

Shapes and the reference run come from test_replay_equivalence (sequences,
named steps, nested forks with sequence branches, caught and uncaught
failures, ``try/except`` cleanup, ``Terminal``, unsafe steps). The rows left
out are checked against the rule written independently of ``everystep.history``:
a row is after step S when it was recorded no earlier than S and S and the row
do not lie in two different branches of one fork. A ``Terminal`` kept in a
branch alongside S stops the re-run before any step starts, S included.
"""

from collections import Counter

import pytest
from hypothesis import HealthCheck, event, example, given, settings

from everystep import history, runner
from everystep.api import schedule
from everystep.models import RunFork, Step, Workflow
from tests.helpers import CLAIMER, claim
from tests.reliability import replay_shapes as shapes
from tests.reliability.test_replay_equivalence import (
    holds_terminal,
    observe,
    reference_run,
    rows_of,
    shape_strategy,
)

pytestmark = pytest.mark.django_db(transaction=True)


def recording_order(run_id) -> list[str]:
    return list(Step.objects.filter(workflow_id=run_id).order_by("id").values_list("step_id", flat=True))


def alongside(a: str, b: str) -> bool:
    """Two step ids in different branches of one fork."""
    forks_a, forks_b = dict(shapes.branch_scopes(a)), dict(shapes.branch_scopes(b))
    return any(forks_b.get(fork, index) != index for fork, index in forks_a.items() if fork in forks_b)


def after(order: list[str], step_id: str) -> set[str]:
    later = order[order.index(step_id) :]
    return {other for other in later if other == step_id or not alongside(step_id, other)}


def fresh_run(shape, ref):
    """A new run of ``shape``, executed as the reference was."""
    shapes.reset()
    run = schedule(shapes.replayed, shape)
    runner.execute(claim(run), CLAIMER)
    assert rows_of(run.id) == ref.rows
    return run


def resume(run_id, ref, discarded: set[str], context) -> None:
    kept = rows_of(run_id)
    shapes.executions.clear()
    shapes.new_pass()
    runner.execute(claim(Workflow.objects.get(id=run_id)), CLAIMER)
    final = observe(run_id)
    assert (final.status, final.result, final.error) == (ref.status, ref.result, ref.error), context
    if holds_terminal(kept):  # kept in a branch alongside the step: no step starts after it
        assert (final.rows, final.executions) == (kept, Counter()), context
        return
    assert final.rows == ref.rows, context
    assert final.executions == Counter(discarded), context


def check_rerun(shape, ref, step_id: str) -> None:
    run = fresh_run(shape, ref)
    order = recording_order(run.id)
    cut = history.rerun_from_step(run.id, step_id, expected_status=ref.status, confirm_unsafe=True)
    discarded = {row.step_id for row in cut.discarded}
    context = f"re-run from {step_id} (recorded {order})"
    assert discarded == after(order, step_id), context
    assert set(rows_of(run.id)) == set(order) - discarded, context
    resume(run.id, ref, discarded, context)


def check_fork(shape, ref, origin, step_id: str) -> None:
    order = recording_order(origin.id)
    fork, cut = history.fork_from_step(origin.id, step_id, confirm_unsafe=True)
    discarded = {row.step_id for row in cut.discarded}
    context = f"fork from {step_id} (recorded {order})"
    assert discarded == after(order, step_id), context
    copied = rows_of(fork.id)
    assert copied == {s: row for s, row in ref.rows.items() if s not in discarded}, context
    assert recording_order(fork.id) == [s for s in order if s not in discarded], context
    resume(fork.id, ref, discarded, context)
    assert rows_of(origin.id) == ref.rows, context


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(shape_strategy)
# Always tried: a fork of a one-step branch, an unsafe step in a sequence branch
# and a nested fork, a step after it; and a branch that fails, caught by the body.
@example([["step", None, "s1", "ok", False],
          ["fork", "fan", [["one", [["step", None, "s2", "ok", False]]],
                           ["seq", [[["step", None, "s3", "ok", True]],
                                    [["fork", None, [["one", [["step", None, "s4", "ok", False]]],
                                                     ["one", [["step", None, "s5", "ok", False]]]]]]]]]],
          ["step", "pay", "s6", "ok", True]])
@example([["try", [["fork", None, [["one", [["step", None, "s1", "fail", False]]],
                                   ["one", [["step", None, "s2", "ok", False]]]]]],
           [["step", None, "s3", "ok", False]]]])
def test_rerun_or_fork_from_any_step_ends_as_the_uninterrupted_run(shape):
    ref = reference_run(shape)
    event(f"reference run {ref.status}")
    origin = fresh_run(shape, ref)
    for step_id in recording_order(origin.id):
        check_rerun(shape, ref, step_id)
        check_fork(shape, ref, origin, step_id)
    assert RunFork.objects.filter(origin=origin).count() == len(ref.rows)
