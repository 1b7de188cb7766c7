"""The log format, its reader and loader, without trio or sockets."""

from __future__ import annotations

import os
import random
import struct

import pytest

from broker import aof
from node import logfile
from tests.aof.fakebroker import FakeBroker


def _records(n: int) -> list[tuple[str, object]]:
    recs: list[tuple[str, object]] = []
    for i in range(n):
        jid = b"D-%08d" % i
        recs.append(("job", [jid, b"q%d" % (i % 3), os.urandom(i % 40), True, 0]))
        if i % 5 == 0:
            recs.append(("ack", jid))
        elif i % 7 == 0:
            recs.append(("del", jid))
    return recs


def _write_log(path: str, recs: list[tuple[str, object]]) -> list[int]:
    """Write a log; return the file offset after each record."""
    ends = []
    with open(path, "wb") as f:
        f.write(aof.encode_header())
        for kind, data in recs:
            f.write(aof.encode_frame(kind, data))
            ends.append(f.tell())
    return ends


def test_round_trip(tmp_path):
    path = str(tmp_path / "a.aof")
    recs = _records(300)
    _write_log(path, recs)
    end = aof.ReadEnd()
    got = list(logfile.read_log(path, end))
    assert [(k, d) for k, d in got] == [(k, d) for k, d in recs]
    assert end.state == "clean" and end.offset == os.path.getsize(path)
    assert end.counts["job"] == 300 and end.records == len(recs)


def test_encode_records_matches_encode_frame_and_drops_undo():
    entries = [("job", [b"D-1", b"q", b"body", True, 3], [b"old"]), ("ack", b"D-1", None)]
    assert aof.encode_records(entries) == b"".join(aof.encode_frame(k, d) for k, d, _ in entries)


def test_fifty_random_truncations_recover_every_whole_record(tmp_path):
    path = str(tmp_path / "a.aof")
    recs = _records(200)
    ends = _write_log(path, recs)
    full = open(path, "rb").read()
    rng = random.Random(1234)
    cuts = rng.sample(range(1, len(full)), 50)
    for cut in cuts:
        with open(path, "wb") as f:
            f.write(full[:cut])
        broker = FakeBroker()
        warnings: list[str] = []
        end = logfile.load_into(path, broker, 0, warn=warnings.append)
        whole = sum(1 for e in ends if e <= cut)
        expected = FakeBroker()
        for r in recs[:whole]:
            expected.load_record(r, 0)
        assert end.records == whole, cut
        assert broker.jobs == expected.jobs, cut
        on_boundary = cut in ends or cut == aof.HEADER_SIZE
        assert (end.state == "clean") == on_boundary, cut
        if not on_boundary:
            assert warnings and "truncated" in warnings[0]
        # The cut log is whole again and appending to it works.
        assert logfile.scan(path).state == "clean"
        assert logfile.scan(path).records == whole


def test_corruption_in_the_middle_is_refused_with_file_and_offset(tmp_path):
    path = str(tmp_path / "a.aof")
    ends = _write_log(path, _records(50))
    data = bytearray(open(path, "rb").read())
    bad = ends[10] + aof.FRAME_HEADER_SIZE + 2  # inside the payload of record 11
    data[bad] ^= 0x40
    open(path, "wb").write(data)
    with pytest.raises(aof.LogCorrupt) as info:
        logfile.load_into(path, FakeBroker(), 0)
    assert info.value.offset == ends[10]
    assert path in str(info.value) and f"offset {ends[10]}" in str(info.value)
    assert open(path, "rb").read() == data  # nothing was cut


def test_flipped_length_is_corruption_not_a_torn_tail(tmp_path):
    path = str(tmp_path / "a.aof")
    ends = _write_log(path, _records(50))
    data = bytearray(open(path, "rb").read())
    data[ends[3] + 1] ^= 0x10  # length of record 5 now points past the end of the file
    open(path, "wb").write(data)
    end = logfile.scan(path)
    assert end.state == "corrupt" and end.offset == ends[3]


