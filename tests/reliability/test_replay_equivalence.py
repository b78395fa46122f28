"""Property: a run that crashes anywhere and is resumed ends exactly as the
uncrashed run of the same shape, but for the documented re-runs.

For each generated shape (tests/reliability/replay_shapes.py) the uncrashed run
is the reference: its status, result, error, step rows, how many times each
step's function ran, and the order in which steps reached their record (the
trace). Then the run is crashed at every position of the trace
(``runner.fault`` raising ``SimulatedCrash`` after the step's function ran,
before its record) and once after the last record, before the run's end is
written (``crash_before_end``). Inside forks it is also crashed with the last
step of each earlier sibling branch still in flight, its record either lost
with the process or landed just before; and just after the record of a fork's
last step while an earlier branch's last step is still in flight (with a
``Terminal`` there, the state between the Terminal's record and the run's end).
The run is then resumed. The rule:

- the crashed pass leaves the reference's rows for the steps it recorded and
  nothing else (plus a ``started`` row for an unsafe step caught mid-effect);
- after resume the run's status, result, error and rows are the reference's,
  and each step's function ran as often as in the reference plus once for
  every safe step whose function ran in the crashed pass but whose record is
  missing;
- an unsafe step whose record is missing is never run again: the resumed run
  ends ``blocked`` with ``EffectUncertain`` naming it; resolved with the value
  its function returned, the run then ends as the reference did;
- once the crashed pass recorded a ``Terminal``, the resumed run starts no step
  (a sibling lost in flight included) and ends as the reference did.
"""

import threading
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from everystep import operations, runner
from everystep.api import schedule
from everystep.errors import SimulatedCrash
from everystep.models import Step, Workflow
from tests.helpers import CLAIMER, claim, crash_before_end, run_once
from tests.reliability import replay_shapes as shapes

pytestmark = pytest.mark.django_db(transaction=True)

# ---------------------------------------------------------------- shapes

NAMES = ["pay", "ship", "mail", "fan"]
STEP_BUDGET = 10  # steps per shape, so that every example runs in well under a second


@st.composite
def raw_shapes(draw):
    """A tree of steps, forks (single and sequence branches, nested) and
    try/except, up to two forks deep, of about ``STEP_BUDGET`` steps."""
    left = [STEP_BUDGET]

    def name():
        return draw(st.sampled_from([None, None, *NAMES]))

    def step_node():
        left[0] -= 1
        behaviour = draw(st.sampled_from(["ok", "ok", "ok", "ok", "ok", "fail", "terminal"]))
        return ["step", name(), behaviour, draw(st.sampled_from([False, False, True]))]

    def nodes(depth, min_size=1):
        out = []
        for _ in range(draw(st.integers(min_size, 3))):
            if left[0] <= 0 and len(out) >= min_size:
                break
            kind = draw(st.sampled_from(["step", "step", "fork", "try"])) if depth else "step"
            if kind == "step" or left[0] <= 1:
                out.append(step_node())
            elif kind == "try":
                out.append(["try", nodes(depth - 1), nodes(0, min_size=0)])
            else:
                branches = []
                for _ in range(draw(st.integers(1, 3))):
                    if draw(st.booleans()):
                        branches.append(["one", nodes(depth - 1)])
                    else:
                        branches.append(["seq", [nodes(depth - 1), nodes(depth - 1)]])
                out.append(["fork", name(), branches])
        return out

    return nodes(2)


def finish(raw) -> list:
    """Number the steps' labels, and drop a name to a positional id where it
    would repeat in its scope (a try's body and handler share the enclosing
    scope; the parts of a sequence branch share one)."""
    labels = iter(range(1, 1000))

    def walk(nodes, seen: set) -> list:
        out = []
        for node in nodes:
            if node[0] == "try":
                out.append(["try", walk(node[1], seen), walk(node[2], seen)])
                continue
            name = node[1] if node[1] not in seen else None
            seen.add(name)
            if node[0] == "step":
                out.append(["step", name, f"s{next(labels)}", node[2], node[3]])
                continue
            branches = []
            for kind, body in node[2]:
                if kind == "one":
                    branches.append(["one", walk(body, set())])
                else:
                    scope: set = set()
                    branches.append(["seq", [walk(part, scope) for part in body]])
            out.append(["fork", name, branches])
        return out

    return walk(raw, set())


shape_strategy = raw_shapes().map(finish)

# ---------------------------------------------------------------- observing runs


@dataclass
class Observed:
    status: str
    result: object
    error: object
    rows: dict
    executions: Counter
    trace: list = field(default_factory=list)
    labels: dict = field(default_factory=dict)  # step id -> its node's label


def rows_of(run_id) -> dict:
    return {
        row["step_id"]: row
        for row in Step.objects.filter(workflow_id=run_id).values(
            "step_id", "name", "status", "args", "kwargs", "result", "error"
        )
    }


