"""Per-job log files: the cap and rotation, and how many are kept (cli/worker/joblog.py)."""

from __future__ import annotations

import os
from pathlib import Path

from cli.worker.joblog import LogDir, file_name


def test_a_log_is_rotated_at_its_cap_so_a_job_keeps_at_most_two_parts(tmp_path: Path) -> None:
    logs = LogDir(tmp_path, max_bytes=4096, keep=10)
    log = logs.open("D-abcdef01-aaaa/bbbb+cccc=dddddddddddd-0001", 1)
    for i in range(25):
        log.write(bytes([65 + i % 26]) * 1000)
    log.close()
    assert log.path.name == "D-abcdef01-aaaa%2Fbbbb+cccc=dddddddddddd-0001.1.log"
    older = log.path.with_name(log.path.name + ".1")
    assert older.stat().st_size == 4096
    assert log.path.stat().st_size == 25_000 - 6 * 4096
    assert log.rotations == 6
    # The newest bytes are in the current part, the ones before them in the older part.
    assert log.path.read_bytes() == b"Y" * 424
    assert older.read_bytes()[-576:] == b"Y" * 576
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([log.path.name, older.name])


def test_only_the_newest_logs_are_kept_including_those_found_at_start(tmp_path: Path) -> None:
    for i in range(3):
        p = tmp_path / file_name(f"old{i}", 1)
        p.write_text("x")
        os.utime(p, (1000 + i, 1000 + i))
    logs = LogDir(tmp_path, max_bytes=4096, keep=3)
    logs.open("new", 1).close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [file_name("old1", 1), file_name("old2", 1), file_name("new", 1)])
    again = logs.open("old1", 1)  # a second run of the same job appends and is the newest now
    again.write(b"y")
    again.close()
    logs.open("newer", 1).close()
    assert (tmp_path / file_name("old1", 1)).read_text() == "xy"
    assert not (tmp_path / file_name("old2", 1)).exists()
