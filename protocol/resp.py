"""RESP2/RESP3 codec: bytes in, values out; values in, bytes out.

Theory of operation
-------------------
Two readers share one shape, a feed/next object in the style of h11: ``feed(data)`` appends
bytes, ``next()`` returns one complete value or the ``NEED_DATA`` sentinel. Short input is
"not yet", never an error; malformed input raises ``ProtocolError`` whose text is the one
Redis sends (``Protocol error: ...``) before it closes the connection.

* ``ReplyReader`` (client side) wraps ``hiredis.Reader``: replies come from a server we chose
  to talk to, and hiredis turns them into Python values in C.
* ``RequestParser`` (server side) reads what clients send: multibulk requests and inline
  commands, as Redis accepts them. It checks every header itself, because hiredis has no limit
  on multibulk counts or bulk lengths and does not say where an unfinished request starts, so it
  cannot refuse ``$2000000000`` at once the way Redis does. Once the headers are read, the
  arguments are only slices of the buffer. The common case (complete frames of bulk strings,
  possibly pipelined) takes a fast path that gives exactly the same results (see the class).

Replies are plain Python values: ``bytes`` (bulk), ``int``, ``None`` (null), ``list``/``tuple``
(array), ``dict`` (map: flattened in RESP2), ``Status`` (``+``), ``Error`` (``-``),
``NULL_ARRAY`` (``*-1``, what GETJOB answers on timeout) and ``Verbatim``-free simple types.
``encode(value, protover)`` writes them; RESP3 differs only in nulls and maps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import hiredis
from mypy_extensions import mypyc_attr

# Limits, as in Redis/Disque (networking.c): they bound what one client can make us buffer.
MAX_INLINE_SIZE: Final = 64 * 1024
MAX_MULTIBULK_COUNT: Final = 1024 * 1024
MAX_BULK_LEN: Final = 512 * 1024 * 1024

# The request fast path (RequestParser._fill_fast): how much of the buffer one pass reads at
# most (it also bounds the commands it splits ahead: a client blocked in GETJOB keeps them),
# and the largest count it reads. A larger count, or a frame larger than the window, is not an
# error, only a frame for the full parser; both stay far below the limits.
_FAST_WINDOW: Final = 16 * 1024
_FAST_MAX_COUNT: Final = 1024


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


class ProtocolError(Exception):
    """Malformed input. ``str(exc)`` is the Redis text, e.g. ``Protocol error: invalid bulk length``."""


@mypyc_attr(native_class=False)  # mypyc's native classes cannot subclass str
class Status(str):
    """A simple string reply (``+OK``). Never built from client bytes: the encoder writes it
    as it is (error replies, which may echo input, are made single-line)."""

    __slots__ = ()


@mypyc_attr(native_class=False)  # as Status
class Error(str):
    """An error reply (``-ERR ...``): the text starts with its code."""

    __slots__ = ()

    @property
    def code(self) -> str:
        return self.split(" ", 1)[0]


class _NullArray:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NULL_ARRAY"


NULL_ARRAY: Final = _NullArray()

OK: Final = Status("OK")


# ---------------------------------------------------------------------------------------------
# Server side: requests


class RequestParser:
    """Splits a client's byte stream into commands (lists of ``bytes`` arguments).

    Empty commands (``*0``, ``*-1``, blank inline lines) are skipped, as Redis does.

    Two parsers share the buffer. The *full parser* (``_next_full``) reads anything a client
    may send, one header at a time, and keeps its place inside a frame that is not complete
    yet. The *fast path* (``_fill_fast``) takes only the common case: at a frame boundary,
    complete multibulk frames of bulk strings with plain headers, possibly several pipelined,
    which it reads in one pass over (a window of) the buffer, reading headers byte by byte
    and jumping over the data, into a queue of commands (``_ready``). At the first frame it
    is not sure of (inline, partial, empty, odd or large headers, anything near a limit) it
    stops, and the full parser goes on from there, so every error and every limit is the
    full parser's. Queued commands are consumed only when ``next()`` hands them out (each
    moves ``_pos`` past its own frame), and a frame the fast path began but could not finish
    is handed to the full parser in the very state the full parser would have reached by
    itself; so after each ``next()`` the buffer, the command read in part, ``buffered`` and
    ``held`` are what the full parser alone would leave
    (``tests/property/test_resp_fastpath.py`` checks it on any input split anywhere).
    ``RequestParser(fast=False)`` is the full parser alone, the reference for that test.
    """

    __slots__ = ("_buf", "_pos", "_argv", "_argc", "_bulklen", "_argv_bytes", "_fast",
                 "_ready", "_ready_sizes")

    def __init__(self, *, fast: bool = True) -> None:
        self._buf = bytearray()
        self._pos = 0
        # State of a multibulk request read only in part: arguments so far, how many are
        # expected, and the length of the bulk being waited for (-1: its header is not read).
        self._argv: list[bytes] = []
        self._argc = 0
        self._bulklen = -1
        self._argv_bytes = 0  # size of the arguments in _argv
        self._fast = fast
        # Commands the fast path split ahead, last one first (``pop()`` hands out the next),
        # and the size of each one's frame, by which ``_pos`` moves when it is handed out.
        self._ready: list[list[bytes]] = []
        self._ready_sizes: list[int] = []

    def feed(self, data: bytes) -> None:
        buf = self._buf
        if self._pos:
            # Drop what is consumed before growing, so a long-lived connection stays small.
            # (Queued commands keep their frames' sizes, not positions: nothing to adjust.)
            del buf[: self._pos]
            self._pos = 0
        buf += data

    @property
    def buffered(self) -> int:
        """Bytes received and not yet turned into a command."""
        return len(self._buf) - self._pos

    @property
    def free(self) -> int:
        """Bytes the input buffer has room for before it grows (CLIENT LIST's qbuf-free)."""
        buf = self._buf
        return max(buf.__alloc__() - len(buf) - 1, 0)

    @property
    def held(self) -> int:
        """Bytes this parser holds for its client: the unparsed input and the arguments of a
        command read in part (what ``client-query-buffer-limit`` is checked against)."""
        return len(self._buf) - self._pos + self._argv_bytes

    def clear(self) -> None:
        """Drop everything held (the client is gone)."""
        self._buf = bytearray()
        self._pos = self._argc = self._argv_bytes = 0
        self._argv = []
        self._bulklen = -1
        self._ready = []
        self._ready_sizes = []

    def next(self) -> list[bytes] | _NeedData:
        ready = self._ready
        if not ready and self._fast and self._argc == 0:
            buf = self._buf
            pos = self._pos
            if pos < len(buf) and buf[pos] == 0x2A:  # '*'
                self._fill_fast()
        if ready:
            self._pos += self._ready_sizes.pop()
            return ready.pop()
        return self._next_full()

    def _fill_fast(self) -> None:
        """Queue the ordinary complete frames at the start of the buffer (see the class
        docstring): ``*<n>`` with 1 <= n <= 1024, then n bulk strings whose ``$<len>``
        headers are plain decimal numbers (no sign, no leading zero) and whose data and the
        two bytes after it are all in the window. For such a frame the full parser would find
        the same header lines, read the same lengths, take the same bytes and stop at the same
        place, so queuing it changes nothing but the cost. Anything else ends the batch
        where it begins, for the full parser.

        When that happens in the first frame, after its count, what was read is not thrown
        away: the full parser's state is set to where it would be after reading the same
        bytes (the count, the arguments taken, the header of one whose data is still to
        come), a state it passes through itself, so it goes on from there as if it had read
        them. A large argument or a frame cut by a read costs its headers once."""
        # One copy of at most a window: the arguments below are slices of an immutable
        # bytes object (one allocation per argument), its bytes are read as C ints when
        # compiled, and a frame larger than the window is left to the full parser.
        buf = self._buf
        first = self._pos
        if first == 0 and len(buf) <= _FAST_WINDOW:
            window = bytes(buf)  # the usual case: feed() has just dropped what was consumed
        else:
            view = memoryview(buf)
            try:
                window = bytes(view[first : first + _FAST_WINDOW])
            finally:
                view.release()
        end = len(window)
        ready = self._ready
        sizes = self._ready_sizes
        start = 0  # where the frame being read begins in the window
        while True:
            if start >= end or window[start] != 0x2A:  # '*'
                break
            count, pos = _fast_number(window, start + 1, end, 4)
            if count < 1 or count > _FAST_MAX_COUNT:
                break
            left = count  # arguments still to read
            argv: list[bytes] = []
            taken = 0  # bytes of the arguments in argv
            bulklen = -1  # the length of an argument whose header is read and data is not
            while left:
                if pos >= end or window[pos] != 0x24:  # '$'
                    break
                length, data = _fast_number(window, pos + 1, end, 10)
                if length < 0 or length > MAX_BULK_LEN:
                    break
                # Like the full parser, the two bytes after the data must be there, and are
                # skipped unread (Redis does not check them either).
                if data + length + 2 > end:
                    pos = data
                    bulklen = length
                    break
                pos = data + length + 2
                argv.append(window[data : pos - 2])
                taken += length
                left -= 1
            if left:
                if not ready:
                    self._pos = first + pos
                    self._argc = count
                    self._argv = argv
                    self._argv_bytes = taken
                    self._bulklen = bulklen
                break
            ready.append(argv)
            sizes.append(pos - start)
            start = pos
        if len(ready) > 1:
            ready.reverse()
            sizes.reverse()

    def _next_full(self) -> list[bytes] | _NeedData:
        while True:
            buf = self._buf
            pos = self._pos
            if self._argc == 0:
                if pos >= len(buf):
                    return NEED_DATA
                if buf[pos] != 0x2A:  # '*'
                    cmd = self._inline()
                    if cmd is NEED_DATA or cmd:
                        return cmd
                    continue
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    if len(buf) - pos > MAX_INLINE_SIZE:
                        raise ProtocolError("Protocol error: too big mbulk count string")
                    return NEED_DATA
                count = _parse_int(buf, pos + 1, nl)
                if count is None or count > MAX_MULTIBULK_COUNT:
                    raise ProtocolError("Protocol error: invalid multibulk length")
                self._pos = nl + 2
                if count <= 0:
                    continue
                self._argc = count
                self._argv = []
            argv = self._bulks()
            if argv is not None:
                return argv
            return NEED_DATA

    def _bulks(self) -> list[bytes] | None:
        # The hot path of the server: locals only, the number check inlined, one copy per
        # argument (through a memoryview, released before the buffer can grow again).
        buf = self._buf
        pos = self._pos
        argv = self._argv
        need = self._argc
        bulklen = self._bulklen
        end = len(buf)
        find = buf.find
        view = memoryview(buf)
        got = 0  # bytes of arguments taken in this call
        try:
            while len(argv) < need:
                if bulklen < 0:
                    nl = find(b"\r\n", pos)
                    if nl < 0:
                        if end - pos > MAX_INLINE_SIZE:
                            raise ProtocolError("Protocol error: too big bulk count string")
                        break
                    if buf[pos] != 0x24:  # '$'
                        raise ProtocolError(f"Protocol error: expected '$', got '{chr(buf[pos])}'")
                    text = buf[pos + 1 : nl]
                    # string2ll's rules: digits only, no sign, no leading zero.
                    if not text.isdigit() or len(text) > 10 or (text[0] == 0x30 and len(text) > 1):
                        raise ProtocolError("Protocol error: invalid bulk length")
                    bulklen = int(text)
                    if bulklen > MAX_BULK_LEN:
                        raise ProtocolError("Protocol error: invalid bulk length")
                    pos = nl + 2
                stop = pos + bulklen
                if end < stop + 2:
                    break
                argv.append(bytes(view[pos:stop]))
                got += bulklen
                pos = stop + 2
                bulklen = -1
        finally:
            view.release()
        self._pos = pos
        self._bulklen = bulklen
        if len(argv) < need:
            self._argv_bytes += got
            return None
        self._argc = 0
        self._argv = []
        self._argv_bytes = 0
        return argv

    def _inline(self) -> list[bytes] | _NeedData:
        buf = self._buf
        pos = self._pos
        nl = buf.find(b"\n", pos)
        if nl < 0:
            if len(buf) - pos > MAX_INLINE_SIZE:
                raise ProtocolError("Protocol error: too big inline request")
            return NEED_DATA
        line = bytes(buf[pos:nl])
        self._pos = nl + 1
        if line.endswith(b"\r"):
            line = line[:-1]
        return split_args(line)


def _fast_number(window: bytes, pos: int, end: int, max_digits: int) -> tuple[int, int]:
    """The header number starting at ``pos`` (just after its ``*`` or ``$``) if its line is
    complete in ``window`` and is what the full parser reads as a plain number: 1 to
    ``max_digits`` decimal digits, no sign, no leading zero, then CR LF. Returns (the number,
    where the next line starts), or (-1, 0) for anything else (incomplete, or for the full
    parser to judge). Byte by byte: compiled, this is a C loop, where finding the line end
    and slicing the header out to look it up cost a Python-level call and an object each."""
    value = 0
    i = pos
    while i < end:
        c = window[i]
        if c < 0x30 or c > 0x39:
            break
        if i - pos == max_digits:
            return -1, 0
        value = value * 10 + (c - 0x30)
        i += 1
    digits = i - pos
    if digits == 0 or i + 1 >= end or window[i] != 0x0D or window[i + 1] != 0x0A:
        return -1, 0
    if digits > 1 and window[pos] == 0x30:
        return -1, 0
    return value, i + 2


def _parse_int(buf: bytearray, start: int, end: int) -> int | None:
    text = buf[start:end]
    # int() accepts spaces, '+', '_' and leading zeros, which Redis's string2ll refuses.
    if not text or len(text) > 20:
        return None
    digits = text[1:] if text[0] == 0x2D else text
    if not digits.isdigit() or (digits[0] == 0x30 and (len(digits) > 1 or digits is not text)):
        return None
    return int(text)


def split_args(line: bytes) -> list[bytes]:
    """Split an inline command like Redis's sdssplitargs: quotes, escapes, \\xHH."""
    args: list[bytes] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i] in b" \t\n\r\v\f":
            i += 1
        if i >= n:
            return args
        cur = bytearray()
        inq = insq = False
        while True:
            if inq:
                if i >= n:
                    raise ProtocolError("Protocol error: unbalanced quotes in request")
                c = line[i]
                if c == 0x5C and i + 3 < n and line[i + 1] == 0x78 and _ishex(line[i + 2 : i + 4]):
                    cur.append(int(line[i + 2 : i + 4], 16))
                    i += 3
                elif c == 0x5C and i + 1 < n:
                    i += 1
                    cur += {0x6E: b"\n", 0x72: b"\r", 0x74: b"\t", 0x62: b"\b", 0x61: b"\a"}.get(
                        line[i], bytes([line[i]])
                    )
                elif c == 0x22:
                    if i + 1 < n and line[i + 1] not in b" \t\n\r\v\f":
                        raise ProtocolError("Protocol error: unbalanced quotes in request")
                    i += 1
                    break
                else:
                    cur.append(c)
            elif insq:
                if i >= n:
                    raise ProtocolError("Protocol error: unbalanced quotes in request")
                c = line[i]
                if c == 0x5C and i + 1 < n and line[i + 1] == 0x27:
                    i += 1
                    cur.append(0x27)
                elif c == 0x27:
                    if i + 1 < n and line[i + 1] not in b" \t\n\r\v\f":
                        raise ProtocolError("Protocol error: unbalanced quotes in request")
                    i += 1
                    break
                else:
                    cur.append(c)
            else:
                if i >= n:
                    break
                c = line[i]
                if c in b" \t\n\r\v\f":
                    break
                if c == 0x22:
                    inq = True
                elif c == 0x27:
                    insq = True
                else:
                    cur.append(c)
            i += 1
        args.append(bytes(cur))


