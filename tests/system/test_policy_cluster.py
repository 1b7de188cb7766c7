"""Queue policies on a real cluster of ``trisque-server`` processes: replicated over the bus
(cluster/policy_sync.py wired in node/server.py), given to a node that joins later, kept by a
node restarted after kill -9, and a dead letter made once on a 2-holder job."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.cluster import wait_until
from tests.system.test_replicated_jobs import JOIN_WITHIN_S, Factory, joined

pytestmark = pytest.mark.cluster_processes


def listing(c: Any, i: int) -> Any:
    return c.call(i, "QPOLICY", "LIST")


def test_policies_reach_every_node_a_late_joiner_and_survive_kill9(
        local_cluster: Factory) -> None:
    c, ids = joined(local_cluster, 2, directives=[{"appendonly": "yes"}] * 2)
    c.call(0, "QPOLICY", "CREATE", "dlq")
    wait_until(lambda: listing(c, 1)[0] == 1, 5, "dlq on node 1")
    c.call(1, "QPOLICY", "CREATE", "work", "REDRIVE", "1", "dlq", "VISIBILITY", "2")
    wait_until(lambda: listing(c, 0) == listing(c, 1) and listing(c, 0)[0] == 2, 5, "both")
    # A third node that joins later gets both.
    late = local_cluster(1, directives=[{"appendonly": "yes"}])
    late.call(0, "CLUSTER", "MEET", "127.0.0.1", str(c.port(0)))
    wait_until(lambda: listing(late, 0) == listing(c, 0), JOIN_WITHIN_S, "the late joiner")
    # Changed while node 1 is down: it learns it when it comes back (its log kept the rest).
    c.kill(1)
    c.call(0, "QPOLICY", "UPDATE", "work", "DELAY", "1")
    c.restart(1)
    wait_until(lambda: listing(c, 1) == listing(c, 0), JOIN_WITHIN_S, "node 1 caught up")


def test_one_dead_letter_for_a_job_held_by_two_nodes(local_cluster: Factory) -> None:
    c, ids = joined(local_cluster, 2)
    c.call(0, "QPOLICY", "CREATE", "dlq")
    c.call(0, "QPOLICY", "CREATE", "work", "REDRIVE", "1", "dlq", "VISIBILITY", "1")
    wait_until(lambda: listing(c, 1)[0] == 2, 5, "policies on node 1")
    job = c.call(0, "ADDJOB", "work", "x", "2000", "REPLICATE", "2")
    assert c.call(0, "GETJOB", "NOHANG", "FROM", "work")[0][1] == job
    # Nobody acknowledges: both holders' retry timers come due; one dead letter results.
    def dead_letters() -> list[tuple[int, Any]]:
        out = []
        for i in (0, 1):
            cursor, ids_ = c.call(i, "JSCAN", "QUEUE", "dlq", "STATE", "queued")
            out += [(i, j) for j in ids_]
        return out

    wait_until(lambda: dead_letters(), 10, "a dead letter")
    time.sleep(2)  # both retry timers have long passed: a second copy would be queued by now
    found = dead_letters()
    assert len(found) == 1, found
    assert all(c.call(i, "QLEN", "work") == 0 for i in (0, 1))
