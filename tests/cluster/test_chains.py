"""Chained jobs (ADDJOB ... AFTER id): on one broker, and on a simulated cluster with the
parent and the child on different nodes, a partition, a failover and restarts."""

from __future__ import annotations

from typing import Any

from broker.clients import Client
from broker.core import Broker
from tests.cluster.jobsim import JobCluster, lone_broker

T0 = 1_795_315_000_000


def _add(b: Broker, c: Client, queue: bytes, *opts: bytes) -> bytes:
    reply = b.execute([b"ADDJOB", queue, b"body", b"0", *opts], c, T0)
    assert str(reply).startswith("D-"), reply
    return str(reply).encode()


def _show(reply: Any) -> dict[str, Any]:
    assert isinstance(reply, list), reply
    return {reply[k].decode(): reply[k + 1] for k in range(0, len(reply), 2)}


def test_a_child_waits_for_every_parent() -> None:
    b, c = lone_broker(T0)
    p1, p2 = _add(b, c, b"q"), _add(b, c, b"q")
    child = _add(b, c, b"next", b"AFTER", p1, b"AFTER", p2)
    shown = _show(b.execute([b"SHOW", child], c, T0))
    assert shown["state"] == b"waiting" and shown["after"] == [p1, p2]
    assert b.execute([b"QLEN", b"next"], c, T0) == 0
    assert b.execute([b"ENQUEUE", child], c, T0) == 0  # not before its parents
    b.execute([b"ACKJOB", p1], c, T0)
    assert _show(b.execute([b"SHOW", child], c, T0))["after"] == [p2]
    b.execute([b"RESOLVE", p2, b"r"], c, T0)
    assert _show(b.execute([b"SHOW", child], c, T0))["state"] == b"queued"
    assert b.execute([b"QLEN", b"next"], c, T0) == 1


def test_a_plain_show_is_unchanged() -> None:
    b, c = lone_broker(T0)
    job = _add(b, c, b"q")
    shown = b.execute([b"SHOW", job], c, T0)
    assert shown[-2:] == [b"body", b"body"] and len(shown) == 30


def test_a_failed_parent_dead_letters_or_deletes_the_child() -> None:
    b, c = lone_broker(T0)
    b.execute([b"QPOLICY", b"CREATE", b"dlq"], c, T0)
    b.execute([b"QPOLICY", b"CREATE", b"next", b"REDRIVE", b"5", b"dlq"], c, T0)
    parent = _add(b, c, b"q", b"TTL", b"1")
    to_dlq = _add(b, c, b"next", b"AFTER", parent)
    deleted = _add(b, c, b"other", b"AFTER", parent)
    b.tick(T0 + 2000)
    assert to_dlq not in b.jobs and deleted not in b.jobs
    assert b.execute([b"QLEN", b"dlq"], c, T0 + 2000) == 1
    letter = b.queues[b"dlq"].peek(1)[0]
    shown = _show(b.execute([b"SHOW", letter.id], c, T0 + 2000))
    assert shown["reason"] == b"parent " + parent + b" expired"


def test_a_parent_done_before_the_child_counts_as_done_an_unknown_one_fails() -> None:
    b, c = lone_broker(T0)
    b.execute([b"QPOLICY", b"CREATE", b"dlq"], c, T0)
    b.execute([b"QPOLICY", b"CREATE", b"next", b"REDRIVE", b"5", b"dlq"], c, T0)
    parent = _add(b, c, b"q")
    b.execute([b"RESOLVE", parent, b"r"], c, T0)
    child = _add(b, c, b"next", b"AFTER", parent)
    assert b.jobs[child].state.value == "queued"
    # Never added, or acked by a plain ACKJOB and collected: no proof it succeeded, so the
    # child is dead-lettered with why (deleted without a dead-letter queue), never held.
    acked = _add(b, c, b"q")
    b.execute([b"ACKJOB", acked], c, T0)
    gone = b"D-bbbbbbbb" + parent[10:]
    orphans = [_add(b, c, b"next", b"AFTER", p) for p in (gone, acked)]
    assert all(o not in b.jobs for o in orphans)
    letters = b.queues[b"dlq"].peek(2)
    reasons = sorted(_show(b.execute([b"SHOW", j.id], c, T0))["reason"] for j in letters)
    assert reasons == sorted(b"parent " + p + b" unknown to the cluster" for p in (gone, acked))
    dropped = _add(b, c, b"other", b"AFTER", gone)
    assert dropped not in b.jobs


def test_a_waiting_child_survives_a_restart() -> None:
    b, c = lone_broker(T0)
    parent = _add(b, c, b"q")
    child = _add(b, c, b"next", b"AFTER", parent)
    records = [(r[0], r[1]) for r in b.snapshot()]
    fresh, _ = lone_broker(T0)
    for kind, payload in records:
        fresh.load_record((kind, payload), T0)
    fresh.finish_load(T0 + 1000, False)
    assert _show(fresh.execute([b"SHOW", child], c, T0 + 1000))["state"] == b"waiting"
    fresh.tick(T0 + 400_000)  # past any retry: still waiting
    assert _show(fresh.execute([b"SHOW", child], c, T0 + 400_000))["state"] == b"waiting"
    fresh.execute([b"ACKJOB", parent], c, T0 + 400_000)
    assert fresh.jobs[child].state.value == "queued"