def _ishex(two: bytes) -> bool:
    return len(two) == 2 and all(c in b"0123456789abcdefABCDEF" for c in two)


# ---------------------------------------------------------------------------------------------
# Client side: replies


class ReplyReader:
    """hiredis behind the feed/next shape. Error replies come back as ``Error`` values."""

    __slots__ = ("_reader",)

    def __init__(self) -> None:
        self._reader = hiredis.Reader(
            protocolError=ProtocolError,
            replyError=Error,  # type: ignore[arg-type]  # a str subclass: callable with the text
            notEnoughData=NEED_DATA,
        )
        # hiredis gives status replies and bulk strings the same type (bytes). A caller that
        # must tell them apart (redis-cli style printing) uses ``TypedReplyParser``.

    def feed(self, data: bytes) -> None:
        self._reader.feed(data)

    def next(self) -> Any:
        return self._reader.gets()


# ---------------------------------------------------------------------------------------------
# Encoding

_CRLF: Final = b"\r\n"
_NULL_BULK: Final = b"$-1\r\n"
_NULL_ARRAY2: Final = b"*-1\r\n"
_NULL3: Final = b"_\r\n"
_SMALL_INTS: Final = [b":%d\r\n" % i for i in range(1024)]
_BULK_HEADERS: Final = [b"$%d\r\n" % i for i in range(1024)]
_ARRAY_HEADERS: Final = [b"*%d\r\n" % i for i in range(256)]


