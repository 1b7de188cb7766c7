"""A number out of range never kills a node nor reaches its log, and
a log that holds a record no node could have written stops the start with one clear line.

Before the fix, ``ADDJOB q x 0 RETRY 9223372036854775807`` on a node with ``appendfsync
always`` got no reply and the node died (OverflowError); with ``DELAY 1`` added it was accepted
and the node died when the delay ended, and again at every start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from broker import aof
from broker.job import Job
from protocol.resp import Error
from tests.support.server import REPO, ServerProcess, free_port

HUGE = "9223372036854775807"


def test_huge_retry_is_refused_and_the_node_lives_on() -> None:
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        for extra in ((), ("DELAY", "1")):
            reply = srv.call("ADDJOB", "q", "x", "0", "RETRY", HUGE, *extra)
            assert reply == Error("ERR RETRY must be at most 4294967295")
        assert srv.call("PING") == b"PONG"
        assert srv.call("INFO", "jobs").count(b"registered_jobs:0") == 1


def test_largest_accepted_values_survive_delay_rewrite_and_restart() -> None:
    """The limits themselves are safe end to end: the delay ends, the log is rewritten, the
    node stops with its snapshot and starts again with the job."""
    top = str((1 << 32) - 1)
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        job_id = srv.call("ADDJOB", "q", "x", "0", "RETRY", top, "TTL", top, "DELAY", "1")
        assert isinstance(job_id, bytes), job_id
        deadline = time.monotonic() + 5
        while srv.call("QLEN", "q") != 1:  # the delay ends: the job is queued
            assert time.monotonic() < deadline, "the delayed job was never queued"
            time.sleep(0.05)
        assert srv.call("BGREWRITEAOF") is not None
        time.sleep(0.3)
        assert srv.restart().proc is not None
        assert srv.call("QLEN", "q") == 1
        shown = srv.call("SHOW", job_id)
        assert shown[shown.index(b"retry") + 1] == (1 << 32) - 1


def _poisoned_log(directory: str) -> int:
    """A log whose second record has a RETRY no node accepts; returns that record's offset."""
    path = os.path.join(directory, "trisque.aof")
    with open(path, "wb") as f:
        f.write(aof.encode_header())
        for i in range(3):
            rec = Job(b"D-00000000-%024d-05a1" % i, b"q", b"x", repl=1, ttl=3600, retry=60,
                      delay=0, ctime=1, delivered=()).to_record()
            if i == 1:
                rec[6] = int(HUGE)
                offset = f.tell()
            f.write(aof.encode_frame("job", rec))
    return offset


def test_a_poisoned_log_stops_the_start_with_one_clear_line(tmp_path) -> None:
    offset = _poisoned_log(str(tmp_path))
    logfile = tmp_path / "node.log"
    proc = subprocess.run(
        [sys.executable, "-m", "cli.server", "--port", str(free_port()), "--bind", "127.0.0.1",
         "--dir", str(tmp_path), "--appendonly", "yes", "--logfile", str(logfile)],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for text in (lines[0], logfile.read_text()):
        assert f"offset {offset}" in text and "trisque.aof" in text
        assert "trisque check-log" in text and "retry" in text


def _log_with_state(directory: str, state: object, at: int) -> int:
    """Three job records, record ``at`` with ``state`` in its state field (a map or a list
    once raised TypeError out of the record check); returns that record's offset."""
    path = os.path.join(directory, "trisque.aof")
    with open(path, "wb") as f:
        f.write(aof.encode_header())
        for i in range(3):
            rec = Job(b"D-00000000-%024d-05a1" % i, b"q", b"x", repl=1, ttl=3600, retry=60,
                      delay=0, ctime=int(time.time() * 1000) * 1_000_000,
                      delivered=()).to_record()
            if i == at:
                rec[3] = state
                offset = f.tell()
            f.write(aof.encode_frame("job", rec))
    return offset


def test_a_job_state_of_another_type_in_the_middle_stops_the_start_cleanly(tmp_path) -> None:
    offset = _log_with_state(str(tmp_path), {"queued": 1}, at=1)
    proc = subprocess.run(
        [sys.executable, "-m", "cli.server", "--port", str(free_port()), "--bind", "127.0.0.1",
         "--dir", str(tmp_path), "--appendonly", "yes"],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"offset {offset}" in lines[0], proc.stderr
    assert "unknown state a dict of 1" in lines[0], lines[0]


def test_a_job_state_of_another_type_at_the_tail_is_cut_and_the_node_starts(tmp_path) -> None:
    _log_with_state(str(tmp_path), ["active"], at=2)
    with ServerProcess(directory=str(tmp_path), appendonly="yes") as srv:
        assert srv.call("QLEN", "q") == 0  # after a crash, queued again only after RETRY
        assert srv.call("INFO", "jobs").count(b"registered_jobs:2") == 1
        assert "truncated" in srv.log() and "unknown state a list of 1" in srv.log()
