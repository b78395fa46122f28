import collections
import datetime as dt
import decimal
import enum
import json
import math
import os
import re
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from everystep import serde
from everystep.errors import ChildFailed, EverystepError, StepFailure, Terminal
from tests.core.workflows import Color

# Text every backend stores: no NUL, no lone surrogate (Cs).
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    text,
    st.datetimes(timezones=st.one_of(st.none(), st.just(dt.UTC))),
    st.dates(),
    st.timedeltas(),
    st.uuids(),
    st.binary(),
    st.binary().map(bytearray),
    st.sampled_from(list(Color)),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children),
        st.lists(children).map(tuple),
        st.dictionaries(st.one_of(text, st.just("$es")), children),
    ),
    max_leaves=20,
)


@given(values)
def test_round_trip_keeps_values_and_types(value):
    restored = serde.loads(serde.dumps(value))
    assert restored == value
    assert type(restored) is type(value)


@given(st.dictionaries(text, text))
def test_plain_dict_with_tag_like_content_is_not_mistaken(value):
    value = {**value, "$es": "datetime", "v": "2020-01-01T00:00:00"}
    assert serde.loads(serde.dumps(value)) == value


def test_a_dict_of_plain_values_with_the_tag_key_is_still_wrapped():
    assert serde.encode({"$es": "uuid", "v": "x"}) == {"$es": "dict", "v": {"$es": "uuid", "v": "x"}}
    assert serde.encode([1, "a", None, True]) == [1, "a", None, True]


def test_encodings_are_plain_json():
    encoded = serde.encode({"when": dt.date(2024, 5, 1), "id": uuid.UUID(int=1), "raw": b"\x00"})
    assert json.loads(json.dumps(encoded)) == encoded
    assert encoded["when"] == {"$es": "date", "v": "2024-05-01"}


@pytest.mark.parametrize(
    "value, problem",
    [(object(), "is not serializable"), (float("nan"), "must be finite"), ({1: "a"}, "keys must be str")],
)
def test_unsupported_values_are_refused_with_their_path(value, problem):
    with pytest.raises(EverystepError, match=problem) as info:
        serde.encode({"outer": [value]})
    assert "$['outer'][0]" in str(info.value)


@pytest.mark.parametrize(
    "value, problem",
    [
        ("a\x00b", "NUL character"),
        ("caf\u00e9 \ud800", "lone surrogate"),
        ({"k\x00": 1}, "dict key .* NUL character"),
    ],
)
def test_text_a_backend_cannot_store_is_refused_on_every_backend(value, problem):
    # PostgreSQL's jsonb refuses NUL and lone surrogates after the fact (and
    # libpq cuts text at a NUL); SQLite and MariaDB keep them. Refused alike.
    with pytest.raises(EverystepError, match=problem):
        serde.encode({"outer": [value]})


Point = collections.namedtuple("Point", "x y")


@pytest.mark.parametrize(
    "value, plain",
    [(Point(1, 2), "tuple"), (collections.OrderedDict(a=1), "dict"), (collections.UserList([1]), None)],
)
def test_subclasses_of_containers_are_refused_not_stored_as_the_plain_type(value, plain):
    # A namedtuple stored as a tuple would replay without its fields: point.x
    # works on the first pass and fails after a crash.
    with pytest.raises(
        EverystepError, match=f"would come back as a plain {plain}" if plain else "not serializable"
    ):
        serde.encode([value])


def test_an_enum_that_cannot_be_imported_back_is_refused_when_stored():
    class Local(enum.Enum):
        ONE = 1

    with pytest.raises(EverystepError, match="cannot be imported back"):
        serde.encode(Local.ONE)


@pytest.mark.parametrize(
    "value", [1e16, -6.02e23, 2.0**70, 1.7976931348623157e308, 123456789012345.0, 5e-324]
)
def test_large_floats_keep_their_type_through_text_that_prints_them_whole(value):
    # jsonb keeps numbers as numeric and prints them without an exponent:
    # 1e+16 comes back as 10000000000000000, an int to json.loads.
    def as_numeric(match):
        return format(decimal.Decimal(match.group()), "f")

    printed = re.sub(r"-?\d+(\.\d+)?e[+-]?\d+", as_numeric, json.dumps(serde.encode(value)))
    restored = serde.decode(json.loads(printed))
    assert type(restored) is float and restored == value


def test_negative_zero_keeps_its_sign_though_jsonb_drops_it():
    # jsonb prints -0.0 as 0.0: a replay would see another value than the first pass.
    encoded = serde.encode([-0.0, 0.0])
    assert encoded == [{"$es": "float", "v": "-0.0"}, 0.0]
    assert [math.copysign(1.0, x) for x in serde.decode(json.loads(json.dumps(encoded)))] == [-1.0, 1.0]


