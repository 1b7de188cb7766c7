"""Requeue coordination: Disque's "Job re-queueing state machine" — WILLQUEUE 500
ms before, QUEUED to every holder, the greater node ID keeps its queued copy; WORKING, NACK,
ENQUEUE/DEQUEUE and PAUSE ... BCAST."""

from __future__ import annotations

from cluster.sim import Faults
from cluster.wire import MessageType as M
from tests.cluster.jobsim import JobCluster


def _consume(c: JobCluster, i: int, queue: str = "q") -> bytes:
    reply = c.cmd(i, "GETJOB", "NOHANG", "FROM", queue)
    assert isinstance(reply, list) and len(reply) == 1, reply
    job_id: bytes = reply[0][1]
    return job_id


def test_an_unacked_job_is_requeued_by_exactly_one_holder_after_retry() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500", "RETRY", "3")
    assert _consume(c, 0) == job_id
    assert c.queued_on(job_id) == []
    c.run_for(2000)
    assert c.queued_on(job_id) == []  # not before RETRY (minus the 250 ms of error)
    c.run_for(2000)
    queued = c.queued_on(job_id)
    assert len(queued) == 1
    first = c.sent(M.QUEUED, job_id)
    assert first and {src for _, src, _ in first} == {c.node_id(queued[0])}
    # WILLQUEUE went out 500 ms before from the node(s) about to requeue.
    wq = c.sent(M.WILLQUEUE, job_id)
    assert wq and min(at for at, _, _ in wq) <= min(at for at, _, _ in first) - 500
    # Every holder counts the additional delivery (QUEUED carries it) and moved its retry.
    for i in range(3):
        assert c.job(i, job_id).deliveries == 1
        assert c.job(i, job_id).qtime > c.sim.now + 1000


def test_two_nodes_requeueing_at_once_leave_the_copy_of_the_greatest_node_id() -> None:
    c = JobCluster(3, seed=7, node_timeout=10_000)  # links outlive the 900 ms delays
    job_id = c.addjob(0, "q", "x", "500", "RETRY", "2")
    assert _consume(c, 0) == job_id
    for a in range(3):  # WILLQUEUE and QUEUED cross in flight: everyone requeues
        for b in range(3):
            if a != b:
                c.sim.faults[(a, b)] = Faults(delay_ms=900)
    assert c.run_until(lambda: len(c.queued_on(job_id)) >= 2, 3000)
    c.run_for(1500)
    requeuers = {src for _, src, _, t, body in c.sends if t is M.QUEUED and body["deliv"]}
    assert len(requeuers) >= 2
    queued = c.queued_on(job_id)
    assert len(queued) == 1
    assert c.node_id(queued[0]) == max(requeuers)


def test_willqueue_to_a_node_that_has_the_job_queued_is_answered_with_queued() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500", "RETRY", "60")
    n = len(c.messages(M.QUEUED, job_id))
    c.deliver(0, 1, M.WILLQUEUE, {"id": job_id})
    c.run_for(10)
    # QUEUED to every node in job.delivered (docs/cluster.md, replication), so 1 postpones.
    assert len(c.messages(M.QUEUED, job_id)) == n + 2
    assert c.job(1, job_id).qtime > c.sim.now + 59_000


def test_queued_from_a_smaller_id_keeps_the_local_copy_and_from_a_greater_drops_it() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500", "RETRY", "60")
    others = sorted((1, 2), key=c.node_id)
    me = c.node_id(0)
    smaller = [i for i in others if c.node_id(i) < me]
    greater = [i for i in others if c.node_id(i) > me]
    for i in smaller:
        c.deliver(0, i, M.QUEUED, {"id": job_id, "nack": False, "deliv": True})
        assert c.queued_on(job_id) == [0]
    for i in greater:
        c.deliver(0, i, M.QUEUED, {"id": job_id, "nack": False, "deliv": True})
        assert c.queued_on(job_id) == []
    assert c.job(0, job_id).deliveries == 2


def test_working_propagates_and_postpones_the_requeue_on_every_copy() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500", "RETRY", "4")
    assert _consume(c, 0) == job_id
    c.run_for(3000)
    assert c.cmd(0, "WORKING", job_id) == 4
    c.run_for(10)
    assert len(c.messages(M.WORKING, job_id)) == 2
    for i in range(3):
        assert c.job(i, job_id).qtime >= c.sim.now + 3500
    c.run_for(2500)  # past the original retry time: nobody requeued
    assert c.queued_on(job_id) == []


def test_nack_requeues_here_and_every_copy_counts_it() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500", "RETRY", "60")
    assert _consume(c, 0) == job_id
    assert c.cmd(0, "NACK", job_id) == 1
    c.run_for(10)
    assert c.queued_on(job_id) == [0]
    for i in range(3):
        assert c.job(i, job_id).nacks == 1
        assert c.job(i, job_id).deliveries == 0
    assert {b["nack"] for _, _, _, t, b in c.trace if t is M.QUEUED} == {True}


def test_enqueue_and_dequeue_commands_act_on_the_local_copy() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500", "RETRY", "60")
    assert c.cmd(1, "ENQUEUE", job_id) == 1
    c.run_for(10)
    # Queued on 1 too now (a requeue: QUEUED went out, and 0's copy yields if 1 is greater).
    assert 1 in c.queued_on(job_id)
    assert c.cmd(1, "DEQUEUE", job_id) == 1
    assert 1 not in c.queued_on(job_id)


def test_enqueue_message_queues_a_replica_once_and_ignores_queued_or_unknown_jobs() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500", "RETRY", "60")
    c.deliver(1, 0, M.ENQUEUE, {"id": job_id, "delay": 0})
    assert 1 in c.queued_on(job_id)
    c.deliver(1, 0, M.ENQUEUE, {"id": job_id, "delay": 0})  # already queued: nothing
    assert c.job(1, job_id).deliveries == 0
    c.deliver(2, 0, M.ENQUEUE, {"id": job_id, "delay": 5})
    assert c.job(2, job_id).qtime == c.sim.now + 5000
    c.deliver(2, 0, M.ENQUEUE, {"id": b"D-00000000-000000000000000000000000-0001", "delay": 0})


def test_pause_bcast_reaches_every_node() -> None:
    c = JobCluster(3)
    assert c.cmd(0, "PAUSE", "pq", "out", "bcast") == "out"
    c.run_for(10)
    assert c.cmd(1, "PAUSE", "pq", "state") == "out"
    assert c.cmd(2, "PAUSE", "pq", "state") == "out"
    assert c.cmd(0, "PAUSE", "pq", "none", "bcast") == "none"
    c.run_for(10)
    assert c.cmd(2, "PAUSE", "pq", "state") == "none"
    assert c.cmd(1, "PAUSE", "other", "in") == "in"  # without BCAST: local only
    c.run_for(10)
    assert c.cmd(0, "PAUSE", "other", "state") == "none"


def test_a_delayed_job_is_queued_by_its_origin_when_the_delay_ends_and_nowhere_else() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500", "DELAY", "2", "RETRY", "5")
    assert c.queued_on(job_id) == [] and sorted(c.holders(job_id)) == [0, 1, 2]
    assert all(c.job(i, job_id).state.value == "active" for i in range(3))
    c.run_for(2100)
    assert c.queued_on(job_id) == [0]
    c.run_for(3000)  # the replicas wait RETRY past the delay before they would requeue
    assert c.queued_on(job_id) == [0]
    assert c.cmd(0, "GETJOB", "NOHANG", "FROM", "q")[0][1] == job_id
    c.run_for(5000)
    assert len(c.queued_on(job_id)) == 1  # not acked: one holder requeued it
