"""Run and step statuses. Kept apart from the models so that the runner can
name them without importing models (``everystep`` must import before apps load)."""

from django.db import models


class RunStatus(models.TextChoices):
    SCHEDULED = "scheduled"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"
    BLOCKED = "blocked"

    @classmethod
    def terminal_values(cls):
        return [cls.COMPLETED, cls.FAILED, cls.STOPPED, cls.BLOCKED]


class StepStatus(models.TextChoices):
    STARTED = "started"
    DONE = "done"
    FAILED = "failed"
