"""Regression (found on real processes): while a synchronous ADDJOB waits
with no node left to add, the origin re-sent REPLJOB to every node asked on every timer
pass (about 1,000 frames a second per waiting job: 698 counted on a real replica in 1 s).
Disque tries one more node at most every 50 ms per blocked client, and re-sends to a node
that already confirmed only when a new holder was added."""

from __future__ import annotations

from broker.clients import BLOCKED
from cluster.sim import Faults
from cluster.wire import MessageType as M
from tests.cluster.jobsim import JobCluster


def test_a_waiting_addjob_resends_repljob_at_most_every_50_ms_and_not_to_confirmed_nodes() -> None:
    c = JobCluster(3)
    c.sim.faults[(2, 0)] = Faults(drop=1.0)  # node2's GOTJOB never arrives: the ADDJOB waits
    client = c.client()
    assert c.cmd(0, "ADDJOB", "q", "x", "1000", "REPLICATE", "3", client=client) is BLOCKED
    assert c.run_until(lambda: c.reply_to(0, client) is not None, 1200)
    assert c.reply_to(0, client) == (
        "NOREPL Timeout reached before replicating to the requested number of nodes")
    to_1 = [m for m in c.sent(M.REPLJOB, None, src=0) if m[2] == c.node_id(1)]
    to_2 = [m for m in c.sent(M.REPLJOB, None, src=0) if m[2] == c.node_id(2)]
    # node1 confirmed at once: it is never asked again (no new holder was added).
    assert len(to_1) == 1, to_1
    # node2 never confirmed: asked at ADDJOB and then about every 50 ms for 1 s.
    assert 15 <= len(to_2) <= 22, len(to_2)
