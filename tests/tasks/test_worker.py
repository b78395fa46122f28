"""Tasks enqueued through Django's API and run by real worker processes
(``python -m django everystep_worker``), results read back with ``get_result``
and ``refresh()``."""

import datetime as dt
import signal
import uuid
from collections import Counter

import pytest

pytest.importorskip("django.tasks", reason="django.tasks arrived in Django 6.0")

from django.tasks import TaskResultStatus, default_task_backend  # noqa: E402

from tests.tasks import jobs  # noqa: E402
from tests.worker import workflows as w  # noqa: E402
from tests.worker.support import wait_for  # noqa: E402

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.urls("tests.tasks.views"),
]


def finished(result) -> bool:
    result.refresh()
    return result.is_finished


def test_a_task_enqueued_in_a_views_transaction_is_run_by_a_worker_and_read_back(client, spawn_worker):
    token = uuid.uuid4()
    response = client.post("/book/", {"day": "2026-12-24", "days": "7", "token": str(token), "note": "hi"})
    assert response.status_code == 200
    assert response.json()["status"] == "READY"
    result = jobs.add_days.get_result(response.json()["id"])
    assert result.status == TaskResultStatus.READY
    failing = jobs.fails.enqueue("out of stock")
    async_result = jobs.doubled_then_incremented.enqueue(20)

    worker = spawn_worker("tasks", "--poll", "0.1")
    for each in (result, failing, async_result):
        wait_for(lambda each=each: finished(each), timeout=60, what=f"task {each.task.name} to finish")

    assert result.status == TaskResultStatus.SUCCESSFUL, worker.log()
    assert result.return_value == {
        "day": dt.date(2026, 12, 31),
        "token": token,
        "blob": b"hi",
        "types": ["date", "UUID", "bytes"],
    }
    assert result.worker_ids == ["tasks"]
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert (async_result.status, async_result.return_value) == (TaskResultStatus.SUCCESSFUL, 41)
    assert failing.status == TaskResultStatus.FAILED
    [error] = failing.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert "raise ValueError(message)" in error.traceback
    again = default_task_backend.get_result(failing.id)
    assert (again.status, again.errors, again.worker_ids) == (failing.status, failing.errors, ["tasks"])

    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()


def test_a_task_resumes_after_a_worker_is_killed_without_rerunning_recorded_steps(tmp_path, spawn_worker):
    log = str(tmp_path / "log")
    result = jobs.logged_chain.enqueue(log, 3, 1.0)
    worker = spawn_worker("steady", "--poll", "0.1")
    key = result.id

    def started(index):
        return [line for line in w.read_log(log) if line[:3] == ("start", key, str(index))]

    wait_for(lambda: started(2), timeout=30, what="step 2 to start")
    worker.signal(signal.SIGKILL)
    worker.wait(10)
    result.refresh()
    assert (result.status, result.worker_ids) == (TaskResultStatus.RUNNING, ["steady"])
    first_start = result.started_at
    assert first_start is not None

    restarted = spawn_worker("steady", "--poll", "0.1")
    wait_for(lambda: finished(result), timeout=30, what="the restart to finish the task")
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, [1, 2, 3]), restarted.log()
    assert result.started_at == first_start  # the first start, served from the store
    starts = Counter(line[2] for line in w.read_log(log) if line[:2] == ("start", key))
    ends = Counter(line[2] for line in w.read_log(log) if line[:2] == ("end", key))
    # Step 2 was killed mid-sleep: it started twice and ended once; step 1 was not run again.
    assert starts == {"1": 1, "2": 2, "3": 1}
    assert ends == {"1": 1, "2": 1, "3": 1}
    restarted.signal(signal.SIGTERM)
    assert restarted.wait(30) == 0


def test_a_task_of_another_backend_sent_here_with_using_is_run_by_a_worker(spawn_worker):
    """Importing the task's module in the worker validates the task with its own
    backend ("immediate"), which registers nothing: the registry's lookup
    registers it for the run."""
    result = jobs.inline_by_default.using(backend="default", priority=0).enqueue(21)
    assert result.status == TaskResultStatus.READY

    worker = spawn_worker("durable", "--poll", "0.1")
    wait_for(lambda: finished(result), timeout=60, what="the task to finish")

    assert result.errors == [], result.errors[0].traceback
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 42), worker.log()
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()


def test_a_plain_function_task_of_another_backend_sent_here_is_run_by_a_worker(spawn_worker):
    """Its module path names the plain function, not the Task: the worker finds
    the Task among its module's globals."""
    result = jobs.notify_task.using(backend="default").enqueue("ann")
    assert result.status == TaskResultStatus.READY

    worker = spawn_worker("durable", "--poll", "0.1")
    wait_for(lambda: finished(result), timeout=60, what="the task to finish")

    assert result.errors == [], result.errors[0].traceback
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, "notified ann"), worker.log()
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()
