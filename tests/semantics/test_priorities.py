"""ADDJOB ... PRIORITY n (broker/queue.py's lanes): higher served first, oldest first within a
priority; on one node, in the log, and on the cluster harness (REPLJOB, federation)."""

from __future__ import annotations

import pytest

from broker.job import Job, record_problem
from protocol import errors
from tests.broker.harness import Node
from tests.cluster.jobsim import JobCluster
from tests.cluster.test_federation import block


def _bodies(reply: list[list[bytes]]) -> list[bytes]:
    return [entry[2] for entry in reply]


def _fill(n: Node, queue: str = "q") -> None:
    for body, prio in [("a", 0), ("b", 5), ("c", 9), ("d", 0), ("e", 5), ("f", 1)]:
        n.add(queue, body, *(("PRIORITY", prio) if prio else ()))


def test_getjob_qpeek_and_iteration_follow_priorities() -> None:
    n = Node()
    _fill(n)
    order = [b"c", b"b", b"e", b"f", b"a", b"d"]
    assert n.qlen() == 6
    assert _bodies(n("QPEEK", "q", 10)) == order
    assert _bodies(n("QPEEK", "q", -2)) == [b"d", b"a"]
    assert [j.body for j in n.b.queues[b"q"]] == order
    assert _bodies(n("GETJOB", "NOHANG", "COUNT", 2, "FROM", "q")) == order[:2]
    assert _bodies(n("GETJOB", "NOHANG", "COUNT", 10, "FROM", "q")) == order[2:]


def test_several_queues_keep_disques_round_robin() -> None:
    n = Node()
    n.add("x", "x-low")
    n.add("x", "x-high", "PRIORITY", 3)
    n.add("y", "y-low")
    got = n("GETJOB", "NOHANG", "COUNT", 3, "FROM", "y", "x")
    assert _bodies(got) == [b"y-low", b"x-high", b"x-low"]


def test_show_nack_dequeue_and_ack_of_prioritized_jobs() -> None:
    n = Node()
    plain = n.add("q", "plain")
    high = n.add("q", "high", "PRIORITY", 7)
    assert b"priority" not in n("SHOW", plain)  # Disque's reply, unchanged
    assert n("SHOW", high)[-2:] == [b"priority", 7]
    assert n("JSCAN", "REPLY", "ALL")[1][1][-2:] == [b"priority", 7]
    assert n("DEQUEUE", high) == 1 and n.qlen() == 1
    assert n("ENQUEUE", high) == 1 and _bodies(n("QPEEK", "q", 1)) == [b"high"]
    got = n("GETJOB", "NOHANG", "FROM", "q")
    assert got[0][1] == high
    n.add("q", "newer", "PRIORITY", 7)
    assert n("NACK", high) == 1
    assert _bodies(n("QPEEK", "q", 3)) == [b"high", b"newer", b"plain"]  # oldest first
    assert n("ACKJOB", high) == 1
    assert _bodies(n("QPEEK", "q", 3)) == [b"newer", b"plain"]


def test_priority_bounds() -> None:
    n = Node()
    assert n("ADDJOB", "q", "x", 0, "PRIORITY", 10) == errors.BAD_PRIORITY
    assert n("ADDJOB", "q", "x", 0, "PRIORITY", -1) == errors.BAD_PRIORITY
    assert n("ADDJOB", "q", "x", 0, "PRIORITY", "high") == errors.BAD_PRIORITY
    job = n("ADDJOB", "q", "x", 0, "PRIORITY", 0).encode()
    assert len(n.b.jobs[job].to_record()) == 16  # the record nodes wrote before priorities


def test_records_carry_the_priority_and_old_records_load() -> None:
    n = Node()
    _fill(n)
    records = [(r.kind, r.payload) for r in n.log if r.kind == "job"]
    assert {len(rec) for _, rec in records} == {16, 17}
    for _, rec in records:
        assert record_problem(rec) is None
    assert record_problem(records[1][1][:16] + [10]) is not None
    fresh = Node(n.now)
    for rec in records:
        fresh.b.load_record(rec, n.now)
    fresh.b.finish_load(n.now, True)
    assert _bodies(fresh("QPEEK", "q", 10)) == _bodies(n("QPEEK", "q", 10))
    old = records[0][1][:15]  # a record from before dtime
    assert Job.from_record(old).priority == 0


