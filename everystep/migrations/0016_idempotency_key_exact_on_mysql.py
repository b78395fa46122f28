from django.db import migrations

# Binary collations, best first: the NO PAD ones, where trailing spaces count
# (MariaDB 10.2+: {charset}_nopad_bin; MySQL 8.0.17+: utf8mb4_0900_bin), then
# {charset}_bin, which is PAD SPACE on both ("k" = "k ") but exact otherwise.
_PREFERRED = ("{charset}_nopad_bin", "{charset}_0900_bin", "{charset}_bin")


def _column_charset(cursor) -> str:
    cursor.execute(
        "SELECT CHARACTER_SET_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
        "AND TABLE_NAME = 'everystep_workflow' AND COLUMN_NAME = 'idempotency_key'"
    )
    return cursor.fetchone()[0]


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

    The collation is the first of _PREFERRED the server offers for the
    column's character set: a binary NO PAD one where there is one (MariaDB:
    utf8mb4_nopad_bin; MySQL 8.0.17+: utf8mb4_0900_bin), else {charset}_bin,
    which is exact but for trailing spaces ("k" and "k " stay one key on
    MySQL before 8.0.17 only).

    Stricter comparison cannot make existing keys collide, so this never
    fails on existing rows. The reverse gives the column back the table's
    default collation; it fails with a duplicate-key error if rows made since
    hold keys that differ only by case, accents or trailing spaces.
    """
    if schema_editor.connection.vendor != "mysql":
        return
    with schema_editor.connection.cursor() as cursor:
        charset = _column_charset(cursor)
        cursor.execute(
            "SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE CHARACTER_SET_NAME = %s",
            [charset],
        )
        offered = {row[0] for row in cursor.fetchall()}
    collation = next(c.format(charset=charset) for c in _PREFERRED if c.format(charset=charset) in offered)
    schema_editor.execute(
        "ALTER TABLE everystep_workflow MODIFY idempotency_key "
        f"varchar(255) CHARACTER SET {charset} COLLATE {collation} NULL"
    )


def default_key_collation(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    # No character set or collation: the table's defaults, as 0001 made the column.
    schema_editor.execute("ALTER TABLE everystep_workflow MODIFY idempotency_key varchar(255) NULL")


class Migration(migrations.Migration):
    """Idempotency keys compare exactly on MySQL/MariaDB (see exact_key_collation)."""

    atomic = False  # MySQL cannot run DDL inside a transaction

    dependencies = [("everystep", "0015_child_runs")]

    operations = [migrations.RunPython(exact_key_collation, default_key_collation, elidable=False)]
