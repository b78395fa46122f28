"""What ``everystep_worker`` prints when the project configures no logging for
``everystep``, as runserver prints requests: real worker processes, their
output read back."""

import logging
import re
import signal

import pytest
from django.db import connections

from everystep import database, registry
from everystep.api import schedule
from everystep.models import Workflow
from tests.worker import workflows as w
from tests.worker.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

UNLOGGED = {"DJANGO_SETTINGS_MODULE": "tests.worker.settings_unlogged"}
LOGGED = {"DJANGO_SETTINGS_MODULE": "tests.worker.settings_logged"}
STAMP = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] "


def lines(worker, text: str) -> list[str]:
    return [line for line in worker.log().splitlines() if text in line]


def stop(worker) -> None:
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()


def status(run) -> str:
    return Workflow.objects.get(id=run.id).status


def test_a_start_up_line_and_one_line_per_run_that_ends(tmp_path, spawn_worker):
    done = schedule(w.chain, str(tmp_path / "log"), 2)
    failed = schedule(w.failing, "the lamp is out of stock")
    worker = spawn_worker("talker", "--pool", "2", "--poll", "0.1", extra_env=UNLOGGED)
    wait_for(
        lambda: lines(worker, f"run {done.id}") and lines(worker, f"run {failed.id}"),
        timeout=30,
        what="a line for each run",
    )
    stop(worker)

    engine = connections[database.alias()]
    pickup = "LISTEN on" if engine.vendor == "postgresql" else "LISTEN off, polling every 0.1s"
    found = [name for name in registry.workflow_names() if name.startswith("tests.worker.workflows.")]
    [started] = lines(worker, "started:")
    assert re.fullmatch(
        STAMP
        + re.escape(
            f"worker 'talker' started: pool 2, {engine.display_name} database {engine.alias!r}, "
            f"{pickup}, {len(found)} workflows: {', '.join(found)}"
        ),
        started,
    ), worker.log()
    assert (status(done), status(failed)) == (Workflow.Status.COMPLETED, Workflow.Status.FAILED)
    [done_line] = lines(worker, f"run {done.id}")
    assert re.fullmatch(
        STAMP + rf"run {done.id} tests\.worker\.workflows\.chain completed in \d+\.\d\ds", done_line
    )
    [failed_line] = lines(worker, f"run {failed.id}")
    assert re.fullmatch(
        STAMP + rf"run {failed.id} tests\.worker\.workflows\.failing failed in \d+\.\d\ds: "
        r"builtins\.ValueError: the lamp is out of stock",
        failed_line,
    )
    assert len(lines(worker, "worker 'talker' stopped")) == 1


def test_verbosity_0_prints_neither(tmp_path, spawn_worker):
    run = schedule(w.chain, str(tmp_path / "log"), 1)
    worker = spawn_worker("quiet", "--poll", "0.1", "--verbosity", "0", extra_env=UNLOGGED)
    wait_for(lambda: status(run) == Workflow.Status.COMPLETED, timeout=30, what="the run to complete")
    stop(worker)  # the run's line, had there been one, was written before the worker exited
    assert not lines(worker, "started:") and not lines(worker, f"run {run.id}"), worker.log()
    assert not lines(worker, "stopped"), worker.log()


def test_verbosity_2_adds_each_claim(tmp_path, spawn_worker):
    run = schedule(w.chain, str(tmp_path / "log"), 1)
    worker = spawn_worker("chatty", "--poll", "0.1", "--verbosity", "2", extra_env=UNLOGGED)
    wait_for(lambda: lines(worker, f"run {run.id} "), timeout=30, what="the run's line")
    stop(worker)
    [claim] = lines(worker, "claimed")
    assert re.fullmatch(
        STAMP + re.escape(f"worker 'chatty' claimed 1 run(s): {run.id} tests.worker.workflows.chain"), claim
    )


def test_a_project_that_logs_everystep_gets_each_line_once(tmp_path, spawn_worker):
    run = schedule(w.chain, str(tmp_path / "log"), 1)
    worker = spawn_worker("logged", "--poll", "0.1", extra_env=LOGGED)
    wait_for(lambda: lines(worker, f"run {run.id} "), timeout=30, what="the run's line")
    stop(worker)
    # The project's handler and format, and not the command's on top.
    for text in ("worker 'logged' started:", f"run {run.id} tests.worker.workflows.chain completed"):
        [line] = lines(worker, text)
        assert line.startswith(f"project-log: {text}"), worker.log()


def test_the_start_up_line_says_when_no_workflows_were_found(start_worker, monkeypatch, caplog):
    monkeypatch.setattr(registry, "workflow_names", lambda: [])
    with caplog.at_level(logging.INFO, logger="everystep"):
        worker = start_worker(name="empty")
        wait_for(lambda: "started:" in caplog.text, what="the start-up line")
        worker.stop()
        worker.thread.join(30)
    assert "no workflows found in the installed apps' workflows modules" in caplog.text
