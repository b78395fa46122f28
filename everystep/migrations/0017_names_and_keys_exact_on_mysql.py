from django.db import migrations

from everystep.migrations import _mysql_collation

# The columns whose values must compare exactly, by table: each is in a unique
# index or looked up by value, and Python holds "charge" and "Charge", "k" and
# "k ", "resume" and "résumé" apart.
EXACT = {
    # unique (workflow, step_id): the record of a step, and an unsafe step's claim on its effect
    "everystep_step": ("step_id",),
    # unique (run, step_id); key: what send_event wakes (an event's key, a child's run id)
    "everystep_wait": ("step_id", "key"),
    # unique (run, key): one event per key, served to the wait for that key
    "everystep_event": ("key",),
    # unique (parent, step_id): the one child of a start_child call
    "everystep_child": ("step_id",),
    # unique (name): one heartbeat per worker
    "everystep_heartbeat": ("name",),
    # the worker's name again: the fence of every write, and what recovery requeues
    "everystep_workflow": ("claimed_by",),
}


def exact_collations(apps, schema_editor):
    """On MySQL/MariaDB only: compare step ids, event keys and worker names
    byte for byte, as 0016 does for idempotency keys (the same collation).

    These columns had the database's default collation, which ignores case
    and accents and pads spaces, so that two names Python holds apart were
    one value to their unique index and to every lookup: the step
    everystep_id="Charge" after "charge" could not be recorded (the run was
    requeued for ever, an unsafe step's run blocked), send_event(run, "K")
    was refused after "k" and a wait for "k" was served the value sent for
    "K", and workers named "w1" and "W1" shared one heartbeat, whose
    recovery requeued the other's running runs.

    Not a schema change, as in 0016: each column keeps its type, length,
    nullability and character set, and MySQL rebuilds its indexes (one ALTER
    TABLE per table, which rewrites it: everystep_step is the big one).
    ``everystep_workflow.name``, ``everystep_concurrency_limit.name`` (the
    lock row of the workflow name) and ``everystep_run_fork.origin_step_id``
    (shown, never looked up) keep theirs.

    Stricter comparison cannot make existing values collide, so this never
    fails on existing rows. The reverse gives the columns back their tables'
    default collation; it fails with a duplicate-key error if rows made since
    hold values that differ only by case, accents or trailing spaces.
    """
    for table, columns in EXACT.items():
        _mysql_collation.exact(schema_editor, table, *columns)


def default_collations(apps, schema_editor):
    for table, columns in reversed(EXACT.items()):
        _mysql_collation.default(schema_editor, table, *columns)


class Migration(migrations.Migration):
    """Step ids, event keys and worker names compare exactly on MySQL/MariaDB
    (see exact_collations)."""

    atomic = False  # MySQL cannot run DDL inside a transaction

    dependencies = [("everystep", "0016_idempotency_key_exact_on_mysql")]

    operations = [migrations.RunPython(exact_collations, default_collations, elidable=False)]
