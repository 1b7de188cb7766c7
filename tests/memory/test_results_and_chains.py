"""A real node's memory stays flat through RESOLVE, WAITJOB, chains, dedup and throttling.

These paths keep tables beside the jobs: outcomes for ``result-ttl`` seconds, blocked
WAITJOBs, chained children by parent, the dedup index, a throttled queue's counters. Each
must be empty again once its jobs are gone and their outcomes have expired. The node runs
with ``result-ttl 1``, so an outcome lives one to two seconds (the table is pruned once a
second); every path waits for that before its footprint. FLUSHALL would reset the results
table and hide what it kept, so these footprints are taken without it: the job scan list's
bounded leftovers are then in both footprints alike, and the allocated blocks still judge a
leak of one object per job (tens of thousands of blocks).

How many outcomes are alive at once depends on the run's speed, and RSS follows that peak,
not a leak. So the warm-up runs the same jobs with ``result-ttl 3600``, which holds every
outcome at once (the highest peak the run can reach), FLUSHALL drops them, and a second
warm-up with ``result-ttl 1`` leaves the allocator as a run leaves it; the measured run
then stays under that peak whatever its speed. The log's automatic rewrites still move RSS
by up to 3 MiB from run to run (their buffers; the node gives the freed heap back after
each), so RSS is held to 4 MiB here, 80 bytes per job, and the blocks judge a leak.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from bench import churn
from protocol import core_build
from tests.memory.footprint import assert_flat, footprint
from tests.support.server import ServerProcess

JOBS = 50_000 if core_build.kind() == "compiled" else 15_000
BATCH = 250
OUTCOMES_GONE_S = 2.5  # result-ttl 1 s, pruned once a second, plus margin
RSS_SLACK = 4 << 20


@pytest.fixture(scope="module")
def node() -> Iterator[ServerProcess]:
    # The node timeout sets how long the dedup index keeps an ended job's tombstone (twice
    # it, at least 2 s; dropped every 5 s): 1 s keeps the dedup test short.
    with ServerProcess(appendonly="yes", appendfsync="everysec", result_ttl=1,
                       cluster_node_timeout=1000) as srv:
        yield srv


def _flat(node: ServerProcess, run: Callable[[churn.Pipe, int], None], jobs: int = JOBS,
          settle_s: float = OUTCOMES_GONE_S) -> None:
    assert node.proc is not None
    with churn.Pipe(node.port) as pipe:
        assert pipe.call("CONFIG", "SET", "result-ttl", 3600) == b"OK"
        run(pipe, jobs)
        assert pipe.call("DEBUG", "FLUSHALL") == b"OK"
        assert pipe.call("CONFIG", "SET", "result-ttl", 1) == b"OK"
        run(pipe, jobs)
        before = footprint(node.port, node.proc.pid, settle_s, flush=False)
        run(pipe, jobs)
        after = footprint(node.port, node.proc.pid, settle_s, flush=False)
    assert_flat(before, after, jobs, rss_slack=RSS_SLACK)


def _taken(pipe: churn.Pipe, queue: str, n: int) -> list[bytes]:
    """GETJOB NOHANG COUNT n until n jobs came (a throttled queue gives what its rate's
    tokens allow, possibly none until the next millisecond)."""
    ids: list[bytes] = []
    for _ in range(10_000):
        reply = pipe.call("GETJOB", "NOHANG", "COUNT", n - len(ids), "FROM", queue)
        if reply is None:
            time.sleep(0.001)
            continue
        assert isinstance(reply, list), (len(ids), reply)
        ids += [entry[1] for entry in reply]
        if len(ids) == n:
            return ids
    raise AssertionError(f"{len(ids)} of {n} jobs taken from {queue}")


def resolve_then_wait(pipe: churn.Pipe, jobs: int) -> None:
    """ADDJOB, GETJOB, RESOLVE with a result, then WAITJOB answers it from the outcome."""
    for n in churn.batches(jobs, BATCH):
        churn.add(pipe, "results", n)
        ids = _taken(pipe, "results", n)
        assert pipe.run([("RESOLVE", i, b"result-" + i[-6:]) for i in ids]) == [1] * n
        got = pipe.run([("WAITJOB", i, "TIMEOUT", 1000) for i in ids])
        assert got == [b"result-" + i[-6:] for i in ids], got[:3]


def test_resolve_then_waitjob(node: ServerProcess) -> None:
    _flat(node, resolve_then_wait)


def test_blocked_waitjob_then_resolve(node: ServerProcess) -> None:
    """A WAITJOB blocked with an hour's TIMEOUT, answered by a RESOLVE from another client:
    the waiter and its timeout timer go with the answer."""
    assert node.proc is not None
    with churn.Pipe(node.port) as waiter, churn.Pipe(node.port) as worker:
        def rounds(n: int) -> None:
            for _ in range(n):
                job_id = churn.add(worker, "blocked-results", 1)[0]
                waiter.send([("WAITJOB", job_id, "TIMEOUT", 3_600_000)])
                assert _taken(worker, "blocked-results", 1) == [job_id]
                assert worker.call("RESOLVE", job_id, "done") == 1
                assert waiter.read(1) == [b"done"]
        assert worker.call("CONFIG", "SET", "result-ttl", 3600) == b"OK"
        rounds(5_000)
        assert worker.call("DEBUG", "FLUSHALL") == b"OK"
        assert worker.call("CONFIG", "SET", "result-ttl", 1) == b"OK"
        rounds(5_000)
        before = footprint(node.port, node.proc.pid, OUTCOMES_GONE_S, flush=False)
        rounds(5_000)
        after = footprint(node.port, node.proc.pid, OUTCOMES_GONE_S, flush=False)
    assert_flat(before, after, 5_000, rss_slack=RSS_SLACK)


def test_waitjob_timing_out(node: ServerProcess) -> None:
    """WAITJOBs with TIMEOUT 1 on queued jobs, from 50 connections at once, time out (a
    nil); DELJOB then ends the jobs, watched by nobody any more. A WAITJOB's timeout is
    looked at on the node's 100 ms timer tick, so the jobs are few (5,000) and the clients
    many; without FLUSHALL the allocated blocks move by up to about 2,000 between idle
    footprints here, so that is the noise allowed, under one leaked object per WAITJOB."""
    assert node.proc is not None
    pipes = [churn.Pipe(node.port) for _ in range(50)]
    try:
        def rounds(n: int) -> None:
            for _ in range(n):
                ids = churn.add(pipes[0], "waited", len(pipes))
                for pipe, job_id in zip(pipes, ids, strict=True):
                    pipe.send([("WAITJOB", job_id, "TIMEOUT", 1)])
                assert [pipe.read(1)[0] for pipe in pipes] == [None] * len(pipes)
                assert pipes[0].run([("DELJOB", i) for i in ids]) == [1] * len(ids)
        rounds(50)
        before = footprint(node.port, node.proc.pid, flush=False)
        rounds(100)
        after = footprint(node.port, node.proc.pid, flush=False)
    finally:
        for pipe in pipes:
            pipe.close()
    assert_flat(before, after, 100 * len(pipes), blocks_noise=3_000)


def chains(pipe: churn.Pipe, jobs: int) -> None:
    """A parent and a child ADDJOB ... AFTER parent; the parent taken and resolved queues the
    child, which is taken and acknowledged. ``jobs`` counts the pairs."""
    for n in churn.batches(jobs, BATCH):
        parents = churn.add(pipe, "parents", n)
        children = [i for i in pipe.run([("ADDJOB", "children", churn.BODY, 0, "AFTER", p)
                                         for p in parents])]
        assert all(isinstance(c, bytes) and c.startswith(b"D-") for c in children), children[:3]
        assert pipe.call("QLEN", "children") == 0
        assert _taken(pipe, "parents", n) == parents
        assert pipe.run([("RESOLVE", p, "") for p in parents]) == [1] * n
        assert sorted(_taken(pipe, "children", n)) == sorted(children)
        assert pipe.run([("ACKJOB", c) for c in children]) == [1] * n


def test_chained_jobs(node: ServerProcess) -> None:
    _flat(node, chains, jobs=JOBS // 2)


def _distinct(pipe: churn.Pipe, queue: str, jobs: int, first: int) -> int:
    """ADDJOB of distinct bodies (a dedup queue would answer a repeated one with the first
    job's ID), GETJOB, ACKJOB; returns the next body number."""
    for n in churn.batches(jobs, BATCH):
        ids = pipe.run([("ADDJOB", queue, b"body-%d" % (first + k), 0) for k in range(n)])
        assert len(set(ids)) == n and all(isinstance(i, bytes) for i in ids), ids[:3]
        first += n
        assert sorted(_taken(pipe, queue, n)) == sorted(ids)
        assert pipe.run([("ACKJOB", i) for i in ids]) == [1] * n
    return first


def test_dedup_queue(node: ServerProcess) -> None:
    """Each live job of a DEDUP queue has an index entry; the ack turns it into a tombstone,
    which must go once every node has it (here, alone, after 2 s, dropped every 5 s) rather
    than at the job's TTL a day later: that held about 550 bytes per job processed."""
    with churn.Pipe(node.port) as pipe:
        policy = pipe.call("QPOLICY", "CREATE", "deduped", "DEDUP", "yes")
        assert policy[policy.index(b"message-deduplication") + 1] == 1, policy
    counter = [0]

    def run(pipe: churn.Pipe, jobs: int) -> None:
        counter[0] = _distinct(pipe, "deduped", jobs, counter[0])
    _flat(node, run, settle_s=7.5)


def test_throttled_queue(node: ServerProcess) -> None:
    """A queue with MAXINFLIGHT and RATE keeps counters while jobs are in flight; consumed
    jobs must not leave any behind."""
    with churn.Pipe(node.port) as pipe:
        policy = pipe.call("QPOLICY", "CREATE", "throttled", "MAXINFLIGHT", 10_000,
                           "RATE", 1_000_000)
        assert policy[policy.index(b"max-inflight") + 1] == 10_000, policy
    counter = [0]

    def run(pipe: churn.Pipe, jobs: int) -> None:
        counter[0] = _distinct(pipe, "throttled", jobs, counter[0])
    _flat(node, run)