@pytest.mark.parametrize("wrap", [lambda v: v, lambda v: [v], lambda v: {"k": v}, lambda v: (v,)])
def test_an_int_too_long_to_write_as_text_is_refused_and_one_digit_shorter_is_kept(wrap):
    # Python writes no int of more than 4300 digits as text (sys.get_int_max_str_digits()):
    # refused here, not a bare ValueError from the JSON writer after the check.
    for sign in (1, -1):
        assert serde.loads(serde.dumps(wrap(sign * (10**4300 - 1)))) == wrap(sign * (10**4300 - 1))
        with pytest.raises(EverystepError, match="int of more than 4300 digits is not serializable"):
            serde.encode(wrap(sign * 10**4300))


@pytest.mark.parametrize(
    "text",
    [
        '{"$es": "uuid"}',
        '{"$es": "dict", "v": 5}',
        '{"$es": "timedelta", "s": 1e300, "us": 0}',
        '{"$es": "enum", "cls": "gone.Color", "v": 1}',
        '{"$es": "enum", "cls": "tests.core.workflows.Color", "v": "no such member"}',
    ],
)
def test_malformed_tags_are_refused_with_everystep_error(text):
    with pytest.raises(EverystepError, match="unreadable everystep JSON tag"):
        serde.loads(text)


def test_an_enum_tag_calls_nothing_but_an_enum(tmp_path):
    # The JSON may come from an operator (a resolved step's result, an event's value).
    target = tmp_path / "made"
    with pytest.raises(EverystepError, match="'os.mkdir' is not an Enum class"):
        serde.loads(json.dumps({"$es": "enum", "cls": "os.mkdir", "v": str(target)}))
    assert not os.path.exists(target)


def test_exception_payload_shape_and_round_trip():
    payload = serde.encode_exception(ValueError("bad", 3))
    assert payload == {"type": "builtins.ValueError", "message": "('bad', 3)", "args": ["bad", 3]}
    restored = serde.decode_exception(payload)
    assert type(restored) is ValueError and restored.args == ("bad", 3)


def test_terminal_round_trips_reason_and_payload():
    restored = serde.decode_exception(serde.encode_exception(Terminal("cancelled", {"by": "ann"})))
    assert isinstance(restored, Terminal)
    assert (restored.reason, restored.payload, str(restored)) == ("cancelled", {"by": "ann"}, "cancelled")


def test_unimportable_exception_becomes_step_failure_with_message():
    restored = serde.decode_exception({"type": "gone.Module.Error", "message": "it broke", "args": []})
    assert isinstance(restored, StepFailure)
    assert str(restored) == "it broke"


def test_corrupt_error_payload_still_decodes_to_step_failure():
    assert isinstance(serde.decode_exception("not a dict"), StepFailure)
    assert isinstance(serde.decode_exception({"type": "builtins.ValueError", "args": 5}), StepFailure)


def test_exception_with_unserializable_args_keeps_its_message():
    payload = serde.encode_exception(KeyError(object()))
    assert json.dumps(payload)
    assert payload["args"] == [payload["message"]]


def test_an_exception_message_a_backend_cannot_store_is_kept_escaped():
    payload = serde.encode_exception(ValueError("bad record: a\x00b \ud800"))
    assert payload["message"] == "bad record: a\\x00b \\ud800"
    assert serde.encode(payload) == payload
    assert type(serde.decode_exception(payload)) is ValueError


def test_an_exception_that_cannot_be_written_as_text_is_still_recorded():
    payload = serde.encode_exception(ValueError(10**5000))  # str() raises: more than 4300 digits
    assert payload == {"type": "builtins.ValueError", "message": "<exception str() failed>",
                       "args": ["<exception str() failed>"]}


def test_exception_group_round_trips():
    group = ExceptionGroup("two", [ValueError("a"), KeyError("b")])
    restored = serde.decode_exception(serde.encode_exception(group))
    assert isinstance(restored, ExceptionGroup)
    assert [type(e) for e in restored.exceptions] == [ValueError, KeyError]


class Declined(Exception):
    def __init__(self, code):
        super().__init__(f"card declined: {code}")
        self.code = code


def test_an_exception_with_its_own_init_comes_back_with_its_args_and_attributes():
    payload = serde.encode_exception(Declined("fraud"))
    assert payload == {"type": "tests.core.test_serde.Declined", "message": "card declined: fraud",
                       "args": ["card declined: fraud"], "attrs": {"code": "fraud"}}
    restored = serde.decode_exception(payload)  # Declined(*args) would take the message as code
    assert type(restored) is Declined
    assert (restored.args, restored.code) == (("card declined: fraud",), "fraud")
    assert str(restored) == payload["message"]


class OutOfStock(Terminal):
    def __init__(self, sku):
        super().__init__(f"{sku} is out of stock")
        self.sku = sku


