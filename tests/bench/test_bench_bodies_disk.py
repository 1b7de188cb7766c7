"""bench/bodies_disk.py at a small scale: every phase prints, every body is checked."""

from __future__ import annotations

import random

import pytest

from bench import bodies_disk
from tests.support.server import ServerProcess, send_command


def test_a_small_run_prints_every_phase_and_the_ratios(tmp_path) -> None:
    lines: list[str] = []
    times = bodies_disk.scale_run(2_000, 1024, str(tmp_path), "1gb", "everysec",
                                  bodies_disk.time.monotonic() + 300, lines.append)
    assert set(times) == {"add", "take", "restart", "take2"}
    text = "\n".join(lines)
    assert "kill -9, restart (replay)" in text and "RSS" in text
    assert "every one of 2,000 bodies served once and right" in text
    assert "all 2,000 held: 2000 bodies on disk" in text  # every one held at once
    result = bodies_disk.compare(str(tmp_path), 500, 1024, "everysec", 1,
                                 bodies_disk.time.monotonic() + 300, lines.append)
    assert all(result[f"ratio_{m}_{op}"] > 0 and result[f"cpu_ratio_{m}_{op}"] >= 0
               for m in ("warm", "cold") for op in ("add", "take"))
    assert "us CPU/job" in "\n".join(lines)
    assert not list(tmp_path.iterdir()), "the nodes' data is removed"


def test_a_wrong_body_fails_the_run() -> None:
    pad = random.Random(7).randbytes(2048)
    with ServerProcess(appendonly="yes") as srv:
        send_command(srv.port, "ADDJOB", bodies_disk.QUEUE,
                     b"%010d" % 3 + b"x" * 1014, 0)
        with pytest.raises(bodies_disk.BenchFailed, match="wrong body for job number 3"):
            bodies_disk.take_jobs(srv.port, 1, 1024, pad, bytearray(10),
                                  bodies_disk.time.monotonic() + 30)


def test_a_job_served_twice_fails_the_run() -> None:
    pad = random.Random(7).randbytes(2048)
    with ServerProcess() as srv:
        for _ in range(2):
            send_command(srv.port, "ADDJOB", bodies_disk.QUEUE, bodies_disk.body_of(5, 64, pad), 0)
        with pytest.raises(bodies_disk.BenchFailed, match="job number 5 delivered twice"):
            bodies_disk.take_jobs(srv.port, 2, 64, pad, bytearray(10),
                                  bodies_disk.time.monotonic() + 30)
