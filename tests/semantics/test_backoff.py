"""QPOLICY ... BACKOFF base max (broker/backoff.py): a NACKed job, or one whose RETRY elapsed,
comes back after a growing wait; on one node with a fake clock and on the cluster harness."""

from __future__ import annotations

import pytest

from broker.backoff import wait_ms
from cluster.sim import Faults
from protocol.resp import Error
from tests.broker.harness import Node
from tests.cluster.jobsim import JobCluster


def test_wait_grows_to_its_max_with_ten_percent_jitter() -> None:
    assert [wait_ms(2, 60, n, 0.5) for n in range(1, 8)] == [
        2000, 4000, 8000, 16000, 32000, 60000, 60000]
    assert wait_ms(2, 60, 1, 0.0) == 1800
    assert wait_ms(2, 60, 1, 0.999999) == 2199
    assert wait_ms(1, 3600, 10_000, 0.5) == 3_600_000  # no huge shift


def _taken(n: Node, queue: str = "q") -> bytes:
    got = n("GETJOB", "NOHANG", "FROM", queue)
    assert got, "nothing to deliver"
    return bytes(got[0][1])


def test_nack_waits_then_comes_back_with_its_counters() -> None:
    n = Node()
    assert not isinstance(n("QPOLICY", "SET", "q", "BACKOFF", 10, 100), Error)
    policy = n("QPOLICY", "GET", "q")
    assert policy[-4:] == [b"backoff-base", 10, b"backoff-max", 100]
    job = n.add("q", "x")
    waits = []
    for attempt in range(4):
        assert _taken(n) == job
        assert n("NACK", job) == 1
        shown = n.show(job)
        assert shown is not None and shown[b"state"] == b"active"
        assert shown[b"nacks"] == attempt + 1  # counted when the wait begins
        wait = shown[b"next-requeue-within"]
        waits.append(wait)
        expected = min(100_000, 10_000 * 2 ** attempt)
        assert 0.9 * expected <= wait <= 1.1 * expected, (attempt, wait)
        assert n.qlen() == 0
        assert n("NACK", job) == 1  # a NACK while it waits changes nothing
        assert n.show(job)[b"next-requeue-within"] == wait
        n.run_until(n.now + wait - 600)
        assert n.qlen() == 0
        n.run_until(n.now + 1200)
        assert n.qlen() == 1
    got = n("GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "q")
    assert got[0][4] == 4 and got[0][6] == 0  # 4 NACKs, no additional delivery


def test_retry_expiry_waits_too_and_counts_a_delivery() -> None:
    n = Node()
    n("QPOLICY", "SET", "q", "BACKOFF", 30, 30, "VISIBILITY", 5)
    job = n.add("q", "x")
    assert _taken(n) == job
    n.run_until(n.now + 5_300)  # RETRY (5 s, +-250 ms) elapsed: the wait begins
    shown = n.show(job)
    assert shown is not None and shown[b"state"] == b"active"
    assert shown[b"additional-deliveries"] == 1
    assert 25_000 <= shown[b"next-requeue-within"] <= 33_000
    n.run_until(n.now + 34_000)
    assert n.qlen() == 1
    assert n.show(job)[b"additional-deliveries"] == 1  # the queueing counted nothing more


def test_without_a_policy_nack_requeues_at_once_and_delay_is_not_a_failure() -> None:
    n = Node()
    job = n.add("plain", "x")
    assert _taken(n, "plain") == job
    assert n("NACK", job) == 1 and n.qlen("plain") == 1
    n("QPOLICY", "SET", "d", "BACKOFF", 60, 60)
    delayed = n.add("d", "x", "DELAY", 5)
    n.run_until(n.now + 5_500)
    assert n.qlen("d") == 1 and n.show(delayed)[b"additional-deliveries"] == 0
    # ENQUEUE is explicit: it ends a wait at once.
    assert _taken(n, "d") == delayed
    n("NACK", delayed)
    assert n.qlen("d") == 0
    assert n("ENQUEUE", delayed) == 1 and n.qlen("d") == 1
    assert n.show(delayed)[b"nacks"] == 1


def test_backoff_off_and_bad_values() -> None:
    n = Node()
    n("QPOLICY", "SET", "q", "BACKOFF", 5, 10)
    n("QPOLICY", "SET", "q", "BACKOFF", 0, 0)
    assert b"backoff-base" not in n("QPOLICY", "GET", "q")
    assert isinstance(n("QPOLICY", "SET", "q", "BACKOFF", 10, 5), Error)
    assert isinstance(n("QPOLICY", "SET", "q", "BACKOFF", -1, 5), Error)
    assert isinstance(n("QPOLICY", "SET", "q", "BACKOFF", 5), Error)


def test_backoff_survives_a_log_replay() -> None:
    n = Node()
    n("QPOLICY", "SET", "q", "BACKOFF", 10, 10)
    job = n.add("q", "x")
    _taken(n)
    n("NACK", job)
    records = [(r.kind, r.payload) for r in n.log]
    fresh = Node(n.now)
    for rec in records:
        assert fresh.b.validate_record(*rec) is None
        fresh.b.load_record(rec, n.now)
    fresh.b.finish_load(n.now, True)
    assert fresh("QPOLICY", "GET", "q")[-4:] == [b"backoff-base", 10, b"backoff-max", 10]
    shown = fresh.show(job)
    assert shown is not None and shown[b"nacks"] == 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cluster_nack_waits_on_every_holder(seed: int) -> None:
    c = JobCluster(3, seed=seed)
    for i in range(3):
        c.cmd(i, "QPOLICY", "SET", "w", "BACKOFF", "4", "4", "VISIBILITY", "60")
    job = c.addjob(0, "w", "payload", "500", "REPLICATE", "3")
    assert c.cmd(0, "GETJOB", "NOHANG", "FROM", "w")[0][1] == job
    assert c.cmd(0, "NACK", job) == 1
    c.run_for(3_000)
    # Nobody queued it during the wait; the other holders counted the NACK.
    assert c.queued_on(job) == []
    assert all(c.job(i, job).nacks == 1 for i in c.holders(job))
    c.run_for(2_000)
    assert len(c.queued_on(job)) == 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cluster_backoff_with_lost_frames_still_delivers_once_more(seed: int) -> None:
    c = JobCluster(3, seed=seed)
    for i in range(3):
        c.cmd(i, "QPOLICY", "SET", "w", "BACKOFF", "3", "3", "VISIBILITY", "60")
    job = c.addjob(0, "w", "payload", "500", "REPLICATE", "3")
    for a in range(3):
        for b in range(3):
            if a != b:
                c.sim.faults[(a, b)] = Faults(drop=0.3)
    assert c.cmd(0, "GETJOB", "NOHANG", "FROM", "w")[0][1] == job
    assert c.cmd(0, "NACK", job) == 1
    c.run_for(2_000)
    assert c.queued_on(job) == []  # lost QUEUED frames change nothing on node 0's side
    # After the wait it is queued again somewhere (at least once: never lost).
    assert c.run_until(lambda: bool(c.queued_on(job)), 10_000)
    assert c.job(0, job).nacks == 1
