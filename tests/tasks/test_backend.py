"""everystep.tasks.EverystepBackend through Django's own Tasks API, runs
executed in-process (tests/tasks/test_worker.py runs them in worker processes)."""

import contextlib
import datetime as dt
import enum
import re
import uuid
from decimal import Decimal
from functools import partial
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync

pytest.importorskip("django.tasks", reason="django.tasks arrived in Django 6.0")

from django.core import checks  # noqa: E402
from django.db import DEFAULT_DB_ALIAS, transaction  # noqa: E402
from django.tasks import TaskResultStatus, default_task_backend, task, task_backends  # noqa: E402
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch  # noqa: E402
from django.test import override_settings  # noqa: E402
from django.utils import timezone  # noqa: E402

from everystep import database, history, operations, registry, runner, serde  # noqa: E402
from everystep.api import schedule  # noqa: E402
from everystep.errors import EverystepError, SimulatedCrash  # noqa: E402
from everystep.models import Step, Workflow  # noqa: E402
from everystep.statuses import RunStatus  # noqa: E402
from everystep.tasks import STATUSES, EverystepBackend  # noqa: E402
from everystep.worker import Worker  # noqa: E402
from everystep_ui.tree import intended_steps  # noqa: E402
from tests.helpers import CLAIMER, run_once  # noqa: E402
from tests.tasks import jobs  # noqa: E402
from tests.worker import workflows  # noqa: E402

pytestmark = pytest.mark.django_db

DAY = dt.date(2026, 12, 24)
TOKEN = uuid.UUID("0192f1c4-7d2e-7000-8000-0000000000aa")
BLOB = b"\x00\xff not utf-8"
EVERYSTEP_TASKS = {"BACKEND": "everystep.tasks.EverystepBackend"}
# A module of tasks that raises while being imported, after its first task.
HALF_IMPORTED = """
from django.tasks import task
from everystep import workflow


@workflow
def first_workflow(n):
    return n + 1


@task
def first_task(n):
    return n + 1


raise RuntimeError("the rest of this module is broken")
"""

# Two module-level lambdas (Django accepts them: not in <locals>), both named
# tests.tasks.test_backend.<lambda>.
LAMBDAS = (lambda name: f"hello {name}", lambda name: f"{name.upper()}!")


def run_of(result) -> Workflow:
    return Workflow.objects.get(id=result.id)


def execute(result) -> None:
    """What a worker does: claim the run and replay it once."""
    run_once(run_of(result))
    result.refresh()


def steps_of(result) -> list[tuple[str, str]]:
    return list(Step.objects.filter(workflow_id=result.id).order_by("id").values_list("step_id", "name"))


# ---------------------------------------------------------------- enqueue


def test_the_configured_backend_says_what_it_supports():
    backend = task_backends["default"]
    assert isinstance(backend, EverystepBackend)
    flags = (backend.supports_defer, backend.supports_async_task, backend.supports_get_result,
             backend.supports_priority)
    assert flags == (False, True, True, False)


def test_enqueue_inserts_one_scheduled_run_named_after_the_task():
    result = jobs.add_days.enqueue(DAY, 7, token=TOKEN, blob=BLOB)

    run = run_of(result)
    assert run.name == jobs.add_days.module_path == "tests.tasks.jobs.add_days"
    assert run.status == RunStatus.SCHEDULED
    assert run.args == [[DAY, 7], {"token": TOKEN, "blob": BLOB}]
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at == run.created_at
    assert (result.started_at, result.finished_at, result.errors, result.worker_ids) == (None, None, [], [])
    # Django keeps JSON in a TaskResult: the arguments as stored.
    assert result.args == serde.encode([DAY, 7])
    assert result.kwargs == serde.encode({"token": TOKEN, "blob": BLOB})
    with pytest.raises(ValueError, match="not finished yet"):
        result.return_value  # noqa: B018


def test_the_run_is_written_on_everystep_database():
    before = Workflow.objects.using(database.alias()).count()
    jobs.total.enqueue(1)
    assert Workflow.objects.using(database.alias()).count() == before + 1


