"""The append-log reader on any bytes after a valid header, and on damaged real logs: it yields
records and says how the file ends (clean, torn, corrupt at an offset), nothing else."""

from __future__ import annotations

import os
import tempfile

from hypothesis import given
from hypothesis import strategies as st

from broker import aof
from broker.job import Job, validate_record
from node import logfile


def _record(n: int) -> list:
    return Job(b"D-00000000-%024d-05a1" % n, b"q", b"x" * n, repl=1, ttl=60, retry=5, delay=0,
               ctime=n, delivered=()).to_record()


_GOOD = aof.encode_header() + b"".join(
    aof.encode_frame(k, d) for k, d in
    [("job", _record(i)) for i in range(6)] + [("ack", _record(1)[0]), ("del", _record(2)[0])]
)


def _read(data: bytes):
    fd, path = tempfile.mkstemp(prefix="trisque-prop-", suffix=".aof")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        end = aof.ReadEnd()
        records = list(logfile.read_log(path, end, validate_record))
    finally:
        os.unlink(path)
    return records, end


def _check(data: bytes) -> None:
    records, end = _read(data)
    assert end.state in ("clean", "torn", "corrupt")
    assert aof.HEADER_SIZE <= end.offset <= len(data) or end.offset == 0
    for kind, payload in records:
        assert validate_record(kind, payload) is None
    if end.state == "clean":  # the records end the file, or a zero-filled tail follows them
        assert end.offset + end.tail == len(data)
        assert data[end.offset:] == bytes(end.tail)


@given(st.binary(max_size=400))
def test_any_bytes_after_the_header(tail: bytes) -> None:
    _check(aof.encode_header() + tail)


@given(st.lists(st.tuples(st.integers(min_value=aof.HEADER_SIZE, max_value=len(_GOOD) - 1),
                          st.integers(min_value=1, max_value=255)), max_size=4),
       st.integers(min_value=aof.HEADER_SIZE, max_value=len(_GOOD)))
def test_a_damaged_real_log(flips: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(_GOOD[:cut])
    for pos, mask in flips:
        if pos < len(data):
            data[pos] ^= mask
    _check(bytes(data))


@given(st.lists(st.one_of(st.integers(min_value=-(2**63), max_value=2**64 - 1),
                          st.binary(max_size=8), st.text(max_size=4),
                          st.none(), st.booleans(), st.lists(st.integers(0, 9), max_size=3)),
                max_size=16))
def test_well_framed_nonsense_is_damage_not_a_crash(payload) -> None:
    data = aof.encode_header() + aof.encode_frame("job", payload)
    records, end = _read(data)
    if records:
        assert end.state == "clean"
    else:
        assert end.state in ("corrupt", "torn") and end.offset == aof.HEADER_SIZE


# Values a record may hold, and some msgpack refuses (ints past 64 bits, a lone surrogate, a
# set): the batch encoder must give msgpack's own bytes for the first and add nothing for the
# second.
_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**64), max_value=2**65),
              st.binary(max_size=300), st.text(max_size=40), st.floats(allow_nan=False)),
    lambda inner: st.one_of(st.lists(inner, max_size=20), st.tuples(inner, inner)),
    max_leaves=40,
)
_KIND = st.one_of(st.sampled_from(aof.KINDS), st.text(max_size=10))


def _frames(records: list[tuple]) -> bytes:
    """The reference: one ``encode_frame`` (msgpack.packb) per record."""
    return b"".join(aof.encode_frame(kind, data) for kind, data, _ in records)


@given(st.lists(st.tuples(_KIND, _VALUE, st.none()), max_size=8), st.binary(max_size=40))
def test_append_records_writes_the_reference_frames_or_nothing(records, before) -> None:
    """The group commit's encoder (``append_records`` into the open batch, with the event
    loop's own packer) writes byte for byte the frames ``encode_frame`` writes; a record
    msgpack refuses raises its error and leaves the buffer as it was; the packer then still
    encodes correctly."""
    pack = aof.new_packer()
    buf = bytearray(before)
    try:
        expected = _frames(records)
    except (OverflowError, ValueError, TypeError) as exc:
        refused = type(exc)
    else:
        refused = None
    if refused is None:
        aof.append_records(buf, records, pack)
        assert bytes(buf) == before + expected
        assert aof.encode_records(records) == expected
    else:
        try:
            aof.append_records(buf, records, pack)
        except refused:
            pass
        assert bytes(buf) == before
    after = [("ack", b"D-1", None)]
    buf = bytearray()
    aof.append_records(buf, after, pack)
    assert bytes(buf) == _frames(after)
