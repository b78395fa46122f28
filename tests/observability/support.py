"""Ways to end a run other than completing it, for the tests of what is (not)
reported, and a fresh process for what must be seen from its start."""

import os
import subprocess
import sys
from pathlib import Path

from everystep import runner
from everystep.api import schedule
from everystep.errors import DrainOrphan, SimulatedCrash
from everystep.models import Step, Workflow
from everystep.worker import Worker
from tests.core import workflows as w
from tests.helpers import CLAIMER, claim, run_once
from tests.observability import workflows as ow

ROOT = Path(__file__).resolve().parents[2]


def drain_after(steps: int):
    """A leave_check that asks the run to leave after ``steps`` step boundaries."""
    calls = []

    def leave_check():
        calls.append(1)
        if len(calls) > steps:
            return DrainOrphan("the worker is shutting down")
        return None

    return leave_check


def crash_at(target: str) -> None:
    def fault(ctx, step_id):
        if step_id == target:
            runner.fault = None  # the process dies once
            raise SimulatedCrash(step_id)

    runner.fault = fault


def fence_at(target: str) -> None:
    """Another worker takes the run over while step ``target`` runs."""

    def fault(ctx, step_id):
        if step_id == target:
            runner.fault = None
            Workflow.objects.filter(id=ctx.workflow_id).update(claimed_by="someone-else")

    runner.fault = fault


def blocked_run(claimer: str = CLAIMER) -> Workflow:
    """A run whose unsafe step was left ``started`` by a dead worker, replayed: it blocks."""
    run = claim(schedule(w.pays, 10), claimer)
    Step.objects.create(workflow=run, step_id="1", name="tests.core.workflows.charge", status="started")
    runner.execute(run, claimer)
    return Workflow.objects.get(id=run.id)


def resume(run: Workflow, claimer: str = CLAIMER) -> Workflow:
    """Replay a run left ``running`` (crash) or requeued (drain) to its end."""
    run.refresh_from_db()
    if run.status == Workflow.Status.SCHEDULED:
        return run_once(run, claimer)
    runner.execute(run, claimer)
    return Workflow.objects.get(id=run.id)


def run_with_an_unreadable_step(monkeypatch, claimer: str) -> Workflow:
    """A run whose recorded step result no longer decodes, taken by a worker: step 1
    recorded with ``Shade.LIGHT``, the run drained back to the queue, then ``Shade``
    removed (a deploy). The worker fails it."""
    row = run_once(schedule(ow.picks_a_shade), claimer, leave_check=drain_after(1))
    assert row.status == "scheduled"
    monkeypatch.delattr(ow, "Shade")
    Worker(
        pool_size=1, poll=0.05, name=claimer, stop_when_idle=True, install_signals=False, listen=False
    ).run()
    row.refresh_from_db()
    assert row.status == "failed"
    return row


def run_script(script: str, tmp_path, **env: str) -> subprocess.CompletedProcess:
    """``python -c script`` in a new process with the test settings (``env`` on top),
    on a SQLite file of its own and without the environment's Sentry or OpenTelemetry
    settings. For what is decided at import or set once per process."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("EVERYSTEP_TEST_", "SENTRY_", "OTEL_"))
    }
    environ.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        EVERYSTEP_TEST_SQLITE_NAME=str(tmp_path / "process.sqlite3"),
        PYTHONPATH=str(ROOT),
    )
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120
    )