def test_bad_after_options() -> None:
    b, c = lone_broker(T0)
    assert str(b.execute([b"ADDJOB", b"q", b"x", b"0", b"AFTER", b"nope"], c, T0)).startswith(
        "BADID")
    assert str(b.execute([b"ADDJOB", b"q", b"x", b"0", b"AFTER"], c, T0)).startswith("ERR syntax")


# -- a cluster ---------------------------------------------------------------------------------


def test_a_parent_on_other_nodes_releases_the_child() -> None:
    cl = JobCluster(3)
    parent = cl.addjob(0, "q", "p", "0", "REPLICATE", "1")
    child = cl.addjob(1, "next", "c", "0", "REPLICATE", "2", "AFTER", parent.decode())
    cl.run_for(500)
    assert all(cl.job(i, child).after == (parent,) for i in cl.holders(child))
    assert cl.queued_on(child) == []
    cl.cmd(0, "RESOLVE", parent, "done")
    assert cl.run_until(lambda: cl.queued_on(child) == [1], 3000), cl.queued_on(child)
    cl.run_for(500)
    assert all(not cl.job(i, child).after for i in cl.holders(child))


def test_a_deleted_parent_on_another_node_deletes_the_child() -> None:
    cl = JobCluster(3)
    parent = cl.addjob(0, "q", "p", "0", "REPLICATE", "1")
    child = cl.addjob(1, "next", "c", "0", "REPLICATE", "2", "AFTER", parent.decode())
    cl.run_for(200)
    cl.cmd(0, "DELJOB", parent)
    assert cl.run_until(lambda: cl.holders(child) == [], 5000), cl.holders(child)


def test_a_partition_delays_the_release_until_it_heals() -> None:
    # The child's question cannot reach the parent's node before the partition: a RESOLVE
    # keeps the parent's outcome anyway, so the child is released once it heals ...
    cl = JobCluster(3, node_timeout=500)
    parent = cl.addjob(0, "q", "p", "0", "REPLICATE", "1")
    child = cl.addjob(1, "next", "c", "0", "REPLICATE", "1", "AFTER", parent.decode())
    acked = cl.addjob(0, "q", "p2", "0", "REPLICATE", "1")
    orphan = cl.addjob(1, "next", "c2", "0", "REPLICATE", "1", "AFTER", acked.decode())
    cl.sim.partition([0], [1, 2])
    cl.run_for(200)
    cl.cmd(0, "RESOLVE", parent, "")
    cl.cmd(0, "ACKJOB", acked)
    cl.run_for(3000)
    assert cl.job(1, child).after == (parent,)
    assert cl.job(1, orphan).after == (acked,)  # its creator unreachable: it waits
    cl.sim.heal()
    assert cl.run_until(lambda: cl.queued_on(child) == [1], 20_000)
    # ... while a plain ACKJOB nobody watched leaves nothing: no proof the parent succeeded,
    # and the child fails (deleted: its queue has no dead-letter queue).
    assert cl.run_until(lambda: cl.holders(orphan) == [], 20_000)


def test_the_origins_failure_leaves_the_release_to_a_replica() -> None:
    cl = JobCluster(3)
    parent = cl.addjob(0, "q", "p", "0", "REPLICATE", "3")
    child = cl.addjob(1, "next", "c", "0", "REPLICATE", "2", "RETRY", "2", "AFTER",
                      parent.decode())
    other = next(i for i in cl.holders(child) if i != 1)
    cl.run_for(200)
    cl.sim.kill(1)
    cl.cmd(0, "ACKJOB", parent)
    assert cl.run_until(lambda: cl.queued_on(child) == [other], 10_000)


def test_chains_survive_a_restart_of_every_node() -> None:
    cl = JobCluster(3)
    parent = cl.addjob(0, "q", "p", "0", "REPLICATE", "2")
    child = cl.addjob(2, "next", "c", "0", "REPLICATE", "2", "AFTER", parent.decode())
    cl.run_for(500)
    for i in range(3):
        cl.sim.kill(i)
    for i in range(3):
        cl.sim.restart(i)
    assert cl.run_until(cl.meshed, 30_000)
    assert cl.job(2, child) is not None and cl.job(2, child).after == (parent,)
    cl.cmd(0, "ACKJOB", parent)
    assert cl.run_until(lambda: cl.queued_on(child) == [2], 10_000), cl.queued_on(child)


def test_a_failed_child_is_no_longer_watched_for_its_other_parents() -> None:
    b, c = lone_broker(T0)
    failing, other = _add(b, c, b"q"), _add(b, c, b"q")
    child = _add(b, c, b"next", b"AFTER", failing, b"AFTER", other)
    b.execute([b"DELJOB", failing], c, T0)
    assert child not in b.jobs
    assert not b.results.children  # nothing left to ask about
