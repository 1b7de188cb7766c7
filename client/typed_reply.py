"""A small pure-Python RESP reply parser that keeps the reply *types* apart.

Theory of operation
-------------------
``protocol.resp.ReplyReader`` (hiredis) returns status replies (``+OK``) and bulk strings as the
same ``bytes`` type. That is right for the client library, which knows what each command
answers, but a redis-cli style printer must show ``OK`` bare and ``"OK"`` quoted, so it needs
to know which one the server sent. ``TypedReplyParser`` has the same feed/next shape as the
other readers in ``protocol.resp``: ``feed(data)`` appends bytes, ``next()`` returns one
complete reply or ``NEED_DATA``. Values:

* ``+text``  -> ``resp.Status`` (a ``str``), ``-text`` -> ``resp.Error``
* ``$n``     -> ``bytes``; ``$-1`` -> ``None``
* ``:n``     -> ``int``
* ``*n``     -> ``list`` of replies; ``*-1`` -> ``None`` (redis-cli prints both nulls as ``(nil)``)
* RESP3 ``_`` -> ``None``, ``#t/#f`` -> ``bool``, ``,x`` -> ``float``, ``(n`` -> ``int``,
  ``%n`` map / ``~n`` set / ``>n`` push -> ``list`` (maps flattened), ``=n`` verbatim -> ``bytes``
  without its ``txt:`` prefix. A trisque server speaks RESP2; these are accepted so the parser
  never chokes on a server that says more.

Parsing restarts from the start of an unfinished reply each time ``next()`` is called; replies
are small (a job body at most) and it keeps the parser free of resumable state.
"""

from __future__ import annotations

from typing import Any, Final

from protocol.resp import NEED_DATA, Error, ProtocolError, Status, _NeedData

__all__ = ["TypedReplyParser", "NEED_DATA", "Status", "Error"]

_AGGREGATES: Final = frozenset(b"*%~>")


class _Short(Exception):
    """Raised inside a parse when the buffer ends before the reply does."""


class TypedReplyParser:
    __slots__ = ("_buf", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next(self) -> Any | _NeedData:
        if self._pos >= len(self._buf):
            return NEED_DATA
        try:
            value, end = self._parse(self._pos)
        except _Short:
            return NEED_DATA
        self._pos = end
        return value

    def _line(self, pos: int) -> tuple[bytes, int]:
        nl = self._buf.find(b"\r\n", pos)
        if nl < 0:
            raise _Short
        return bytes(self._buf[pos:nl]), nl + 2

    def _parse(self, pos: int) -> tuple[Any, int]:
        if pos >= len(self._buf):
            raise _Short
        kind = self._buf[pos]
        line, pos = self._line(pos + 1)
        if kind == 0x2B:  # '+'
            return Status(line.decode("utf-8", "surrogateescape")), pos
        if kind == 0x2D:  # '-'
            return Error(line.decode("utf-8", "surrogateescape")), pos
        if kind == 0x3A or kind == 0x28:  # ':' '('
            return _int(line), pos
        if kind == 0x24 or kind == 0x3D or kind == 0x21:  # '$' '=' '!'
            n = _int(line)
            if n < 0:
                return None, pos
            if len(self._buf) < pos + n + 2:
                raise _Short
            data = bytes(self._buf[pos : pos + n])
            if kind == 0x3D and data[3:4] == b":":
                data = data[4:]
            if kind == 0x21:
                return Error(data.decode("utf-8", "surrogateescape")), pos + n + 2
            return data, pos + n + 2
        if kind in _AGGREGATES:
            n = _int(line)
            if n < 0:
                return None, pos
            if kind == 0x25:  # '%': a map is read as its flattened key/value list
                n *= 2
            items: list[Any] = []
            for _ in range(n):
                item, pos = self._parse(pos)
                items.append(item)
            return items, pos
        if kind == 0x5F:  # '_'
            return None, pos
        if kind == 0x23:  # '#'
            return line == b"t", pos
        if kind == 0x2C:  # ','
            return float(line), pos
        raise ProtocolError(f"Protocol error: unexpected reply type byte {chr(kind)!r}")


def _int(line: bytes) -> int:
    try:
        return int(line)
    except ValueError:
        raise ProtocolError("Protocol error: invalid integer in reply") from None
