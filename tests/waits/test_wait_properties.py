"""Property: a run of steps, sleeps and event waits that crashes at any fault
point (after a step's function, after a wait's started row, after a wait was
found over and before its record) and is resumed ends exactly as the uncrashed
run: same result, same step rows; only the step whose record the crash lost
runs again, once. Events are sent before the run reaches their wait or while
it waits; sleeps and timeouts end by ``wake_now``."""

import itertools
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from everystep import operations, runner, waits
from everystep.api import schedule
from everystep.errors import SimulatedCrash
from everystep.models import Step, Wait, Workflow
from tests.helpers import CLAIMER, run_once
from tests.waits import workflows as w

pytestmark = pytest.mark.django_db(transaction=True)


@st.composite
def shapes(draw):
    ops, early = [], []
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["step", "step", "sleep", "event", "timeout"]))
        if kind == "step":
            ops.append(["step", f"s{i}"])
        elif kind == "sleep":
            ops.append(["sleep"])
        else:
            ops.append(["event", f"e{i}"] + ([3600] if kind == "timeout" else []))
            if draw(st.booleans()):
                early.append(f"e{i}")
    return ops, early


def drive(run, fault=None):
    """Resume the run until it completes, ending each wait as it comes."""
    runner.fault = fault
    for _ in range(50):
        row = Workflow.objects.get(id=run.id)
        if row.status == "completed":
            return row
        if row.status == "scheduled":
            run_once(row)
        elif row.status == "running":  # a crashed pass: its worker restarts under its name
            runner.execute(row, CLAIMER)
        elif row.status == "waiting":
            wait = Wait.objects.get(run=row)
            if wait.kind == "event":
                waits.send_event(row.id, wait.key, f"v-{wait.key}")
            else:
                operations.wake_now(row.id)
        else:
            raise AssertionError(f"run ended {row.status}: {row.error}")
    raise AssertionError("the run did not complete")


def start(ops, early):
    nonce = uuid.uuid4().hex[:8]
    run = schedule(w.shaped, nonce, ops)
    for key in early:
        waits.send_event(run.id, key, f"v-{key}")
    return nonce, run


def rows(run):
    return list(Step.objects.filter(workflow_id=run.id).order_by("step_id").values_list(
        "step_id", "name", "status", "result"
    ))


def effects(nonce):
    return {label: n for label, n in w.effects.items() if label.startswith(f"{nonce}:")}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes())
def test_a_crash_at_any_fault_point_ends_as_the_uncrashed_run(shape):
    ops, early = shape
    calls = itertools.count(1)
    nonce, run = start(ops, early)
    reference = drive(run, fault=lambda ctx, step_id: next(calls))
    points = next(calls) - 1
    ref_rows = [row[1:] for row in rows(reference)]
    ref_effects = {label.split(":", 1)[1]: n for label, n in effects(nonce).items()}
    for crash_at in range(1, points + 1):
        seen = itertools.count(1)

        def fault(ctx, step_id, crash_at=crash_at, seen=seen):
            if next(seen) == crash_at:
                raise SimulatedCrash(f"crash at fault point {crash_at}")

        nonce, run = start(ops, early)
        ended = drive(run, fault)
        assert ended.result == [
            value.replace(reference.args[0], nonce) if isinstance(value, str) else value
            for value in reference.result
        ]
        assert [
            (name, status, result.replace(nonce, "N") if isinstance(result, str) else result)
            for name, status, result in (row[1:] for row in rows(ended))
        ] == [
            (name, status, result.replace(reference.args[0], "N") if isinstance(result, str) else result)
            for name, status, result in ref_rows
        ]
        mine = {label.split(":", 1)[1]: n for label, n in effects(nonce).items()}
        extra = {label: mine[label] - ref_effects[label] for label in ref_effects}
        assert set(mine) == set(ref_effects)
        assert all(n in (0, 1) for n in extra.values()) and sum(extra.values()) <= 1
    runner.fault = None
