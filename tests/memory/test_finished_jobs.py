"""A real node's memory stays flat however many jobs went through it.

Each path runs a warm-up, then enough jobs that a leak would show, and holds the node to the
same footprint: no job and no timer left, RSS within 1 MiB, and the interpreter's allocated
blocks within one per 20 jobs (plus the scan list's noise). On the compiled core each path
runs 100,000 jobs: a leak of 16 bytes per job would add 1.6 MB of RSS (after a warm-up RSS
moves by well under 0.1 MiB here). The pure core runs the same Python code several times
slower, so it runs 30,000, which the block count still judges (a leaked object per job is
30,000 blocks). Before the timer wheel cancelled timers, each path grew by about 85 bytes per
job. One node with the append log on (its writer's buffers are part of the path) serves every
path in turn; the queues stay nearly empty (at most one pipelined batch of jobs is live).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from bench import churn
from protocol import core_build
from tests.memory.footprint import assert_flat, footprint
from tests.support.server import ServerProcess

WARM_UP = 10_000
JOBS = 100_000 if core_build.kind() == "compiled" else 30_000


@pytest.fixture(scope="module")
def node() -> Iterator[ServerProcess]:
    with ServerProcess(appendonly="yes", appendfsync="everysec") as srv:
        yield srv


def _flat(node: ServerProcess, run: Callable[[churn.Pipe, int], None], jobs: int = JOBS) -> None:
    assert node.proc is not None
    with churn.Pipe(node.port) as pipe:
        run(pipe, WARM_UP)
        before = footprint(node.port, node.proc.pid)
        run(pipe, jobs)
        after = footprint(node.port, node.proc.pid)
    assert_flat(before, after, jobs)


def test_addjob_then_deljob(node: ServerProcess) -> None:
    _flat(node, lambda p, n: churn.add_delete(p, n))


def test_addjob_retry_0_then_deljob(node: ServerProcess) -> None:
    """RETRY 0: the job's only timer is its TTL, a day away; it must go with the job."""
    _flat(node, lambda p, n: churn.add_delete(p, n, retry0=True))


def test_getjob_then_ackjob(node: ServerProcess) -> None:
    _flat(node, lambda p, n: churn.consume(p, n))


def test_getjob_then_fastack(node: ServerProcess) -> None:
    _flat(node, lambda p, n: churn.consume(p, n, ack="FASTACK"))


def test_nack_then_ackjob(node: ServerProcess) -> None:
    """NACK requeues (a rescheduled timer), the job is taken again, then acknowledged."""
    _flat(node, lambda p, n: churn.consume(p, n, nack_first=True), jobs=JOBS // 2)


def test_jobs_expired_by_ttl(node: ServerProcess) -> None:
    """TTL 1, never taken: each job is freed by its own timer. A job lives about two seconds
    (Disque's rule: expiry is looked at one second after the TTL), so the jobs go in rounds
    of 5,000, each waited for; RSS then follows the live jobs' fragmentation and is held to
    3 MiB, and the allocated blocks judge the leak."""
    assert node.proc is not None
    with churn.Pipe(node.port) as pipe:
        churn.expire(pipe, 5_000)
        before = footprint(node.port, node.proc.pid)
        for _ in range(3):
            churn.expire(pipe, 5_000)
        after = footprint(node.port, node.proc.pid)
    assert_flat(before, after, 15_000, rss_slack=3 << 20)


def test_blocked_getjob_served_leaves_no_timer(node: ServerProcess) -> None:
    """A GETJOB blocked with an hour's TIMEOUT and then served leaves nothing behind: its
    timeout timer goes when it is served, not an hour later."""
    assert node.proc is not None
    getjob = ("GETJOB", "TIMEOUT", 3_600_000, "FROM", "blocked")
    with churn.Pipe(node.port) as consumer, churn.Pipe(node.port) as producer:
        def rounds(n: int) -> None:
            for _ in range(n):
                consumer.send([getjob])
                job_id = churn.add(producer, "blocked", 1)[0]
                got = consumer.read(1)[0]
                assert got[0][1] == job_id, got
                assert producer.call("ACKJOB", job_id) == 1
        rounds(3_000)  # the first few thousand grow the node's tables once (pure core)
        before = footprint(node.port, node.proc.pid)
        rounds(5_000)
        after = footprint(node.port, node.proc.pid)
    assert_flat(before, after, 5_000)
