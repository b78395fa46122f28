"""Run and step statuses. Kept apart from the models so that the runner can
name them without importing models (``everystep`` must import before apps load)."""

from django.db import models


class RunStatus(models.TextChoices):
    """A run's status: ``scheduled`` -> ``running`` -> ``completed``, ``failed``,
    ``stopped`` (a ``Terminal``, or an operator's Stop) or ``blocked`` (an
    unsafe-to-repeat step's outcome is uncertain). A drain or a requeue puts a
    ``running`` run back to ``scheduled``. A ``running`` run that sleeps or
    waits for an event leaves its worker as ``waiting`` (no worker slot, no
    connection) and is put back to ``scheduled`` when it is due
    (:mod:`everystep.waits`)."""

    SCHEDULED = "scheduled"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"
    BLOCKED = "blocked"
    WAITING = "waiting"

    @classmethod
    def terminal_values(cls):
        """The statuses a run ends in: completed, failed, stopped, blocked."""
        return [cls.COMPLETED, cls.FAILED, cls.STOPPED, cls.BLOCKED]


class StepStatus(models.TextChoices):
    """A step row's status: ``done``, ``failed``, or ``started`` (an
    unsafe-to-repeat step whose function is running, or whose outcome was
    never recorded)."""

    STARTED = "started"
    DONE = "done"
    FAILED = "failed"