def test_arguments_that_do_not_serialize_are_refused_and_nothing_is_written():
    before = Workflow.objects.count()
    message = r"keyword arguments are not serializable, nothing was enqueued: \$\['blob'\]: a builtins.object"
    with pytest.raises(EverystepError, match=message):
        jobs.add_days.enqueue(DAY, 1, token=TOKEN, blob=object())
    with pytest.raises(EverystepError, match=r"positional arguments .*: \$\[1\]: a decimal.Decimal"):
        jobs.total.enqueue(1, Decimal("2.5"))
    with pytest.raises(EverystepError, match=r"\$\[0\]: nan is not storable"):
        jobs.total.enqueue(float("nan"))
    assert Workflow.objects.count() == before


def test_arguments_that_do_not_fit_the_function_are_refused():
    before = Workflow.objects.count()
    with pytest.raises(TypeError, match="arguments do not fit task tests.tasks.jobs.add_days"):
        jobs.add_days.enqueue(DAY, 1)  # token and blob are missing
    with pytest.raises(TypeError, match="arguments do not fit task tests.tasks.jobs.knows_its_context"):
        jobs.knows_its_context.enqueue(1, 2)
    assert Workflow.objects.count() == before


def test_run_after_priority_and_other_queues_are_refused_with_djangos_errors():
    before = Workflow.objects.count()
    with pytest.raises(InvalidTask, match="^Backend does not support run_after.$"):
        jobs.total.using(run_after=timezone.now() + dt.timedelta(hours=1))
    with pytest.raises(InvalidTask, match="^Backend does not support setting priority of tasks.$"):
        jobs.total.using(priority=10)
    with pytest.raises(InvalidTask, match="^Backend does not support setting priority of tasks.$"):
        task(priority=-5)(jobs.not_a_task)
    with pytest.raises(InvalidTask, match="^Queue 'emails' is not valid for backend.$"):
        jobs.total.using(queue_name="emails")
    assert Workflow.objects.count() == before


def test_two_lambda_tasks_are_refused_as_one_name_cannot_tell_them_apart():
    # Registered under one name, a worker would run the second's body for a run of the first.
    for func in LAMBDAS:
        with pytest.raises(InvalidTask, match=r"tests\.tasks\.test_backend\.<lambda> has no name of its own"):
            task(func)


def test_other_queues_fail_a_system_check_and_stay_refused():
    assert not [e for e in checks.run_checks() if e.id == "everystep.E004"]
    with override_settings(TASKS={"default": {**EVERYSTEP_TASKS, "QUEUES": ["default", "emails"]}}):
        errors = [e for e in checks.run_checks() if e.id == "everystep.E004"]
        with pytest.raises(InvalidTask, match="Queue 'emails' is not valid"):
            jobs.total.using(queue_name="emails")
    assert len(errors) == 1
    assert "everystep has one queue" in errors[0].msg


def test_a_rolled_back_transaction_takes_its_enqueued_run_with_it():
    before = Workflow.objects.count()
    with contextlib.suppress(RuntimeError), database.atomic():
        jobs.total.enqueue(1)
        raise RuntimeError("the view failed")
    assert Workflow.objects.count() == before


def test_with_everystep_in_another_database_a_default_transaction_does_not_cover_enqueue():
    """As the README says: on a split layout, enqueue through transaction.on_commit."""
    before = Workflow.objects.count()
    with contextlib.suppress(RuntimeError), transaction.atomic(using=DEFAULT_DB_ALIAS):
        jobs.total.enqueue(1)
        raise RuntimeError("the view failed")
    split = database.alias() != DEFAULT_DB_ALIAS
    assert Workflow.objects.count() == before + (1 if split else 0)