def _one_line(text: str) -> bytes:
    """An error line as bytes. Errors often echo client input (an unknown command's
    name, a CONFIG value); a CR or LF in it would end the line early and let the client forge
    the next reply, so both become spaces, as Disque's addReplyErrorFormat does. Input
    decoded with ``surrogateescape`` goes back to the bytes the client sent."""
    data = text.encode("utf-8", "surrogateescape")
    if b"\r" in data or b"\n" in data:
        data = data.replace(b"\r", b" ").replace(b"\n", b" ")
    return data


# Types whose value is only known when the reply is encoded (a body the append log holds: the
# broker replies with its reference, node/bodies.py reads it): type -> the function giving the
# value to encode in its place. Looked up after every ordinary type, so other replies pay
# nothing.
_LAZY: Final[dict[type, Callable[[Any], Any]]] = {}


def register_lazy(t: type, resolve: Callable[[Any], Any]) -> None:
    """Encode a value of type ``t`` as ``resolve(value)`` (``resolve`` replaces any previous
    one for ``t``)."""
    _LAZY[t] = resolve


def encode(value: Any, protover: int = 2) -> bytes:
    out: list[bytes] = []
    _encode_into(value, out, protover)
    return b"".join(out)


def encode_into(value: Any, out: list[bytes], protover: int = 2) -> None:
    """Append the encoding of ``value`` to ``out`` (a list joined once per write)."""
    _encode_into(value, out, protover)


