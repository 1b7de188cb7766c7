"""How `trisque` prints a reply: redis-cli's TTY and raw forms, and one JSON document.

Theory of operation
-------------------
Replies come from ``client.typed_reply.TypedReplyParser``, so status (``resp.Status``),
error (``resp.Error``) and bulk (``bytes``) replies are told apart. Each formatter returns the
whole text to write for one reply, newline included, matching redis-cli 7 byte for byte:

* ``format_tty``: ``OK`` bare, ``"text"`` quoted with C-locale escaping (``\\n``, ``\\"``,
  ``\\xNN`` for anything outside 0x20..0x7e), ``(integer) 3``, ``(nil)``, ``(empty array)``,
  ``(error) ERR ...``; arrays as ``1) ...`` with the index right-aligned to the width of the
  largest index and nested elements indented by that width plus two, the first nested element
  on the parent's line.
* ``format_raw``: every scalar as its bare bytes, array elements joined by newlines (nested
  arrays flattened, nil and empty arrays as empty text), one newline after the reply; an error
  ends with an extra newline, as redis-cli does.
* ``format_json``: one line of JSON. Bulk strings that are valid UTF-8 become JSON strings;
  other bytes become ``{"$bytes": "<base64>"}`` so nothing is lost; errors become
  ``{"error": "ERR ..."}``; nil is ``null``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from protocol.resp import Error, Status

_ESCAPES = {
    0x5C: b"\\\\", 0x22: b'\\"', 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t", 0x07: b"\\a",
    0x08: b"\\b",
}
# One table lookup per byte: the repr of every byte value, as redis-cli's sdscatrepr writes it.
_REPR = [
    _ESCAPES.get(b, bytes([b]) if 0x20 <= b <= 0x7E else b"\\x%02x" % b) for b in range(256)
]


def quote(data: bytes) -> str:
    """``"..."`` with redis-cli escaping (the result is pure ASCII)."""
    return '"' + b"".join(_REPR[b] for b in data).decode("ascii") + '"'


def format_tty(reply: Any) -> str:
    return _tty(reply, "")


def _tty(reply: Any, prefix: str) -> str:
    if isinstance(reply, Error):
        return f"(error) {reply}\n"
    if isinstance(reply, Status):
        return f"{reply}\n"
    if isinstance(reply, bool):
        return "(true)\n" if reply else "(false)\n"
    if isinstance(reply, int):
        return f"(integer) {reply}\n"
    if isinstance(reply, float):
        return f"(double) {reply!r}\n"
    if reply is None:
        return "(nil)\n"
    if isinstance(reply, bytes):
        return quote(reply) + "\n"
    if isinstance(reply, list):
        if not reply:
            return "(empty array)\n"
        width = len(str(len(reply)))
        nested_prefix = prefix + " " * (width + 2)
        out = []
        for i, item in enumerate(reply):
            # The parent already wrote this line's start for the first element.
            out.append(f"{'' if i == 0 else prefix}{i + 1:>{width}}) ")
            out.append(_tty(item, nested_prefix))
        return "".join(out)
    return f"{reply}\n"


def format_raw(reply: Any) -> bytes:
    return _raw(reply) + b"\n"


def _raw(reply: Any) -> bytes:
    if isinstance(reply, Error):
        return str(reply).encode("utf-8", "surrogateescape") + b"\n"
    if isinstance(reply, str):
        return reply.encode("utf-8", "surrogateescape")
    if reply is None:
        return b""
    if isinstance(reply, bytes):
        return reply
    if isinstance(reply, list):
        return b"\n".join(_raw(item) for item in reply)
    return str(reply).encode()


def to_json(reply: Any) -> Any:
    """The JSON-ready value of a reply (see the module docstring for the mapping)."""
    if isinstance(reply, Error):
        return {"error": _json_text(str(reply))}
    if isinstance(reply, str):
        # Status texts were decoded with surrogateescape: non-UTF-8 bytes must not leak as
        # lone surrogates into the JSON, so they go the $bytes way like bulk strings.
        return to_json(reply.encode("utf-8", "surrogateescape"))
    if isinstance(reply, bytes):
        try:
            return reply.decode("utf-8")
        except UnicodeDecodeError:
            return {"$bytes": base64.b64encode(reply).decode("ascii")}
    if isinstance(reply, list):
        return [to_json(item) for item in reply]
    return reply


def _json_text(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def format_json(reply: Any) -> str:
    return json.dumps(to_json(reply), ensure_ascii=False) + "\n"
