"""The one database the engine uses, and getting through its outages.

``EVERYSTEP_DATABASE`` (default ``"default"``) names the alias of
``DATABASES`` that holds everystep's tables. Every engine statement,
transition, claim, NOTIFY/LISTEN and UI query goes there: the models' managers
are bound to it, and raw SQL and transactions ask :func:`alias` for it. A
project's own tables may live elsewhere; ``schedule()`` then joins the
caller's transaction only when that transaction is on this alias
(``transaction.atomic(using=...)``).

``EVERYSTEP_LISTEN_DATABASE`` (default: ``EVERYSTEP_DATABASE``) names the
alias whose connection settings a worker's LISTEN connection uses. Behind a
pooler in transaction mode (PgBouncer) that must be a direct connection to the
same PostgreSQL database: LISTEN is session state, which such a pooler hands
to another client after each transaction. Only its settings are used (the
worker opens that one connection itself); nothing else goes there.

And code that only reads may send everystep's queries to
another alias, a streaming replica, inside :func:`reading_from` (the UI's
pages do, with ``EVERYSTEP_UI_READ_DATABASE``).
"""

import contextlib
import contextvars
import logging
import time

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction

logger = logging.getLogger("everystep")


# Set only around read-only code: a replica refuses writes, loudly.
_reads = contextvars.ContextVar("everystep_reads", default=None)


def alias() -> str:
    """The alias of ``DATABASES`` that holds everystep's tables (or, inside
    :func:`reading_from`, the copy being read)."""
    return _reads.get() or getattr(settings, "EVERYSTEP_DATABASE", "default")


@contextlib.contextmanager
def reading_from(read_alias: str | None):
    """Inside this block everystep's queries go to ``read_alias`` (``None``:
    nowhere else). For read-only code only: a streaming replica refuses
    writes, and lags the primary by its replication delay."""
    token = _reads.set(read_alias)
    try:
        yield
    finally:
        _reads.reset(token)


def is_alias(value) -> bool:
    """Whether a setting's ``value`` names an alias of ``DATABASES`` (a list or
    a dict, say, does not, and cannot be looked up there)."""
    return isinstance(value, str) and value in settings.DATABASES


def listen_alias() -> str:
    """The alias of ``DATABASES`` whose settings the workers' LISTEN connection uses."""
    return getattr(settings, "EVERYSTEP_LISTEN_DATABASE", None) or alias()


def connection():
    """This thread's connection to everystep's database."""
    return connections[alias()]


def atomic():
    """A transaction (or a savepoint inside one) on everystep's database."""
    return transaction.atomic(using=alias())


# A worker's pool thread keeps its connection to everystep's database from one
# run to the next: a new PostgreSQL connection costs milliseconds (a backend
# process, authentication, Django's set-up), a run of ten steps about the same.
# A connection left idle longer than this is tried (SELECT 1) before a run
# uses it, so that a restart or an idle timeout meanwhile costs a reconnect,
# not a run sent back to the queue.
CHECK_IDLE_AFTER = 1.0


def keep_for_next_run() -> None:
    """At the end of a run on a worker's pool thread: Django's rule at the end
    of a request for each of the thread's connections (one left changed by a
    step, or broken, is closed; ``CONN_MAX_AGE``), except that the connection
    to everystep's database has no maximum age: it is kept for the next run."""
    engine = alias()
    for conn in connections.all(initialized_only=True):
        if conn.alias == engine:
            conn.close_at = None
        conn.close_if_unusable_or_obsolete()
        if conn.alias == engine and conn.connection is not None:
            conn.everystep_idle_since = time.monotonic()


def ready_for_run() -> None:
    """Before a run on a worker's pool thread: drop a kept connection that sat
    idle past :data:`CHECK_IDLE_AFTER` and no longer answers; the run's first
    statement then opens a new one."""
    conn = connection()
    idle_since = getattr(conn, "everystep_idle_since", None)
    if conn.connection is None or idle_since is None:
        return
    conn.everystep_idle_since = None
    if time.monotonic() - idle_since > CHECK_IDLE_AFTER and not conn.is_usable():
        conn.close()


def close_quietly() -> None:
    """Drop this thread's connection to everystep's database (e.g. one broken by
    a restart); the next query reconnects."""
    with contextlib.suppress(DatabaseError):
        connection().close()


def reconnecting(func, *args, attempts: int = 30, give_up=None, **kwargs):
    """Call ``func``, reconnecting through a database restart (about a minute):
    a run's end or a requeue must not be lost to a short outage. ``give_up``:
    a callable, true once retrying must stop (the last error is raised)."""
    for attempt in range(attempts):
        try:
            return func(*args, **kwargs)
        except (OperationalError, InterfaceError) as exc:
            if attempt == attempts - 1 or (give_up is not None and give_up()):
                raise
            logger.warning("database unavailable (%s); reconnecting", exc)
            close_quietly()
            resume = time.monotonic() + min(0.2 * 2**attempt, 2.0)
            while (pause := resume - time.monotonic()) > 0:
                if give_up is not None and give_up():
                    raise
                time.sleep(min(pause, 0.1))  # a give_up() heard within 0.1 s
