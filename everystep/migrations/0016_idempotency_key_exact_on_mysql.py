from django.db import migrations

from everystep.migrations import _mysql_collation


def exact_key_collation(apps, schema_editor):
    """On MySQL/MariaDB only: compare idempotency keys byte for byte.

    The column had the database's default collation, which ignores case and
    accents and pads spaces (utf8mb4_general_ci, utf8mb4_unicode_ci,
    utf8mb4_0900_ai_ci), so that "Order-A" and "order-a", "k" and "k ",
    "straße" and "strasse" were one key to the unique (name, idempotency_key)
    index of 0006 (everystep_workflow_idempotency_my) and to schedule()'s
    lookup: the second request got the first request's run. PostgreSQL and
    SQLite compare keys exactly; now MySQL/MariaDB do too.

    Not a schema change: the column stays varchar(255) NULL in its character
    set, and every index and constraint stays as it is (MySQL rebuilds them);
    the collation is how MySQL compares the values, which other backends do
    not have to be told. So the model is unchanged, and this runs on
    MySQL/MariaDB only. ``name`` keeps its collation: the UI's
    case-insensitive search relies on it.

    The collation is the first of _mysql_collation._PREFERRED the server
    offers for the column's character set: a binary NO PAD one where there is one (MariaDB:
    utf8mb4_nopad_bin; MySQL 8.0.17+: utf8mb4_0900_bin), else {charset}_bin,
    which is exact but for trailing spaces ("k" and "k " stay one key on
    MySQL before 8.0.17 only).

    Stricter comparison cannot make existing keys collide, so this never
    fails on existing rows. The reverse gives the column back the table's
    default collation; it fails with a duplicate-key error if rows made since
    hold keys that differ only by case, accents or trailing spaces.
    """
    _mysql_collation.exact(schema_editor, "everystep_workflow", "idempotency_key")


def default_key_collation(apps, schema_editor):
    # No character set or collation: the table's defaults, as 0001 made the column.
    _mysql_collation.default(schema_editor, "everystep_workflow", "idempotency_key")


class Migration(migrations.Migration):
    """Idempotency keys compare exactly on MySQL/MariaDB (see exact_key_collation)."""

    atomic = False  # MySQL cannot run DDL inside a transaction

    dependencies = [("everystep", "0015_child_runs")]

    operations = [migrations.RunPython(exact_key_collation, default_key_collation, elidable=False)]
