"""``trisque check-log``: counts, first bad offset, exit codes, --fix only for a torn tail."""

from __future__ import annotations

import os
import subprocess
import sys

from broker import aof
from broker.job import Job
from cli import check_log
from tests.support.server import REPO


def _id(n: int) -> bytes:
    return b"D-00000000-%024d-05a1" % n


def _record(n: int) -> list:
    return Job(_id(n), b"q", b"x", repl=1, ttl=3600, retry=60, delay=0, ctime=1,
              delivered=("a" * 40,)).to_record()


def _log(path, n=10):
    with open(path, "wb") as f:
        f.write(aof.encode_header())
        for i in range(n):
            f.write(aof.encode_frame("job", _record(i)))
        f.write(aof.encode_frame("ack", _id(0)))
        f.write(aof.encode_frame("dlv", [_id(2), 1_700_000_000_000]))
        f.write(aof.encode_frame("del", _id(1)))
    return os.path.getsize(path)


def test_clean(tmp_path, capsys):
    path = str(tmp_path / "a.aof")
    _log(path)
    assert check_log.main([path]) == 0
    out = capsys.readouterr().out
    assert "records: 13 (job 10, ack 1, del 1, dlv 1, qpolicy 0, timer 0)" in out and "status: OK" in out


def test_zero_filled_tail_is_ok(tmp_path, capsys):
    path = str(tmp_path / "a.aof")
    size = _log(path)
    with open(path, "ab") as f:
        f.write(bytes(65536))  # what a node killed while running leaves
    assert check_log.main([path]) == 0
    out = capsys.readouterr().out
    assert f"zero-filled tail: 65536 bytes after the last record, at offset {size}" in out
    assert "status: OK" in out


def test_torn_tail_reported_then_fixed(tmp_path, capsys):
    path = str(tmp_path / "a.aof")
    size = _log(path)
    os.truncate(path, size - 4)
    whole = size - len(aof.encode_frame("del", _id(1)))
    assert check_log.main([path]) == 1
    out = capsys.readouterr().out
    assert f"torn tail at offset {whole}" in out and "--fix" in out
    assert os.path.getsize(path) == size - 4
    assert check_log.main([path, "--fix"]) == 0
    assert os.path.getsize(path) == whole
    assert check_log.main([path]) == 0


def test_corruption_not_fixed(tmp_path, capsys):
    path = str(tmp_path / "a.aof")
    _log(path)
    data = bytearray(open(path, "rb").read())
    data[aof.HEADER_SIZE + 20] ^= 0xFF
    open(path, "wb").write(data)
    assert check_log.main([path, "--fix"]) == 1
    out = capsys.readouterr().out
    assert f"corrupt at offset {aof.HEADER_SIZE}" in out and "not fixable" in out
    assert open(path, "rb").read() == data


def test_not_a_log_and_missing(tmp_path, capsys):
    path = str(tmp_path / "a.aof")
    open(path, "wb").write(b"hello world, not a log")
    assert check_log.main([path]) == 2
    assert check_log.main([str(tmp_path / "missing.aof")]) == 2


def test_runs_as_a_module(tmp_path):
    path = str(tmp_path / "a.aof")
    _log(path)
    out = subprocess.run([sys.executable, "-m", "cli.check_log", path], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "status: OK" in out.stdout


def test_record_a_node_could_not_have_written_is_damage(tmp_path, capsys):
    """A well-framed record with a RETRY past what ADDJOB accepts (the value that killed a
    node) is reported at its offset, not applied."""
    path = str(tmp_path / "a.aof")
    _log(path, n=2)
    bad = _record(5)
    bad[6] = 9223372036854775807  # retry
    offset = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(aof.encode_frame("job", bad))
        f.write(aof.encode_frame("job", _record(6)))
    assert check_log.main([path]) == 1
    out = capsys.readouterr().out
    assert f"offset {offset}" in out and "retry" in out


def test_a_malformed_delivery_record_is_corruption(tmp_path, capsys):
    path = str(tmp_path / "a.aof")
    with open(path, "wb") as f:
        f.write(aof.encode_header() + aof.encode_frame("job", _record(0)))
        bad_at = f.tell()
        f.write(aof.encode_frame("dlv", [_id(0), 0]))  # dtime 0: no node writes that
        f.write(aof.encode_frame("del", _id(0)))
    assert check_log.main([path]) == 1
    out = capsys.readouterr().out
    assert f"corrupt at offset {bad_at}" in out and "dlv" in out
