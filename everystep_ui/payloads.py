"""Stored JSON payloads on the pages, bounded: a preview, and the whole value as a download.

A page shows at most ``PREVIEW_CHARS`` characters of each payload, pretty-printed,
with the size of the whole. The database cuts the value (``JSONHead``, one SQL
expression per payload), so a page never reads, decodes or carries a payload
whole, however big it is. The full value is a separate JSON download
(``json_download``), behind the same permissions.

Values are shown as stored (everystep's tagged JSON), never decoded to Python
objects: see ``display``.
"""

import json
import re
from dataclasses import dataclass

from django.db.models import Func, TextField
from django.http import HttpResponse

# Characters of a payload a page shows, and reads from the database. A page shows
# a handful of payloads (a run's arguments and result or error; a step's four).
PREVIEW_CHARS = 10_000


class JSONHead(Func):
    """``'<bytes>:<first PREVIEW_CHARS characters>'`` of a JSON column's text, or NULL.

    One expression so that PostgreSQL turns a jsonb value into text once for
    both; on SQLite and MySQL/MariaDB the column is text already.
    """

    output_field = TextField()
    arity = 1

    def as_sql(self, compiler, connection, **extra):  # MySQL and MariaDB
        template = f"CONCAT(OCTET_LENGTH(%(expressions)s), ':', LEFT(%(expressions)s, {PREVIEW_CHARS}))"
        return super().as_sql(compiler, connection, template=template, **extra)

    def as_postgresql(self, compiler, connection, **extra):
        # OFFSET 0 keeps the planner from inlining the text into both uses.
        template = (
            f"(SELECT octet_length(es_text) || ':' || left(es_text, {PREVIEW_CHARS}) "
            "FROM (SELECT (%(expressions)s)::text AS es_text OFFSET 0) AS es_head)"
        )
        return super().as_sql(compiler, connection, template=template, **extra)

    def as_sqlite(self, compiler, connection, **extra):
        template = (
            f"(LENGTH(CAST(%(expressions)s AS BLOB)) || ':' || SUBSTR(%(expressions)s, 1, {PREVIEW_CHARS}))"
        )
        return super().as_sql(compiler, connection, template=template, **extra)


@dataclass
class Preview:
    """The start of a stored payload, pretty-printed, and the size of all of it."""

    text: str  # at most PREVIEW_CHARS characters
    size: int  # bytes of the stored JSON text
    complete: bool  # ``text`` shows the whole value
    url: str  # the whole value as a JSON download
    whole: str | None = None  # the stored JSON text, when it was read whole

    @property
    def shown(self) -> str:
        """How much of the value the page shows, when not all of it."""
        return f"the first {len(self.text):,} characters"

    @classmethod
    def of(cls, head: str | None, url: str) -> "Preview":
        """From a ``JSONHead`` annotation. SQL NULL (nothing stored) shows as ``null``."""
        if head is None:
            return cls(text="null", size=len("null"), complete=True, url=url, whole="null")
        size, _, stored = head.partition(":")
        read_whole = len(stored.encode("utf-8", "surrogatepass")) >= int(size)
        text, cut = reindent(stored)
        return cls(
            text=text,
            size=int(size),
            complete=read_whole and not cut,
            url=url,
            whole=stored if read_whole else None,
        )


# A JSON token: a string (possibly cut off by the end of the text), a structural
# character, or a scalar (number, true, false, null). Whitespace matches nothing.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\\?\Z)|[{}\[\],:]|[^\s{}\[\],:"]+', re.S)
_CLOSING = {"{": "}", "[": "]"}


def reindent(text: str, limit: int = PREVIEW_CHARS) -> tuple[str, bool]:
    """JSON text, or the start of one, laid out as ``json.dumps(value, indent=2,
    ensure_ascii=False)`` would lay out the value, up to ``limit`` characters.

    Returns the text and whether it stops short of the whole input. Works
    token by token without parsing, so a cut-off value, or one nested too deep
    for ``json.loads``, still shows; the output is exactly the start of the
    pretty-printed value when ``text`` is complete.
    """
    tokens = _TOKEN.findall(text)
    out: list[str] = []
    length = depth = i = 0
    while i < len(tokens) and length < limit:
        token = tokens[i]
        if token in _CLOSING:
            following = tokens[i + 1] if i + 1 < len(tokens) else None
            if following == _CLOSING[token]:
                piece, i = token + following, i + 1  # [] and {} stay on one line
            elif following is None:
                piece = token
            else:
                depth += 1
                piece = token + "\n" + "  " * depth
        elif token in ("}", "]"):
            depth = max(depth - 1, 0)
            piece = "\n" + "  " * depth + token
        elif token == ",":
            piece = ",\n" + "  " * depth
        elif token == ":":
            piece = ": "
        elif token[0] == '"' and "\\" in token:
            piece = _unescaped(token)
        else:
            piece = token
        out.append(piece)
        length += len(piece)
        i += 1
    pretty = "".join(out)
    return pretty[:limit], i < len(tokens) or len(pretty) > limit


def _unescaped(token: str) -> str:
    """A string token with its escapes written as ``ensure_ascii=False`` writes
    them (``\\u00e9`` as ``é``), also when the token is cut off at the end."""
    backslashes = len(token[:-1]) - len(token[:-1].rstrip("\\"))
    closed = len(token) > 1 and token.endswith('"') and backslashes % 2 == 0
    # A cut-off token loses its last characters until it parses: an escape
    # (\\u00e9) is at most six characters.
    candidates = [token] if closed else [token[: len(token) - trim] + '"' for trim in range(7)]
    for candidate in candidates:
        try:
            shown = json.dumps(json.loads(candidate), ensure_ascii=False)
            shown.encode("utf-8")  # a lone surrogate would break the page: keep the escape
        except (ValueError, UnicodeEncodeError):
            continue
        return shown if closed else shown[:-1]
    return token


_UNSAFE_IN_FILENAME = re.compile(r"[^A-Za-z0-9_.-]")


def json_download(text: str | None, filename: str) -> HttpResponse:
    """The stored JSON text as an ``application/json`` attachment.

    ``<``, ``>`` and ``&`` (which valid JSON holds only inside strings) become
    ``\\u`` escapes: the same value, and no markup even if a browser ignored the
    content type.
    """
    body = "null" if text is None else text
    body = body.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    response = HttpResponse(body, content_type="application/json; charset=utf-8")
    # The name holds a step id, which may hold any character: a line break
    # would make the header refused (a 500), a quote or ; end the name early.
    # Anything but these few becomes _, so run and step ids stay readable.
    safe_name = _UNSAFE_IN_FILENAME.sub("_", filename)
    response["Content-Disposition"] = f'attachment; filename="{safe_name}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response
