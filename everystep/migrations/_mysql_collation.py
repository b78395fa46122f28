"""Exact comparison of text columns on MySQL/MariaDB, for migrations 0016 and 0017.

The underscore keeps Django's migration loader from taking this module for a
migration. Both functions do nothing on other backends: PostgreSQL and SQLite
compare text exactly already, and the models do not change.
"""

# Binary collations, best first: the NO PAD ones, where trailing spaces count
# (MariaDB 10.2+: {charset}_nopad_bin; MySQL 8.0.17+: utf8mb4_0900_bin), then
# {charset}_bin, which is PAD SPACE on both ("k" = "k ") but exact otherwise.
_PREFERRED = ("{charset}_nopad_bin", "{charset}_0900_bin", "{charset}_bin")


def _columns(cursor, table: str, columns) -> list[tuple[str, str, str, str]]:
    """``(column, type, nullable, charset)`` of each column, as the database holds it."""
    cursor.execute(
        "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, CHARACTER_SET_NAME FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
        [table],
    )
    found = {name: (column_type, nullable, charset) for name, column_type, nullable, charset in cursor.fetchall()}
    return [(column, *found[column]) for column in columns]


def _exact_collation(cursor, charset: str) -> str:
    cursor.execute(
        "SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE CHARACTER_SET_NAME = %s",
        [charset],
    )
    offered = {row[0] for row in cursor.fetchall()}
    return next(c.format(charset=charset) for c in _PREFERRED if c.format(charset=charset) in offered)


def _modify(schema_editor, table: str, columns, collation) -> None:
    """One ALTER TABLE that re-states each of ``columns`` as the database holds
    it (type, length, nullability), with the clause ``collation(cursor,
    charset)`` gives after its type. Nothing on other backends."""
    if schema_editor.connection.vendor != "mysql":
        return
    with schema_editor.connection.cursor() as cursor:
        changes = [
            f"MODIFY {schema_editor.quote_name(column)} {column_type}{collation(cursor, charset)} "
            f"{'NULL' if nullable == 'YES' else 'NOT NULL'}"
            for column, column_type, nullable, charset in _columns(cursor, table, columns)
        ]
    schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} {', '.join(changes)}")


def exact(schema_editor, table: str, *columns: str) -> None:
    """Give ``table``'s ``columns`` the first binary collation of _PREFERRED
    their character set offers; type, length, nullability and character set
    stay as they are, and MySQL rebuilds the indexes."""
    _modify(
        schema_editor,
        table,
        columns,
        lambda cursor, charset: f" CHARACTER SET {charset} COLLATE {_exact_collation(cursor, charset)}",
    )


def default(schema_editor, table: str, *columns: str) -> None:
    """The reverse of :func:`exact`: no character set or collation, i.e. the
    table's defaults, as the columns were made. Fails with a duplicate-key
    error if rows made since hold values that differ only by case, accents
    or trailing spaces in a unique index."""
    _modify(schema_editor, table, columns, lambda cursor, charset: "")
