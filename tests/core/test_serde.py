import datetime as dt
import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from everystep import serde
from everystep.errors import EverystepError, StepFailure, Terminal
from tests.core.workflows import Color

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
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
        st.dictionaries(st.one_of(st.text(), st.just("$es")), children),
    ),
    max_leaves=20,
)


@given(values)
def test_round_trip_keeps_values_and_types(value):
    restored = serde.loads(serde.dumps(value))
    assert restored == value
    assert type(restored) is type(value)


@given(st.dictionaries(st.text(), st.text()))
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


def test_exception_group_round_trips():
    group = ExceptionGroup("two", [ValueError("a"), KeyError("b")])
    restored = serde.decode_exception(serde.encode_exception(group))
    assert isinstance(restored, ExceptionGroup)
    assert [type(e) for e in restored.exceptions] == [ValueError, KeyError]


def test_deeply_nested_values_are_refused_clearly():
    value = []
    for _ in range(5000):
        value = [value]
    with pytest.raises(EverystepError, match="nested too deeply"):
        serde.encode(value)


def test_loads_refuses_absurd_nesting_clearly():
    with pytest.raises(EverystepError, match="nested too deeply"):
        serde.loads("[" * 100_000 + "]" * 100_000)
