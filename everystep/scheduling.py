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
            with transaction.atomic(using=using):
                # A locking read sees the winner's committed row even under
                # MySQL's REPEATABLE READ snapshot.
                return existing.select_for_update().get()
    notify_scheduled(using)
    return run


def notify_scheduled(using: str) -> None:
    """Wake idle workers. PostgreSQL delivers NOTIFY on commit and drops it on rollback."""
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [NOTIFY_CHANNEL])
