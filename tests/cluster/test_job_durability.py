"""Replicated jobs across kill -9 and restart: a node replays its append log
(``tests/cluster/jobsim.py`` keeps each node's records as appendfsync always would) and keeps
every job it acknowledged to a client or GOTJOB'd to a peer, then takes part in requeue and
ack GC again."""

from __future__ import annotations

from broker.config import Config
from broker.core import Broker
from broker.job import FLAG_REPLICA, Job, JobState
from tests.cluster.jobsim import JobCluster


def test_a_job_survives_the_kill_of_two_of_its_three_holders() -> None:
    c = JobCluster(3, node_timeout=1000)
    job_id = c.addjob(0, "q", "x", "500", "RETRY", "2")
    c.sim.kill(0)
    c.sim.kill(1)
    c.run_for(3000)
    assert c.holders(job_id) == [2]
    assert c.queued_on(job_id) == [2]  # the survivor requeued it after RETRY
    reply = c.cmd(2, "GETJOB", "NOHANG", "FROM", "q")
    assert reply[0][1] == job_id


def test_a_restarted_replica_keeps_what_it_gotjobd_and_requeues_it_again() -> None:
    c = JobCluster(3, node_timeout=1000)
    job_id = c.addjob(0, "q", "x", "500", "RETRY", "3")
    assert c.cmd(0, "GETJOB", "NOHANG", "FROM", "q")[0][1] == job_id
    c.sim.kill(1)
    c.sim.kill(0)
    c.sim.kill(2)
    c.sim.restart(1)
    job = c.job(1, job_id)
    assert job is not None and job.state is JobState.ACTIVE
    assert set(job.delivered) == {c.node_id(i) for i in range(3)}
    assert c.run_until(lambda: c.queued_on(job_id) == [1], 5000)


def test_a_restarted_origin_keeps_the_job_it_acknowledged_to_the_client() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500")
    c.sim.restart(0)
    job = c.job(0, job_id)
    assert job is not None and job.state is JobState.ACTIVE  # back in a queue after RETRY
    assert job.flags & FLAG_REPLICA


def test_an_acked_job_is_replayed_acked_and_its_gc_finishes_after_the_restart() -> None:
    c = JobCluster(3, node_timeout=60_000)
    job_id = c.addjob(0, "q", "x", "500")
    c.sim.kill(2)
    assert c.cmd(1, "ACKJOB", job_id) == 1
    c.run_for(500)
    assert sorted(c.holders(job_id)) == [0, 1]
    c.sim.restart(1)
    assert c.job(1, job_id).state is JobState.ACKED  # not dropped, not active again
    c.sim.restart(2)
    assert c.job(2, job_id).state is JobState.ACTIVE
    assert c.run_until(lambda: c.holders(job_id) == [], 60_000)


def test_a_dummy_ack_is_replayed_too() -> None:
    c = JobCluster(2, node_timeout=60_000)
    odd = b"D-00000000-000000000000000000000000-05a1"
    c.sim.kill(1)
    assert c.cmd(0, "ACKJOB", odd) == 0
    c.sim.restart(0)
    job = c.job(0, odd)
    assert job is not None and job.state is JobState.ACKED and job.delivered == ()


def test_single_node_logs_and_acked_records_without_the_replica_flag_load_as_before() -> None:
    b = Broker(Config(), "a" * 40, b"seed", now_ms=1000)
    job = Job(b"D-aaaaaaaa-000000000000000000000000-05a1", b"q", b"x", repl=1, ttl=100,
              retry=10, delay=0, ctime=1000 * 1_000_000, delivered=("a" * 40,),
              state=JobState.ACKED)
    assert b.validate_record("job", job.to_record()) is None
    b.load_record(("job", job.to_record()), 2000)
    b.finish_load(2000, False)
    assert b.jobs == {}  # an acked single-node job is gone, as it always was


def test_an_async_job_is_logged_with_the_nodes_it_was_sent_to() -> None:
    c = JobCluster(3)
    reply = c.cmd(0, "ADDJOB", "q", "x", "0", "ASYNC")
    job_id = reply.encode()
    record = next(r.payload for r in c.logs[0] if r.kind == "job" and r.payload[0] == job_id)
    assert set(record[12]) == {c.node_id(i) for i in range(3)}
