"""The two tables of the data model: one row per run, one row per executed step."""

import uuid6
from django.db import models
from django.db.models import Q
from django.utils import timezone

from . import database
from .fields import EverystepJSONField
from .statuses import RunStatus, StepStatus


class EngineManager(models.Manager):
    """Queries go to everystep's database (``EVERYSTEP_DATABASE``), whatever
    the project's routers say about other models."""

    def get_queryset(self):
        return super().get_queryset().using(database.alias())


class WorkflowQuerySet(models.QuerySet):
    def claimable(self):
        """Runs a worker may claim, in claim order."""
        return self.filter(status=Workflow.Status.SCHEDULED).order_by("created_at")

    def terminal(self):
        return self.filter(status__in=Workflow.Status.terminal_values())

    def parked_by(self, name):
        """Runs left ``running`` under a claimer's name."""
        return self.filter(status=Workflow.Status.RUNNING, claimed_by=name)


class Workflow(models.Model):
    """A run: one ``everystep_workflow`` row, made by :func:`everystep.schedule`.

    ``id`` is a time-ordered UUIDv7 (the run id); ``name`` the workflow's
    ``module.qualname``; ``args`` its stored arguments; ``status`` one of
    :class:`Workflow.Status <everystep.statuses.RunStatus>`; ``claimed_by``
    the worker running it; ``result`` the return value of a completed run;
    ``error`` the encoded exception of a failed, stopped or blocked one;
    ``created_at`` and ``completed_at`` (when it reached its terminal status).
    Change a run only through :mod:`everystep.operations`.
    """

    Status = RunStatus

    id = models.UUIDField(primary_key=True, default=uuid6.uuid7, editable=False)
    name = models.CharField(max_length=300)
    args = EverystepJSONField(default=list)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    status = models.CharField(
        max_length=16, choices=Status, default=Status.SCHEDULED, db_index=True
    )
    claimed_by = models.CharField(max_length=255, null=True, blank=True)
    result = EverystepJSONField(null=True, blank=True)
    error = EverystepJSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    objects = EngineManager.from_queryset(WorkflowQuerySet)()

    class Meta:
        db_table = "everystep_workflow"
        ordering = ["-id"]
        # A row is one run of a workflow: the admin and its messages say "run".
        verbose_name = "run"
        verbose_name_plural = "runs"
        indexes = [
            # Serves the claim query: scheduled rows in created_at order.
            models.Index(
                fields=["created_at"],
                condition=Q(status="scheduled"),
                name="everystep_workflow_claim_idx",
            ),
            # Back the UI's filters and searches (PostgreSQL also gets a GIN index
            # on args for JSON containment, in migration 0007).
            models.Index(fields=["name", "-created_at"], name="everystep_workflow_name_idx"),
            models.Index(fields=["claimed_by"], name="everystep_workflow_claimer_idx"),
            models.Index(fields=["idempotency_key"], name="everystep_workflow_idem_idx"),
            # The overview's throughput chart and everystep_prune select by end time.
            models.Index(fields=["completed_at"], name="everystep_workflow_ended_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["name", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="everystep_workflow_idempotency_uniq",
            )
        ]
        permissions = [
            ("retry_workflow", "Can retry a failed or stopped run"),
            ("stop_workflow", "Can stop a run"),
            ("resolve_workflow", "Can resolve a blocked run"),
            ("requeue_workflow", "Can requeue a running run"),
            ("rerun_workflow", "Can re-run a run from a step"),
            ("fork_workflow", "Can fork a run from a step"),
        ]

    def __str__(self):
        return f"{self.name} {self.id}"

    @property
    def is_terminal(self):
        return self.status in Workflow.Status.terminal_values()


class Step(models.Model):
    """An executed step: one ``everystep_step`` row per recorded outcome.

    ``step_id`` is the step's dotpath in its run (unique per run); ``name``
    the step function's ``module.qualname``; ``status`` one of
    :class:`Step.Status <everystep.statuses.StepStatus>`; ``args``,
    ``kwargs``, ``result`` and ``error`` as stored. Steps served from the
    store on replay write nothing.
    """

    Status = StepStatus

    # No index of its own: the unique (workflow, step_id) index serves every
    # lookup by run, and one index fewer is one write fewer per recorded step.
    workflow = models.ForeignKey(
        Workflow, on_delete=models.CASCADE, related_name="steps", db_index=False
    )
    step_id = models.CharField(max_length=300)
    name = models.CharField(max_length=300)
    args = EverystepJSONField(default=list)
    kwargs = EverystepJSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status)
    result = EverystepJSONField(null=True, blank=True)
    error = EverystepJSONField(null=True, blank=True)

    objects = EngineManager()

    class Meta:
        db_table = "everystep_step"
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["workflow", "step_id"], name="everystep_step_workflow_step_id_uniq"
            )
        ]

    def __str__(self):
        return f"{self.step_id} {self.name}"


class RunFork(models.Model):
    """Where a forked run comes from: one row per run made by "fork from a
    step" (:func:`everystep.history.fork_from_step`), keyed by that run.

    ``origin`` is the run it was forked from (``NULL`` once that run is
    deleted, e.g. pruned), ``origin_step_id`` the step it was forked at: the
    fork started with copies of the origin's rows recorded before that step
    and ran the rest anew. An additive table: the two tables above keep
    their columns.
    """

    run = models.OneToOneField(
        Workflow, primary_key=True, on_delete=models.CASCADE, related_name="forked_from"
    )
    origin = models.ForeignKey(
        Workflow, null=True, on_delete=models.SET_NULL, related_name="forks", db_index=False
    )
    origin_step_id = models.CharField(max_length=300)
    created_at = models.DateTimeField(default=timezone.now)

    objects = EngineManager()

    class Meta:
        db_table = "everystep_run_fork"
        indexes = [
            # A run page lists the run's forks, oldest first.
            models.Index(fields=["origin", "created_at"], name="everystep_run_fork_origin_idx"),
        ]

    def __str__(self):
        return f"{self.run_id} forked from {self.origin_id} at step {self.origin_step_id}"