def holds_terminal(rows: dict) -> bool:
    return any((row["error"] or {}).get("type") == "everystep.errors.Terminal" for row in rows.values())


def observe(run_id, trace=()) -> Observed:
    row = Workflow.objects.get(id=run_id)
    return Observed(
        row.status, row.result, row.error, rows_of(run_id), Counter(shapes.executions), list(trace)
    )


def tracer(trace: list):
    def fault(ctx, step_id):
        trace.append(step_id)

    return fault


def reference_run(shape) -> Observed:
    shapes.reset()
    trace: list = []
    run = schedule(shapes.replayed, shape)
    runner.fault = tracer(trace)
    try:
        runner.execute(claim(run), CLAIMER)
    finally:
        runner.fault = None
    ref = observe(run.id, trace)
    ref.labels = dict(shapes.labels)
    assert ref.status in {"completed", "failed", "stopped"}, ref.error
    assert len(trace) == len(set(trace)), trace
    assert sorted(ref.rows) == sorted(trace)  # every step that ran is recorded once
    assert set(ref.executions.values()) <= {1}
    return ref


# ---------------------------------------------------------------- crash plans


@dataclass(frozen=True)
class Plan:
    """When the process dies: at the record of ``before`` (its function ran, its
    record is lost), just after the record of ``after``, or (neither given) just
    before the run's end is written. Meanwhile each ``in_flight`` step (the last
    step of a branch that precedes the death point's branch in a fork) is parked
    before its record while its later siblings go on; its record is then ``lost``
    with the process, or lands just before the process died."""

    before: str | None = None
    after: str | None = None
    in_flight: tuple = ()
    lost: bool = True

    @property
    def point(self) -> str | None:
        return self.before or self.after


def in_flight_candidates(trace: list, point: str) -> tuple:
    """The last step of each branch that precedes ``point``'s branch in a fork ``point`` lies in."""
    before = trace[: trace.index(point)]
    out = []
    for fork, index in shapes.branch_scopes(point):
        for earlier in range(index):
            inside = [s for s in before if s.startswith(f"{fork}.{earlier}.")]
            if inside:
                out.append(inside[-1])
    return tuple(out)


def recorded_while_in_flight(trace: list) -> list[tuple[str, str]]:
    """``(parked, last)`` for each branch of each fork: its last step, and the
    fork's last step in a later branch, recorded while ``parked`` is in flight
    (with a Terminal there, the state a crash leaves between the Terminal's
    record and the run's end)."""
    pairs = []
    for fork in sorted({fork for s in trace for fork, _ in shapes.branch_scopes(s)}):
        inside = [(s, dict(shapes.branch_scopes(s)).get(fork)) for s in trace]
        inside = [(s, index) for s, index in inside if index is not None]
        for branch in sorted({index for _, index in inside}):
            later = [s for s, index in inside if index > branch]
            if later:
                parked = [s for s, index in inside if index == branch][-1]
                pairs.append((parked, later[-1]))
    return pairs


def plans(ref: Observed) -> list[Plan]:
    out = [Plan()]
    for step_id in ref.trace:
        out.append(Plan(before=step_id))
        parked = in_flight_candidates(ref.trace, step_id)
        if parked:
            out.append(Plan(before=step_id, in_flight=parked, lost=True))
            out.append(Plan(before=step_id, in_flight=parked, lost=False))
    for parked, last in recorded_while_in_flight(ref.trace):
        out.append(Plan(after=last, in_flight=(parked,)))
    return out


class Death:
    """The fault hook (and the interpreter's after-call hook) carrying out a plan.
    A harness error is kept in ``problems`` (and raised as a BaseException), so
    that neither a body's ``except Exception`` nor a halted fork can hide it."""

    def __init__(self, plan: Plan, labels: dict):
        self.plan = plan
        self.after_label = labels.get(plan.after)
        self.dead = threading.Event()
        self.arrived: set = set()
        self.problems: list = []

    def problem(self, message: str):
        self.problems.append(message)
        raise shapes.HarnessError(message)

    def fault(self, ctx, step_id):
        plan = self.plan
        if step_id in plan.in_flight:
            self.arrived.add(step_id)
            point = dict(shapes.branch_scopes(plan.point))
            for fork, index in shapes.branch_scopes(step_id):
                if fork in point and index < point[fork]:
                    shapes.turns.finish(f"{fork}.{index}.")  # its later siblings go on
                    break
            if not self.dead.wait(shapes.TURN_TIMEOUT):
                self.problem(f"{step_id} waited {shapes.TURN_TIMEOUT}s for the crash at {plan}")
            if plan.lost:
                raise SimulatedCrash(f"{step_id} was in flight when the process died")
            return
        if self.dead.is_set():
            self.problem(f"{step_id} reached its record after the crash ({plan})")
        if step_id == plan.before:
            self.dead.set()
            raise SimulatedCrash(f"the process died at the record of {step_id}")

    def after_call(self, label):
        if label == self.after_label:
            self.dead.set()


