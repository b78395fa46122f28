"""Inserting a run: the one write ``schedule()`` makes, inside the caller's transaction."""

from django.db import IntegrityError, connections, router, transaction

NOTIFY_CHANNEL = "everystep_scheduled"


def insert_run(model, name: str, args: list, idempotency_key: str | None):
    using = router.db_for_write(model)
    if idempotency_key is None:
        run = model.objects.using(using).create(name=name, args=args)
    else:
        existing = model.objects.using(using).filter(name=name, idempotency_key=idempotency_key)
        run = existing.first()
        if run is not None:
            return run
        try:
            # A savepoint: losing the race must not break the caller's transaction.
            with transaction.atomic(using=using):
                run = model.objects.using(using).create(
                    name=name, args=args, idempotency_key=idempotency_key
                )
        except IntegrityError:
            return _winner(model, using, name, idempotency_key)
    notify_scheduled(using)
    return run


def _winner(model, using: str, name: str, idempotency_key: str):
    """The row that won the race. On MySQL a plain read could come from the
    caller's REPEATABLE READ snapshot, which predates the winner; a shared
    locking read sees the committed row, and unlike FOR UPDATE it does not
    deadlock with the other losers, who hold shared locks on the same key."""
    if connections[using].vendor != "mysql":
        return model.objects.using(using).get(name=name, idempotency_key=idempotency_key)
    table = model._meta.db_table
    query = f"SELECT * FROM {table} WHERE name = %s AND idempotency_key = %s LOCK IN SHARE MODE"
    return model.objects.using(using).raw(query, [name, idempotency_key])[0]


def notify_scheduled(using: str) -> None:
    """Wake idle workers. PostgreSQL delivers NOTIFY on commit and drops it on rollback."""
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [NOTIFY_CHANNEL])


CONTROL_CHANNEL = "everystep_control"


def notify_control(using: str, run_id) -> None:
    """Tell the worker running ``run_id`` that the run left it (stopped or requeued),
    so that it starts no further step. Delivered on commit, PostgreSQL only; elsewhere
    the fenced step insert is what stops the worker."""
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CONTROL_CHANNEL, str(run_id)])