def test_enqueue_on_commit_inserts_the_run_when_the_transaction_commits(django_capture_on_commit_callbacks):
    before = Workflow.objects.count()
    with django_capture_on_commit_callbacks(execute=True) as callbacks, transaction.atomic():
        transaction.on_commit(partial(jobs.total.enqueue, 2, 3))
        assert Workflow.objects.count() == before  # not yet
    assert len(callbacks) == 1
    run = Workflow.objects.order_by("-id").first()
    assert (run.name, run.args) == ("tests.tasks.jobs.total", [[2, 3], {}])


# ---------------------------------------------------------------- running and reading back


def test_a_task_gets_and_returns_dates_uuids_and_bytes_as_they_went_in():
    result = jobs.add_days.enqueue(DAY, 7, token=TOKEN, blob=BLOB)
    execute(result)

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {
        "day": dt.date(2026, 12, 31),
        "token": TOKEN,
        "blob": BLOB,
        "types": ["date", "UUID", "bytes"],
    }
    assert result.worker_ids == [CLAIMER]
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.errors == []
    # The start is a recorded step; the task's own steps count from 1, as in a workflow.
    assert steps_of(result) == [
        ("task:started", "everystep.tasks.task_started"),
        ("1", "tests.tasks.jobs.shift"),
    ]


def test_get_result_reports_what_refresh_reports():
    result = jobs.total.enqueue(1, 2, 3)
    execute(result)
    for fresh in (default_task_backend.get_result(result.id), jobs.total.get_result(result.id)):
        assert fresh.id == result.id
        assert fresh.task == jobs.total
        assert fresh.return_value == 12 == result.return_value
        assert (fresh.status, fresh.enqueued_at, fresh.started_at, fresh.finished_at, fresh.worker_ids) == (
            result.status, result.enqueued_at, result.started_at, result.finished_at, result.worker_ids
        )


def test_aenqueue_and_aget_result_go_through_the_same_backend():
    result = async_to_sync(jobs.total.aenqueue)(4, 5)
    assert run_of(result).args == [[4, 5], {}]
    fetched = async_to_sync(jobs.total.aget_result)(result.id)
    assert (fetched.id, fetched.status) == (result.id, TaskResultStatus.READY)


def test_get_result_of_an_unknown_malformed_or_non_task_id_does_not_exist():
    workflow_run = schedule(workflows.chain, "/dev/null", 1)
    for result_id in (str(uuid.uuid4()), "not-a-run-id", str(workflow_run.id)):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)
    other = jobs.total.enqueue(1)
    with pytest.raises(TaskResultMismatch):
        jobs.fails.get_result(other.id)


def test_a_failure_reports_the_exception_class_and_its_traceback():
    result = jobs.fails.enqueue("out of stock")
    execute(result)

    assert result.status == TaskResultStatus.FAILED
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert error.traceback.startswith("Traceback (most recent call last):\n")
    assert "raise ValueError(message)" in error.traceback
    assert error.traceback.endswith("ValueError: out of stock\n")
    # The run's error JSON carries it; the UI's keys are unchanged.
    stored = run_of(result).error
    assert stored == {"type": "builtins.ValueError", "message": "out of stock", "args": ["out of stock"],
                      "traceback": error.traceback}


@pytest.mark.parametrize(("job", "args", "line"), [
    (jobs.exits, (3,), "sys.exit(code)"),
    (jobs.cancelled, (), 'raise asyncio.CancelledError("the job was cancelled")'),
])
def test_a_base_exception_raised_in_the_task_keeps_its_traceback(job, args, line):
    # SystemExit from sys.exit(), CancelledError in an async task: not Exceptions.
    result = job.enqueue(*args)
    execute(result)
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.traceback.startswith("Traceback (most recent call last):\n"), error.traceback
    assert line in error.traceback


