"""JSON with tagged extensions for the types a step commonly passes around.

Plain JSON values encode as themselves. Other supported values become a dict
holding the reserved key ``"$es"`` naming the type. A user's own dict that
happens to contain ``"$es"`` is wrapped as ``{"$es": "dict", "v": {...}}``, so
decoding never mistakes user data for a tag. Everything round-trips to the
original type: datetime (aware or naive), date, timedelta, UUID, bytes,
bytearray, tuple, enum members. Floats must be finite (PostgreSQL's jsonb
refuses NaN and infinities); dict keys must be strings.
"""

import base64
import datetime as dt
import enum
import importlib
import json
import uuid
from typing import Any

from .errors import EverystepError

TAG = "$es"


class _Refused(EverystepError):
    """A value that cannot be stored; ``where`` is filled in on the way up."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem
        self.where: list[str] = []


# Stored as they are; by exact type, so that an IntEnum or a str subclass still
# goes through _encode. Most step arguments and results are one of these.
_PLAIN = frozenset({str, int, bool, type(None)})


def encode(value: Any) -> Any:
    """Return a JSON-compatible structure for ``value`` or raise ``EverystepError``
    naming where in the value the problem is (``$['items'][3]``)."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    # A step's arguments (a list) and keyword arguments (a dict) are most often
    # plain values, stored as they are: one pass over them, no copy, no dispatch.
    if kind is list and all(type(item) in _PLAIN for item in value):
        return value
    if kind is dict and TAG not in value and all(
        type(key) is str and type(item) in _PLAIN for key, item in value.items()
    ):
        return value
    try:
        return _encode(value)
    except _Refused as exc:
        raise EverystepError(f"${''.join(reversed(exc.where))}: {exc.problem}") from None
    except RecursionError:
        raise EverystepError("the value is nested too deeply to store as JSON") from None


def _encode(value: Any) -> Any:
    if type(value) in _PLAIN:
        return value
    if isinstance(value, enum.Enum):
        cls = type(value)
        return {TAG: "enum", "cls": f"{cls.__module__}.{cls.__qualname__}", "v": _encode(value.value)}
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise _Refused(f"{value!r} is not storable as JSON (must be finite)")
        return value
    if isinstance(value, list):
        return _encode_items(value)
    if isinstance(value, tuple):
        return {TAG: "tuple", "v": _encode_items(value)}
    if isinstance(value, dict):
        encoded = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Refused(f"dict key {key!r} is a {type(key).__name__}; JSON keys must be str")
            try:
                encoded[key] = _encode(item)
            except _Refused as exc:
                exc.where.append(f"[{key!r}]")
                raise
        return {TAG: "dict", "v": encoded} if TAG in encoded else encoded
    if isinstance(value, dt.datetime):
        return {TAG: "datetime", "v": value.isoformat()}
    if isinstance(value, dt.date):
        return {TAG: "date", "v": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {TAG: "timedelta", "s": value.days * 86400 + value.seconds, "us": value.microseconds}
    if isinstance(value, uuid.UUID):
        return {TAG: "uuid", "v": str(value)}
    if isinstance(value, bytes | bytearray):
        kind = "bytes" if isinstance(value, bytes) else "bytearray"
        return {TAG: kind, "v": base64.b64encode(value).decode("ascii")}
    raise _Refused(
        f"a {type(value).__module__}.{type(value).__qualname__} is not serializable; "
        "use JSON types, datetime, date, timedelta, UUID, bytes, tuple or an Enum"
    )


def _encode_items(items) -> list:
    encoded = []
    for i, item in enumerate(items):
        try:
            encoded.append(_encode(item))
        except _Refused as exc:
            exc.where.append(f"[{i}]")
            raise
    return encoded


def decode(data: Any) -> Any:
    """Inverse of :func:`encode`."""
    if isinstance(data, list):
        return [decode(item) for item in data]
    if not isinstance(data, dict):
        return data
    if TAG not in data:
        return {key: decode(item) for key, item in data.items()}
    kind = data[TAG]
    if kind == "dict":
        return {key: decode(item) for key, item in data["v"].items()}
    if kind == "tuple":
        return tuple(decode(item) for item in data["v"])
    if kind == "datetime":
        return dt.datetime.fromisoformat(data["v"])
    if kind == "date":
        return dt.date.fromisoformat(data["v"])
    if kind == "timedelta":
        return dt.timedelta(seconds=data["s"], microseconds=data["us"])
    if kind == "uuid":
        return uuid.UUID(data["v"])
    if kind == "bytes":
        return base64.b64decode(data["v"])
    if kind == "bytearray":
        return bytearray(base64.b64decode(data["v"]))
    if kind == "enum":
        return import_string(data["cls"])(decode(data["v"]))
    raise EverystepError(f"unknown everystep JSON tag {kind!r}")


def dumps(value: Any) -> str:
    """:func:`encode` ``value`` and write it as a JSON string."""
    return json.dumps(encode(value), allow_nan=False)


def loads(text: str | bytes) -> Any:
    """Parse a JSON string and :func:`decode` it: the inverse of :func:`dumps`."""
    try:
        return decode(json.loads(text))
    except RecursionError:
        raise EverystepError("the JSON is nested too deeply") from None


def import_string(dotted: str) -> Any:
    """Import ``module.Qual.name``, trying the longest importable module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            break
        return obj
    raise ImportError(f"cannot import {dotted!r}")


def encode_exception(exc: BaseException) -> dict:
    """``{"type": "module.Class", "message": str(exc), "args": [...]}``, and
    ``"traceback"`` (formatted) when the exception left a django.tasks task.

    ``args`` keeps the exception's arguments when they are all serializable,
    else only the message, so the stored payload is always valid JSON.
    """
    cls = type(exc)
    if isinstance(exc, BaseExceptionGroup):
        args = [exc.message, [encode_exception(e) for e in exc.exceptions]]
    else:
        try:
            args = encode(list(exc.args))
        except EverystepError:
            args = [str(exc)]
    payload = {"type": f"{cls.__module__}.{cls.__qualname__}", "message": str(exc), "args": args}
    # A task's failure keeps the traceback django.tasks reports (everystep.tasks sets it).
    formatted = getattr(exc, "_everystep_traceback", None)
    if isinstance(formatted, str):
        payload["traceback"] = formatted
    return payload


def decode_exception(payload: dict) -> BaseException:
    """Rebuild the stored exception: the original class when importable and
    constructible from its args, else ``StepFailure`` with the stored message."""
    from .errors import StepFailure

    if not isinstance(payload, dict):
        return StepFailure(f"unreadable stored error: {payload!r}")
    type_name = str(payload.get("type", ""))
    message = str(payload.get("message", ""))
    args = payload.get("args", [message])
    try:
        if not isinstance(args, list):
            raise TypeError("stored exception args must be a list")
        cls = import_string(type_name)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise TypeError(type_name)
        if issubclass(cls, BaseExceptionGroup):
            return cls(args[0], [decode_exception(e) for e in args[1]])
        return cls(*decode(args))
    except Exception:
        failure = StepFailure(message or type_name)
        failure.original_type = type_name
        return failure
