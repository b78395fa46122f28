"""everystep_rerun and everystep_fork: argv to the operations in
everystep.history, clear refusals (non-zero exit, nothing changed), and a real
worker process finishing what they scheduled, running again only the steps
the cut left out."""

import os
import signal
import subprocess
import sys
import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from everystep.models import RunFork, Step, Workflow
from tests.helpers import run_workflow
from tests.worker import workflows as w
from tests.worker.support import ROOT, database_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

MARK = "tests.worker.workflows.mark"
CHARGE = "tests.worker.workflows.charge"


def run_command(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def state(run) -> tuple:
    row = Workflow.objects.get(pk=run.pk)
    steps = Step.objects.filter(workflow_id=run.pk).order_by("id")
    steps = list(steps.values_list("id", "step_id", "status"))
    return row.status, row.result, row.completed_at, steps, Workflow.objects.count()


def starts(log, run) -> list[str]:
    log = w.read_log(log)
    return [index for event, run_id, index, *_ in log if event == "start" and run_id == str(run.pk)]


@pytest.fixture
def completed_chain(tmp_path):
    log = str(tmp_path / "steps.log")
    run = run_workflow(w.chain, log, 4)
    assert run.status == "completed" and starts(log, run) == ["1", "2", "3", "4"]
    return run, log


def test_rerun_then_a_worker_runs_again_only_the_steps_discarded(completed_chain, spawn_worker):
    run, log = completed_chain
    out = run_command("everystep_rerun", str(run.pk), "3")
    assert out.splitlines() == [
        f"run {run.pk} cut at step 3: 2 step rows kept",
        "2 step rows were discarded:",
        f"  3  {MARK}  (done; the chosen step)",
        f"  4  {MARK}  (done; later in the workflow body)",
        f"run {run.pk}: re-run from step 3; it is scheduled again",
    ]
    assert Workflow.objects.get(pk=run.pk).status == "scheduled"
    worker = spawn_worker("rerun-worker", "--poll", "0.05")
    wait_for(lambda: Workflow.objects.get(pk=run.pk).status == "completed", what="the worker to finish it")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert starts(log, run) == ["1", "2", "3", "4", "3", "4"]
    assert Workflow.objects.get(pk=run.pk).result == [1, 2, 3, 4]


def test_fork_then_a_worker_runs_the_fork(completed_chain, spawn_worker):
    run, log = completed_chain
    before = state(run)
    out = run_command("everystep_fork", str(run.pk), "4")
    fork = Workflow.objects.exclude(pk=run.pk).get()
    lines = out.splitlines()
    assert lines[:3] == [
        f"run {run.pk} cut at step 4: 3 step rows kept",
        "1 step row was not copied (they run anew in the fork):",
        f"  4  {MARK}  (done; the chosen step)",
    ]
    assert lines[3] == f"run {fork.pk}: forked from run {run.pk} at step 4; it is scheduled"
    assert RunFork.objects.get(run=fork).origin_id == run.pk
    worker = spawn_worker("fork-worker", "--poll", "0.05")
    wait_for(lambda: Workflow.objects.get(pk=fork.pk).status == "completed", what="the fork to finish")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert starts(log, fork) == ["4"]
    assert Workflow.objects.get(pk=fork.pk).result == [1, 2, 3, 4]
    assert state(run)[:4] == before[:4]


def test_dry_run_shows_the_cut_and_changes_nothing(completed_chain):
    run, _ = completed_chain
    before = state(run)
    out = run_command("everystep_rerun", str(run.pk), "2", "--dry-run")
    assert "3 step rows would be discarded:" in out and "re-run from step" not in out
    out = run_command("everystep_fork", str(run.pk), "2", "--dry-run")
    assert "3 step rows would not be copied (they run anew in the fork):" in out
    assert state(run) == before


def unsafe_run() -> Workflow:
    run = Workflow.objects.create(name="tests.worker.workflows.chain", status="failed", args=["x", 3])
    Step.objects.create(workflow=run, step_id="1", name=MARK, status="done", result=1)
    Step.objects.create(workflow=run, step_id="2", name=CHARGE, status="done", result=5)
    Step.objects.create(workflow=run, step_id="3", name=MARK, status="failed")
    return run


@pytest.mark.parametrize("command", ["everystep_rerun", "everystep_fork"])
def test_unsafe_steps_need_yes_unsafe(command):
    run = unsafe_run()
    before = state(run)
    with pytest.raises(CommandError) as refused:
        call_command(command, str(run.pk), "1")
    assert f"2 ({CHARGE})" in str(refused.value)
    assert str(refused.value).endswith("may happen again to go ahead. (--yes-unsafe)")
    assert state(run) == before
    out = run_command(command, str(run.pk), "1", "--yes-unsafe")
    unsafe = "[unsafe to repeat: its effect happens again]"
    assert f"  2  {CHARGE}  (done; later in the workflow body) {unsafe}" in out


@pytest.mark.parametrize(
    "command, args, message",
    [
        ("everystep_rerun", ["nope", "1"], "'nope' is not a valid run id"),
        ("everystep_fork", ["nope", "1"], "'nope' is not a valid run id"),
        ("everystep_rerun", [str(uuid.UUID(int=5)), "1"], "does not exist"),
        ("everystep_fork", [str(uuid.UUID(int=5)), "1"], "does not exist"),
        ("everystep_rerun", ["RUN", "7"], r"has no recorded step '7' \(recorded: 1, 2, 3\)"),
        ("everystep_fork", ["RUN", "7"], r"has no recorded step '7'"),
        ("everystep_rerun", ["RUN"], "the following arguments are required: step_id"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(command, args, message):
    run = unsafe_run()
    before = state(run)
    with pytest.raises(CommandError, match=message):
        call_command(command, *[str(run.pk) if arg == "RUN" else arg for arg in args])
    assert state(run) == before


@pytest.mark.parametrize(
    "command, status, message",
    [
        ("everystep_rerun", "running", "is running: only a failed or stopped or completed run can be re-run"),
        ("everystep_rerun", "blocked", "is blocked: only a failed or stopped or completed run"),
        ("everystep_fork", "scheduled", "is scheduled: only a completed or failed or stopped or blocked run"),
    ],
)
def test_a_status_that_does_not_allow_it_is_refused(command, status, message):
    run = unsafe_run()
    Workflow.objects.filter(pk=run.pk).update(status=status)
    before = state(run)
    for dry_run in ([], ["--dry-run"]):
        with pytest.raises(CommandError, match=message):
            call_command(command, str(run.pk), "3", *dry_run)
    assert state(run) == before


def test_a_refusal_exits_non_zero_with_the_message():
    run = unsafe_run()
    result = subprocess.run(
        [sys.executable, "-m", "django", "everystep_rerun", str(run.pk), "2"],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(ROOT),
            **database_env(),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    refusal = f"CommandError: run {run.pk}: re-running from step 2 runs again 1 unsafe-to-repeat step "
    assert refusal in result.stderr
    assert Step.objects.filter(workflow=run).count() == 3