def _write_v1_log(path: str, recs: list[tuple[str, object]]) -> list[int]:
    ends = []
    with open(path, "wb") as f:
        f.write(aof.encode_header(version=1))
        for kind, data in recs:
            f.write(aof.encode_frame(kind, data, version=1))
            ends.append(f.tell())
    return ends


def test_zero_filled_tail_of_a_version_1_log_is_torn(tmp_path):
    path = str(tmp_path / "a.aof")
    ends = _write_v1_log(path, _records(20))
    with open(path, "ab") as f:
        f.write(b"\0" * 5000)  # what a crash leaves when the size reached the disk first
    end = logfile.scan(path)
    assert end.state == "torn" and end.offset == ends[-1]


def test_zero_filled_tail_is_the_end_of_the_log(tmp_path):
    path = str(tmp_path / "a.aof")
    recs = _records(20)
    ends = _write_log(path, recs)
    with open(path, "ab") as f:
        f.write(b"\0" * 5000)  # the writer's preallocated tail, left by a crash
    end = logfile.scan(path)
    assert end.state == "clean" and end.offset == ends[-1] and end.tail == 5000
    warnings: list[str] = []
    end = logfile.load_into(path, FakeBroker(), 0, warn=warnings.append)
    assert end.records == len(recs) and not warnings
    assert os.path.getsize(path) == ends[-1]  # cut: the writer starts at the logical end


def test_zero_filled_tail_right_after_the_header(tmp_path):
    path = str(tmp_path / "a.aof")
    with open(path, "wb") as f:
        f.write(aof.encode_header() + bytes(70_000))
    end = logfile.scan(path)
    assert end.state == "clean" and end.offset == aof.HEADER_SIZE and end.records == 0


@pytest.mark.parametrize("kept", [1, 3, 5, 11, 12, 20])
def test_record_torn_in_the_zero_filled_tail_is_torn_not_the_end(tmp_path, kept):
    """A crash that left only the first ``kept`` bytes of the last record, zeros after it:
    its first byte is never zero, so it is a torn record, cut with a warning."""
    path = str(tmp_path / "a.aof")
    ends = _write_log(path, _records(10))
    frame = aof.encode_frame("job", [b"D-x", b"q", b"b" * 30, True, 0])
    with open(path, "ab") as f:
        f.write(frame[:kept] + bytes(8192))
    end = logfile.scan(path)
    assert end.state == "torn" and end.offset == ends[-1], end.reason
    with pytest.raises(aof.LogTruncated):
        logfile.load_into(path, FakeBroker(), 0, load_truncated=False)


def test_data_after_zeros_is_still_corruption(tmp_path):
    path = str(tmp_path / "a.aof")
    ends = _write_log(path, _records(10))
    with open(path, "ab") as f:
        f.write(bytes(4096) + aof.encode_frame("ack", b"D-1"))
    end = logfile.scan(path)
    assert end.state == "corrupt" and end.offset == ends[-1]


# A version-1 log (frames ``length | ~length | crc``) as the previous release wrote it:
# D-00000001 and D-00000002 added to q, then D-00000001 acknowledged.
_V1_LOG = bytes.fromhex(
    "54524953514c4f4700010000423228a20000001effffffe12ee6cfe092a36a6f6295c40a442d3030303030"
    "303031c40171c4056669727374c3000000001fffffffe0aaef743192a36a6f6295c40a442d303030303030"
    "3032c40171c4067365636f6e64c30000000011ffffffeeb7885ba992a361636bc40a442d30303030303030"
    "31")


def test_a_log_of_the_previous_format_is_read(tmp_path):
    path = str(tmp_path / "a.aof")
    open(path, "wb").write(_V1_LOG)
    end = aof.ReadEnd()
    assert list(logfile.read_log(path, end)) == [
        ("job", [b"D-00000001", b"q", b"first", True, 0]),
        ("job", [b"D-00000002", b"q", b"second", True, 0]),
        ("ack", b"D-00000001"),
    ]
    assert end.state == "clean" and end.header is not None and end.header.version == 1


def test_damaged_last_frame_is_torn(tmp_path):
    path = str(tmp_path / "a.aof")
    ends = _write_log(path, _records(20))
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0xFF
    open(path, "wb").write(data)
    end = logfile.scan(path)
    assert end.state == "torn" and end.offset == ends[-2]


