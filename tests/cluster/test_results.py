"""RESOLVE and WAITJOB: on one broker, and across a simulated cluster (cluster/results.py):
a node that does not hold the job learns its outcome, through partitions, drops and
restarts."""

from __future__ import annotations

from typing import Any

from broker.clients import BLOCKED, Client
from broker.core import Broker
from broker.effects import Reply
from cluster.sim import Faults
from cluster.wire import MessageType
from protocol.resp import Error
from tests.cluster.jobsim import JobCluster, lone_broker

T0 = 1_795_315_000_000


def _add(b: Broker, c: Client, *opts: bytes) -> bytes:
    reply = b.execute([b"ADDJOB", b"q", b"body", b"0", *opts], c, T0)
    return str(reply).encode()


def _replies(b: Broker) -> list[Any]:
    return [e.value for e in b.take_effects() if isinstance(e, Reply)]


def test_resolve_answers_a_blocked_waitjob_and_later_ones() -> None:
    b, c = lone_broker(T0)
    job = _add(b, c)
    waiter = Client(2)
    assert b.execute([b"WAITJOB", job], waiter, T0) is BLOCKED
    assert b.execute([b"RESOLVE", job, b"42"], c, T0) == 1
    assert _replies(b) == [b"42"]
    assert job not in b.jobs
    assert b.execute([b"WAITJOB", job], waiter, T0 + 1) == b"42"
    assert b.execute([b"RESOLVE", job, b"other"], c, T0) == 0  # the first result stays
    assert b.execute([b"WAITJOB", job], waiter, T0 + 1) == b"42"


def test_each_end_of_a_watched_job_has_its_answer() -> None:
    b, c = lone_broker(T0)
    acked, deleted, expiring = _add(b, c), _add(b, c), _add(b, c, b"TTL", b"1")
    for job in (acked, deleted, expiring):
        assert b.execute([b"WAITJOB", job], Client(9), T0) is BLOCKED
    b.execute([b"ACKJOB", acked], c, T0)
    b.execute([b"DELJOB", deleted], c, T0)
    b.tick(T0 + 2000)
    got = _replies(b)
    assert got[0] == b""
    assert isinstance(got[1], Error) and got[1].startswith("DELETED")
    assert isinstance(got[2], Error) and got[2].startswith("EXPIRED")
    # Kept for result-ttl: asked again, the same answers.
    assert b.execute([b"WAITJOB", acked], c, T0 + 2000) == b""
    b.tick(T0 + 3600_000 + 2000)
    assert b.execute([b"WAITJOB", acked], c, T0 + 3600_000 + 2000) == Error(
        "NOJOB Job not known in the cluster")


def test_a_dead_lettered_job_says_so() -> None:
    b, c = lone_broker(T0)
    b.execute([b"QPOLICY", b"CREATE", b"dlq"], c, T0)
    b.execute([b"QPOLICY", b"CREATE", b"q", b"REDRIVE", b"1", b"dlq"], c, T0)
    job = _add(b, c)
    assert b.execute([b"WAITJOB", job], Client(2), T0) is BLOCKED
    b.execute([b"GETJOB", b"FROM", b"q"], c, T0)
    b.execute([b"NACK", job], c, T0)
    got = _replies(b)
    assert len(got) == 1 and isinstance(got[0], Error) and got[0].startswith("DEADLETTER")


def test_waitjob_times_out_with_a_null_and_unknown_ids_are_errors() -> None:
    b, c = lone_broker(T0)
    job = _add(b, c)
    assert b.execute([b"WAITJOB", job, b"TIMEOUT", b"100"], c, T0) is BLOCKED
    b.tick(T0 + 200)
    assert _replies(b) == [None]
    assert not b.results.waiters and b.blocked_clients == 0
    unknown = b"D-" + b"b" * 8 + job[10:]
    assert b.execute([b"WAITJOB", unknown], c, T0) == Error("NOJOB Job not known in the cluster")
    assert b.execute([b"WAITJOB", job, b"TIMEOUT"], c, T0) == Error("ERR syntax error")
    assert b.execute([b"WAITJOB", b"nope"], c, T0).startswith("BADID")


def test_result_max_size_is_enforced_and_the_result_is_logged() -> None:
    b, c = lone_broker(T0)
    b.config.set("result-max-size", ["4"])
    job = _add(b, c)
    assert str(b.execute([b"RESOLVE", job, b"12345"], c, T0)).startswith("ERR result of 5")
    assert job in b.jobs
    b.execute([b"RESOLVE", job, b"1234"], c, T0)
    records = [(r[0], r[1]) for r in b.snapshot()]
    assert ("result", [job, "resolved", b"1234", T0 + 3600_000]) in records
    # Replayed into a fresh broker, the result is there.
    fresh, _ = lone_broker(T0)
    for kind, payload in records:
        fresh.load_record((kind, payload), T0)
    fresh.finish_load(T0, False)
    assert fresh.execute([b"WAITJOB", job], c, T0) == b"1234"


def test_client_gone_forgets_its_waitjob() -> None:
    b, c = lone_broker(T0)
    job = _add(b, c)
    waiter = Client(2)
    b.execute([b"WAITJOB", job], waiter, T0)
    b.client_gone(waiter)
    assert not b.results.waiters and b.blocked_clients == 0
    b.execute([b"ACKJOB", job], c, T0)
    assert _replies(b) == []