def test_a_terminal_subclass_with_its_own_init_is_still_a_terminal_on_replay():
    restored = serde.decode_exception(serde.encode_exception(OutOfStock("A-1")))
    assert type(restored) is OutOfStock  # OutOfStock(reason, payload) raised TypeError: StepFailure
    assert restored.sku == "A-1"
    assert restored.reason == str(restored) == "A-1 is out of stock"


def test_builtin_exceptions_keep_what_their_args_leave_out():
    try:
        json.loads("{x")
    except ValueError as exc:
        decode_error = exc
    missing = FileNotFoundError(2, "No such file or directory", "/etc/app.toml")
    for exc in (decode_error, missing, KeyError("k"), ModuleNotFoundError("no x", name="x")):
        restored = serde.decode_exception(serde.encode_exception(exc))
        assert type(restored) is type(exc)
        assert (restored.args, str(restored), vars(restored)) == (exc.args, str(exc), vars(exc))
    assert restored.name == "x"
    restored = serde.decode_exception(serde.encode_exception(missing))
    assert (restored.errno, restored.filename) == (2, "/etc/app.toml")


def test_an_exception_with_an_attribute_that_cannot_be_stored_is_rebuilt_from_its_args():
    exc = Declined("fraud")
    exc.response = object()
    payload = serde.encode_exception(exc)
    assert "attrs" not in payload
    assert serde.decode_exception(payload).code == "card declined: fraud"  # as before attrs were kept


def test_a_payload_stored_before_attrs_decodes_as_before():
    payload = {"type": "json.decoder.JSONDecodeError", "message": "no value", "args": ["no value"]}
    restored = serde.decode_exception(payload)  # JSONDecodeError("Expecting value") lacks doc and pos
    assert isinstance(restored, StepFailure) and str(restored) == "no value"


def test_everysteps_own_exceptions_and_a_tasks_traceback_are_not_stored_as_attrs():
    error = {"type": "builtins.ValueError", "message": "x", "args": ["x"]}
    child = ChildFailed("child failed", "0190", error)  # its args hold the child's error already
    assert set(serde.encode_exception(child)) == {"type", "message", "args"}
    exc = ValueError("bad")
    exc._everystep_traceback = "Traceback ..."
    assert serde.encode_exception(exc) == {"type": "builtins.ValueError", "message": "bad", "args": ["bad"],
                                           "traceback": "Traceback ..."}


def test_deeply_nested_values_are_refused_clearly():
    value = []
    for _ in range(5000):
        value = [value]
    with pytest.raises(EverystepError, match="nested more than 100 levels deep as JSON"):
        serde.encode(value)


def nested(depth: int, wrap) -> object:
    value = 1
    for _ in range(depth):
        value = wrap(value)
    return value


@pytest.mark.parametrize(
    "wrap, levels",
    [(lambda v: [v], 1), (lambda v: (v,), 2), (lambda v: {"k": v}, 1), (lambda v: {"$es": v}, 2)],
    ids=["list", "tuple", "dict", "dict with the tag key"],
)
def test_a_value_is_stored_up_to_100_json_levels_and_always_reads_back(wrap, levels):
    # Tuples 400 deep (800 levels) were stored, and reading them back raised
    # RecursionError: the step's row, and every replay of its run.
    deepest = nested(100 // levels, wrap)
    assert serde.decode(json.loads(json.dumps(serde.encode(deepest)))) == deepest
    with pytest.raises(EverystepError, match="nested more than 100 levels deep as JSON"):
        serde.encode(nested(100 // levels + 1, wrap))


def test_json_nested_deeper_than_python_reads_is_an_everystep_error():
    # Stored before the limit, or written by hand: not a RecursionError.
    with pytest.raises(EverystepError, match="the JSON is nested too deeply to read"):
        serde.decode(nested(5000, lambda v: {"$es": "tuple", "v": [v]}))


def test_loads_refuses_absurd_nesting_clearly():
    with pytest.raises(EverystepError, match="nested too deeply"):
        serde.loads("[" * 100_000 + "]" * 100_000)


def test_an_enum_tag_whose_module_raises_on_import_is_an_everystep_error(tmp_path, monkeypatch):
    # ImproperlyConfigured (a project module needing a setting, GDAL missing)
    # escaped: the Send event and Resolve forms answered 500.
    (tmp_path / "serde_broken_enum_module.py").write_text(
        "from django.core.exceptions import ImproperlyConfigured\n\n"
        'raise ImproperlyConfigured("API_KEY is not set")\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EverystepError, match="unreadable everystep JSON tag 'enum': ImproperlyConfigured"):
        serde.loads('{"$es": "enum", "cls": "serde_broken_enum_module.Mood", "v": 1}')