def crashed_pass(shape, plan: Plan, labels: dict):
    shapes.reset()
    run = schedule(shapes.replayed, shape)
    claimed = claim(run)
    death = Death(plan, labels)
    runner.fault, shapes.after_call = death.fault, death.after_call
    try:
        if plan.before is None:  # the process dies before the run's end is written
            with crash_before_end():
                try:
                    written = runner.execute(claimed, CLAIMER)
                except SimulatedCrash:
                    written = "the end, lost"
            # With a step parked in flight the body cannot reach its end; a Terminal
            # recorded meanwhile still takes the run to its (lost) end.
            assert written == "the end, lost" or (plan.after and written is None), plan
        else:
            assert runner.execute(claimed, CLAIMER) is None
    finally:
        runner.fault, shapes.after_call = None, None
    assert not death.problems, death.problems
    assert death.arrived == set(plan.in_flight), plan
    assert death.dead.is_set() or plan.point is None, plan
    return run


def check_crash_and_resume(shape, ref: Observed, plan: Plan) -> None:
    run = crashed_pass(shape, plan, ref.labels)
    after = observe(run.id)
    context = f"plan {plan}"
    assert after.status == "running", context
    # The crash leaves the reference's rows for what it recorded, and nothing else.
    lost = {plan.before, *plan.in_flight} if plan.lost else {plan.before}
    lost.discard(None)
    for step_id, row in after.rows.items():
        if row["status"] == "started":
            assert step_id in lost and row["name"] == shapes.act_once.__everystep__.name, context
            assert (row["args"], row["kwargs"]) == (ref.rows[step_id]["args"], {}), context
        else:
            assert row == ref.rows[step_id], context
    # It ran the reference's steps up to the crash, once each.
    reached = ref.trace if plan.point is None else ref.trace[: ref.trace.index(plan.point) + 1]
    assert after.executions == Counter(reached), context
    missing = {s for s in reached if s not in after.rows}
    uncertain = [s for s in reached if after.rows.get(s, {}).get("status") == "started"]
    assert missing | set(uncertain) == lost, context

    shapes.new_pass()
    runner.execute(Workflow.objects.get(id=run.id), CLAIMER)  # the restarted worker
    row = Workflow.objects.get(id=run.id)
    if holds_terminal(after.rows):
        # No step starts after a recorded Terminal, not even one lost in flight
        # or caught mid-effect: the run with the Terminal's branch ahead of it.
        final = observe(run.id)
        assert (final.status, final.result, final.error) == (ref.status, ref.result, ref.error), context
        assert (final.rows, final.executions) == (after.rows, after.executions), context
        return
    if uncertain:
        event("resumed run blocked on an unsafe step")
    settled = after.rows  # what the pass just resumed started from
    for step_id in uncertain:  # at most once: each stops the run until resolved
        assert row.status == "blocked", (context, row.status, row.error)
        assert row.error["type"] == "everystep.errors.EffectUncertain", context
        assert f"step {step_id} (" in row.error["message"], context
        rows = rows_of(run.id)
        assert all(rows[s] == recorded for s, recorded in settled.items()), context
        assert shapes.executions[step_id] == 1, context
        if step_id not in shapes.returned:
            return  # it raised: no value to resolve it with; the block is what we check
        operations.resolve_step(run.id, step_id, result=shapes.returned[step_id])
        settled = rows_of(run.id)
        shapes.new_pass()
        row = run_once(row)
    final = observe(run.id)
    assert (final.status, final.result, final.error) == (ref.status, ref.result, ref.error), context
    assert final.rows == ref.rows, context
    assert final.executions == ref.executions + Counter(missing), context


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(shape_strategy)
# Always tried: a Terminal caught by the body, and one in a branch caught by the
# body with an unsafe step in a later branch and a step after the fork.
@example([["try", [["step", None, "s1", "terminal", False]], [["step", None, "s2", "ok", False]]],
          ["step", "pay", "s3", "ok", False]])
@example([["try", [["fork", "fan", [["one", [["step", None, "s1", "ok", False]]],
                                     ["seq", [[["step", None, "s2", "terminal", False]],
                                              [["step", None, "s3", "ok", False]]]],
                                     ["one", [["step", None, "s4", "ok", True]]]]]],
           []],
          ["step", None, "s5", "ok", False]])
def test_a_crash_anywhere_then_resume_ends_as_the_uncrashed_run(shape):
    ref = reference_run(shape)
    event(f"reference run {ref.status}")
    for plan in plans(ref):
        if plan.in_flight:
            event(f"crash with a sibling in flight ({'after' if plan.after else 'at'} a record)")
        check_crash_and_resume(shape, ref, plan)
