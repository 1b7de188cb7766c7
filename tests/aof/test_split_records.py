"""Format version 3: a job record's body after its frame (a split record). Replay can skip the
bodies, and a torn tail, a damaged body and a damaged record are each still caught."""

from __future__ import annotations

import io
import os
import zlib
from typing import Any

import msgpack
import pytest

from broker import aof
from broker.job import REC_BODY
from node import logfile
from tests.aof.fakebroker import FakeBroker

BODY_MAX = 256


def _job(i: int, size: int) -> list[Any]:
    return [b"D-%08d" % i, b"q", os.urandom(size), "queued", 1]


def _records() -> list[tuple[str, Any]]:
    recs: list[tuple[str, Any]] = []
    for i in range(40):
        recs.append(("job", _job(i, 3000 if i % 2 else 100)))  # split, then inline
        if i % 5 == 0:
            recs.append(("ack", b"D-%08d" % i))
    return recs


def _log(recs: list[tuple[str, Any]]) -> bytes:
    return aof.encode_header() + aof.encode_records(recs, None, BODY_MAX)


def _refs(offset: int, length: int, crc: int) -> tuple[str, int, int, int]:
    return ("ref", offset, length, crc)


def _read(data: bytes, keep: aof.BodyKeeper | None = None) -> tuple[list[Any], aof.ReadEnd]:
    end = aof.ReadEnd()
    return list(aof.read_records(io.BytesIO(data), "t.aof", end, None, keep)), end


@pytest.fixture(autouse=True)
def _no_tail_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aof, "VERIFY_TAIL", 0)


def test_long_bodies_follow_their_frame_and_short_ones_stay_inside() -> None:
    recs = _records()
    data = _log(recs)
    assert data[aof.HEADER_SIZE:].startswith(aof.encode_frame(*recs[0]))  # 100 B: inline
    split = recs[2][1]
    meta = [*split[:REC_BODY], [3000, zlib.crc32(split[REC_BODY])], *split[REC_BODY + 1:]]
    frame = aof.encode_frame("job", meta)
    assert frame + split[REC_BODY] in data  # the body right after its own frame
    got, end = _read(data)
    assert got == [(k, list(d) if isinstance(d, list) else d) for k, d in recs]
    assert end.state == "clean" and end.offset == len(data)


def test_a_keeping_reader_skips_the_bodies_and_points_at_them() -> None:
    recs = _records()
    data = _log(recs)

    class Counting(io.BytesIO):
        read_bytes = 0

        def read(self, n: int | None = -1) -> bytes:
            chunk = super().read(n)
            Counting.read_bytes += len(chunk)
            return chunk

    old_chunk = aof.READ_CHUNK
    aof.READ_CHUNK = 64  # a small buffer: most bodies lie past it and are skipped
    try:
        got = list(aof.read_records(Counting(data), "t.aof", aof.ReadEnd(), None, _refs))
    finally:
        aof.READ_CHUNK = old_chunk
    for (kind, rec), (_, want) in zip(got, recs, strict=True):
        if kind == "job" and len(want[REC_BODY]) > BODY_MAX:
            _, at, length, crc = rec[REC_BODY]
            assert data[at:at + length] == want[REC_BODY] and crc == zlib.crc32(want[REC_BODY])
        else:
            assert rec == want
    assert Counting.read_bytes < len(data) - 15 * 3000  # most of the 20 bodies never read


@pytest.mark.parametrize("keep", [None, _refs])
def test_a_body_cut_by_the_end_of_the_file_is_a_torn_tail(keep: Any) -> None:
    recs = [("job", _job(1, 3000)), ("job", _job(2, 3000))]
    data = _log(recs)
    first_end = data.index(recs[0][1][REC_BODY]) + 3000
    got, end = _read(data[:-10], keep)
    assert len(got) == 1 and end.state == "torn" and end.offset == first_end
    assert "body of 3000 bytes cut" in end.reason


def test_a_damaged_body_is_damage_for_a_reading_reader_and_its_crc_for_a_keeping_one() -> None:
    recs = [("job", _job(i, 3000)) for i in range(3)]
    data = bytearray(_log(recs))
    at = data.index(recs[1][1][REC_BODY])
    data[at + 100] ^= 0x01
    _, end = _read(bytes(data))
    assert end.state == "corrupt" and end.reason == "body checksum mismatch"
    got, end = _read(bytes(data), _refs)  # outside the checked tail: replay does not read it
    assert end.state == "clean" and len(got) == 3
    _, offset, length, crc = got[1][1][REC_BODY]
    assert zlib.crc32(bytes(data[offset:offset + length])) != crc  # node/bodies.py's check


def test_a_damaged_last_body_in_the_checked_tail_is_a_torn_tail(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """What a crash leaves when the metadata reached the disk and the body did not."""
    monkeypatch.setattr(aof, "VERIFY_TAIL", 1 << 20)
    recs = [("job", _job(i, 3000)) for i in range(3)]
    data = bytearray(_log(recs))
    at = data.index(recs[2][1][REC_BODY])
    data[at:] = bytes(len(data) - at)
    path = str(tmp_path / "t.aof")
    with open(path, "wb") as f:
        f.write(data)
    warnings: list[str] = []
    broker = FakeBroker()
    end = logfile.load_into(path, broker, 0, warn=warnings.append, keep=_refs)
    assert end.state == "torn" and end.records == 2 and warnings
    second_end = data.index(recs[1][1][REC_BODY]) + 3000
    assert end.offset == second_end and os.path.getsize(path) == second_end  # cut there


def test_a_damaged_record_before_a_body_is_corrupt() -> None:
    recs = [("job", _job(i, 3000)) for i in range(3)]
    data = bytearray(_log(recs))
    at = data.index(recs[1][1][REC_BODY])
    data[at - 5] ^= 0x40  # inside the metadata of record 2
    _, end = _read(bytes(data), _refs)
    assert end.state == "corrupt" and end.reason == "checksum mismatch"


def test_a_bad_body_reference_is_damage() -> None:
    meta = [b"D-1", b"q", [-1, 0], "queued", 1]
    payload = msgpack.packb(("job", meta), use_bin_type=True)
    frame = aof.encode_frame("job", meta)
    assert frame.endswith(payload)
    _, end = _read(aof.encode_header() + frame + aof.encode_frame("ack", b"D-1"))
    assert end.state == "corrupt" and end.reason == "bad body reference"


def test_a_version_2_log_with_long_bodies_reads_them_inside_their_frames() -> None:
    recs = [("job", _job(i, 3000)) for i in range(3)]
    data = aof.encode_header(version=2) + b"".join(aof.encode_frame(k, d) for k, d in recs)
    got, end = _read(data, _refs)
    assert got == recs and end.state == "clean" and end.header is not None
    assert end.header.version == 2
