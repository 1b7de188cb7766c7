"""Dead letters on a cluster (cluster/sim.py through tests/cluster/jobsim.py): one job reaches
the dead-letter queue even when several holders of the original dead-letter it at once."""

from __future__ import annotations

import pytest

from broker.policy_table import dead_letter_id
from tests.cluster.jobsim import JobCluster


def _policies(c: JobCluster, *extra: str) -> None:
    for i in range(len(c.sim.nodes)):
        c.cmd(i, "QPOLICY", "CREATE", "dlq")
        c.cmd(i, "QPOLICY", "CREATE", "w", "REDRIVE", "1", "dlq", *extra)


def _dead_letters(c: JobCluster) -> set[bytes]:
    return {jid for i in range(len(c.sim.nodes)) for jid, j in c.broker(i).jobs.items()
            if j.queue == b"dlq"}


def _queued_in_dlq(c: JobCluster) -> list[tuple[int, bytes]]:
    return [(i, jid) for i in range(len(c.sim.nodes)) for jid, j in c.broker(i).jobs.items()
            if j.queue == b"dlq" and j.state.value == "queued"]


def test_two_holders_nacking_at_once_make_one_dead_letter() -> None:
    c = JobCluster(3)
    _policies(c)
    job = c.addjob(0, "w", "payload", "500", "REPLICATE", "2")
    other = next(i for i in c.holders(job) if i != 0)
    got = c.cmd(0, "GETJOB", "NOHANG", "FROM", "w")
    assert got[0][1] == job
    # Both holders are told to put it back in the same instant: each would deliver it a
    # second time, each dead-letters it.
    assert c.cmd(0, "NACK", job) == 0
    assert c.cmd(other, "NACK", job) == 0
    dl = dead_letter_id(job, 86400, 300)
    assert _dead_letters(c) == {dl}
    assert len(_queued_in_dlq(c)) == 2  # before the holders hear from each other
    c.run_for(1000)
    # The tie-break (WILLQUEUE answered by QUEUED): one queued copy, on the greater node ID.
    queued = _queued_in_dlq(c)
    assert len(queued) == 1, queued
    winner = max((0, other), key=c.node_id)
    assert queued == [(winner, dl)]
    # The original is acknowledged everywhere and collected.
    assert c.run_until(lambda: not c.holders(job), 5000)
    # The dead letter's body and counters, and its origin on both nodes that made it.
    reply = c.cmd(winner, "GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "dlq")
    (queue, got_id, body, _, nacks, _, deliveries), = reply
    assert (queue, got_id, body, nacks, deliveries) == (b"dlq", dl, b"payload", 1, 0)
    for i in (0, other):
        assert c.cmd(i, "QPOLICY", "ORIGIN", dl) == [job, b"w"]
    # One ACK removes every copy.
    c.cmd(winner, "ACKJOB", dl)
    assert c.run_until(lambda: not _dead_letters(c), 10_000)
    assert not any(j.queue == b"w" for i in range(3) for j in c.broker(i).jobs.values())


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_retry_timers_of_every_holder_make_one_dead_letter(seed: int) -> None:
    c = JobCluster(3, seed=seed)
    _policies(c, "VISIBILITY", "2")
    job = c.addjob(0, "w", "payload", "500", "REPLICATE", "3")
    assert len(c.holders(job)) == 3
    assert c.cmd(0, "GETJOB", "NOHANG", "FROM", "w")[0][1] == job
    # Nobody acknowledges: every holder's retry timer comes due within the same second.
    c.run_for(6000)
    assert not c.holders(job) or all(
        c.job(i, job).state.value == "acked" for i in c.holders(job))
    queued = _queued_in_dlq(c)
    assert len(queued) == 1, queued
    assert _dead_letters(c) == {queued[0][1]}
    # Nothing was delivered a second time from the original queue.
    assert all(c.cmd(i, "QLEN", "w") == 0 for i in range(3))


def test_a_holder_that_learns_of_the_ack_first_does_not_dead_letter() -> None:
    c = JobCluster(2)
    _policies(c)
    job = c.addjob(0, "w", "payload", "500", "REPLICATE", "2")
    c.cmd(0, "GETJOB", "NOHANG", "FROM", "w")
    assert c.cmd(0, "NACK", job) == 0
    c.run_for(500)  # node 1 receives the SETACK of the original
    assert c.cmd(1, "NACK", job) == 0  # acked there: nothing to queue
    c.run_for(500)
    assert [i for i, _ in _queued_in_dlq(c)] == [0]
    assert _dead_letters(c) == {dead_letter_id(job, 86400, 300)}
    assert 1 not in [i for i in range(2) if dead_letter_id(job, 86400, 300) in c.broker(i).jobs]
