"""A peer killed right after its restart, on the in-process harness (seven nodes, node
timeout 3000 ms): Disque's replication test "Sync REPLJOB messages are retried against old
nodes", run right after "Replicating job expires before reaching the replication level".
tests/system/test_peer_restart.py runs the same sequence on real processes."""

from __future__ import annotations

import pytest

from broker.clients import BLOCKED
from cluster.sim import Faults
from tests.cluster.jobsim import JobCluster

NODE_TIMEOUT = 3000


@pytest.mark.parametrize("answer_delay_ms", [0, 300], ids=["answered", "killed-before-answering"])
def test_addjob_waits_for_a_peer_killed_right_after_its_restart(answer_delay_ms: int) -> None:
    c = JobCluster(7, node_timeout=NODE_TIMEOUT)
    sim = c.sim
    node1 = c.node_id(1)
    view = sim.nodes[0].membership.nodes[node1]  # node 0's entry for node 1
    sim.kill(1)
    expiring = c.client()
    assert c.cmd(0, "ADDJOB", "q", "body", "15000", "REPLICATE", "7", "TTL", "1",
                 client=expiring) is BLOCKED
    assert c.run_until(lambda: c.reply_to(0, expiring) is not None, 2000)
    assert c.reply_to(0, expiring).startswith("NOREPL")
    c.run_for(800)  # a restart takes a while
    if answer_delay_ms:
        sim.faults[(1, 0)] = Faults(delay_ms=answer_delay_ms)  # node 1 answers node 0 late...
    sim.restart(1)
    assert c.run_until(lambda: view.link is not None, 100)  # reconnected within a tick
    c.run_for(50)
    assert (view.pong_received >= view.link_since) is not bool(answer_delay_ms)
    sim.kill(1)  # ...too late: it is killed before its PONG reaches node 0
    sim.faults.pop((1, 0), None)
    killed = sim.now
    waiting = c.client()
    assert c.cmd(0, "ADDJOB", "q", "body", "30000", "REPLICATE", "7", client=waiting) is BLOCKED
    # Node 1 counts as reachable for a node timeout after it was last seen: a client that
    # comes a second later may still ask for seven copies.
    c.run_for(1000)
    late = c.client()
    assert c.cmd(0, "ADDJOB", "q", "late", "30000", "REPLICATE", "7", client=late) is BLOCKED
    assert not c.run_until(view.failing, killed + 2000 - sim.now)
    sim.restart(1)
    assert c.run_until(lambda: None not in (c.reply_to(0, waiting), c.reply_to(0, late)), 1000)
    for client in (waiting, late):
        reply = c.reply_to(0, client)
        assert isinstance(reply, str) and reply.startswith("D-"), reply
        job_id = reply.encode()
        assert c.holders(job_id) == list(range(7))
        assert sorted(c.job(0, job_id).delivered) == sorted(c.node_id(i) for i in range(7))