def test_torn_tail_refused_when_load_truncated_is_off(tmp_path):
    path = str(tmp_path / "a.aof")
    _write_log(path, _records(20))
    size = os.path.getsize(path)
    os.truncate(path, size - 3)
    with pytest.raises(aof.LogTruncated, match="aof-load-truncated"):
        logfile.load_into(path, FakeBroker(), 0, load_truncated=False)
    assert os.path.getsize(path) == size - 3


def test_newer_format_version_is_refused(tmp_path):
    path = str(tmp_path / "a.aof")
    with open(path, "wb") as f:
        f.write(aof.encode_header(version=aof.FORMAT_VERSION + 1))
        f.write(aof.encode_frame("ack", b"D-1"))
    with pytest.raises(aof.LogVersionError, match="version 4.*upgrade trisque"):
        logfile.load_into(path, FakeBroker(), 0)


def test_not_a_log(tmp_path):
    path = str(tmp_path / "a.aof")
    open(path, "wb").write(b"*2\r\n$6\r\nADDJOB\r\n" * 4)
    with pytest.raises(aof.LogError, match="not a trisque append log"):
        logfile.scan(path)


def test_header_checksum(tmp_path):
    path = str(tmp_path / "a.aof")
    data = bytearray(aof.encode_header())
    data[10] ^= 1  # the flags
    open(path, "wb").write(bytes(data))
    with pytest.raises(aof.LogCorrupt, match="offset 0"):
        logfile.scan(path)


def test_torn_header_is_repaired(tmp_path):
    path = str(tmp_path / "a.aof")
    open(path, "wb").write(aof.encode_header()[:5])
    end = logfile.load_into(path, FakeBroker(), 0)
    assert end.state == "torn" and end.offset == 0
    assert open(path, "rb").read() == aof.encode_header()


def test_large_record_spanning_read_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(aof, "READ_CHUNK", 64)
    path = str(tmp_path / "a.aof")
    recs = [("job", [b"D-1", b"q", b"z" * 1000, True, 0]), ("ack", b"D-1"),
            ("job", [b"D-2", b"q", b"y" * 10, True, 0])]
    _write_log(path, recs)
    assert list(logfile.read_log(path)) == recs


def test_writer_cuts_back_a_short_failing_write(tmp_path):
    class Half:
        def __init__(self) -> None:
            self.buf = bytearray(b"H" * 16)
            self.fail = True

        def write(self, data):
            if self.fail:
                self.buf += bytes(data[: len(data) // 2])
                self.fail = False
                raise OSError(28, "No space left on device")
            self.buf += bytes(data)
            return len(data)

        def sync(self):
            pass

        def truncate(self, size):
            del self.buf[size:]

        def size(self):
            return len(self.buf)

        def close(self):
            pass

    f = Half()
    w = aof.LogWriter(f)
    with pytest.raises(OSError):
        w.write(b"A" * 100)
    assert bytes(f.buf) == b"H" * 16 and w.good_size == 16
    w.write(b"B" * 10)
    assert bytes(f.buf) == b"H" * 16 + b"B" * 10


def test_shutdown_flag_round_trip(tmp_path):
    path = str(tmp_path / "a.aof")
    logfile.write_snapshot(path, [("job", [b"D-1", b"q", b"b", True, 0])], aof.FLAG_ENQUEUE_ONCE)
    end = logfile.scan(path)
    assert end.header is not None and end.header.enqueue_once
    logfile.clear_flags(path, aof.FORMAT_VERSION)
    end = logfile.scan(path)
    assert end.header is not None and not end.header.enqueue_once and end.records == 1


def test_frame_layout_is_documented_one():
    frame = aof.encode_frame("ack", b"D-1")
    check, n, _crc = struct.unpack(">III", frame[:12])
    assert n == len(frame) - 12 and check == n ^ 0xFFFFFFFF
    assert frame[0] != 0  # what tells a record from the zero-filled tail
    assert aof.encode_records([("ack", b"D-1")]) == frame
