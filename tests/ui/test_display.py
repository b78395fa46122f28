"""Formatting helpers and the JSON containment used on SQLite."""

import datetime as dt

import pytest

from everystep_ui.display import decode_error, format_duration, resolve_command
from everystep_ui.json_contains import contains


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.25, "0.2 s"),
        (42, "42 s"),
        (90, "1 min 30 s"),
        (3 * 3600 + 120, "3 h 2 min"),
        (2 * 86400 + 3600, "2 d 1 h"),
    ],
)
def test_durations_read_at_a_glance(seconds, text):
    assert format_duration(dt.timedelta(seconds=seconds)) == text


def test_no_duration_is_a_dash():
    assert format_duration(None) == "—"


def test_terminal_errors_expose_reason_and_payload():
    error = decode_error({"type": "everystep.errors.Terminal", "message": "why", "args": ["why", {"a": 1}]})
    assert error.is_terminal and error.terminal_reason == "why"
    assert error.terminal_payload_json == '{\n  "a": 1\n}'


def test_effect_uncertain_errors_are_recognised():
    assert decode_error({"type": "everystep.errors.EffectUncertain", "message": "m"}).is_uncertain


def test_where_an_import_error_was_raised_is_shown_only_when_readable():
    payload = {"type": "builtins.KeyError", "message": "'region'", "args": ["region"]}
    where = {"module": "shop.workflows", "file": "/srv/shop/workflows.py", "line": 7}
    assert decode_error({**payload, "where": where}).where == {**where, "line": "7"}
    assert decode_error({**payload, "where": "line 7"}).where is None
    assert decode_error(payload).where is None


def test_the_resolve_command_names_run_and_step():
    assert resolve_command("RUN", "3.0.1") == (
        "python manage.py everystep_resolve_step RUN 3.0.1 (--result JSON | --error MESSAGE | --discard)"
    )


@pytest.mark.parametrize(
    ("haystack", "needle", "expected"),
    [
        ([{"order_id": 42, "x": 1}, "eu"], [{"order_id": 42}], True),
        ([{"order_id": 42}], [{"order_id": 43}], False),
        ([{"tags": ["a", "b"]}], [{"tags": ["b"]}], True),
        ([1, 2, 3], [3, 1], True),
        ([1, [2, 3]], [[3]], True),
        ([1, [2]], [2], False),
        ([1], [True], False),
        ([True], [1], False),
        ([1.0], [1], True),
        ([None], [None], True),
        ({"a": {"b": 1}}, {"a": {}}, True),
        ("text", "text", True),
        ([], [], True),
    ],
)
def test_containment_follows_postgresql(haystack, needle, expected):
    assert contains(haystack, needle) is expected
