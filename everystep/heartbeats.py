"""Worker heartbeats: one ``everystep_heartbeat`` row per worker, written by its
claim loop every ``EVERYSTEP_HEARTBEAT_INTERVAL`` seconds, never per step; and
the settings that say when a silent worker counts as stale.

``last_seen`` is written and compared by the database's clock (:class:`UtcNow`),
so clock skew between machines never makes a live worker look stale.

Invariants (what a crash at any line leaves behind):
- a killed worker leaves its row as it last wrote it. Once that row is older
  than ``EVERYSTEP_RECOVER_STALE_AFTER``, any live worker requeues the killed
  worker's runs (:func:`everystep.operations.requeue_stale_worker`); a restart
  under the same name takes the row over and re-claims its own runs first;
- a clean shutdown deletes the row after requeueing its runs; a crash in
  between leaves the row, which goes stale with nothing left to recover.
"""

import functools
import importlib.metadata
import numbers

from django.conf import settings
from django.db import IntegrityError
from django.db.models.functions import Now

from . import database

DEFAULT_INTERVAL = 5.0
DEFAULT_STALE_AFTER = 60.0
# A live worker may miss a beat or two (a slow claim, a busy database) without
# its runs being taken: the stale limit must cover at least this many intervals.
MIN_INTERVALS = 3
# Executing step ids reported per run: a fork of thousands of branches must not
# make each heartbeat thousands of ids long.
MAX_STEPS_PER_RUN = 100


class UtcNow(Now):
    """Django's ``Now()``, read in UTC on MySQL/MariaDB too: there ``Now()`` is
    ``CURRENT_TIMESTAMP(6)``, in the session time zone, and ``last_seen`` a
    naive DATETIME. With the server's ``time_zone = SYSTEM`` on a host with
    daylight saving time, the offset changes between a beat and the look at it:
    at the spring switch every live worker would look an hour silent (its runs
    requeued), at the autumn switch a dead one an hour younger. UTC has no
    switch (and is what Django stores there). PostgreSQL (timestamptz) and
    SQLite (UTC) keep Django's SQL."""

    def as_mysql(self, compiler, connection, **extra_context):
        return self.as_sql(compiler, connection, template="UTC_TIMESTAMP(6)", **extra_context)


def interval() -> float:
    """``EVERYSTEP_HEARTBEAT_INTERVAL``: seconds between a worker's heartbeats."""
    return getattr(settings, "EVERYSTEP_HEARTBEAT_INTERVAL", DEFAULT_INTERVAL)


def stale_after() -> float | None:
    """``EVERYSTEP_RECOVER_STALE_AFTER``: seconds of silence after which a worker's
    runs are requeued by the others; ``None`` turns recovery off."""
    return getattr(settings, "EVERYSTEP_RECOVER_STALE_AFTER", DEFAULT_STALE_AFTER)


def shown_stale_after() -> float:
    """When the UI calls a worker stale: the recovery limit, or its default
    when recovery is off (the worker is then still shown as stale, its runs stay)."""
    limit = stale_after()
    return DEFAULT_STALE_AFTER if limit is None else limit


def problems(interval: object, stale_after: object) -> list[tuple[str, str]]:
    """What is wrong with these two settings, as ``(check id, message)`` (nothing: [])."""
    found = []
    if not _positive(interval):
        found.append((
            "everystep.E006",
            f"EVERYSTEP_HEARTBEAT_INTERVAL must be a positive number of seconds, got {interval!r}.",
        ))
    if stale_after is not None and not _positive(stale_after):
        found.append((
            "everystep.E006",
            "EVERYSTEP_RECOVER_STALE_AFTER must be a positive number of seconds, or None to turn "
            f"recovery off, got {stale_after!r}.",
        ))
    if not found and stale_after is not None and stale_after < MIN_INTERVALS * interval:
        found.append((
            "everystep.E007",
            f"EVERYSTEP_RECOVER_STALE_AFTER ({stale_after} s) is less than {MIN_INTERVALS} heartbeat "
            f"intervals (EVERYSTEP_HEARTBEAT_INTERVAL = {interval} s): a live worker late with a "
            "heartbeat or two would have its runs taken from it.",
        ))
    return found


def _positive(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value > 0


@functools.cache
def version() -> str:
    """everystep's installed version, as the heartbeat reports it."""
    try:
        return importlib.metadata.version("everystep")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def beat(name: str, **values) -> None:
    """Write worker ``name``'s heartbeat: ``values`` are the row's other columns,
    ``last_seen`` is now. One UPDATE, or an INSERT for a new name."""
    from .models import Heartbeat

    if Heartbeat.objects.filter(name=name).update(last_seen=UtcNow(), **values):
        return
    try:
        with database.atomic():  # a savepoint: a lost race must not break anything around
            Heartbeat.objects.create(name=name, last_seen=UtcNow(), **values)
    except IntegrityError:  # a process under the same name inserted it meanwhile
        Heartbeat.objects.filter(name=name).update(last_seen=UtcNow(), **values)


def others(name: str) -> list[tuple[str, float, bool]]:
    """``(name, age in seconds, holds running runs)`` of every other worker's heartbeat."""
    from .models import Heartbeat

    rows = Heartbeat.objects.exclude(name=name).with_age().with_claims().values_list("name", "age", "claims")
    return [(other, age.total_seconds(), claims) for other, age, claims in rows]


def forget(name: str, *, hostname: str, pid: int) -> None:
    """Delete this process's heartbeat at a clean shutdown (not that of a
    process that took the name over meanwhile)."""
    from .models import Heartbeat

    Heartbeat.objects.filter(name=name, hostname=hostname, pid=pid).delete()
