"""Deduplication's scope on a cluster: the jobs added on each node."""

from __future__ import annotations

from tests.cluster.jobsim import JobCluster


def test_dedup_is_per_node_and_a_partition_changes_nothing() -> None:
    c = JobCluster(3)
    for i in range(3):
        c.cmd(i, "QPOLICY", "CREATE", "q", "DEDUP", "yes")
    job = c.addjob(0, "q", "same", "500", "REPLICATE", "2")
    holder = next(i for i in c.holders(job) if i != 0)
    assert c.addjob(0, "q", "same", "500") == job
    # Another node creates its own job, even while holding a copy of node 0's.
    other = c.addjob(holder, "q", "same", "500", "REPLICATE", "1")
    assert other != job
    assert c.addjob(holder, "q", "same", "500") == other
    # Cut off from the others, node 0 still deduplicates what was added on it.
    c.sim.partition({0}, {1, 2})
    assert c.addjob(0, "q", "same", "500", "REPLICATE", "1") == job
    c.sim.heal()
    c.run_for(2000)
    assert c.holders(job) and c.holders(other)  # never merged
