"""The tables: one row per run, one row per executed step, one row per worker
(its heartbeat), the links of forks and child runs, and one row per
concurrency-limited workflow (its claim lock)."""

import datetime as dt

import uuid6
from django.db import models
from django.db.models import Case, DurationField, Exists, ExpressionWrapper, F, OuterRef, Q, When
from django.db.models.lookups import Exact
from django.utils import timezone

from . import database
from .fields import EverystepJSONField
from .heartbeats import UtcNow
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

    def running_under(self, claimer):
        """The fence of a write to one run (``filter(id=...)`` first): the run,
        while it is ``running`` under ``claimer``."""
        return self.filter(running_under(claimer))


def running_under(claimer, run: str = "") -> Exact:
    """The fence of a write to one run, as a filter: the run (``run``: the path
    to it, ``"workflow__"`` from a step) is ``running`` under ``claimer``.

    One expression, as in the hot path's SQL (``statements.RUNNING_UNDER``),
    so that the run is found by its primary key whatever the table's
    statistics say: with the status and the claimer as two conditions,
    PostgreSQL may plan the lookup through their indexes instead."""
    running_claimer = Case(When(**{f"{run}status": Workflow.Status.RUNNING}, then=F(f"{run}claimed_by")))
    return Exact(running_claimer, claimer)


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
    # On MySQL/MariaDB, idempotency_key and claimed_by have a binary collation
    # (migrations 0016, 0017): they compare exactly, as elsewhere. name keeps
    # the default one, for the UI's case-insensitive search.
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
            # Serves the claim of a concurrency-limited workflow: its scheduled
            # rows in created_at order (MySQL gets a (status, name, created_at) index).
            models.Index(
                fields=["name", "created_at"],
                condition=Q(status="scheduled"),
                name="everystep_workflow_limit_idx",
            ),
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
            ("wake_workflow", "Can wake a waiting run now"),
            ("send_event_workflow", "Can send an event to a waiting run"),
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
    # Compared exactly on MySQL/MariaDB too (a binary collation, migration 0017),
    # as are Wait.step_id and key, Event.key, ChildRun.step_id and Heartbeat.name.
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


class ChildRun(models.Model):
    """Which run started a run: one row per run made by
    :func:`~everystep.start_child`, keyed by that child run.

    ``parent`` is the run whose body called ``start_child``, ``step_id`` the
    dotpath of that call in the parent (unique per parent: one child per
    call). Deleting either run (e.g. pruning it) deletes the link, never the
    other run. An additive table: the two tables above keep their columns.
    """

    child = models.OneToOneField(
        Workflow, primary_key=True, on_delete=models.CASCADE, related_name="parent_link"
    )
    # No index of its own: the unique (parent, step_id) index serves a parent's lookups.
    parent = models.ForeignKey(
        Workflow, on_delete=models.CASCADE, related_name="child_links", db_index=False
    )
    step_id = models.CharField(max_length=300)
    created_at = models.DateTimeField(default=timezone.now)

    objects = EngineManager()

    class Meta:
        db_table = "everystep_child"
        constraints = [
            models.UniqueConstraint(fields=["parent", "step_id"], name="everystep_child_parent_step_uniq")
        ]

    def __str__(self):
        return f"{self.child_id} started by {self.parent_id} at step {self.step_id}"


class HeartbeatQuerySet(models.QuerySet):
    """Ages are measured by the database's clock, which also wrote ``last_seen``:
    clock skew between machines never makes a live worker look stale. Both the
    beat and the look read it as ``UtcNow()``: on MySQL/MariaDB ``Now()``
    follows the session time zone, which a DST switch moves in between."""

    def with_age(self):
        """Each row's ``age``: how long ago its worker last wrote it (a timedelta)."""
        return self.annotate(age=ExpressionWrapper(UtcNow() - F("last_seen"), output_field=DurationField()))

    def stale(self, seconds: float):
        """Workers whose last heartbeat is more than ``seconds`` old."""
        return self.filter(last_seen__lt=UtcNow() - dt.timedelta(seconds=seconds))

    def with_claims(self):
        """Each row's ``claims``: whether runs are ``running`` under its worker's name."""
        running = Workflow.objects.filter(status=Workflow.Status.RUNNING, claimed_by=OuterRef("name"))
        return self.annotate(claims=Exists(running))


