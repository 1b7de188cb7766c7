"""The request parser's fast path changes nothing but the cost.

Two parsers read the same byte stream, cut into the same reads: ``RequestParser()`` (the fast
path first, the full parser for the rest) and ``RequestParser(fast=False)`` (the full parser
alone, the code the server ran before the fast path). After every ``feed`` and every
``next()`` they must agree on everything: the command or ``NEED_DATA`` returned, the protocol
error raised (its text included), and, unless it was an error (after which the server closes
the connection and clears the parser), the parser's whole state: the unconsumed bytes, the
command read in part, ``buffered`` and ``held``. Between reads a random number of commands
is taken, as when a client blocked in GETJOB leaves its pipeline in the buffer.

The inputs are built from frames whose every header is either the plain one or one of the
odd ones the fast path must leave alone (leading zeros, signs, lengths one off, counts and
lengths at and past Redis's limits and past the fast path's tables and window), arguments
holding CRLF, ``$`` and ``*``, inline commands, empty commands and noise.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from protocol.resp import (
    _FAST_WINDOW,
    MAX_BULK_LEN,
    MAX_INLINE_SIZE,
    MAX_MULTIBULK_COUNT,
    NEED_DATA,
    ProtocolError,
    RequestParser,
)

# Arguments: short ones with the bytes that matter to a line-based reader, and lengths at the
# edges of the fast path's table (1023/1024) and window.
_TRICKY = st.sampled_from([b"\r\n", b"\r", b"\n", b"$", b"*", b"$3\r\n", b"*1\r\n", b"0", b" "])
_short_arg = st.lists(st.one_of(_TRICKY, st.binary(max_size=6)), max_size=5).map(b"".join)
_EDGE_LENGTHS = [1023, 1024, 1025, _FAST_WINDOW - 64, _FAST_WINDOW - 10, _FAST_WINDOW - 9,
                 _FAST_WINDOW, _FAST_WINDOW + 1]
_long_arg = st.builds(lambda n, b: bytes([b]) * n, st.sampled_from(_EDGE_LENGTHS),
                      st.sampled_from([0x78, 0x0D, 0x0A]))
argument = st.one_of(_short_arg, _short_arg, _short_arg, _long_arg)

# Headers other than the plain one: each is either refused by the full parser (and the text of
# its error must come out of the fast parser too) or accepted with a value the fast path does
# not vouch for.
_ODD_COUNTS = [b"*0", b"*-1", b"*01", b"*-0", b"*+1", b"* 1", b"*", b"*x", b"*1025", b"*1024",
               b"*%d" % MAX_MULTIBULK_COUNT, b"*%d" % (MAX_MULTIBULK_COUNT + 1),
               b"*99999999999999999999", b"*-99999999999999999999"]
_ODD_LENGTHS = [b"$", b"$-1", b"$+3", b"$ 3", b"$03", b"$00", b"$x", b":3", b"+3",
                b"$%d" % MAX_BULK_LEN, b"$%d" % (MAX_BULK_LEN + 1), b"$2147483648",
                b"$9999999999", b"$99999999999"]
_TERMINATORS = [b"\r\n", b"\n", b"\r", b"", b"xx", b"\r\r\n"]


def _rarely(draw: st.DrawFn, plain: bytes, odd: list[bytes]) -> bytes:
    """``plain`` most of the time, else one of ``odd``: each header of a frame is odd or
    not on its own, so a frame can go wrong at any argument."""
    if draw(st.integers(min_value=0, max_value=7)):
        return plain
    return draw(st.sampled_from(odd))


@st.composite
def frame(draw: st.DrawFn) -> bytes:
    """A multibulk frame, mostly plain, with odd headers, lengths or terminators here and there."""
    args = draw(st.lists(argument, min_size=1, max_size=5))
    parts = [_rarely(draw, b"*%d" % len(args), _ODD_COUNTS), b"\r\n"]
    for arg in args:
        n = len(arg)
        head = _rarely(draw, b"$%d" % n, [b"$%d" % (n + 1), b"$%d" % max(0, n - 1), *_ODD_LENGTHS])
        parts += [head, b"\r\n", arg, _rarely(draw, b"\r\n", _TERMINATORS)]
    return b"".join(parts)


def _many_empty_args(n: int) -> bytes:
    return b"*%d\r\n" % n + b"$0\r\n\r\n" * n


_INLINE = st.sampled_from([b"PING\r\n", b"PING\n", b"\r\n", b"\n", b'ECHO "a b"\r\n',
                           b"ECHO 'x\r\n", b"ECHO x$3\r\n"])
_FRAGMENTS = st.sampled_from([b"*", b"$", b"\r\n", b"\n", b"\r", b"0", b"1", b"3", b"-1", b"01",
                              b"PING", b"q", b" ", b"\x00", b"\xff"])
piece = st.one_of(
    frame(), frame(), frame(), frame(),
    _INLINE,
    st.sampled_from([1023, 1024, 1025]).map(_many_empty_args),
    st.lists(st.one_of(_FRAGMENTS, st.binary(max_size=8)), max_size=10).map(b"".join),
)
stream = st.lists(piece, max_size=12).map(b"".join)
# Where the stream is cut into reads: anywhere, or next to a CR or LF (just before or after a
# header's or an argument's end, where a reader that looks too far would go wrong); and how
# many commands are taken after each read.
cuts = st.lists(st.tuples(st.integers(min_value=0), st.sampled_from([None, -1, 0, 1, 2])),
                max_size=10)
Cuts = list[tuple[int, int | None]]
takes = st.lists(st.one_of(st.none(), st.integers(min_value=0, max_value=3)), max_size=11)


def state(p: RequestParser) -> tuple[Any, ...]:
    """Everything the full parser keeps: a fast parser must leave exactly this. (The fast
    path's queue is not in it: its commands are bytes still in the buffer.)"""
    return (bytes(p._buf[p._pos:]), p._argc, p._bulklen, list(p._argv), p._argv_bytes,
            p.buffered, p.held)


def step(p: RequestParser) -> Any:
    try:
        return p.next()
    except ProtocolError as exc:
        return ("error", str(exc))


def cut_positions(data: bytes, cut_points: Cuts) -> list[int]:
    ends = [i for i, c in enumerate(data) if c in b"\r\n"]
    points = set()
    for at, near in cut_points:
        if near is None or not ends:
            points.add(at % (len(data) + 1))
        else:
            points.add(min(len(data), max(0, ends[at % len(ends)] + near)))
    return sorted(points)


def compare(data: bytes, cut_points: Cuts, take_counts: list[int | None]) -> list[Any]:
    """Run both parsers in lockstep; every difference fails. The outcomes, for more checks."""
    points = cut_positions(data, cut_points)
    reads, start = [], 0
    for p in points:
        reads.append(data[start:p])
        start = p
    reads.append(data[start:])
    fast, full = RequestParser(), RequestParser(fast=False)
    outcomes: list[Any] = []
    for i, chunk in enumerate(reads):
        fast.feed(chunk)
        full.feed(chunk)
        assert state(fast) == state(full)
        # None: take every command, as the server does; a number: stop early, as a blocked
        # client does; the last read is always drained.
        limit = take_counts[i] if i < len(take_counts) and i < len(reads) - 1 else None
        taken = 0
        while limit is None or taken < limit:
            got, want = step(fast), step(full)
            assert got == want
            if isinstance(got, tuple):
                # A protocol error: the server replies with it, closes the connection and
                # clears the parser, so what is left in it is never read again (the full
                # parser itself leaves it half updated).
                outcomes.append(got)
                return outcomes
            assert state(fast) == state(full)
            if got is NEED_DATA:
                break
            outcomes.append(got)
            taken += 1
    return outcomes


@given(stream, cuts, takes)
def test_fast_path_gives_the_full_parsers_results(data: bytes, cut_points: Cuts,
                                                  take_counts: list[int | None]) -> None:
    compare(data, [], [])  # in one read: the fast path sees whole batches
    compare(data, cut_points, take_counts)


@given(st.lists(st.lists(argument, min_size=1, max_size=6), min_size=1, max_size=20), cuts,
       takes)
def test_plain_pipelines_come_back_whole(commands: list[list[bytes]], cut_points: Cuts,
                                         take_counts: list[int | None]) -> None:
    """Only plain frames (what the fast path is for): every command comes back as sent."""
    data = b"".join(_plain_frame(c) for c in commands)
    assert compare(data, cut_points, take_counts) == commands


def _plain_frame(args: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


@given(st.lists(_short_arg, min_size=1, max_size=4), st.integers(min_value=0),
       st.sampled_from(["count", "length", "terminator"]), st.data(), cuts, takes)
def test_one_odd_header_between_plain_frames(args: list[bytes], where: int, what: str,
                                             data: st.DataObject, cut_points: Cuts,
                                             take_counts: list[int | None]) -> None:
    """A plain frame, then one with a single odd part, then a plain one: every odd header
    and terminator is tried where the fast path is in the middle of a batch."""
    parts = [b"*%d" % len(args), b"\r\n"]
    for arg in args:
        parts += [b"$%d" % len(arg), b"\r\n", arg, b"\r\n"]
    if what == "count":
        parts[0] = data.draw(st.sampled_from(_ODD_COUNTS))
    else:
        i = where % len(args)
        n = len(args[i])
        if what == "length":
            parts[2 + 4 * i] = data.draw(st.sampled_from(
                [b"$%d" % (n + 1), b"$%d" % max(0, n - 1), b"$0%d" % n, *_ODD_LENGTHS]))
        else:
            parts[5 + 4 * i] = data.draw(st.sampled_from(_TERMINATORS[1:]))
    plain = _plain_frame([b"PING"])
    stream = plain + b"".join(parts) + plain
    compare(stream, [], [])
    compare(stream, cut_points, take_counts)


@given(st.sampled_from([b"*", b"*1\r\n$"]), st.integers(min_value=1, max_value=3), cuts)
def test_headers_without_end_hit_the_same_limit(prefix: bytes, extra: int,
                                                cut_points: Cuts) -> None:
    """A count or bulk length that never ends: the same error at the same byte."""
    data = prefix + b"1" * (MAX_INLINE_SIZE + extra)
    outcomes = compare(data, cut_points, [])
    assert outcomes[-1] in (("error", "Protocol error: too big mbulk count string"),
                            ("error", "Protocol error: too big bulk count string"))