# -- a cluster ---------------------------------------------------------------------------------


def _wait(cl: JobCluster, i: int, job: bytes, timeout_ms: int = 0) -> Client:
    waiter = cl.client()
    argv = ["WAITJOB", job] if not timeout_ms else ["WAITJOB", job, "TIMEOUT", str(timeout_ms)]
    assert cl.cmd(i, *argv, client=waiter) is BLOCKED
    return waiter


def test_a_node_without_the_job_learns_its_result() -> None:
    cl = JobCluster(3)
    job = cl.addjob(0, "q", "x", "0", "REPLICATE", "2")
    outsider = next(i for i in range(3) if i not in cl.holders(job))
    waiter = _wait(cl, outsider, job)
    cl.run_for(200)
    assert cl.reply_to(outsider, waiter) is None
    holder = next(i for i in cl.holders(job) if i != 0)
    assert cl.cmd(holder, "RESOLVE", job, "the answer") == 1
    assert cl.run_until(lambda: cl.reply_to(outsider, waiter) is not None, 2000)
    assert cl.reply_to(outsider, waiter) == b"the answer"
    # Every holder kept the result (replicated) and answers itself.
    assert cl.cmd(0, "WAITJOB", job) == b"the answer"
    cl.run_for(5000)  # the ack GC collects the job everywhere; the result stays
    assert cl.holders(job) == []
    for i in range(3):
        assert cl.cmd(i, "WAITJOB", job) == b"the answer"


def test_a_plain_ack_on_another_node_answers_an_empty_string() -> None:
    cl = JobCluster(3)
    job = cl.addjob(0, "q", "x", "0", "REPLICATE", "2")
    outsider = next(i for i in range(3) if i not in cl.holders(job))
    waiter = _wait(cl, outsider, job)
    cl.run_for(100)
    cl.cmd(0, "ACKJOB", job)
    assert cl.run_until(lambda: cl.reply_to(outsider, waiter) is not None, 2000)
    assert cl.reply_to(outsider, waiter) == b""


def test_an_id_no_node_knows_is_an_error_once_everyone_answered() -> None:
    cl = JobCluster(3)
    job = cl.addjob(0, "q", "x", "0", "REPLICATE", "1")
    cl.cmd(0, "ACKJOB", job)  # gone, and nobody watched it
    waiter = _wait(cl, 2, job)
    assert cl.run_until(lambda: cl.reply_to(2, waiter) is not None, 1000)
    assert cl.reply_to(2, waiter) == Error("NOJOB Job not known in the cluster")


def test_a_partition_delays_the_answer_until_it_heals() -> None:
    cl = JobCluster(3, node_timeout=500)
    job = cl.addjob(0, "q", "x", "0", "REPLICATE", "2")
    outsider = next(i for i in range(3) if i not in cl.holders(job))
    holders = cl.holders(job)
    cl.sim.partition([outsider], holders)
    cl.run_for(100)
    waiter = _wait(cl, outsider, job)
    cl.cmd(0, "RESOLVE", job, "late")
    cl.run_for(3000)
    # The origin cannot be reached: no "unknown" answer, the client still waits.
    assert cl.reply_to(outsider, waiter) is None
    cl.sim.heal()
    assert cl.run_until(lambda: cl.reply_to(outsider, waiter) is not None, 20_000)
    assert cl.reply_to(outsider, waiter) == b"late"


def test_lost_frames_are_asked_again() -> None:
    cl = JobCluster(3)
    job = cl.addjob(0, "q", "x", "0", "REPLICATE", "2")
    outsider = next(i for i in range(3) if i not in cl.holders(job))
    for i in cl.holders(job):
        cl.sim.faults[(outsider, i)] = Faults(drop=0.5)
        cl.sim.faults[(i, outsider)] = Faults(drop=0.5)
    waiter = _wait(cl, outsider, job)
    cl.run_for(500)
    cl.cmd(0, "RESOLVE", job, "r")
    assert cl.run_until(lambda: cl.reply_to(outsider, waiter) is not None, 30_000)
    assert cl.reply_to(outsider, waiter) == b"r"
    assert len(cl.sent(MessageType.WAITFOR, job)) >= 2


def test_a_result_survives_its_holders_restart() -> None:
    cl = JobCluster(3)
    job = cl.addjob(0, "q", "x", "0", "REPLICATE", "3")
    cl.cmd(1, "RESOLVE", job, "kept")
    cl.run_for(5000)
    for i in range(3):
        cl.sim.kill(i)
    for i in range(3):
        cl.sim.restart(i)
    assert cl.run_until(cl.meshed, 30_000)
    for i in range(3):
        assert cl.cmd(i, "WAITJOB", job) == b"kept"


def test_results_count_in_used_memory_until_they_expire() -> None:
    b, c = lone_broker(T0)
    job = _add(b, c)
    before = b.used_memory
    b.execute([b"RESOLVE", job, b"x" * 10_000], c, T0)
    assert b.used_memory >= before + 10_000 - b.job_overhead - 4  # the job went, the result came
    b.tick(T0 + 3600_000 + 2000)
    assert b.results.bytes == 0 and not b.results.outcomes
