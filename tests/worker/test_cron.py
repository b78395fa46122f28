"""Cron schedules run by real workers: an embedded worker starts the slots that
come due while it runs; several worker processes racing for the same slots
start each one once; a bad schedule stops the worker and the system check."""

import datetime as dt
import importlib
import os
import re
import signal
from collections import Counter

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from everystep.cron import CronSchedule
from everystep.errors import WorkflowImportError
from everystep.models import Workflow
from everystep.worker import Worker
from tests.worker.support import ROOT, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

TICKS = """\
    from everystep import step, workflow


    @step
    def note(slot):
        return slot.isoformat()


    @workflow(cron="{cron}")
    def tick(slot):
        return note(slot)
"""

STARTED = re.compile(r"cron (\S+) .*: slot (\S+) started as run (\S+)")
FIRST_CHECK = "first check: last slot started"
ALREADY = re.compile(r"worker '([^']+)': cron (\S+) slot (\S+) was started already, as run (\S+)")


def cron_app(scratch_modules, cron: str) -> tuple[str, str]:
    """A scratch app whose workflows module declares ``tick`` on ``cron``; its name and tick's."""
    app = scratch_modules.app(TICKS.format(cron=cron))
    return app, f"{app}.workflows.tick"


def completed_runs(name: str) -> list[Workflow]:
    return list(Workflow.objects.filter(name=name, status="completed").order_by("idempotency_key"))


def test_an_embedded_worker_starts_the_slots_that_come_due_while_it_runs(scratch_modules, start_worker):
    app, tick = cron_app(scratch_modules, "* * * * * *")  # every second
    importlib.import_module(f"{app}.workflows")
    began = dt.datetime.now(dt.UTC)
    worker = start_worker(name="cron-embedded")

    runs = wait_for(lambda: completed_runs(tick)[2:] and completed_runs(tick), what="three slots run")
    worker.stop()
    for run in runs:
        slot = run.args[0]
        assert slot > began  # a schedule that never ran starts at its next slot, not before
        assert run.idempotency_key == CronSchedule(tick, "* * * * * *").key(slot)
        assert run.result == slot.isoformat()  # the body got its slot
        assert run.claimed_by == "cron-embedded"
    slots = [run.args[0] for run in runs]
    assert len(set(slots)) == len(slots)


def spawn_cron_workers(spawn_worker, scratch_modules, app, names):
    """Worker processes of a project with ``app`` installed and no LOGGING: at
    ``--verbosity 2`` they print each slot they start or find started."""
    settings = f"{scratch_modules.prefix}_cron_settings"
    scratch_modules.write(
        f"{settings}.py",
        "from tests.worker.settings_unlogged import *  # noqa: F403\n"
        f"INSTALLED_APPS = [*INSTALLED_APPS, {app!r}]  # noqa: F405\n",
    )
    env = {
        "DJANGO_SETTINGS_MODULE": settings,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(scratch_modules.root)]),
    }
    return [spawn_worker(name, "--poll", "0.2", "--verbosity", "2", extra_env=env) for name in names]


def stop_all(workers):
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(30) == 0, worker.log()


def attempts(workers, tick):
    """Per slot, the workers whose insert won it, and those that found it started."""
    won, found = Counter(), Counter()
    for worker in workers:
        for line in worker.log().splitlines():
            if (match := STARTED.search(line)) and match[1] == tick:
                won[match[2]] += 1
            elif (match := ALREADY.search(line)) and match[2] == tick:
                found[match[3]] += 1
    return won, found


@pytest.mark.slow
def test_worker_processes_racing_every_second_start_each_slot_once(spawn_worker, scratch_modules):
    app, tick = cron_app(scratch_modules, "* * * * * *")
    workers = spawn_cron_workers(spawn_worker, scratch_modules, app, ["cron-a", "cron-b", "cron-c"])

    wait_for(lambda: len(completed_runs(tick)) >= 5, timeout=60, what="five slots run")
    stop_all(workers)

    runs = Workflow.objects.filter(name=tick)
    keys = [run.idempotency_key for run in runs]
    won, found = attempts(workers, tick)
    # Each slot's run was inserted by exactly one worker, which knew it won...
    assert won == Counter({key.removeprefix("cron:"): 1 for key in keys}), [w.log() for w in workers]
    # ...while the others, at the same moment, found it started: the race was real.
    assert sum(found.values()) >= 1, [w.log() for w in workers]
    assert set(found) <= set(won)
    assert all(run.status == "completed" for run in runs if run.idempotency_key in {*won})
    for worker in workers:
        assert "Traceback" not in worker.log() and "ERROR" not in worker.log(), worker.log()


@pytest.mark.slow
def test_worker_processes_restarting_after_downtime_start_the_latest_missed_slot_once(
    spawn_worker, scratch_modules
):
    app, tick = cron_app(scratch_modules, "0 0 * * *")  # daily, at midnight UTC
    schedule = CronSchedule(tick, "0 0 * * *")
    today = schedule.latest_at(dt.datetime.now(dt.UTC))
    three_days_ago = today - dt.timedelta(days=3)
    # The last slot the fleet started, before every worker went away for three days.
    Workflow.objects.create(
        name=tick, args=[three_days_ago], idempotency_key=schedule.key(three_days_ago), status="completed"
    )

    workers = spawn_cron_workers(spawn_worker, scratch_modules, app, ["back-a", "back-b", "back-c"])
    wait_for(lambda: len(completed_runs(tick)) == 2, timeout=60, what="the caught-up slot to run")
    for worker in workers:  # each made its first check
        wait_for(lambda w=worker: FIRST_CHECK in w.log(), timeout=30, what=f"{worker.name}'s first check")
    stop_all(workers)

    assert [run.idempotency_key for run in completed_runs(tick)] == [
        schedule.key(three_days_ago),
        schedule.key(today),  # the two slots in between were skipped
    ]
    won, found = attempts(workers, tick)
    assert won == {schedule.key(today)[5:]: 1}  # one worker inserted it; the others found it there
    assert sum("2 missed slots before it skipped" in worker.log() for worker in workers) == 1


BAD = """\
    from everystep import workflow


    @workflow(cron="0 25 * * *")
    def nightly(slot):
        pass
"""


def test_a_bad_expression_fails_the_system_check_and_the_worker_start(settings, scratch_modules):
    app = scratch_modules.app(BAD)
    with override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, app]):
        with pytest.raises(SystemCheckError) as failed:
            call_command("check")
        with pytest.raises(WorkflowImportError) as refused:
            Worker(pool_size=1, poll=0.05, name="w1", stop_when_idle=True).run()
    expected = (
        f"ScheduleError: workflow {app}.workflows.nightly: cron='0 25 * * *': "
        "not a valid cron expression (Bad hour)"
    )
    assert "everystep.E002" in str(failed.value) and expected in str(failed.value)
    assert expected in str(refused.value)
