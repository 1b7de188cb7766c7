"""Backoff, priorities and throttling on a real cluster of ``trisque-server`` processes
(docs/semantics.md): the policies reach every node, REPLJOB carries the priority, and the
throttle's per-node shares follow the nodes each one reaches."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.cluster import wait_until
from tests.system.test_replicated_jobs import Factory, joined

pytestmark = pytest.mark.cluster_processes


def _d(reply: list[Any]) -> dict[bytes, Any]:
    return dict(zip(reply[::2], reply[1::2], strict=True))


def test_backoff_priority_and_throttle_shares_on_a_cluster(local_cluster: Factory) -> None:
    c, _ = joined(local_cluster, 2)
    c.call(0, "QPOLICY", "SET", "q", "BACKOFF", "30", "30", "MAXINFLIGHT", "2")
    wait_until(lambda: c.call(1, "QPOLICY", "GET", "q") is not None, 5, "the policy on node 1")
    assert _d(c.call(1, "QPOLICY", "GET", "q"))[b"max-inflight"] == 2
    # The priority reaches the other holder with REPLJOB.
    high = c.call(0, "ADDJOB", "q", "high", "5000", "REPLICATE", "2", "PRIORITY", "8")
    low = c.call(0, "ADDJOB", "q", "low", "5000", "REPLICATE", "2")
    assert _d(c.call(1, "SHOW", high))[b"priority"] == 8
    assert b"priority" not in _d(c.call(1, "SHOW", low))
    # Two nodes reach each other: MAXINFLIGHT 2 is one job in flight per node.
    assert c.call(0, "GETJOB", "NOHANG", "COUNT", "2", "FROM", "q")[0][1] == high
    assert c.call(0, "GETJOB", "NOHANG", "FROM", "q") is None
    stat = _d(c.call(0, "QSTAT", "q"))
    assert (stat[b"inflight"], stat[b"throttled"]) == (1, 1)
    # NACK with a backoff: the job waits on its holder, and the other holder learned of the
    # NACK (QUEUED) instead of queueing it.
    assert c.call(0, "NACK", high) == 1
    wait_until(lambda: _d(c.call(1, "SHOW", high))[b"nacks"] == 1, 5, "the NACK on node 1")
    for i in (0, 1):
        assert _d(c.call(i, "SHOW", high))[b"state"] == b"active"
    assert 25_000 <= _d(c.call(0, "SHOW", high))[b"next-requeue-within"] <= 33_000
    # Its slot is free again: the low job goes out.
    assert c.call(0, "GETJOB", "NOHANG", "FROM", "q")[0][1] == low