class Heartbeat(models.Model):
    """A worker's heartbeat: one ``everystep_heartbeat`` row per worker name,
    written by its claim loop every few seconds (never per step).

    ``name`` is the worker's name (what its runs' ``claimed_by`` holds);
    ``hostname``, ``pid``, ``version`` (everystep's), ``pool_size`` and
    ``started_at`` (the worker's clock) say which process it is; ``in_flight``
    counts the runs it executes and ``executing`` maps each of their ids to the
    ids of the steps whose functions run now, as of ``last_seen`` (the
    database's clock). A restart under the same name takes the row over; a
    clean shutdown deletes it.
    """

    name = models.CharField(max_length=255)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    version = models.CharField(max_length=64)
    pool_size = models.PositiveIntegerField()
    in_flight = models.PositiveIntegerField(default=0)
    executing = models.JSONField(default=dict)
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField()

    objects = EngineManager.from_queryset(HeartbeatQuerySet)()

    class Meta:
        db_table = "everystep_heartbeat"
        ordering = ["name"]
        # No other index: a row per worker, read whole, and one index fewer
        # is one write fewer per heartbeat.
        constraints = [models.UniqueConstraint(fields=["name"], name="everystep_heartbeat_name_uniq")]

    def __str__(self):
        return self.name


class Wait(models.Model):
    """What a ``waiting`` run waits for: one row per wait step it stopped at
    (:mod:`everystep.waits`), deleted when the run is woken.

    ``step_id`` is the wait's step (its ``started`` row in ``everystep_step``);
    ``kind`` is ``time`` (a sleep) or ``event`` (``wait_for_event``; ``key``
    names the event), with room for more kinds; ``wake_at`` is when the run
    becomes claimable again (a sleep's end, an event wait's timeout; ``NULL``
    for an event wait without a timeout). An additive table.
    """

    class Kind(models.TextChoices):
        TIME = "time"
        EVENT = "event"
        CHILD = "child"  # handle.result() of a child run (everystep.children); key: its run id

    run = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="waits", db_index=False)
    step_id = models.CharField(max_length=300)
    kind = models.CharField(max_length=16, choices=Kind)
    key = models.CharField(max_length=255, null=True, blank=True)
    wake_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    objects = EngineManager()

    class Meta:
        db_table = "everystep_wait"
        ordering = ["wake_at"]
        indexes = [
            # The worker loop's "what is due" and "when is the next one due".
            models.Index(fields=["wake_at"], name="everystep_wait_wake_idx"),
            # send_event's "is this run waiting for this key".
            models.Index(fields=["key"], name="everystep_wait_key_idx"),
        ]
        constraints = [
            # Also serves every lookup by run.
            models.UniqueConstraint(fields=["run", "step_id"], name="everystep_wait_run_step_uniq")
        ]

    def __str__(self):
        return f"{self.run_id} waits at {self.step_id} ({self.kind})"


class Event(models.Model):
    """An event sent to a run (:func:`everystep.send_event`): one row per
    ``(run, key)``, kept whether or not the run waits for it yet; the first
    value sent for a key is the one served. An additive table."""

    run = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="events", db_index=False)
    key = models.CharField(max_length=255)
    value = EverystepJSONField(null=True, blank=True)
    sent_at = models.DateTimeField(default=timezone.now)

    objects = EngineManager()

    class Meta:
        db_table = "everystep_event"
        ordering = ["sent_at"]
        constraints = [
            models.UniqueConstraint(fields=["run", "key"], name="everystep_event_run_key_uniq")
        ]

    def __str__(self):
        return f"{self.run_id} event {self.key}"


class ConcurrencyLimit(models.Model):
    """The lock of a workflow declared ``@workflow(max_concurrent=N)``: one
    ``everystep_concurrency_limit`` row per limited workflow name, made by the
    first claim of one of its runs (``everystep.limits``).

    A claim of that workflow's runs writes the row first, which locks it until
    the claim commits, so that claimers of the workflow count its ``running``
    runs one after the other. ``max_concurrent`` is the limit and
    ``claimed_at`` the time of the last claim that took the lock, as the
    claiming worker saw them. An additive table: the two tables above keep
    their columns.
    """

    name = models.CharField(max_length=300)
    max_concurrent = models.PositiveIntegerField()
    claimed_at = models.DateTimeField()

    objects = EngineManager()

    class Meta:
        db_table = "everystep_concurrency_limit"
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["name"], name="everystep_concurrency_limit_name_uniq")]

    def __str__(self):
        return f"{self.name} (at most {self.max_concurrent} running)"
