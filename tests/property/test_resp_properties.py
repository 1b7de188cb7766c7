"""The RESP request parser on any input: every step gives a command, NEED_DATA or a protocol
error (never another exception), and how the bytes are split into reads changes nothing."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from protocol.resp import NEED_DATA, ProtocolError, RequestParser, encode_command

# Bytes that look like RESP more often than random bytes do, so the parser's deeper states are
# reached: fragments of frames mixed with noise.
_FRAGMENTS = st.sampled_from([
    b"*", b"$", b"\r\n", b"\n", b"\r", b"0", b"1", b"2", b"3", b"-1", b"01", b"999999999999",
    b"PING", b"ADDJOB", b"q", b" ", b'"', b"'", b"\\x41", b"+", b":", b"\x00", b"\xff",
])
resp_like = st.lists(st.one_of(_FRAGMENTS, st.binary(max_size=12)), max_size=40).map(b"".join)
any_input = st.one_of(st.binary(max_size=300), resp_like)


def _run(chunks: list[bytes]) -> list[Any]:
    """Feed the chunks one by one, taking every command after each; the outcome sequence."""
    parser = RequestParser()
    out: list[Any] = []
    for chunk in chunks:
        parser.feed(chunk)
        while True:
            try:
                value = parser.next()
            except ProtocolError as exc:
                assert str(exc).startswith("Protocol error: ")
                out.append(("error", str(exc)))
                return out
            if value is NEED_DATA:
                break
            assert isinstance(value, list) and all(type(a) is bytes for a in value)
            out.append(value)
    return out


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, start = [], 0
    for p in points:
        pieces.append(data[start:p])
        start = p
    pieces.append(data[start:])
    return pieces


@given(any_input, st.lists(st.integers(min_value=0), max_size=8))
def test_any_bytes_any_split(data: bytes, cuts: list[int]) -> None:
    whole = _run([data])
    assert _run(_split(data, cuts)) == whole
    assert _run([bytes([b]) for b in data]) == whole


_ARGS = st.lists(st.binary(max_size=40), min_size=1, max_size=12)


@given(st.lists(_ARGS, min_size=1, max_size=5), st.lists(st.integers(min_value=0), max_size=8))
def test_commands_come_back_as_sent(commands: list[list[bytes]], cuts: list[int]) -> None:
    data = b"".join(encode_command(*c) for c in commands)
    assert _run(_split(data, cuts)) == commands
