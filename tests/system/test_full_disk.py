"""A full disk under ``appendfsync always``. ADDJOB gets a clear error, the node stays
up, nothing acknowledged is lost, and writes work again once space is freed. Runs on a small
tmpfs, which needs root and mount(8); skipped with the reason when those are not there."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from protocol.resp import Error
from tests.support.server import ServerProcess


@pytest.fixture
def small_disk() -> Iterator[str]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    where = tempfile.mkdtemp(prefix="trisque-full-disk-")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", where],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        os.rmdir(where)
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", where], check=False)
        os.rmdir(where)


def test_full_disk_refuses_clearly_keeps_everything_and_recovers(small_disk: str) -> None:
    ballast = os.path.join(small_disk, "ballast")
    with open(ballast, "wb") as f:  # room we can give back later
        f.write(b"\0" * 1_000_000)
    body = b"d" * 8_000
    with ServerProcess(directory=small_disk, appendonly="yes", appendfsync="always",
                       aof_rewrite_on_shutdown="no", logfile="") as srv:
        acknowledged: list[bytes] = []
        error: object = None
        for _ in range(2_000):  # 16 MB: far past the 3 MB disk
            reply = srv.call("ADDJOB", "disk", body, 0, "RETRY", 3600)
            if isinstance(reply, Error):
                error = reply
                break
            acknowledged.append(reply)
        assert error is not None, "the disk never filled"
        assert error.startswith("ERR Errors writing to the AOF file: ") and "space" in error
        assert len(acknowledged) > 50
        # Still up, and the refused job does not exist.
        assert srv.call("PING") == b"PONG"
        assert srv.call("QLEN", "disk") == len(acknowledged)
        again = srv.call("ADDJOB", "disk", body, 0)
        assert isinstance(again, Error)
        # Space comes back: so do writes.
        os.unlink(ballast)
        recovered = srv.call("ADDJOB", "disk", b"after", 0, "RETRY", 3600)
        assert isinstance(recovered, bytes), recovered
        acknowledged.append(recovered)
        srv.kill()
        srv.start()
        for job_id in acknowledged:
            assert srv.call("SHOW", job_id) is not None, job_id
