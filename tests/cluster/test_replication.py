"""Replication of jobs at ADDJOB: Disque's "Job replication state machine" on the
in-process cluster, message by message."""

from __future__ import annotations

from broker.clients import BLOCKED
from cluster.sim import Faults
from cluster.wire import MessageType as M
from tests.cluster.jobsim import JobCluster

NOREPL = "NOREPL Not enough reachable nodes for the requested replication level"


def _show(c: JobCluster, i: int, job_id: bytes) -> dict[bytes, object]:
    reply = c.cmd(i, "SHOW", job_id)
    assert reply is not None
    return dict(zip(reply[::2], reply[1::2], strict=True))


def test_sync_addjob_replies_after_two_gotjob_and_every_node_shows_three_holders() -> None:
    c = JobCluster(3)
    client = c.client()
    assert c.cmd(0, "ADDJOB", "q", "payload", "500", client=client) is BLOCKED
    assert c.reply_to(0, client) is None  # nothing answered before the GOTJOBs
    assert c.run_until(lambda: c.reply_to(0, client) is not None, 500)
    job_id = c.reply_to(0, client).encode()
    ids = {c.node_id(i) for i in range(3)}
    # REPLJOB from the origin to both others, GOTJOB back from both.
    assert sorted(c.messages(M.REPLJOB, job_id)) == sorted((c.node_id(0), c.node_id(i))
                                                           for i in (1, 2))
    assert sorted(c.messages(M.GOTJOB, job_id)) == sorted((c.node_id(i), c.node_id(0))
                                                          for i in (1, 2))
    for i in range(3):
        show = _show(c, i, job_id)
        assert {n.decode() for n in show[b"nodes-delivered"]} == ids
        assert show[b"nodes-confirmed"] == []
        assert show[b"repl"] == 3
        assert show[b"state"] == (b"queued" if i == 0 else b"active")
    # Each holder logged the job before the reply / the GOTJOB.
    for i in range(3):
        assert any(r.kind == "job" and r.payload[0] == job_id for r in c.logs[i])


def test_default_replication_is_three_or_the_reachable_nodes_plus_one() -> None:
    c = JobCluster(2)
    job_id = c.addjob(0, "q", "x", "500")
    assert c.job(0, job_id).repl == 2 and set(c.holders(job_id)) == {0, 1}
    c5 = JobCluster(5)
    job_id = c5.addjob(0, "q", "x", "500")
    assert c5.job(0, job_id).repl == 3 and len(c5.holders(job_id)) == 3


def test_replicate_one_on_a_cluster_is_local_and_answered_at_once() -> None:
    c = JobCluster(3)
    reply = c.cmd(0, "ADDJOB", "q", "x", "0", "REPLICATE", "1")
    assert isinstance(reply, str) and reply.startswith("D-")
    c.run_for(200)
    assert c.holders(reply.encode()) == [0]
    assert c.messages(M.REPLJOB) == []


def test_replicate_beyond_the_cluster_and_retry_zero_are_refused_with_disques_texts() -> None:
    c = JobCluster(3)
    assert c.cmd(0, "ADDJOB", "q", "x", "0", "REPLICATE", "4") == NOREPL
    assert c.cmd(0, "ADDJOB", "q", "x", "0", "RETRY", "0", "REPLICATE", "2") == (
        "ERR With RETRY set to 0 please explicitly set  REPLICATE to 1 (at-most-once delivery)")
    assert c.broker(0).jobs == {}


def test_a_slow_node_makes_the_origin_try_one_more_node_every_50_ms() -> None:
    c = JobCluster(4, seed=3)
    for j in (1, 2, 3):
        c.sim.faults[(0, j)] = Faults(delay_ms=400)  # REPLJOB is slow to every node ...
    client = c.client()
    assert c.cmd(0, "ADDJOB", "q", "x", "5000", "REPLICATE", "2", client=client) is BLOCKED
    t0 = c.sim.now
    assert c.run_until(lambda: c.reply_to(0, client) is not None, 2000)
    job_id = c.reply_to(0, client).encode()
    first = c.sent(M.REPLJOB, job_id, src=0)
    targets = []
    for at, _, dst in first:
        if dst not in targets:
            targets.append(dst)
            assert at >= t0 + 50 * (len(targets) - 1)  # one node more every >= 50 ms
    assert len(targets) == 3  # ... so all three were asked before the first GOTJOB came
    assert len(c.job(0, job_id).delivered) == 4


def test_replication_timeout_replies_norepl_and_deletes_the_partial_copies() -> None:
    c = JobCluster(3)
    for j in (1, 2):
        c.sim.faults[(j, 0)] = Faults(drop=1.0)  # every GOTJOB is lost
    client = c.client()
    assert c.cmd(0, "ADDJOB", "q", "x", "300", client=client) is BLOCKED
    c.run_for(250)
    assert c.reply_to(0, client) is None
    assert c.run_until(lambda: c.reply_to(0, client) is not None, 200)
    assert c.reply_to(0, client) == (
        "NOREPL Timeout reached before replicating to the requested number of nodes")
    c.run_for(50)
    assert c.broker(0).jobs == {} and c.broker(0).blocked_clients == 0
    # The copies the others made were deleted by DELJOB (best effort, delivered here).
    assert all(c.broker(i).jobs == {} for i in (1, 2))
    assert len(c.messages(M.DELJOB)) == 2


