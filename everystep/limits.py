"""Concurrency limits: ``@workflow(max_concurrent=N)`` caps the runs of a
workflow that are ``running`` at once, across every worker of the fleet.

A worker claims a limited workflow's runs apart from the others
(:func:`claim_limited`, called by :func:`everystep.claims.claim_runs` before
its usual claim, which then skips the limited names). Each limited workflow
with runs waiting and room left is claimed in a transaction of its own:

1. write the workflow's ``everystep_concurrency_limit`` row: the row lock
   (PostgreSQL, MariaDB/MySQL) or the database's write lock (SQLite) makes
   every other claimer of that workflow wait here until this one commits;
2. count its ``running`` runs: under the lock, a claim that committed before
   is counted, one that has not started yet comes after;
3. claim at most N minus that count of its ``scheduled`` runs, oldest first.

The count is read after the lock is taken, as its own statement: fresh under
READ COMMITTED (PostgreSQL), and under REPEATABLE READ (InnoDB's default) the
transaction's snapshot is taken by its first plain read, which is this count,
not by the locking write before it.

Only a claim makes a run ``running``; every other move (completion, failure,
stop, requeue, drain, the recovery of a stale worker's runs) takes it out of
``running`` and so frees its slot for the next claim, of any worker. A run
left ``running`` under a crashed worker keeps its slot until that worker's
restart resumes it or another worker's recovery requeues it: it may still be
executing.

The limits are the ones the claiming worker's code declares: workers that
import different declarations (during a deploy) each enforce their own.
A workflow without a limit costs its claim nothing more than a filter on the
limited names; with no limit declared at all, the claim is today's statement.

Invariant (what a crash at any line leaves behind): the claim is one
transaction; a crash before its commit claims nothing, after it leaves the
claimed runs ``running`` under the claimer's name, as an unlimited claim does.
"""

import datetime as dt
import logging
from dataclasses import dataclass

from django.db import DatabaseError
from django.utils import timezone

from . import database
from .errors import EverystepError

# The largest limit every backend's max_concurrent column holds: a
# PositiveIntegerField is a signed 32-bit integer on PostgreSQL (MariaDB/MySQL:
# unsigned, SQLite: 64 bits).
MAX_LIMIT = 2**31 - 1

logger = logging.getLogger("everystep")


