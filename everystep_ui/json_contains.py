"""JSON containment on any supported database, for the run list's argument filter.

PostgreSQL (``@>``) and MySQL (``JSON_CONTAINS``) answer Django's ``contains``
lookup on JSON fields; SQLite has no containment operator, so on SQLite the
same test runs as a Python function registered on each new connection.
"""

import json

from django.db import connections
from django.db.models import BooleanField, F, Func, QuerySet, Value

from everystep import serde

SQLITE_FUNCTION = "everystep_ui_json_contains"


def filter_containing(queryset: QuerySet, field_name: str, needle) -> QuerySet:
    """Rows whose JSON column ``field_name`` contains ``needle`` (PostgreSQL semantics)."""
    if connections[queryset.db].vendor == "sqlite":
        encoded = json.dumps(serde.encode(needle))
        test = Func(
            F(field_name),
            Value(encoded),
            function=SQLITE_FUNCTION,
            output_field=BooleanField(),
        )
        return queryset.filter(test)
    return queryset.filter(**{f"{field_name}__contains": needle})


def contains(haystack, needle) -> bool:
    """PostgreSQL's ``jsonb @> jsonb``: objects match a subset of their keys,
    arrays match when every needle element is contained by some element."""
    if isinstance(needle, dict):
        return isinstance(haystack, dict) and all(
            key in haystack and contains(haystack[key], value) for key, value in needle.items()
        )
    if isinstance(needle, list):
        return isinstance(haystack, list) and all(
            any(contains(item, wanted) for item in haystack) for wanted in needle
        )
    if isinstance(haystack, dict | list):
        return False
    if isinstance(haystack, bool) or isinstance(needle, bool):
        return haystack is needle  # JSON true is not the number 1
    return haystack == needle


def _sqlite_contains(haystack_text, needle_text):
    if haystack_text is None or needle_text is None:
        return None
    return contains(json.loads(haystack_text), json.loads(needle_text))


def register_sqlite_function(sender, connection, **kwargs):
    """``connection_created`` receiver."""
    if connection.vendor == "sqlite":
        connection.connection.create_function(SQLITE_FUNCTION, 2, _sqlite_contains, deterministic=True)
