"""DEDUP across the cluster (broker/dedup.py, cluster/dedup_sync.py): a body added on one
node is a duplicate on every node while its job lives; an ack anywhere ends it; a partition
lets each side add its own; a node that restarts learns the index again."""

from __future__ import annotations

from tests.cluster.allsim import AllCoresCluster


def _cluster() -> AllCoresCluster:
    c = AllCoresCluster(3)
    c.cmd(0, "QPOLICY", "CREATE", "orders", "DEDUP", "yes")
    c.run_for(200)
    return c


def test_a_duplicate_on_another_node_returns_the_first_job() -> None:
    c = _cluster()
    first = c.addjob(0, "orders", "order-17", "0", "REPLICATE", "1")
    c.run_for(50)
    assert c.addjob(1, "orders", "order-17", "0") == first
    assert c.addjob(2, "orders", "order-17", "0") == first
    assert c.holders(first) == [0]
    other = c.addjob(2, "orders", "order-18", "0")
    assert other != first


def test_an_ack_on_any_node_ends_the_window() -> None:
    c = _cluster()
    first = c.addjob(0, "orders", "order-1", "0", "REPLICATE", "2")
    c.run_for(50)
    holder = next(i for i in c.holders(first) if i != 0)
    c.cmd(holder, "ACKJOB", first)
    c.run_for(100)
    again = c.addjob(2, "orders", "order-1", "0")
    assert again != first


def test_the_ttl_ends_the_window_without_a_message() -> None:
    c = _cluster()
    first = c.addjob(0, "orders", "short", "0", "REPLICATE", "1", "TTL", "2")
    c.run_for(50)
    assert c.addjob(1, "orders", "short", "0") == first
    c.run_for(3000)
    assert c.addjob(1, "orders", "short", "0") != first


def test_a_partition_deduplicates_each_side_and_heals() -> None:
    c = _cluster()
    c.sim.partition([0], [1, 2])
    c.run_for(100)
    left = c.addjob(0, "orders", "split", "0", "REPLICATE", "1")
    right = c.addjob(1, "orders", "split", "0", "REPLICATE", "1")
    assert left != right  # each side saw only its own
    c.run_for(50)
    assert c.addjob(2, "orders", "split", "0", "REPLICATE", "1") == right
    c.sim.heal()
    assert c.run_until(c.meshed, 30_000)
    c.run_for(500)
    # Both jobs stay; every node now answers one of them, the same one.
    answers = {c.addjob(i, "orders", "split", "0", "REPLICATE", "1") for i in range(3)}
    assert len(answers) == 1 and answers <= {left, right}


def test_a_restarted_node_learns_the_index_again() -> None:
    c = _cluster()
    first = c.addjob(0, "orders", "kept", "0", "REPLICATE", "1")
    c.run_for(100)
    c.sim.kill(2)
    c.run_for(100)
    c.sim.restart(2)
    assert c.run_until(c.meshed, 30_000)
    c.run_for(300)
    assert c.addjob(2, "orders", "kept", "0") == first


def _entries(c: AllCoresCluster, i: int) -> int:
    return len(c.broker(i).policies.shared.entries)


def test_tombstones_go_once_every_node_has_them() -> None:
    """An ended job's entry (a tombstone) is dropped on every node once all of them have been
    linked for twice the node timeout (here 4 s, looked at every 5 s), not at its TTL."""
    c = _cluster()
    first = c.addjob(0, "orders", "order-9", "0", "REPLICATE", "2")
    c.run_for(50)
    c.cmd(0, "ACKJOB", first)
    c.run_for(500)
    assert [_entries(c, i) for i in range(3)] == [1, 1, 1]  # the tombstone, everywhere
    c.run_for(10_000)
    assert [_entries(c, i) for i in range(3)] == [0, 0, 0]
    assert c.addjob(1, "orders", "order-9", "0") != first


def test_tombstones_stay_while_a_node_is_cut_off_and_reach_it_on_healing() -> None:
    """Node 2 holds the live entry and is cut off when the job ends: the others keep the
    tombstone as long as it is away (the live entry would come back otherwise), send it
    when the link returns, and only then, after the window, drop it."""
    c = _cluster()
    first = c.addjob(0, "orders", "order-5", "0", "REPLICATE", "1")
    c.run_for(100)
    c.sim.partition([0, 1], [2])
    c.run_for(100)
    c.cmd(0, "ACKJOB", first)
    c.run_for(20_000)
    assert _entries(c, 0) == 1 and _entries(c, 1) == 1  # kept: node 2 never got it
    assert c.addjob(2, "orders", "order-5", "0") == first  # its side still sees the job
    c.sim.heal()
    assert c.run_until(c.meshed, 30_000)
    c.run_for(500)
    again = c.addjob(2, "orders", "order-5", "0", "REPLICATE", "1")
    assert again != first  # the tombstone reached node 2, and was not undone by its entry
    c.run_for(50)
    assert c.addjob(0, "orders", "order-5", "0") == again
    c.cmd(2, "ACKJOB", again)
    c.run_for(12_000)
    assert [_entries(c, i) for i in range(3)] == [0, 0, 0]
