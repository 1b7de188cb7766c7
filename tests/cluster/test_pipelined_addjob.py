"""One client's synchronous ADDJOBs waiting together (pipelined by the runtime): the broker
emits their replies in the order they ran, whatever order their jobs are confirmed in, and
counts the client once as blocked. On the in-process cluster, message by message."""

from __future__ import annotations

from typing import Any

from broker.clients import BLOCKED, Client
from cluster.sim import Faults
from cluster.wire import MessageType as M
from tests.cluster.jobsim import JobCluster

TIMEOUT = "NOREPL Timeout reached before replicating to the requested number of nodes"


def _replies(c: JobCluster, i: int, client: Client) -> list[Any]:
    return [value for who, value in c.blocked_replies.get(i, []) if who is client]


def _waiting_ids(c: JobCluster, i: int) -> list[bytes]:
    return list(c.broker(i).repl_wait)


def test_a_later_job_confirmed_first_waits_for_the_earlier_ones_reply() -> None:
    c = JobCluster(3)
    c.sim.faults[(1, 0)] = Faults(drop=1.0)  # node1's GOTJOBs are lost
    client = c.client()
    assert c.cmd(0, "ADDJOB", "q", "a", "0", "REPLICATE", "3", client=client) is BLOCKED
    assert c.cmd(0, "ADDJOB", "q", "b", "0", "REPLICATE", "2", client=client) is BLOCKED
    first, second = _waiting_ids(c, 0)
    assert c.broker(0).blocked_clients == 1  # a client, not an ADDJOB
    # b is confirmed by node2; its reply is held behind a's.
    assert c.run_until(lambda: c.broker(0).jobs[second].state.name == "QUEUED", 500)
    assert _replies(c, 0, client) == []
    del c.sim.faults[(1, 0)]
    assert c.run_until(lambda: _replies(c, 0, client), 1000)
    assert _replies(c, 0, client) == [first.decode(), second.decode()]
    assert c.broker(0).blocked_clients == 0 and client.repl_waits == []


def test_a_timeout_is_answered_in_its_place_between_confirmed_jobs() -> None:
    c = JobCluster(3)
    c.sim.faults[(2, 0)] = Faults(drop=1.0)  # node2 never confirms: REPLICATE 3 times out
    client = c.client()
    for body, repl in (("a", "2"), ("b", "3"), ("c", "2")):
        assert c.cmd(0, "ADDJOB", "q", body, "300", "REPLICATE", repl, client=client) is BLOCKED
    a, b, cc = _waiting_ids(c, 0)
    assert c.run_until(lambda: len(_replies(c, 0, client)) == 3, 1000)
    assert _replies(c, 0, client) == [a.decode(), TIMEOUT, cc.decode()]
    assert b not in c.broker(0).jobs and c.broker(0).blocked_clients == 0


def test_a_client_gone_drops_the_jobs_still_waiting_and_keeps_the_confirmed_ones() -> None:
    c = JobCluster(3)
    c.sim.faults[(2, 0)] = Faults(drop=1.0)
    client = c.client()
    assert c.cmd(0, "ADDJOB", "q", "a", "0", "REPLICATE", "3", client=client) is BLOCKED
    assert c.cmd(0, "ADDJOB", "q", "b", "0", "REPLICATE", "2", client=client) is BLOCKED
    waiting, confirmed = _waiting_ids(c, 0)
    assert c.run_until(lambda: c.broker(0).jobs[confirmed].state.name == "QUEUED", 500)
    c.broker(0).client_gone(client)
    c.sim.drain(0)
    assert c.broker(0).blocked_clients == 0 and c.broker(0).repl_wait == {}
    assert list(c.broker(0).jobs) == [confirmed]  # the confirmed one stays, as if replied
    c.run_for(200)
    assert c.holders(waiting) == [] and sorted(c.holders(confirmed)) == [0, 1]
    assert len(c.messages(M.DELJOB, waiting)) == 2
    assert _replies(c, 0, client) == []


def test_only_addjobs_that_cannot_depend_on_the_waiting_ones_may_run_ahead() -> None:
    c = JobCluster(1)
    b = c.broker(0)
    ok = [b"ADDJOB", b"q", b"x", b"0", b"REPLICATE", b"3", b"ASYNC", b"TTL", b"100"]
    assert b.may_run_ahead(ok) and b.may_run_ahead([b"addjob", b"q", b"x", b"0"])
    assert not b.may_run_ahead([b"ADDJOB", b"q", b"x", b"0", b"MAXLEN", b"3"])
    assert not b.may_run_ahead([b"ADDJOB", b"q", b"x", b"0", b"maxlen", b"3"])
    for other in ([b"GETJOB", b"FROM", b"q"], [b"PING"], [b"QLEN", b"q"], [b"ADDJOB", b"q"],
                  [b"ACKJOB", b"D-x"]):
        assert not b.may_run_ahead(other)
    assert isinstance(c.cmd(0, "QPOLICY", "CREATE", "withpolicy"), list)
    assert not b.may_run_ahead([b"ADDJOB", b"withpolicy", b"x", b"0"])
    assert b.may_run_ahead([b"ADDJOB", b"other", b"x", b"0"])