@pytest.mark.django_db(transaction=True)
def test_get_result_of_a_task_whose_arguments_no_longer_decode_reports_it_failed(monkeypatch):
    result = jobs.escalate.enqueue(jobs.Level.HIGH)
    # A deploy renamed the enum's value: the stored arguments name one that is gone.
    monkeypatch.setattr(jobs, "Level", enum.Enum("Level", {"HIGH": "urgent"}))
    Worker(pool_size=1, poll=0.05, name="w1", stop_when_idle=True).run()
    status, error = Workflow.objects.values_list("status", "error").get(id=result.id)
    assert status == "failed" and "its stored arguments cannot be read" in error["message"]

    # What a view polling the result does: not an EverystepError (a 500).
    fetched = default_task_backend.get_result(result.id)
    assert fetched.status == TaskResultStatus.FAILED
    assert "its stored arguments cannot be read" in fetched.errors[0].traceback
    [level] = fetched.args  # as stored
    assert (level["$es"], level["v"]) == ("enum", "high")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED


def test_a_terminal_stop_is_failed_with_the_terminal_as_its_error():
    result = jobs.stops.enqueue("cancelled by the customer")
    execute(result)

    assert run_of(result).status == RunStatus.STOPPED
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "everystep.errors.Terminal"
    assert error.traceback.endswith("everystep.errors.Terminal: cancelled by the customer\n")
    assert "raise Terminal(reason" in error.traceback


def test_an_operators_stop_is_failed_and_says_no_traceback_was_recorded():
    result = jobs.total.enqueue(1)
    operations.stop_run(result.id, actor="ann")
    result.refresh()

    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "everystep.errors.Terminal"
    assert error.traceback == "everystep.errors.Terminal: stopped by an operator (ann)\n"


def test_a_blocked_task_is_failed_until_resolved_then_ready_and_successful(tmp_path):
    gate = tmp_path / "gate"
    gate.touch()
    result = jobs.pay.enqueue(str(tmp_path / "log"), str(gate))

    def crash_after_the_charge(ctx, step_id):
        if step_id == "1":
            raise SimulatedCrash("the worker died after charging")

    runner.fault = crash_after_the_charge
    run_once(run_of(result))  # the charge ran, its outcome was never recorded
    runner.fault = None
    runner.execute(run_of(result), CLAIMER)  # the claimer's restart finds it uncertain
    result.refresh()

    assert run_of(result).status == RunStatus.BLOCKED
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "everystep.errors.EffectUncertain"
    assert f"everystep_resolve_step {result.id} 1" in error.traceback

    operations.resolve_step(result.id, "1", result="charged")
    result.refresh()
    assert (result.status, result.errors, result.finished_at) == (TaskResultStatus.READY, [], None)

    execute(result)
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, "charged")


@pytest.mark.parametrize("status", list(RunStatus))
def test_every_run_status_has_a_django_status(status):
    run = Workflow.objects.create(name=jobs.total.module_path, args=[[1], {}], status=status)
    expected = {
        "scheduled": "READY", "running": "RUNNING", "completed": "SUCCESSFUL",
        "failed": "FAILED", "stopped": "FAILED", "blocked": "FAILED", "waiting": "RUNNING",
    }[status]
    assert STATUSES[status] == expected
    assert default_task_backend.get_result(str(run.id)).status == expected


def test_a_task_that_takes_context_gets_its_running_result():
    result = jobs.knows_its_context.enqueue(5)
    execute(result)
    assert result.return_value == {
        "id": result.id,
        "status": "RUNNING",
        "attempt": 1,
        "worker_ids": [CLAIMER],
        "value": 5,
    }


def test_an_async_task_runs_and_its_steps_are_recorded():
    result = jobs.doubled_then_incremented.enqueue(20)
    execute(result)
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 41)
    assert steps_of(result)[1] == ("1", "tests.tasks.jobs.double")


def test_a_replay_serves_recorded_steps_and_keeps_the_first_start(tmp_path):
    log = str(tmp_path / "log")
    result = jobs.logged_chain.enqueue(log, 3)

    def crash_after_step_2(ctx, step_id):
        if step_id == "2":
            raise SimulatedCrash("killed")

    runner.fault = crash_after_step_2
    run_once(run_of(result))
    runner.fault = None
    result.refresh()
    first_start = result.started_at
    assert (result.status, first_start is not None) == (TaskResultStatus.RUNNING, True)

    runner.execute(run_of(result), CLAIMER)
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, [1, 2, 3])
    assert result.started_at == first_start
    starts = [line.split()[2] for line in Path(log).read_text().splitlines() if line.startswith("start")]
    assert starts == ["1", "2", "2", "3"]  # step 2's outcome was lost to the crash; step 1 was served