def test_a_blocked_consumer_gets_the_job_that_arrives() -> None:
    n = Node()
    from broker.clients import BLOCKED, Client

    client = Client(7)
    assert n("GETJOB", "FROM", "q", client=client) is BLOCKED
    n.add("q", "high", "PRIORITY", 4)
    replies = n.take_replies()
    assert [(c.id, _bodies(v)) for c, v in replies] == [(7, [b"high"])]


@pytest.mark.parametrize("seed", [1, 2])
def test_replicas_keep_the_priority_through_a_failover(seed: int) -> None:
    c = JobCluster(3, seed=seed)
    job = c.addjob(0, "q", "payload", "500", "REPLICATE", "3", "RETRY", "5", "PRIORITY", "6")
    assert sorted(c.holders(job)) == [0, 1, 2]
    assert all(c.job(i, job).priority == 6 for i in range(3))
    assert c.cmd(0, "GETJOB", "NOHANG", "FROM", "q")[0][1] == job
    # Node 0 is cut off with the job delivered and never acknowledged: after RETRY a holder
    # on the other side queues its copy, which keeps its priority there.
    c.sim.partition([0], [1, 2])
    low = c.addjob(1, "q", "low", "0", "REPLICATE", "1")
    assert c.run_until(lambda: any(i in (1, 2) for i in c.queued_on(job)), 20_000)
    where = next(i for i in c.queued_on(job) if i in (1, 2))
    got = c.cmd(where, "GETJOB", "NOHANG", "COUNT", "2", "FROM", "q")
    assert got[0][1] == job and (where != 1 or got[1][1] == low)


def test_federation_moves_the_highest_priorities_first() -> None:
    c = JobCluster(3, federation=True)
    for k in range(3):
        c.addjob(0, "q", f"low{k}", "0", "REPLICATE", "1")
    c.addjob(0, "q", "high", "0", "REPLICATE", "1", "PRIORITY", "8")
    client = block(c, 1)
    c.run_for(2_000)
    reply = c.reply_to(1, client)
    assert reply is not None and _bodies(reply) == [b"high"]


def test_peek_reads_across_levels_in_pop_order() -> None:
    import random

    from broker.queue import Queue

    rng = random.Random(3)
    for _ in range(200):
        q = Queue(b"q", 0)
        jobs = []
        for k in range(rng.randint(0, 30)):
            job = Job(b"D-%04d" % k, b"q", b"", repl=1, ttl=100, retry=1, delay=0, ctime=k,
                      delivered=())
            job.priority = rng.choice([0, 0, 1, 5, 9])
            q.push(job)
            jobs.append(job)
        order = sorted(jobs, key=lambda j: (-j.priority, j.ctime))
        assert q.ordered() == order == list(q)
        for count in range(-32, 33):
            assert q.peek(count) == (order[:count] if count >= 0 else order[::-1][:-count])
        assert [q.pop() for _ in jobs] == order and len(q) == 0


def test_priority_and_after_share_the_record_tail() -> None:
    # priority at index 16 and the parents at 17, each only when needed: 16 fields for a plain
    # job, 17 for a priority, 18 (priority possibly 0) for a job waiting for parents.
    n = Node()
    parent = n.add("q", "parent")
    plain = n.b.jobs[parent].to_record()
    prio = n.b.jobs[n.add("q", "p", "PRIORITY", 3)].to_record()
    child = n.b.jobs[n.add("q", "c", "AFTER", parent.decode())].to_record()
    both = n.b.jobs[n.add("q", "pc", "PRIORITY", 8, "AFTER", parent.decode())].to_record()
    assert [len(r) for r in (plain, prio, child, both)] == [16, 17, 18, 18]
    assert (child[16], child[17]) == (0, [parent])
    assert (both[16], both[17]) == (8, [parent])
    for rec in (plain, prio, child, both):
        assert record_problem(rec) is None
        assert Job.from_record(rec).to_record() == rec
    loaded = Job.from_record(both)
    assert (loaded.priority, loaded.after) == (8, (parent,))
    assert Job.from_record(prio).after == ()
    assert record_problem(both[:17] + [[b"not an id"]]) is not None
    assert record_problem(both[:17] + [[]]) is not None
    assert record_problem(both + [0]) is not None  # 19 fields