def checked(workflow: str, value) -> int | None:
    """``value`` as a ``max_concurrent`` (None: no limit), or an
    :class:`~everystep.errors.EverystepError` naming the workflow and the value."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EverystepError(
            f"workflow {workflow}: max_concurrent={value!r}: the limit must be a positive "
            "integer (the most runs of this workflow running at once), or None for no limit"
        )
    if value > MAX_LIMIT:
        # Every claim writes the limit into everystep_concurrency_limit: a value
        # the column cannot hold would fail every claim of every worker (other
        # workflows' runs included), so it is refused here, at import.
        raise EverystepError(
            f"workflow {workflow}: max_concurrent={value!r}: the limit must be at most "
            f"{MAX_LIMIT} (what the database stores); use None for no limit"
        )
    return value


# One row per limited workflow, in one round trip: how many of its runs are
# running, and when its oldest waiting run was made (NULL: none waits). Both
# are probes of an index: the status index for the few running rows, the
# partial (name, created_at) index of scheduled rows for the oldest one.
_PEEK = (
    "SELECT {i}, "
    "(SELECT COUNT(*) FROM everystep_workflow WHERE status = 'running' AND name = %s), "
    "(SELECT MIN(created_at) FROM everystep_workflow WHERE status = 'scheduled' AND name = %s)"
)


@dataclass(frozen=True)
class Usage:
    """A limited workflow as of a peek: ``running`` of at most ``limit``, and
    when its oldest waiting run was made (None: none waits)."""

    name: str
    limit: int
    running: int
    oldest_waiting: dt.datetime | None

    @property
    def full(self) -> bool:
        return self.running >= self.limit


def peek(limits: dict[str, int]) -> list[Usage]:
    """Each limited workflow of ``limits`` (``{name: N}``), by name, in one query
    and without a lock: what a claim goes by to pick whom to lock, and what the
    overview shows."""
    if not limits:
        return []
    names = sorted(limits)
    sql = " UNION ALL ".join(_PEEK.format(i=i) for i in range(len(names)))
    conn = database.connection()
    with conn.cursor() as cursor:
        cursor.execute(sql, [param for name in names for param in (name, name)])
        rows = sorted(cursor.fetchall())
    return [Usage(names[i], limits[names[i]], running, _aware(oldest)) for i, running, oldest in rows]


def _aware(value) -> dt.datetime | None:
    """A raw ``created_at`` as an aware datetime: SQLite returns text, and
    MySQL a naive datetime in UTC (Django stores UTC there with USE_TZ)."""
    from .models import Workflow

    if value is None:
        return None
    value = Workflow._meta.get_field("created_at").to_python(value)
    return timezone.make_aware(value, dt.UTC) if timezone.is_naive(value) else value


def claim_limited(claimer: str, free: int, exclude, limits: dict[str, int]) -> list:
    """Claim up to ``free`` runs of the limited workflows in ``limits``
    (``{name: N}``), never letting more than N of a workflow be ``running``.

    A :func:`peek` comes first, so that a claim locks only a workflow that has
    runs waiting and looked like it had room: a full or idle limited workflow
    costs a claim that one query. Workflows are then claimed in the order of
    their oldest waiting run."""
    waiting = sorted(
        (usage.oldest_waiting, usage.name)
        for usage in peek(limits)
        if usage.oldest_waiting is not None and not usage.full
    )
    claimed = []
    for _, name in waiting:
        if len(claimed) >= free:
            break
        try:
            claimed += _claim_workflow(claimer, name, limits[name], free - len(claimed), exclude)
        except DatabaseError as exc:
            if not claimed:
                raise
            # The workflows claimed before are committed: their runs must be executed.
            kept_after_failure(claimer, claimed, exc)
            break
    return claimed


def kept_after_failure(claimer: str, claimed: list, exc: DatabaseError) -> None:
    """A claim failed after part of it committed: ``claimed`` goes to the
    worker all the same (left out, its runs would stay ``running`` under a live
    worker, holding their workflows' slots); the failure is told here."""
    logger.warning(
        "worker %r: part of a claim failed (%s); executing the %d run(s) claimed before it",
        claimer,
        exc,
        len(claimed),
    )
    database.close_quietly()  # a connection broken by the failure: the next query reconnects


def _claim_workflow(claimer: str, name: str, limit: int, free: int, exclude) -> list:
    """One limited workflow's claim, in its own transaction (see the module docstring)."""
    try:
        return _claim_locked(claimer, name, limit, free, exclude)
    except _NoLockRow:
        _make_lock_row(name, limit)
    try:
        return _claim_locked(claimer, name, limit, free, exclude)
    except _NoLockRow:  # deleted again meanwhile: the next claim tries again
        return []


class _NoLockRow(Exception):
    """The workflow's limit row does not exist yet: nothing was locked."""


def _claim_locked(claimer: str, name: str, limit: int, free: int, exclude) -> list:
    from .claims import decode_stored, undecoded
    from .models import ConcurrencyLimit, Workflow

    Status = Workflow.Status
    conn = database.connection()
    with database.atomic():
        # The lock: this write holds the row until the transaction ends.
        locked = ConcurrencyLimit.objects.filter(name=name).update(
            max_concurrent=limit, claimed_at=timezone.now()
        )
        if not locked:
            raise _NoLockRow(name)
        room = limit - running_count(name)
        if room <= 0:
            return []
        runs = Workflow.objects.filter(status=Status.SCHEDULED, name=name).order_by("created_at")
        if exclude:
            runs = runs.exclude(id__in=list(exclude))
        # Claimers of this workflow are serialised by the lock; SKIP LOCKED passes
        # over a row an operator is changing right now instead of waiting for it.
        skip = conn.vendor == "postgresql"
        # Decoded run by run below: one run whose arguments no longer decode fails alone.
        claimed = list(undecoded(runs).select_for_update(skip_locked=skip)[: min(free, room)])
        if claimed:
            Workflow.objects.filter(id__in=[run.id for run in claimed]).update(
                status=Status.RUNNING, claimed_by=claimer
            )
    for run in claimed:
        run.status, run.claimed_by = Status.RUNNING, claimer
        decode_stored(run, conn)
    return claimed


def running_count(name: str) -> int:
    """How many runs of workflow ``name`` are ``running`` now (all workers)."""
    from .models import Workflow

    return Workflow.objects.filter(status=Workflow.Status.RUNNING, name=name).count()


def _make_lock_row(name: str, limit: int) -> None:
    """The first claim of a workflow (or one after the table was emptied) makes
    its row on its own, committed before the claim: two claimers inserting it
    inside their claims could deadlock on MariaDB's gap locks. Two racing
    here leave one row."""
    from .models import ConcurrencyLimit

    ConcurrencyLimit.objects.bulk_create(
        [ConcurrencyLimit(name=name, max_concurrent=limit, claimed_at=timezone.now())],
        ignore_conflicts=True,
    )
