"""How stored values look on the pages: JSON, durations, ids and decoded errors.

Payloads are shown as they are stored (everystep's tagged JSON), never decoded
to Python objects: decoding can import arbitrary classes and fail when a class
was renamed, and an operator page must open whatever the row holds.
"""

import json
import re
from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from everystep.errors import EffectUncertain, Terminal

from .payloads import Preview, reindent

TERMINAL_TYPE = f"{Terminal.__module__}.{Terminal.__qualname__}"
EFFECT_UNCERTAIN_TYPE = f"{EffectUncertain.__module__}.{EffectUncertain.__qualname__}"


def pretty_json(value) -> str:
    """``value`` pretty-printed, cut at ``payloads.PREVIEW_CHARS`` characters."""
    text, cut = reindent(json.dumps(value, ensure_ascii=False))
    return f"{text}…" if cut else text


def wrappable(name: str) -> SafeString:
    """``name`` escaped, free to wrap after each ``.`` and ``@``: a dotted path or
    a worker name would otherwise widen its column to its whole length."""
    return mark_safe(re.sub(r"([.@])", r"\1<wbr>", escape(name)))  # the name is escaped first


def timestamp(moment: datetime) -> SafeString:
    """Date and time in the current time zone, wrapping between the two (the
    page's time zone is in the title)."""
    # USE_TZ = False: the database gives naive times, already local.
    local = timezone.localtime(moment) if timezone.is_aware(moment) else moment
    return format_html(
        '<time datetime="{}" title="{}">'
        '<span class="es-nowrap">{}</span> <span class="es-nowrap">{}</span></time>',
        local.isoformat(),
        local.strftime("%Y-%m-%d %H:%M:%S %Z"),
        local.strftime("%Y-%m-%d"),
        local.strftime("%H:%M:%S"),
    )


def short_id(run_id) -> str:
    """First 8 and last 4 hex digits of a run id.

    The first 8 digits of a UUIDv7 are the top of its millisecond timestamp and
    change only every ~65 s, so runs scheduled together would all look alike;
    the random tail tells them apart.
    """
    text = str(run_id)
    return f"{text[:8]}…{text[-4:]}"


def format_duration(delta: timedelta | None) -> str:
    if delta is None:
        return "—"
    seconds = delta.total_seconds()
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


@dataclass
class DecodedError:
    """A stored exception payload ``{"type", "message", "args"}`` ready to show
    (plus ``"where"`` when the run's workflow module failed to import)."""

    type: str
    message: str
    args_json: str
    is_terminal: bool = False
    terminal_reason: str = ""
    terminal_payload_json: str = ""
    is_uncertain: bool = False
    raw_json: str = ""
    where: dict | None = None  # a workflows module's import error: module, file, line
    # The exception's arguments say more than its message (or its Terminal
    # reason and payload); usually they are the message again.
    shows_args: bool = True
    stored: Preview | None = None  # the stored payload: its size and download link


def stored_error(stored: Preview) -> DecodedError | None:
    """A stored error payload: decoded when it was read whole, otherwise the
    start of its JSON, as stored."""
    payload = _UNDECODED  # too big to decode for a page, or nested too deep to decode
    if stored.whole is not None:
        with suppress(ValueError, RecursionError):
            payload = json.loads(stored.whole)
    decoded = _UNDECODED
    if payload is not _UNDECODED:
        # Written out again one level deeper than it was read: a payload just
        # shallow enough to read may be too deep to write.
        with suppress(RecursionError):
            decoded = decode_error(payload)
        if decoded is None:
            return None
    if decoded is _UNDECODED:
        decoded = DecodedError(type="", message="", args_json="", raw_json=stored.text)
    else:
        stored = replace(stored, complete=True)  # shown whole, decoded
    decoded.stored = stored
    return decoded


_UNDECODED = object()


def decode_error(payload) -> DecodedError | None:
    if payload is None:
        return None
    if not isinstance(payload, dict):
        # Not the engine's shape: show what is there rather than guess.
        return DecodedError(type="", message="", args_json="", raw_json=pretty_json(payload))
    error_type = str(payload.get("type", ""))
    args = payload.get("args", [])
    decoded = DecodedError(
        type=error_type,
        message=str(payload.get("message", "")),
        args_json=pretty_json(args),
    )
    if error_type == TERMINAL_TYPE:
        # Terminal(reason, payload) stores its two constructor arguments as args.
        args = args if isinstance(args, list) else []
        decoded.is_terminal = True
        decoded.terminal_reason = str(args[0]) if args else decoded.message
        decoded.terminal_payload_json = pretty_json(args[1] if len(args) > 1 else None)
    decoded.is_uncertain = error_type == EFFECT_UNCERTAIN_TYPE
    decoded.shows_args = not decoded.is_terminal and args not in ([], [decoded.message])
    where = payload.get("where")
    if isinstance(where, dict):
        decoded.where = {key: str(where.get(key, "")) for key in ("module", "file", "line")}
    return decoded


def resolve_command(run_id, step_id: str | None) -> str:
    """The command that settles a blocked run's uncertain step."""
    return (
        f"python manage.py everystep_resolve_step {run_id} {step_id or '<STEP_ID>'} "
        "(--result JSON | --error MESSAGE | --discard)"
    )
