"""Inserting a run: the one write ``schedule()`` makes, inside the caller's
transaction on everystep's database (``everystep.database``)."""

from django.db import IntegrityError

from . import database
from .errors import EverystepError, RefusedByDatabase

NOTIFY_CHANNEL = "everystep_scheduled"


def refuse_in_a_body(call: str, way_out: str) -> None:
    """``call`` inserts a run. In a workflow's body (outside a step) nothing
    records that it was made, so every replay of the body would insert
    another run: refused there, naming ``way_out``."""
    from .context import current

    ctx = current()
    if ctx is not None and ctx.running_step is None:
        raise EverystepError(
            f"run {ctx.workflow_id}: {call} was called in the workflow's body, where it is not "
            f"recorded, so every replay would start another run. {way_out}"
        )


def insert_run(model, name: str, args: list, idempotency_key: str | None):
    return insert_run_once(model, name, args, idempotency_key)[0]


def insert_run_once(model, name: str, args: list, idempotency_key: str | None) -> tuple:
    """``(run, inserted)``: ``inserted`` is False when the key's run existed or
    another caller's insert won the race (the cron starter counts its wins)."""
    if idempotency_key is None:
        try:
            run = model.objects.create(name=name, args=args)
        except IntegrityError as exc:
            raise _refused(name, exc) from None
    else:
        run = model.objects.filter(name=name, idempotency_key=idempotency_key).first()
        if run is not None:
            return run, False
        try:
            # A savepoint: losing the race must not break the caller's transaction.
            with database.atomic():
                run = model.objects.create(name=name, args=args, idempotency_key=idempotency_key)
        except IntegrityError as exc:
            winner = _winner(model, name, idempotency_key)
            if winner is None:
                raise _refused(name, exc) from None
            return winner, False
    notify_scheduled()
    return run, True


def _winner(model, name: str, idempotency_key: str):
    """The row that won the race. On MySQL a plain read could come from the
    caller's REPEATABLE READ snapshot, which predates the winner; a shared
    locking read sees the committed row, and unlike FOR UPDATE it does not
    deadlock with the other losers, who hold shared locks on the same key.
    None on MySQL when there is none: the insert failed on a value."""
    if database.connection().vendor != "mysql":
        try:
            return model.objects.get(name=name, idempotency_key=idempotency_key)
        except model.DoesNotExist:
            # PostgreSQL under REPEATABLE READ/SERIALIZABLE: the winner committed
            # after the caller's snapshot, which no read of this transaction can
            # see past (it has no locking read that returns a newer row).
            raise EverystepError(
                f"schedule: the run of {name} with idempotency key {idempotency_key!r} was "
                "committed after this transaction's snapshot was taken (REPEATABLE READ or "
                "SERIALIZABLE), so this transaction cannot read it: retry the transaction"
            ) from None
    table = model._meta.db_table
    query = f"SELECT * FROM {table} WHERE name = %s AND idempotency_key = %s LOCK IN SHARE MODE"
    return next(iter(model.objects.raw(query, [name, idempotency_key])), None)


def _refused(name: str, exc: IntegrityError) -> RefusedByDatabase:
    """The insert failed on a value, not on the key: MariaDB's JSON check
    refuses arguments nested past 32 levels, which the other backends store."""
    return RefusedByDatabase(f"schedule: the database refused the run of {name}, nothing was written: {exc}")


def notify_scheduled() -> None:
    """Wake idle workers. PostgreSQL delivers NOTIFY on commit and drops it on rollback."""
    connection = database.connection()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [NOTIFY_CHANNEL])


CONTROL_CHANNEL = "everystep_control"


def notify_control(run_id) -> None:
    """Tell the worker running ``run_id`` that the run left it (stopped or requeued),
    so that it starts no further step. Delivered on commit, PostgreSQL only; elsewhere
    the fenced step insert is what stops the worker."""
    connection = database.connection()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CONTROL_CHANNEL, str(run_id)])
