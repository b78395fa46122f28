"""JSON with tagged extensions for the types a step commonly passes around.

Plain JSON values encode as themselves. Other supported values become a dict
holding the reserved key ``"$es"`` naming the type. A user's own dict that
happens to contain ``"$es"`` is wrapped as ``{"$es": "dict", "v": {...}}``, so
decoding never mistakes user data for a tag. Everything round-trips to the
original type: datetime (aware or naive), date, timedelta, UUID, bytes,
bytearray, tuple, enum members. Floats must be finite (PostgreSQL's jsonb
refuses NaN and infinities); a float of 1e16 or more and -0.0 are tagged (jsonb
would give back an int and 0.0). Ints must have at most
``sys.get_int_max_str_digits()`` digits (4300; Python writes no longer int as
text). Dict keys must be strings; text must hold no NUL
character and no lone surrogate (jsonb refuses both, and libpq would cut a
string at the NUL). Subclasses of list, tuple and dict (a namedtuple, an
OrderedDict) are refused: they would come back as the plain type, so a replay
would see another value than the first pass did. A subclass of str, int,
float, datetime, date, UUID or bytes is stored as the plain value and comes
back as the plain type (a pendulum or arrow datetime as a datetime at the
same instant).
Nested more than ``MAX_DEPTH`` (100) levels deep as JSON is refused. A
datetime keeps its UTC offset (on Python 3.11 not a sub-second part of it),
not its ``fold``.

Not kept on every backend: the order of a dict's keys. A dict is stored as a
JSON object, and PostgreSQL's jsonb and MySQL's JSON give its keys back in
their own order (shorter keys first); MariaDB and SQLite keep the text as
written. A value read back is equal, but a body that iterates a step's result
may see another key order on replay than on the first pass: it should sort
the keys, or the step should return a list of pairs.
"""

import base64
import datetime as dt
import enum
import importlib
import json
import math
import re
import sys
import uuid
from typing import Any

from .errors import EverystepError

TAG = "$es"
# The deepest JSON a value may encode to: MySQL's own limit (MariaDB refuses
# past 32: errors.RefusedByDatabase), and well within what decode() reads
# back without exhausting Python's recursion limit.
MAX_DEPTH = 100