def test_async_addjob_answers_at_once_and_replicates_without_gotjob() -> None:
    c = JobCluster(3)
    reply = c.cmd(0, "ADDJOB", "q", "x", "0", "ASYNC")
    assert isinstance(reply, str) and reply.startswith("D-")
    job_id = reply.encode()
    assert c.queued_on(job_id) == [0]
    c.run_for(100)
    assert sorted(c.holders(job_id)) == [0, 1, 2]
    assert c.messages(M.GOTJOB) == []  # REPLJOB went with NOREPLY


def test_a_leaving_node_replicates_externally_and_hands_the_job_to_one_holder() -> None:
    c = JobCluster(3)
    c.broker(0).set_leaving(True)
    c.sim.set_leaving(0, True)
    assert c.cmd(0, "ADDJOB", "q", "x", "0", "REPLICATE", "3") == (
        NOREPL + ", since I'm unable to hold a copy of the message for the following "
        "reason: I'm leaving the cluster")
    job_id = c.addjob(0, "q", "x", "500", "REPLICATE", "2")
    c.run_for(100)
    assert sorted(c.holders(job_id)) == [1, 2]  # no local copy
    assert len(c.queued_on(job_id)) == 1  # ENQUEUE went to exactly one holder
    assert len(c.messages(M.ENQUEUE, job_id)) == 1
    # GETJOB that would block on a leaving node: -LEAVING.
    assert c.cmd(0, "GETJOB", "FROM", "q").startswith("LEAVING")


def test_async_external_replication_keeps_no_local_copy_at_all() -> None:
    c = JobCluster(3)
    c.broker(0).set_leaving(True)
    c.sim.set_leaving(0, True)
    reply = c.cmd(0, "ADDJOB", "q", "x", "0", "REPLICATE", "1", "ASYNC")
    assert isinstance(reply, str)
    job_id = reply.encode()
    assert c.broker(0).jobs == {}
    c.run_for(100)
    assert len(c.holders(job_id)) == 1 and len(c.queued_on(job_id)) == 1


def test_past_75_percent_of_maxmemory_the_job_is_replicated_externally() -> None:
    c = JobCluster(3)
    b = c.broker(0)
    b.config.set("maxmemory", ["1000000"])
    b.runtime_bytes = 800_000
    job_id = c.addjob(0, "q", "x", "500", "REPLICATE", "2")
    c.run_for(100)
    assert 0 not in c.holders(job_id) and len(c.holders(job_id)) == 2
    # A node short of memory does not take replicas either (no GOTJOB: tried elsewhere).
    job2 = c.addjob(1, "q", "y", "500", "REPLICATE", "2")
    assert 0 not in c.holders(job2)


def test_a_client_gone_while_waiting_drops_the_job_and_its_copies() -> None:
    c = JobCluster(3)
    for j in (1, 2):
        c.sim.faults[(j, 0)] = Faults(delay_ms=300)
    client = c.client()
    assert c.cmd(0, "ADDJOB", "q", "x", "0", client=client) is BLOCKED
    c.run_for(20)
    c.broker(0).client_gone(client)
    c.sim.drain(0)
    assert c.broker(0).jobs == {} and c.broker(0).blocked_clients == 0
    c.run_for(1000)
    assert all(c.broker(i).jobs == {} for i in range(3))
    assert c.reply_to(0, client) is None


def test_flushall_answers_a_waiting_addjob_instead_of_leaving_it_blocked() -> None:
    c = JobCluster(3)
    for j in (1, 2):
        c.sim.faults[(j, 0)] = Faults(drop=1.0)
    client = c.client()
    assert c.cmd(0, "ADDJOB", "q", "x", "0", client=client) is BLOCKED
    assert c.cmd(0, "DEBUG", "FLUSHALL") == "OK"
    assert c.reply_to(0, client).startswith("NOREPL job removed")
    assert c.broker(0).blocked_clients == 0 and c.broker(0).repl_wait == {}


def test_a_job_deleted_while_replicating_answers_its_client() -> None:
    c = JobCluster(3)
    for j in (1, 2):
        c.sim.faults[(j, 0)] = Faults(drop=1.0)
    client = c.client()
    assert c.cmd(0, "ADDJOB", "q", "x", "0", client=client) is BLOCKED
    job_id = next(iter(c.broker(0).jobs))
    assert c.cmd(0, "DELJOB", job_id) == 1
    assert c.reply_to(0, client) == (
        "NOREPL job removed (expired?) before the requested replication level was achieved")
    assert c.broker(0).blocked_clients == 0
    c.run_for(20)
    assert c.holders(job_id) == []  # the partial copies got DELJOB
