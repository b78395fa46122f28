"""Tasks the tests enqueue through Django's own API (``django.tasks``)."""

import asyncio
import datetime as dt
import enum
import os
import sys

from asgiref.sync import sync_to_async
from django.conf import settings
from django.tasks import task
from django.test import override_settings

from everystep import Terminal, step
from tests.worker.workflows import _wait_for_file, log_line, mark


@step
def shift(day: dt.date, days: int) -> dt.date:
    return day + dt.timedelta(days=days)


@step
def double(value: int) -> int:
    return value * 2


@task
def add_days(day, days, *, token, blob):
    """Dates, UUIDs and bytes in and out; the types the body received."""
    later = shift(day, days)
    types = [type(value).__name__ for value in (day, token, blob)]
    return {"day": later, "token": token, "blob": blob, "types": types}


@task
def total(*numbers):
    return sum(double(n) for n in numbers)


@task
def fails(message):
    double(1)
    raise ValueError(message)


@task
def exits(code):
    sys.exit(code)


@task
async def cancelled():
    await asyncio.sleep(0)
    raise asyncio.CancelledError("the job was cancelled")


class Level(enum.Enum):
    HIGH = "high"


@task
def escalate(level):
    return level.name


@task
def stops(reason):
    raise Terminal(reason, {"by": "the task"})


@task(takes_context=True)
def knows_its_context(context, value):
    return {
        "id": context.task_result.id,
        "status": context.task_result.status,
        "attempt": context.attempt,
        "worker_ids": context.task_result.worker_ids,
        "value": value,
    }


@task
async def doubled_then_incremented(value):
    """An async task: steps go through sync_to_async (thread-sensitive), which
    runs them on the run's thread, where they are recorded."""
    doubled = await sync_to_async(double)(value)
    await asyncio.sleep(0)
    return doubled + 1


@task
def logged_chain(log, steps, delay=0):
    """tests.worker.workflows.chain as a task: each step logs its start and end."""
    return [mark(log, i, delay) for i in range(1, steps + 1)]


@step(unsafe_to_repeat=True)
def charge(log, gate):
    log_line(log, "charge", os.getpid())
    _wait_for_file(gate)
    return "charged"


@task
def pay(log, gate):
    return charge(log, gate)


# A project that runs a task inline by default and durably on request:
# ``inline_by_default.using(backend="default", priority=0).enqueue(...)`` (here
# everystep's backend is "default"; the priority is one everystep refuses).
IMMEDIATE = {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}
with override_settings(TASKS={**settings.TASKS, "immediate": IMMEDIATE}):

    @task(backend="immediate", priority=5)
    def inline_by_default(value):
        return double(value)


def notify(to):  # a plain function, also called inline
    return f"notified {to}"


# Both patterns at once: made by calling task() on it, bound to another backend.
with override_settings(TASKS={**settings.TASKS, "immediate": IMMEDIATE}):
    notify_task = task(notify, backend="immediate")


def not_a_task():
    return None


@step
def enqueues(value):
    return total.enqueue(value).id  # inside a step: once per run


@task
def enqueues_in_its_body(value):
    total.enqueue(value)  # not recorded: every replay would enqueue again
    return value


@task
def enqueues_in_a_step(value):
    return enqueues(value)


def send_email(to):  # also called inline: the task is made by calling task() on it
    return f"sent to {to}"


send_email_task = task(send_email)


def greet(context, name):
    return f"hello {name} from {context.task_result.id}"


greet_task = task(greet, takes_context=True)
