"""QPOLICY ... MAXINFLIGHT n / RATE n (broker/throttle.py): GETJOB on a queue held back waits,
or returns nothing with NOHANG; QSTAT shows inflight and throttled. One node with a fake
clock, and per-node shares on the cluster harness, partitions included."""

from __future__ import annotations

import pytest

from broker.clients import BLOCKED, Client
from protocol.resp import NULL_ARRAY
from tests.broker.harness import Node
from tests.cluster.jobsim import JobCluster


def _qstat(n: Node, queue: str = "q") -> dict[bytes, object]:
    reply = n("QSTAT", queue)
    return dict(zip(reply[::2], reply[1::2], strict=True))


def _take(n: Node, count: int = 10, queue: str = "q") -> list[bytes]:
    got = n("GETJOB", "NOHANG", "COUNT", count, "FROM", queue)
    return [] if got is NULL_ARRAY or got is None else [bytes(e[1]) for e in got]


def test_maxinflight_holds_until_ack_nack_or_requeue() -> None:
    n = Node()
    n("QPOLICY", "SET", "q", "MAXINFLIGHT", 2, "VISIBILITY", 10)
    for k in range(6):
        n.add("q", f"j{k}")
    first = _take(n)
    assert len(first) == 2 and _take(n) == []
    assert _qstat(n)[b"inflight"] == 2 and _qstat(n)[b"throttled"] == 1
    n("ACKJOB", first[0])
    assert _qstat(n)[b"inflight"] == 1 and _qstat(n)[b"throttled"] == 0
    second = _take(n)
    assert len(second) == 1
    n("NACK", second[0])  # back in the queue: no longer in flight
    assert len(_take(n)) == 1
    # RETRY elapses: the job is queued again, its slot is free.
    n.run_until(n.now + 10_500)
    assert _qstat(n)[b"inflight"] == 0
    assert len(_take(n)) == 2


def test_throttle_state_lives_only_while_the_policy_throttles() -> None:
    n = Node()
    for k in range(50):
        queue = f"t{k}"
        n("QPOLICY", "SET", queue, "MAXINFLIGHT", 1, "RATE", 5)
        n.add(queue, "x")
        assert len(_take(n, queue=queue)) == 1
        if k % 2:
            n("QPOLICY", "SET", queue, "MAXINFLIGHT", 0, "RATE", 0)
        else:
            n("QPOLICY", "DEL", queue)
    assert n.b.policies.throttle_state == {}  # bounded by the throttled queues: none left
    n("QPOLICY", "SET", "q", "MAXINFLIGHT", 1)
    n.add("q", "a")
    n.add("q", "b")
    assert len(_take(n)) == 1 and _take(n) == []
    assert list(n.b.policies.throttle_state) == [b"q"]


def test_blocked_clients_are_served_when_a_slot_frees() -> None:
    n = Node()
    n("QPOLICY", "SET", "q", "MAXINFLIGHT", 1)
    n.add("q", "a")
    n.add("q", "b")
    (a,) = _take(n)
    client = Client(5)
    assert n("GETJOB", "FROM", "q", client=client) is BLOCKED
    n.run_until(n.now + 500)
    assert n.take_replies() == []
    n("ACKJOB", a)
    n.run_until(n.now + 100)
    replies = n.take_replies()
    assert [(c.id, v[0][2]) for c, v in replies] == [(5, b"b")]


def test_rate_spreads_deliveries_over_time() -> None:
    n = Node()
    n("QPOLICY", "SET", "q", "RATE", 4)
    for k in range(40):
        n.add("q", f"j{k}")
    got = 0
    for _ in range(50):  # five seconds, polled every 100 ms
        got += len(_take(n))
        n.run_until(n.now + 100)
    assert 18 <= got <= 25, got  # 4 a second, plus the first burst
    assert _qstat(n)[b"throttled"] in (0, 1)


def test_a_queue_without_throttle_keeps_disques_qstat() -> None:
    n = Node()
    n("QPOLICY", "SET", "other", "MAXINFLIGHT", 1)
    n.add("q", "x")
    assert b"inflight" not in _qstat(n)
    n("QPOLICY", "SET", "other", "MAXINFLIGHT", 0)
    assert b"inflight" not in _qstat(n, "q")


def test_backoff_ends_the_flight() -> None:
    n = Node()
    n("QPOLICY", "SET", "q", "MAXINFLIGHT", 1, "BACKOFF", 5, 5)
    n.add("q", "a")
    n.add("q", "b")
    (a,) = _take(n)
    n("NACK", a)  # waiting out its backoff: not in flight
    assert _take(n) != []


def _cluster_setup(seed: int) -> JobCluster:
    c = JobCluster(3, seed=seed)
    for i in range(3):
        c.cmd(i, "QPOLICY", "SET", "q", "MAXINFLIGHT", "3")
    for i in range(3):
        for k in range(6):
            c.addjob(i, "q", f"n{i}-{k}", "0", "REPLICATE", "1")
    return c


def _take_c(c: JobCluster, i: int) -> int:
    got = c.cmd(i, "GETJOB", "NOHANG", "COUNT", "10", "FROM", "q")
    return 0 if got is NULL_ARRAY or got is None else len(got)


@pytest.mark.parametrize("seed", [1, 2])
def test_cluster_shares_and_how_a_partition_degrades(seed: int) -> None:
    c = _cluster_setup(seed)
    # Three nodes reach each other: MAXINFLIGHT 3 is one job in flight per node.
    assert [_take_c(c, i) for i in range(3)] == [1, 1, 1]
    assert [_take_c(c, i) for i in range(3)] == [0, 0, 0]
    # Node 2 is cut off: once it sees the others fail it has the whole limit for itself,
    # and the side of nodes 0 and 1 shares it in two (ceil(3 / 2) = 2 each).
    c.sim.partition([0, 1], [2])
    assert c.run_until(lambda: c.broker(2).reachable_nodes() == 0
                       and c.broker(0).reachable_nodes() == 1, 30_000)
    assert _take_c(c, 2) == 2
    assert [_take_c(c, i) for i in (0, 1)] == [1, 1]
    c.sim.heal()
    assert c.run_until(lambda: all(c.broker(i).reachable_nodes() == 2 for i in range(3)),
                       30_000)
    assert [_take_c(c, i) for i in range(3)] == [0, 0, 0]  # 3 in flight on node 2 alone
