"""A node whose bodies live in the append log (``body-memory-max``) returns to its footprint
after 200,000 jobs of 1 KB (60,000 on the pure core) were added, taken and acknowledged: the
references, the log's batches and buffers, and the rewrites the log's growth starts (each
hands its heap back to the kernel) leave nothing behind."""

from __future__ import annotations

from bench import churn
from protocol import core_build
from tests.memory.footprint import MIB, assert_flat, footprint
from tests.support.server import ServerProcess, send_command

WARM_UP = 10_000
JOBS = 200_000 if core_build.kind() == "compiled" else 60_000
BODY = bytes(range(256)) * 4  # 1 KB, past body-memory-max (256)


def _on_disk(port: int) -> int:
    text = send_command(port, "INFO", "persistence").decode()
    return int(text.split("jobs_bodies_on_disk:")[1].split("\r\n")[0])


def test_jobs_with_bodies_on_disk_leave_the_footprint_flat() -> None:
    with ServerProcess(appendonly="yes", appendfsync="everysec") as srv:
        assert srv.proc is not None
        with churn.Pipe(srv.port) as pipe:
            churn.consume(pipe, WARM_UP, body=BODY)
            held = churn.add(pipe, "held", 100, body=BODY)
            assert _on_disk(srv.port) == 100
            assert pipe.run([("DELJOB", i) for i in held]) == [1] * 100
            before = footprint(srv.port, srv.proc.pid)
            churn.consume(pipe, JOBS, body=BODY)
            after = footprint(srv.port, srv.proc.pid)
            on_disk = _on_disk(srv.port)
        assert on_disk == 0
        # The rewrites this run starts leave RSS 1-3 MiB off, either way, however many jobs
        # (their buffers and the heap's trim): 4 MiB is still under 21 bytes a job, less
        # than any object a job could leave behind, and the blocks count catches those.
        assert_flat(before, after, JOBS, rss_slack=4 * MIB)
