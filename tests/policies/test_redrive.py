"""QPOLICY REDRIVE: dead letters go back to the queue they came from (broker/policies.py),
on one node with a fake clock and on the in-process cluster harness."""

from __future__ import annotations

from protocol.resp import Error
from tests.broker.harness import Node
from tests.cluster.jobsim import JobCluster


def _dead_letter(n: Node, body: str, queue: str = "w") -> bytes:
    """Add a job to ``queue`` (REDRIVE 1 dlq) and NACK it into the dead-letter queue."""
    job = n.add(queue, body)
    got = n("GETJOB", "NOHANG", "FROM", queue)
    assert got[0][1] == job
    assert n("NACK", job) == 0  # dead-lettered instead of queued again
    return job


def _node() -> Node:
    n = Node()
    n("QPOLICY", "CREATE", "dlq")
    n("QPOLICY", "CREATE", "w", "REDRIVE", 1, "dlq", "VISIBILITY", 60)
    return n


def test_redrive_moves_dead_letters_back_as_new_jobs() -> None:
    n = _node()
    originals = [_dead_letter(n, f"job {i}") for i in range(3)]
    assert n.qlen("dlq") == 3 and n.qlen("w") == 0
    assert n("QPOLICY", "REDRIVE", "dlq") == 3
    assert n.qlen("dlq") == 0 and n.qlen("w") == 3
    got = n("GETJOB", "NOHANG", "COUNT", 10, "WITHCOUNTERS", "FROM", "w")
    assert [g[2] for g in got] == [b"job 0", b"job 1", b"job 2"]  # same order, same bodies
    assert all(g[4] == 0 and g[6] == 0 for g in got)  # counters start again from zero
    assert not {g[1] for g in got} & set(originals)  # new jobs, new IDs
    # The source queue's policy applies to them (VISIBILITY 60 -> RETRY 60).
    shown = n.show(got[0][1])
    assert shown is not None and shown[b"retry"] == 60
    # The dead letters were acknowledged: nothing of them is left.
    assert not any(j.queue == b"dlq" for j in n.b.jobs.values())
    # A redriven job follows the redrive policy again, as the new job it is: its NACK
    # dead-letters it, and that dead letter's origin is the redriven job.
    assert n("NACK", got[0][1]) == 0
    dl = n("QPEEK", "dlq", 1)[0][1]
    assert n("QPOLICY", "ORIGIN", dl) == [got[0][1], b"w"]


def test_redrive_count_and_what_stays() -> None:
    n = _node()
    for i in range(4):
        _dead_letter(n, f"d{i}")
    manual = n.add("dlq", "added by hand")  # no origin: not redriven
    taken = n("GETJOB", "NOHANG", "FROM", "dlq")[0][1]  # a dead letter being processed
    assert taken != manual
    assert n("QPOLICY", "REDRIVE", "dlq", "COUNT", 2) == 2
    assert n.qlen("w") == 2
    assert n("QPOLICY", "REDRIVE", "dlq") == 1  # the third queued one; the taken one stays
    assert n.qlen("dlq") == 1 and n("QPEEK", "dlq", 10)[0][1] == manual
    assert n.show(taken) is not None
    assert n("QPOLICY", "REDRIVE", "dlq") == 0
    assert n("QPOLICY", "REDRIVE", "empty-but-no-policy") == Error(
        "NOQUEUE No such queue (it has no policy): create it with QPOLICY CREATE")
    for bad in (("COUNT",), ("COUNT", 0), ("COUNT", -1), ("COUNT", "x"), ("LIMIT", 1)):
        assert isinstance(n("QPOLICY", "REDRIVE", "dlq", *bad), Error), bad


def test_redrive_into_a_paused_queue_moves_nothing_and_says_why() -> None:
    n = _node()
    _dead_letter(n, "x")
    n("PAUSE", "w", "in")
    reply = n("QPOLICY", "REDRIVE", "dlq")
    assert isinstance(reply, Error) and str(reply).startswith("PAUSED")
    assert n.qlen("dlq") == 1
    n("PAUSE", "w", "none")
    assert n("QPOLICY", "REDRIVE", "dlq") == 1


def test_redrive_is_logged_new_job_before_ack_and_replays() -> None:
    n = _node()
    dl_job = _dead_letter(n, "persist me")
    dl = n("QPEEK", "dlq", 1)[0][1]
    assert n("QPOLICY", "REDRIVE", "dlq") == 1
    kinds = [(r.kind, r.payload[0] if r.kind == "job" else r.payload) for r in n.log
             if r.kind in ("job", "ack")]
    new_id = next(jid for jid in n.b.jobs if n.b.jobs[jid].queue == b"w")
    assert kinds.index(("job", new_id)) < kinds.index(("ack", dl)), kinds
    assert dl_job not in n.b.jobs
    # Replayed, the records give the same queues.
    fresh = Node()
    for r in n.log:
        fresh.b.load_record((r.kind, r.payload), fresh.now)
    fresh.b.finish_load(fresh.now, True)
    assert fresh.qlen("w") == 1 and fresh.qlen("dlq") == 0 and dl not in fresh.b.jobs


def test_dead_lettered_counter_per_source_queue() -> None:
    n = _node()
    n("QPOLICY", "CREATE", "v", "REDRIVE", 1, "dlq")
    _dead_letter(n, "a")
    _dead_letter(n, "b")
    _dead_letter(n, "c", queue="v")
    assert n.b.policies.dead_lettered == {b"w": 2, b"v": 1}


def test_redrive_on_a_cluster_acks_every_copy_and_replicates_the_new_job() -> None:
    c = JobCluster(3)
    for i in range(3):
        c.cmd(i, "QPOLICY", "CREATE", "dlq")
        c.cmd(i, "QPOLICY", "CREATE", "w", "REDRIVE", "1", "dlq")
    job = c.addjob(0, "w", "payload", "500", "REPLICATE", "2")
    assert c.cmd(0, "GETJOB", "NOHANG", "FROM", "w")[0][1] == job
    assert c.cmd(0, "NACK", job) == 0
    c.run_for(1000)
    where = [i for i in range(3) for j in c.broker(i).jobs.values()
             if j.queue == b"dlq" and j.state.value == "queued"]
    assert len(where) == 1
    node = where[0]
    assert c.cmd(node, "QPOLICY", "REDRIVE", "dlq") == 1
    assert c.run_until(lambda: not any(j.queue == b"dlq" for i in range(3)
                                       for j in c.broker(i).jobs.values()), 10_000)
    new = [jid for jid, j in c.broker(node).jobs.items() if j.queue == b"w"]
    assert len(new) == 1
    c.run_for(500)
    assert len(c.holders(new[0])) >= 2  # replicated in the background (ASYNC)
    got = c.cmd(node, "GETJOB", "NOHANG", "FROM", "w")
    assert got[0][1:] == [new[0], b"payload"]