def _encode_into(value: Any, out: list[bytes], protover: int) -> None:
    t = type(value)
    if t is bytes:
        n = len(value)
        out.append(_BULK_HEADERS[n] if n < 1024 else b"$%d\r\n" % n)
        out.append(value)
        out.append(_CRLF)
    elif t is Status:
        # Status texts are the node's own (OK, PONG, job IDs it generated), never client
        # bytes, so the hot ADDJOB reply skips the CR/LF scan errors get.
        text: str = value  # typed: compiled, str.encode() is then a C call, not a method lookup
        out.append(b"+" + text.encode() + _CRLF)
    elif t is int:
        out.append(_SMALL_INTS[value] if 0 <= value < 1024 else b":%d\r\n" % value)
    elif t is list or t is tuple:
        n = len(value)
        out.append(_ARRAY_HEADERS[n] if n < 256 else b"*%d\r\n" % n)
        for item in value:
            # Bulk strings in place (GETJOB's [queue, id, body] entries): one call per array
            # instead of one per item.
            if type(item) is bytes:
                n = len(item)
                out.append(_BULK_HEADERS[n] if n < 1024 else b"$%d\r\n" % n)
                out.append(item)
                out.append(_CRLF)
            else:
                _encode_into(item, out, protover)
    elif value is None:
        out.append(_NULL3 if protover == 3 else _NULL_BULK)
    elif t is Error:
        out.append(b"-" + _one_line(value) + _CRLF)
    elif value is NULL_ARRAY:
        out.append(_NULL3 if protover == 3 else _NULL_ARRAY2)
    elif t is dict:
        out.append((b"%%%d\r\n" if protover == 3 else b"*%d\r\n") % (len(value) * (1 if protover == 3 else 2)))
        for k, v in value.items():
            _encode_into(k, out, protover)
            _encode_into(v, out, protover)
    elif t is str:
        _encode_into(value.encode(), out, protover)
    elif t is bool:
        _encode_into(int(value), out, protover)
    elif t is float:
        _encode_into(repr(value).encode(), out, protover)
    else:
        resolve = _LAZY.get(t)
        if resolve is None:
            raise TypeError(f"cannot encode {t.__name__} as RESP")
        _encode_into(resolve(value), out, protover)


def encode_command(*args: bytes | str | int) -> bytes:
    """A request as a multibulk frame: what clients send."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            b = a.encode()
        elif isinstance(a, int):
            b = b"%d" % a
        else:
            b = bytes(a)
        parts.append(b"$%d\r\n" % len(b))
        parts.append(b)
        parts.append(_CRLF)
    return b"".join(parts)