def test_a_fork_records_its_own_start_and_a_rerun_keeps_the_first():
    result = jobs.total.enqueue(1, 2)
    execute(result)
    first_start = result.started_at

    fork, cut = history.fork_from_step(result.id, "2")
    forked = default_task_backend.get_result(str(fork.id))
    assert (forked.status, forked.started_at) == (TaskResultStatus.READY, None)
    execute(forked)
    assert (forked.status, forked.return_value) == (TaskResultStatus.SUCCESSFUL, 6)
    assert first_start < forked.enqueued_at <= forked.started_at <= forked.finished_at
    # The start row is left out (and said so), step 1 copied; the fork records its own start.
    assert [row.step_id for row in cut.discarded] == ["task:started", "2"]
    assert steps_of(forked) == [
        ("1", "tests.tasks.jobs.double"),
        ("task:started", "everystep.tasks.task_started"),
        ("2", "tests.tasks.jobs.double"),
    ]
    assert steps_of(result)[0][1] == history.TASK_START

    # In place, the run keeps the time it first started.
    history.rerun_from_step(result.id, "2")
    execute(result)
    assert (result.status, result.started_at) == (TaskResultStatus.SUCCESSFUL, first_start)


def test_a_task_above_the_line_its_module_raises_at_does_not_run(tmp_path, monkeypatch):
    """As a @workflow there: what the module registered before it raised is
    unregistered again, so the run fails with the module's error."""
    module = f"half_imported_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(HALF_IMPORTED)
    monkeypatch.syspath_prepend(str(tmp_path))

    for name, args in ((f"{module}.first_workflow", [1]), (f"{module}.first_task", [[1], {}])):
        run = run_once(Workflow.objects.create(name=name, args=args))
        assert (run.status, run.error["type"]) == ("failed", "builtins.RuntimeError"), (name, run.result)
        assert registry.get_workflow(name) is None


def test_a_task_enqueued_in_a_body_is_refused_as_every_replay_would_enqueue_it_again():
    result = jobs.enqueues_in_its_body.enqueue(7)
    execute(result)
    assert result.status == TaskResultStatus.FAILED
    assert "enqueue() of the task tests.tasks.jobs.total was called in the workflow's body" in str(
        run_of(result).error["message"]
    )
    assert not Workflow.objects.filter(name="tests.tasks.jobs.total").exists()

    inside_a_step = jobs.enqueues_in_a_step.enqueue(7)
    execute(inside_a_step)
    [enqueued] = Workflow.objects.filter(name="tests.tasks.jobs.total")
    assert inside_a_step.return_value == str(enqueued.id)


def test_a_task_made_from_a_plain_function_runs_and_its_result_reads_back():
    # Its module path names the plain function, not the Task.
    result = jobs.send_email_task.enqueue("ann@example.com")
    execute(result)
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, "sent to ann@example.com")
    assert jobs.send_email_task.get_result(result.id).return_value == "sent to ann@example.com"
    greeting = jobs.greet_task.enqueue("ann")
    execute(greeting)
    assert greeting.return_value == f"hello ann from {greeting.id}"


def test_a_plain_function_task_sent_here_reads_back_where_it_was_not_enqueued(monkeypatch):
    result = jobs.notify_task.using(backend="default").enqueue("bob")
    # Another process (a web worker polling the result): enqueue() registered
    # nothing there.
    monkeypatch.delitem(registry._workflows, jobs.notify_task.module_path)
    fetched = default_task_backend.get_result(result.id)
    assert (fetched.id, fetched.status) == (result.id, TaskResultStatus.READY)


