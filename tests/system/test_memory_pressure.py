"""Disque's memory warning levels on a real 3-node cluster: past 75 % of maxmemory a node
replicates new jobs to other nodes without keeping a copy (external replication)."""

from __future__ import annotations

import pytest

from protocol.resp import Error
from tests.support.cluster import LocalCluster, wait_until
from tests.system.test_replicated_jobs import Factory, joined, show

pytestmark = pytest.mark.cluster_processes

LIMIT = 3_000_000
BODY = 10_000


def _used(c: LocalCluster, i: int) -> int:
    text = c.call(i, "INFO", "memory").decode()
    return int(next(line for line in text.split("\r\n")
                    if line.startswith("used_memory:")).split(":")[1])


def test_past_75_percent_a_node_keeps_no_copy_and_two_others_hold_the_job(
        local_cluster: Factory) -> None:
    c, _ = joined(local_cluster, 3, directives=[{"maxmemory": LIMIT}, {}, {}])
    kept = 0
    while True:
        reply = c.call(0, "ADDJOB", "q", b"p" * BODY, 0, "REPLICATE", 2, "RETRY", 60)
        assert isinstance(reply, bytes) and reply.startswith(b"D-"), reply
        job_id = reply.decode()
        if show(c, 0, job_id) is None:
            break
        kept += 1
        assert kept < 1000, _used(c, 0)
    # Node 0 kept jobs until one more would take it past 75 % of its maxmemory (its data,
    # not its interpreter) ...
    assert kept >= LIMIT * 0.7 // (BODY + 1000), kept
    assert LIMIT * 0.7 < _used(c, 0) <= LIMIT * 0.75 < _used(c, 0) + BODY + 1000
    # ... and the job it did not keep is on REPLICATE (2) other nodes, one of them queued.
    states = {i: show(c, i, job_id) for i in (1, 2)}
    assert all(s is not None and s["state"] in (b"queued", b"active")
               for s in states.values()), states
    wait_until(lambda: any(show(c, i, job_id)["state"] == b"queued"  # type: ignore[index]
                           for i in (1, 2)), 5, "the job queued on node 1 or 2")
    # A consumer on another node gets it.
    holder = next(i for i in (1, 2) if show(c, i, job_id)["state"] == b"queued")  # type: ignore[index]
    got = c.call(holder, "GETJOB", "NOHANG", "COUNT", 1, "FROM", "q")
    assert isinstance(got, list) and got[0][1] == job_id.encode()
    # REPLICATE 3 needs three other nodes when node 0 keeps no copy: Disque's NOREPL.
    reply = c.call(0, "ADDJOB", "q", b"p" * BODY, 0, "REPLICATE", 3)
    assert isinstance(reply, Error) and reply.endswith(
        "for the following reason: I'm out of memory"), reply