class _Refused(EverystepError):
    """A value that cannot be stored; ``where`` is filled in on the way up."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem
        self.where: list[str] = []


# Stored as they are, besides str and int (checked first); by exact type, so
# that an IntEnum or a str subclass still goes through _encode.
_PLAIN = frozenset({bool, type(None)})

# Python writes no int of more digits than sys.get_int_max_str_digits() as
# text, and that limit is 0 (none) or at least this many digits: an int closer
# to zero than 10**640 is written under any limit (two C comparisons), another
# is checked against the limit in force.
_SHORT_INT = 10**sys.int_info.str_digits_check_threshold
_MINUS_SHORT_INT = -_SHORT_INT

# What no backend stores alike: PostgreSQL's jsonb and text columns refuse NUL
# and lone surrogates (MariaDB and SQLite keep them), and libpq's text
# parameters end at a NUL.
_UNSTORABLE_TEXT = re.compile("[\x00\ud800-\udfff]")


def unstorable_text(text: str) -> str | None:
    """Why ``text`` cannot be stored by every backend alike, or None."""
    if "\x00" in text:
        return "it holds a NUL character (\\x00)"
    if not text.isascii() and _UNSTORABLE_TEXT.search(text):
        return "it holds a lone surrogate (text that is not valid Unicode)"
    return None


def encode(value: Any) -> Any:
    """Return a JSON-compatible structure for ``value`` or raise ``EverystepError``
    naming where in the value the problem is (``$['items'][3]``)."""
    # Most step arguments (a list), keyword arguments (a dict) and results are
    # plain scalars, stored as they are: one pass, no copy, no dispatch. Text
    # is plain when it is ASCII without a NUL (two C-speed scans), an int when
    # it is shorter than any digit limit (two comparisons); any other takes
    # _encode's full check. Written out inline: this runs three times per step.
    kind = type(value)
    if kind is list:
        if all(
            ((t := type(i)) is int and _MINUS_SHORT_INT < i < _SHORT_INT)
            or (t is str and i.isascii() and "\x00" not in i)
            or t in _PLAIN
            for i in value
        ):
            return value
    elif kind is dict:
        if TAG not in value and all(
            type(k) is str
            and k.isascii()
            and "\x00" not in k
            and (
                ((t := type(i)) is int and _MINUS_SHORT_INT < i < _SHORT_INT)
                or (t is str and i.isascii() and "\x00" not in i)
                or t in _PLAIN
            )
            for k, i in value.items()
        ):
            return value
    elif kind is str:
        if value.isascii() and "\x00" not in value:
            return value
    elif kind is int:
        if _MINUS_SHORT_INT < value < _SHORT_INT:
            return value
    elif kind in _PLAIN:
        return value
    try:
        return _encode(value, 0)
    except _Refused as exc:
        where = "".join(reversed(exc.where))
        if len(where) > 80:  # a hundred levels deep: its ends say where
            where = f"{where[:40]}...{where[-30:]}"
        raise EverystepError(f"${where}: {exc.problem}") from None
    except RecursionError:
        raise EverystepError("the value is nested too deeply to store as JSON") from None


def check_text(what: str, text: str) -> None:
    """Refuse, naming it, text that is not stored alike by every backend (an
    event key, a worker's name, an operator's message): a clear EverystepError
    on every backend, not a DataError on PostgreSQL alone."""
    problem = unstorable_text(text)
    if problem:
        raise EverystepError(f"{what} {text!r} is refused: {problem}")


def _too_deep() -> _Refused:
    return _Refused(
        f"the value is nested more than {MAX_DEPTH} levels deep as JSON (everystep's tags "
        "count: a tuple is two); MySQL refuses deeper JSON, and it could not be read back"
    )


def _encode(value: Any, depth: int) -> Any:
    """``value`` encoded, ``depth`` JSON levels deep (containers around it)."""
    if isinstance(value, enum.Enum):  # before str and int: a StrEnum, an IntEnum
        if depth >= MAX_DEPTH:
            raise _too_deep()
        return {TAG: "enum", "cls": _enum_path(type(value)), "v": _encode(value.value, depth + 1)}
    if isinstance(value, str):
        problem = unstorable_text(value)
        if problem:
            raise _Refused(f"{value!r} is not storable: {problem}")
        return value
    if value is None:
        return value
    if isinstance(value, int):  # bool too
        if not _MINUS_SHORT_INT < value < _SHORT_INT:
            limit = sys.get_int_max_str_digits()
            if limit and abs(value) >= 10**limit:
                raise _Refused(
                    f"an int of more than {limit} digits is not serializable: Python refuses to write "
                    "it as JSON text (sys.get_int_max_str_digits()); pass it as a str"
                )
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise _Refused(f"{value!r} is not storable as JSON (must be finite)")
        if abs(value) >= 1e16 or (not value and math.copysign(1.0, value) < 0):
            # jsonb keeps a number as numeric: it prints 1e+16 as
            # 10000000000000000, which reads back as an int, and -0.0 as 0.
            if depth >= MAX_DEPTH:
                raise _too_deep()
            return {TAG: "float", "v": repr(float(value))}
        return value
    if type(value) in _CONTAINERS:
        kind = type(value)
        # Each container is a JSON level; a tuple two (a tag holding a list), and
        # so is a dict with a user's "$es" key (wrapped in a tag).
        inner = depth + 2 if kind is tuple or (kind is dict and TAG in value) else depth + 1
        if inner > MAX_DEPTH:
            raise _too_deep()
        if kind is list:
            return _encode_items(value, inner)
        if kind is tuple:
            return {TAG: "tuple", "v": _encode_items(value, inner)}
        encoded = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Refused(f"dict key {key!r} is a {type(key).__name__}; JSON keys must be str")
            problem = unstorable_text(key)
            if problem:
                raise _Refused(f"dict key {key!r} is not storable: {problem}")
            try:
                encoded[key] = _encode(item, inner)
            except _Refused as exc:
                exc.where.append(f"[{key!r}]")
                raise
        return {TAG: "dict", "v": encoded} if TAG in encoded else encoded
    if depth >= MAX_DEPTH and isinstance(value, _TAGGED):  # a tag: one level
        raise _too_deep()
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
    if isinstance(value, list | tuple | dict):
        base = next(kind for kind in _CONTAINERS if isinstance(value, kind))
        raise _Refused(
            f"a {type(value).__module__}.{type(value).__qualname__} would come back as a plain "
            f"{base.__name__} on replay; pass a plain {base.__name__}"
        )
    raise _Refused(
        f"a {type(value).__module__}.{type(value).__qualname__} is not serializable; "
        "use JSON types, datetime, date, timedelta, UUID, bytes, tuple or an Enum"
    )


_CONTAINERS = (list, tuple, dict)
_TAGGED = (dt.datetime, dt.date, dt.timedelta, uuid.UUID, bytes, bytearray)

# Enum classes checked to import back as themselves, by class.
_IMPORTABLE_ENUMS: dict[type, str] = {}


def _enum_path(cls: type) -> str:
    """The dotted path an enum member is stored under, once it is known to
    import back as ``cls``: a class defined in a function, or one replaced
    since, would be written and then be unreadable on replay."""
    path = _IMPORTABLE_ENUMS.get(cls)
    if path is None:
        path = f"{cls.__module__}.{cls.__qualname__}"
        try:
            found = import_string(path)
        except ImportError:
            found = None
        if found is not cls:
            raise _Refused(
                f"the enum {path} cannot be imported back by that path (define it at module level)"
            )
        _IMPORTABLE_ENUMS[cls] = path
    return path


def _encode_items(items, depth: int) -> list:
    encoded = []
    for i, item in enumerate(items):
        try:
            encoded.append(_encode(item, depth))
        except _Refused as exc:
            exc.where.append(f"[{i}]")
            raise
    return encoded


def decode(data: Any) -> Any:
    """Inverse of :func:`encode`. A malformed tag (hand-written JSON, say), or
    JSON nested deeper than Python reads (stored before ``MAX_DEPTH``, or
    written by hand), raises ``EverystepError``."""
    try:
        return _decode(data)
    except RecursionError:
        raise EverystepError("the JSON is nested too deeply to read") from None


def _decode(data: Any) -> Any:
    if isinstance(data, list):
        return [_decode(item) for item in data]
    if not isinstance(data, dict):
        return data
    if TAG not in data:
        return {key: _decode(item) for key, item in data.items()}
    try:
        return _decode_tagged(data[TAG], data)
    except (EverystepError, RecursionError):
        raise
    except Exception as exc:  # whatever a hand-written tag makes fail, an enum's module on import too
        problem = f"{type(exc).__name__}: {exc}"
        raise EverystepError(f"unreadable everystep JSON tag {data[TAG]!r}: {problem}") from None


def _decode_tagged(kind, data: dict) -> Any:
    if kind == "dict":
        return {key: _decode(item) for key, item in data["v"].items()}
    if kind == "tuple":
        return tuple(_decode(item) for item in data["v"])
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
    if kind == "float":
        return float(data["v"])
    if kind == "enum":
        cls = import_string(data["cls"])
        # Only an Enum is called: the path comes from the stored JSON, which an
        # operator may have typed (a resolved step's result, an event's value).
        if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
            raise EverystepError(f"{data['cls']!r} is not an Enum class")
        return cls(_decode(data["v"]))
    raise EverystepError(f"unknown everystep JSON tag {kind!r}")


def dumps(value: Any) -> str:
    """:func:`encode` ``value`` and write it as a JSON string."""
    return json.dumps(encode(value), allow_nan=False)


def loads(text: str | bytes) -> Any:
    """Parse a JSON string and :func:`decode` it: the inverse of :func:`dumps`."""
    try:
        parsed = json.loads(text)
    except RecursionError:
        raise EverystepError("the JSON is nested too deeply") from None
    return decode(parsed)


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
    """``{"type": "module.Class", "message": str(exc), "args": [...]}``, plus
    ``"attrs"`` (see ``_attributes``), and ``"traceback"`` (formatted) when
    the exception left a django.tasks task.

    ``args`` keeps the exception's arguments when they are all serializable,
    else only the message, so the stored payload is always valid JSON.
    """
    cls = type(exc)
    try:
        message = storable_text(str(exc))
    except Exception:  # a failing __str__; ValueError(10**5000): an int too long to write
        message = "<exception str() failed>"
    if isinstance(exc, BaseExceptionGroup):
        args = [storable_text(exc.message), [encode_exception(e) for e in exc.exceptions]]
    else:
        try:
            args = encode(list(exc.args))
        except EverystepError:
            args = [message]
    payload = {"type": f"{cls.__module__}.{cls.__qualname__}", "message": message, "args": args}
    if not isinstance(exc, BaseExceptionGroup):
        attrs = _attributes(exc)
        if attrs is not None:
            payload["attrs"] = attrs
    # A task's failure keeps the traceback django.tasks reports (everystep.tasks sets it).
    formatted = getattr(exc, "_everystep_traceback", None)
    if isinstance(formatted, str):
        payload["traceback"] = storable_text(formatted)
    try:
        encode(payload)  # as it is stored: a level deeper than its args, their tags encoded again
    except EverystepError:  # nested too deeply so: the message stands for the arguments
        payload["args"] = [message]
        payload.pop("attrs", None)
    return payload


# Attributes builtin exceptions keep in C fields rather than in __dict__, that
# their args do not always hold (an OSError's args are (errno, strerror), not
# its filename; ImportError(msg, name=...) keeps only msg).
_FIELDS = (
    (OSError, ("errno", "strerror", "filename", "filename2")),
    (ImportError, ("name", "path")),
    (NameError, ("name",)),
    (AttributeError, ("name",)),
)
_BUILTIN_INIT = type(BaseException.__init__)  # a slot wrapper: no __init__ written in Python


def _fields(exc: BaseException) -> tuple[str, ...]:
    return tuple(name for base, names in _FIELDS if isinstance(exc, base) for name in names)


def _attributes(exc: BaseException) -> dict | None:
    """The stored form of ``exc``'s attributes (its ``__dict__`` and the C fields
    of :data:`_FIELDS`), for :func:`decode_exception` to rebuild it without
    calling its ``__init__``, which may take other arguments than it keeps in
    ``args`` (``PaymentDeclined(order_id, code)``, ``JSONDecodeError``).

    None when its ``args`` rebuild it: everystep's own exceptions (each passes
    all its arguments on, and a ``ChildFailed`` would store its child's error
    twice), one with nothing to keep and no ``__init__`` of its own, and one
    with an attribute that cannot be stored: rebuilt without it, its class could
    fail on the missing attribute (Django's ``ValidationError`` without its
    ``error_list``), so it is rebuilt from its args as before.
    """
    cls = type(exc)
    if cls.__module__.startswith("everystep."):
        return None
    state = {name: value for name, value in vars(exc).items() if name != "_everystep_traceback"}
    try:
        for name in _fields(exc):
            value = getattr(exc, name, None)  # a subclass's property may raise
            if value is not None:
                state[name] = value
        if not state and type(cls.__init__) is _BUILTIN_INIT:
            return None
        return encode(state)
    except Exception:
        return None


def storable_text(text: str) -> str:
    """``text`` with what cannot be stored written as escapes (``\\x00``,
    ``\\ud800``): an error's message is kept, readable, rather than lost."""
    if unstorable_text(text) is None:
        return text
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def decode_exception(payload: dict) -> BaseException:
    """Rebuild the stored exception: the original class when importable, with
    its args and stored ``"attrs"`` (see ``_rebuilt``), or constructed from
    its args (a payload without ``"attrs"``), else ``StepFailure`` with the
    stored message."""
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
        if "attrs" in payload:
            return _rebuilt(cls, decode(args), decode(payload["attrs"]))
        return cls(*decode(args))
    except Exception:
        failure = StepFailure(message or type_name)
        failure.original_type = type_name
        return failure


def _rebuilt(cls: type[BaseException], args: list, attrs: dict) -> BaseException:
    """An instance of ``cls`` with ``args`` and ``attrs``, its ``__init__`` not
    called: ``cls.__new__`` (``BaseException.__new__`` sets ``args``). A class
    whose ``__init__`` is builtin gets it, as it sets its C fields from its args
    (``UnicodeDecodeError``, ``SyntaxError``, ``StopIteration``). If ``__new__``
    raises, the class is constructed from its args, as before ``"attrs"``."""
    if not isinstance(attrs, dict):
        raise TypeError("stored exception attrs must be a dict")
    if type(cls.__init__) is _BUILTIN_INIT:
        exc = cls(*args)
    else:
        try:
            exc = cls.__new__(cls, *args)
        except Exception:
            exc = cls(*args)
        exc.args = tuple(args)
    fields = _fields(exc)
    for name, value in attrs.items():
        if name in fields:
            setattr(exc, name, value)
        else:
            exc.__dict__[name] = value
    return exc