def test_get_result_of_a_run_whose_module_now_raises_on_import_does_not_exist(tmp_path, monkeypatch):
    # Not the module's own exception, which a view polling the result turned into a 500.
    module = f"half_imported_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(HALF_IMPORTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = Workflow.objects.create(name=f"{module}.first_task", args=[[1], {}])
    with pytest.raises(TaskResultDoesNotExist, match=f"{run.id} is a run of {module}.first_task"):
        default_task_backend.get_result(str(run.id))


# ---------------------------------------------------------------- the UI


def test_task_runs_are_listed_and_filterable_by_their_name(admin_client):
    task_run = jobs.total.enqueue(1)
    other = jobs.fails.enqueue("x")
    assert "tests.tasks.jobs.total" in registry.workflow_names()

    response = admin_client.get("/admin/everystep/workflow/", {"name": "tests.tasks.jobs.total"})
    assert response.status_code == 200
    assert '<option value="tests.tasks.jobs.total" selected>' in response.text
    listed = set(re.findall(r'<td class="field-short_id"><a href="[^"]+" title="([^"]+)"', response.text))
    assert task_run.id in listed
    assert other.id not in listed


def test_the_run_page_reads_pending_steps_from_the_tasks_function():
    assert intended_steps("tests.tasks.jobs.fails") == ([("1", "tests.tasks.jobs.double")], "")


def test_a_task_runs_page_shows_its_start_its_steps_and_whats_pending(admin_client, tmp_path):
    result = jobs.logged_chain.enqueue(str(tmp_path / "log"), 3)
    execute(result)
    failed = jobs.fails.enqueue("out of stock")

    response = admin_client.get(f"/admin/everystep/workflow/{result.id}/run/")
    assert response.status_code == 200
    assert "task:started" in response.text
    assert "tests.tasks.jobs.logged_chain" in response.text
    pending = admin_client.get(f"/admin/everystep/workflow/{failed.id}/run/")
    assert pending.status_code == 200
    assert "tests.tasks.jobs.double" in pending.text  # the task function's step, not run yet


EMAILS = """
def send_welcome(to):  # a plain function, also called inline
    return f"welcome {to}"
"""

TASKS = """
from django.conf import settings
from django.tasks import task
from django.test import override_settings

from {emails} import send_welcome

IMMEDIATE = {{"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}
with override_settings(TASKS={{**settings.TASKS, "immediate": IMMEDIATE}}):
    send_welcome_task = task(send_welcome, backend="immediate")
"""


@pytest.fixture
def task_of_an_imported_function(tmp_path, monkeypatch):
    """shop/tasks.py makes a task of another backend from shop/emails.py's
    send_welcome: its runs are named after emails, the Task lives in tasks."""
    import importlib

    suffix = uuid.uuid4().hex[:8]
    emails, tasks = f"emails_{suffix}", f"tasks_{suffix}"
    (tmp_path / f"{emails}.py").write_text(EMAILS)
    (tmp_path / f"{tasks}.py").write_text(TASKS.format(emails=emails))
    monkeypatch.syspath_prepend(str(tmp_path))
    made = importlib.import_module(tasks).send_welcome_task
    yield made
    registry._workflows.pop(made.module_path, None)


def test_a_task_made_from_a_function_of_another_module_is_run_and_read_back_here(
    task_of_an_imported_function, monkeypatch
):
    # It was looked for in the function's module only: a worker failed its runs
    # ("no @workflow is registered"), get_result raised TaskResultDoesNotExist.
    made = task_of_an_imported_function
    first = made.using(backend="default").enqueue("ann")
    second = made.using(backend="default").enqueue("bob")
    # Another process: importing the tasks module validated the task with its
    # own backend, which registered nothing there.
    monkeypatch.delitem(registry._workflows, made.module_path)
    fetched = default_task_backend.get_result(second.id)  # a web process polling it
    assert (fetched.id, fetched.status) == (second.id, TaskResultStatus.READY)
    monkeypatch.delitem(registry._workflows, made.module_path)
    run = run_once(Workflow.objects.get(id=first.id))  # a worker
    assert run.status == "completed", run.error["message"]
    assert run.result == "welcome ann"

