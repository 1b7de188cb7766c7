"""The broker core with a fake clock: no sockets, no sleeping. A 300 s retry takes microseconds.

Expected behaviour is Disque's (docs/disque-semantics.md), except where the project decided
otherwise (a controlled restart restores queues exactly).
"""

from __future__ import annotations

import pytest

from broker.clients import Client
from broker.core import BLOCKED
from protocol.resp import NULL_ARRAY, Error, Status
from tests.broker.harness import NODE, T0, Node


@pytest.fixture
def n() -> Node:
    return Node()


def ids_of(reply: list) -> list[bytes]:
    return [entry[1] for entry in reply]


# ---------------------------------------------------------------------------------------------
# ADDJOB


def test_addjob_defaults_and_id_format(n: Node) -> None:
    reply = n("ADDJOB", "q", "hello", 0)
    assert type(reply) is Status
    job_id = reply.encode()
    assert len(job_id) == 40
    assert job_id.startswith(b"D-" + NODE[:8].encode() + b"-")
    assert job_id[35:36] == b"-"
    assert job_id.endswith(b"-05a1")  # 86400 s = 1440 min = 0x5a0, odd: at-least-once
    s = n.show(job_id)
    assert s is not None
    assert s[b"state"] == b"queued"
    assert s[b"retry"] == 300
    assert s[b"ttl"] == 86400
    assert s[b"delay"] == 0
    assert s[b"repl"] == 1
    assert s[b"queue"] == b"q"
    assert s[b"body"] == b"hello"
    assert s[b"nacks"] == 0 and s[b"additional-deliveries"] == 0
    assert n.qlen() == 1


@pytest.mark.parametrize(("opts", "retry", "suffix"), [
    (("TTL", 100), 10, b"0001"),  # retry = ttl/10; 100 s < 2 min -> 1 minute, odd
    (("TTL", 5), 1, b"0001"),  # ttl/10 == 0 -> 1; < 60 s with retry -> 0001
    (("TTL", 7200), 300, b"0079"),  # capped at 300; 120 min = 0x78 -> odd 0x79
    (("TTL", 3600, "RETRY", 0), 0, b"003c"),  # at-most-once: even
    (("TTL", 59, "RETRY", 0), 0, b"0000"),
    (("TTL", 3600, "RETRY", 7), 7, b"003d"),
])
def test_default_retry_and_ttl_field(n: Node, opts: tuple, retry: int, suffix: bytes) -> None:
    job_id = n.add("q", "x", *opts)
    assert job_id.endswith(b"-" + suffix)
    s = n.show(job_id)
    assert s is not None and s[b"retry"] == retry


def test_ids_are_unique(n: Node) -> None:
    ids = {n.add() for _ in range(200)}
    assert len(ids) == 200


def test_delay_keeps_the_job_active_until_it_passes(n: Node) -> None:
    job_id = n.add("q", "x", "DELAY", 5)
    s = n.show(job_id)
    assert s is not None and s[b"state"] == b"active"
    assert s[b"next-requeue-within"] == 5000
    assert n.qlen() == 0
    assert n("GETJOB", "NOHANG", "FROM", "q") is NULL_ARRAY
    n.run_until(T0 + 4999)
    assert n.qlen() == 0
    assert n.show(job_id)[b"state"] == b"active"
    n.run_until(T0 + 5000)
    assert n.qlen() == 1
    s = n.show(job_id)
    assert s[b"state"] == b"queued"
    assert s[b"additional-deliveries"] == 0  # the first queueing is not a redelivery


def test_delay_single_late_wakeup(n: Node) -> None:
    job_id = n.add("q", "x", "DELAY", 5)
    n.tick(T0 + 5000)
    assert n.qlen() == 1
    assert n.show(job_id)[b"state"] == b"queued"


# ---------------------------------------------------------------------------------------------
# Retry


def _requeue_at(n: Node, job_id: bytes) -> int:
    return n.now + n.show(job_id)[b"next-requeue-within"]


def test_unacked_job_is_requeued_after_retry(n: Node) -> None:
    job_id = n.add()
    qtime = _requeue_at(n, job_id)
    assert T0 + 300_000 - 250 <= qtime <= T0 + 300_000 + 249
    assert ids_of(n("GETJOB", "FROM", "q")) == [job_id]
    assert n.qlen() == 0
    n.run_until(qtime - 1)
    assert n.qlen() == 0
    assert n.show(job_id)[b"state"] == b"active"
    n.run_until(T0 + 300_300)
    assert n.qlen() == 1
    s = n.show(job_id)
    assert s[b"state"] == b"queued"
    assert s[b"additional-deliveries"] == 1
    assert s[b"nacks"] == 0
    # And again: delivered, not acked, back once more.
    assert ids_of(n("GETJOB", "FROM", "q")) == [job_id]
    n.run_until(T0 + 600_600)
    assert n.show(job_id)[b"additional-deliveries"] == 2
    assert n.qlen() == 1


def test_requeue_with_a_single_late_tick(n: Node) -> None:
    job_id = n.add()
    n("GETJOB", "FROM", "q")
    n.tick(T0 + 300_300)
    assert n.qlen() == 1
    assert n.show(job_id)[b"additional-deliveries"] == 1


def test_getjob_does_not_restart_the_retry_period(n: Node) -> None:
    """Disque: the requeue time is armed at enqueue, GETJOB does not move it."""
    job_id = n.add()
    n.run_until(T0 + 200_000)
    n("GETJOB", "FROM", "q")
    n.run_until(T0 + 300_300)
    assert n.qlen() == 1
    assert n.show(job_id)[b"additional-deliveries"] == 1


def test_a_queued_job_is_not_counted_as_redelivered(n: Node) -> None:
    job_id = n.add("q", "x", "RETRY", 10)
    n.run_until(T0 + 35_000)
    s = n.show(job_id)
    assert s[b"state"] == b"queued"
    assert s[b"additional-deliveries"] == 0
    assert n.qlen() == 1


def test_at_most_once_job_is_never_requeued(n: Node) -> None:
    job_id = n.add("q", "x", "RETRY", 0, "TTL", 3600)
    s = n.show(job_id)
    assert s[b"next-requeue-within"] is None
    assert ids_of(n("GETJOB", "FROM", "q")) == [job_id]
    n.run_until(T0 + 3_000_000)
    assert n.qlen() == 0
    s = n.show(job_id)
    assert s[b"state"] == b"active"
    assert s[b"additional-deliveries"] == 0
    assert n("ENQUEUE", job_id) == 0
    assert n("NACK", job_id) == 0
    assert n.qlen() == 0


def test_delayed_at_most_once_job_is_queued_once(n: Node) -> None:
    job_id = n.add("q", "x", "RETRY", 0, "DELAY", 2, "TTL", 100)
    n.run_until(T0 + 2000)
    assert n.qlen() == 1
    n("GETJOB", "FROM", "q")
    n.run_until(T0 + 90_000)
    assert n.qlen() == 0
    assert n.show(job_id)[b"state"] == b"active"


# ---------------------------------------------------------------------------------------------
# TTL


def test_ttl_expiry_removes_jobs_in_every_state(n: Node) -> None:
    queued = n.add("q", "a", "TTL", 10)
    delivered = n.add("q2", "b", "TTL", 10)
    n("GETJOB", "FROM", "q2")
    assert n.show(delivered)[b"state"] == b"active"
    delayed = n.add("d", "c", "TTL", 10, "DELAY", 9)
    amo = n.add("m", "d", "TTL", 10, "RETRY", 0)
    amo_delivered = n.add("m2", "e", "TTL", 10, "RETRY", 0)
    n("GETJOB", "FROM", "m2")
    paused = n.add("p", "f", "TTL", 10)
    n("PAUSE", "p", "all")
    all_ids = [queued, delivered, delayed, amo, amo_delivered, paused]
    before = n.jobs()
    assert before == 6
    n.run_until(T0 + 9_999)
    assert all(n.show(j) is not None for j in all_ids)
    n.run_until(T0 + 11_000)
    assert [n.show(j) for j in all_ids] == [None] * 6
    assert n.jobs() == 0
    for q in ("q", "q2", "d", "m", "m2", "p"):
        assert n.qlen(q) == 0
    assert n("GETJOB", "NOHANG", "FROM", "q", "d", "m") is NULL_ARRAY
    assert n("WORKING", queued).startswith("NOJOB")


def test_ttl_expiry_with_one_late_tick(n: Node) -> None:
    job_id = n.add("q", "a", "TTL", 10)
    n.tick(T0 + 60_000)
    assert n.show(job_id) is None
    assert n.qlen() == 0


def test_show_ttl_counts_down(n: Node) -> None:
    job_id = n.add("q", "a", "TTL", 100)
    n.run_until(T0 + 40_000)
    assert n.show(job_id)[b"ttl"] == 60


# ---------------------------------------------------------------------------------------------
# ACKJOB, FASTACK, DELJOB, NACK, ENQUEUE, DEQUEUE


def test_ackjob_removes_the_job_on_a_single_node(n: Node) -> None:
    a, b = n.add(), n.add()
    assert n("ACKJOB", a) == 1
    assert n.show(a) is None
    assert n("ACKJOB", a) == 0
    assert n.qlen() == 1
    assert n.jobs() == 1
    # a delivered job
    n("GETJOB", "FROM", "q")
    assert n("ACKJOB", b, a) == 1
    assert n.jobs() == 0
    n.run_until(T0 + 301_000)
    assert n.qlen() == 0  # not requeued: it is gone
    assert n("ACKJOB") == 0


def test_multi_id_commands_check_every_id_first(n: Node) -> None:
    a = n.add()
    for cmd in ("ACKJOB", "FASTACK", "DELJOB", "NACK", "ENQUEUE", "DEQUEUE"):
        reply = n(cmd, a, "D-nope")
        assert isinstance(reply, Error) and reply.startswith("BADID"), (cmd, reply)
    assert n.show(a)[b"state"] == b"queued"
    assert n.qlen() == 1


def test_fastack_and_deljob_count_known_jobs(n: Node) -> None:
    a, b, c = n.add(), n.add(), n.add()
    unknown = b"D-" + b"0" * 8 + b"-" + b"A" * 24 + b"-0001"
    n("GETJOB", "FROM", "q")  # a is delivered
    assert n("FASTACK", a, unknown) == 1
    assert n("DELJOB", b, c, unknown, b) == 2
    assert n.jobs() == 0
    assert n.qlen() == 0
    assert n("FASTACK", a) == 0
    assert n("DELJOB", a) == 0


def test_nack_counts_and_requeues(n: Node) -> None:
    a = n.add()
    assert n("NACK", a) == 0  # queued already
    n("GETJOB", "FROM", "q")
    assert n("NACK", a) == 1
    assert n.qlen() == 1
    s = n.show(a)
    assert s[b"state"] == b"queued"
    assert s[b"nacks"] == 1
    assert s[b"additional-deliveries"] == 0
    n("GETJOB", "FROM", "q")
    n("NACK", a)
    assert n.show(a)[b"nacks"] == 2


def test_enqueue_and_dequeue_return_values(n: Node) -> None:
    a, b = n.add(), n.add()
    assert n("ENQUEUE", a, b) == 0  # both queued
    assert n("DEQUEUE", a) == 1
    assert n.qlen() == 1
    assert n.show(a)[b"state"] == b"active"
    assert n("DEQUEUE", a) == 0
    assert n("ENQUEUE", a, b) == 1
    s = n.show(a)
    assert s[b"state"] == b"queued"
    assert s[b"additional-deliveries"] == 1  # not the first queueing
    n("GETJOB", "COUNT", 2, "FROM", "q")
    assert n("ENQUEUE", a, b) == 2
    assert n.show(b)[b"additional-deliveries"] == 1
    assert n.qlen() == 2


def test_dequeued_job_comes_back_at_its_requeue_time(n: Node) -> None:
    a = n.add("q", "x", "RETRY", 10)
    qtime = _requeue_at(n, a)
    n("DEQUEUE", a)
    n.run_until(qtime - 1)
    assert n.qlen() == 0
    n.run_until(T0 + 10_300)
    assert n.qlen() == 1
    assert n.show(a)[b"additional-deliveries"] == 1


def test_enqueue_of_a_delayed_job_is_its_first_queueing(n: Node) -> None:
    a = n.add("q", "x", "DELAY", 100)
    assert n("ENQUEUE", a) == 1
    assert n.qlen() == 1
    assert n.show(a)[b"additional-deliveries"] == 0


# ---------------------------------------------------------------------------------------------
# WORKING


def test_working_dequeues_and_returns_retry(n: Node) -> None:
    a = n.add("q", "x", "RETRY", 60, "TTL", 1000)
    assert n("WORKING", a) == 60
    assert n.qlen() == 0
    assert n.show(a)[b"state"] == b"active"


def test_working_postpones_the_requeue(n: Node) -> None:
    a = n.add("q", "x", "RETRY", 60, "TTL", 1000)
    n("GETJOB", "FROM", "q")
    n.run_until(T0 + 50_000)
    assert n("WORKING", a) == 60
    n.run_until(T0 + 60_300)
    assert n.qlen() == 0  # would have been requeued at ~T0+60 s without WORKING
    n.run_until(T0 + 109_000)
    assert n.qlen() == 0
    n.run_until(T0 + 110_300)
    assert n.qlen() == 1
    assert n.show(a)[b"additional-deliveries"] == 1


def test_working_too_late_after_half_the_ttl(n: Node) -> None:
    a = n.add("q", "x", "RETRY", 60, "TTL", 1000)
    n("GETJOB", "FROM", "q")
    n.run_until(T0 + 500_000)
    assert n("WORKING", a) == 60
    n.run_until(T0 + 500_001)
    reply = n("WORKING", a)
    assert isinstance(reply, Error)
    assert reply == ("TOOLATE Half of job TTL already elapsed, you are no longer allowed to "
                     "postpone the next delivery.")


def test_working_errors_and_at_most_once(n: Node) -> None:
    assert n("WORKING", b"D-" + b"0" * 8 + b"-" + b"A" * 24 + b"-0001").startswith("NOJOB")
    assert n("WORKING", "bad").startswith("BADID")
    a = n.add("q", "x", "RETRY", 0)
    assert n("WORKING", a) == 0
    assert n.show(a)[b"next-requeue-within"] is None


# ---------------------------------------------------------------------------------------------
# Blocked GETJOB


def test_blocked_clients_are_served_in_arrival_order_one_job_each(n: Node) -> None:
    c1, c2, c3 = Client(1), Client(2), Client(3)
    assert n("GETJOB", "FROM", "q", client=c1) is BLOCKED
    assert n("GETJOB", "COUNT", 10, "FROM", "q", client=c2) is BLOCKED
    assert n("GETJOB", "FROM", "q", client=c3) is BLOCKED
    assert n.replies == []
    a = n.add("q", "A")
    assert n.take_replies() == [(c1, [[b"q", a, b"A"]])]
    assert n.qlen() == 0
    b = n.add("q", "B")
    c = n.add("q", "C")
    d = n.add("q", "D")
    assert n.take_replies() == [(c2, [[b"q", b, b"B"]]), (c3, [[b"q", c, b"C"]])]
    assert n.qlen() == 1
    assert ids_of(n("QPEEK", "q", 10)) == [d]
    for j in (a, b, c):
        assert n.show(j)[b"state"] == b"active"


def test_blocked_client_gets_one_job_when_several_arrive_at_once(n: Node) -> None:
    a, b = n.add(), n.add()
    n("GETJOB", "COUNT", 2, "FROM", "q")
    c = Client(5)
    assert n("GETJOB", "COUNT", 5, "WITHCOUNTERS", "FROM", "q", client=c) is BLOCKED
    assert n("NACK", a, b) == 2
    assert n.take_replies() == [(c, [[b"q", a, b"body", b"nacks", 1, b"additional-deliveries", 0]])]
    assert n.qlen() == 1


def test_blocked_on_several_queues_is_served_once(n: Node) -> None:
    c = Client(7)
    assert n("GETJOB", "FROM", "a", "b", client=c) is BLOCKED
    j = n.add("b", "x")
    assert n.take_replies() == [(c, [[b"b", j, b"x"]])]
    n.add("a", "y")
    assert n.take_replies() == []
    assert n.qlen("a") == 1


def test_blocked_timeout_replies_null_at_the_right_time(n: Node) -> None:
    c1, c2 = Client(1), Client(2)
    assert n("GETJOB", "TIMEOUT", 2000, "FROM", "q", client=c1) is BLOCKED
    assert n("GETJOB", "TIMEOUT", 500, "FROM", "q", client=c2) is BLOCKED
    n.run_until(T0 + 499)
    assert n.take_replies() == []
    n.run_until(T0 + 500)
    assert n.take_replies() == [(c2, NULL_ARRAY)]
    n.run_until(T0 + 1999)
    assert n.take_replies() == []
    n.run_until(T0 + 2000)
    assert n.take_replies() == [(c1, NULL_ARRAY)]
    n.add()
    assert n.take_replies() == []
    assert n.qlen() == 1


def test_blocked_timeout_with_one_late_tick(n: Node) -> None:
    c = Client(3)
    assert n("GETJOB", "TIMEOUT", 100, "FROM", "q", client=c) is BLOCKED
    n.tick(T0 + 99)
    assert n.take_replies() == []
    n.tick(T0 + 5000)
    assert n.take_replies() == [(c, NULL_ARRAY)]


def test_served_client_does_not_time_out_later(n: Node) -> None:
    c = Client(3)
    assert n("GETJOB", "TIMEOUT", 1000, "FROM", "q", client=c) is BLOCKED
    n.add()
    assert len(n.take_replies()) == 1
    n.run_until(T0 + 5000)
    assert n.take_replies() == []


def test_client_gone_drops_the_waiter(n: Node) -> None:
    c1, c2 = Client(1), Client(2)
    assert n("GETJOB", "FROM", "q", client=c1) is BLOCKED
    assert n("GETJOB", "TIMEOUT", 1000, "FROM", "q", client=c2) is BLOCKED
    n.b.client_gone(c1)
    n.b.client_gone(c2)
    qstat = n("QSTAT", "q")
    assert qstat[qstat.index(b"blocked") + 1] == 0
    j = n.add()
    assert n.take_replies() == []
    assert n.qlen() == 1
    assert n.show(j)[b"state"] == b"queued"
    n.run_until(T0 + 2000)
    assert n.take_replies() == []


def test_pause_out_holds_jobs_back_from_blocked_clients(n: Node) -> None:
    c = Client(4)
    assert n("GETJOB", "FROM", "q", client=c) is BLOCKED
    assert n("PAUSE", "q", "out") == Status("out")
    j = n.add()
    assert n.take_replies() == []
    assert n.qlen() == 1
    assert n("GETJOB", "NOHANG", "FROM", "q") is NULL_ARRAY
    assert n("PAUSE", "q", "none") == Status("none")
    assert n.take_replies() == [(c, [[b"q", j, b"body"]])]
    assert n.qlen() == 0


def test_pause_in_refuses_addjob(n: Node) -> None:
    n.add()
    assert n("PAUSE", "q", "in") == Status("in")
    before = n.jobs()
    reply = n("ADDJOB", "q", "x", 0)
    assert reply == Error("PAUSED Queue paused in input, try later")
    assert n.jobs() == before
    assert n.qlen() == 1
    assert len(n("GETJOB", "FROM", "q")) == 1  # output still works
    assert n("PAUSE", "q", "out") == Status("out")  # replaces, not ORs
    assert n("ADDJOB", "q", "x", 0).startswith("D-")


def test_pause_in_postpones_requeue(n: Node) -> None:
    a = n.add("q", "x", "RETRY", 10)
    n("GETJOB", "FROM", "q")
    n("PAUSE", "q", "in")
    n.run_until(T0 + 15_000)
    assert n.qlen() == 0
    n("PAUSE", "q", "none")
    n.run_until(T0 + 30_000)
    assert n.qlen() == 1
    assert n.show(a)[b"additional-deliveries"] == 1


# ---------------------------------------------------------------------------------------------
# GETJOB order, QPEEK


def test_getjob_count_is_round_robin_left_to_right(n: Node) -> None:
    a1, a2, a3 = n.add("a", "a1"), n.add("a", "a2"), n.add("a", "a3")
    b1 = n.add("b", "b1")
    c1, c2 = n.add("c", "c1"), n.add("c", "c2")
    reply = n("GETJOB", "COUNT", 5, "FROM", "a", "b", "c")
    assert ids_of(reply) == [a1, b1, c1, a2, c2]
    assert [e[0] for e in reply] == [b"a", b"b", b"c", b"a", b"c"]
    assert ids_of(n("GETJOB", "COUNT", 5, "FROM", "c", "b", "a")) == [a3]


def test_getjob_skips_paused_queues_and_creates_missing_ones(n: Node) -> None:
    a = n.add("a")
    b = n.add("b")
    n("PAUSE", "a", "out")
    assert ids_of(n("GETJOB", "COUNT", 5, "FROM", "a", "b")) == [b]
    assert n("GETJOB", "NOHANG", "FROM", "new") is NULL_ARRAY
    assert n("QSTAT", "new") is not NULL_ARRAY
    assert n.show(a)[b"state"] == b"queued"


def test_queue_order_is_creation_time(n: Node) -> None:
    a, b, c = n.add(), n.add(), n.add()
    assert ids_of(n("GETJOB", "COUNT", 2, "FROM", "q")) == [a, b]
    n("ENQUEUE", b)
    n("ENQUEUE", a)
    assert ids_of(n("QPEEK", "q", 10)) == [a, b, c]
    assert ids_of(n("QPEEK", "q", 2)) == [a, b]
    assert ids_of(n("QPEEK", "q", -2)) == [c, b]
    assert ids_of(n("QPEEK", "q", -10)) == [c, b, a]
    assert n("QPEEK", "q", 0) == []
    assert n("QPEEK", "missing", 3) == []
    assert n("QPEEK", "q", "x").startswith("ERR")
    assert ids_of(n("GETJOB", "COUNT", 3, "FROM", "q")) == [a, b, c]


def test_queue_order_ties_broken_by_id() -> None:
    src = Node()
    ids = [src.add() for _ in range(5)]
    records = [r for _, r in src.b.snapshot()]
    for r in records:
        r[8] = records[0][8]  # same ctime for all
    dst = Node(T0 + 10)
    for r in reversed(records):
        dst.b.load_record(("job", r), dst.now)
    dst.b.finish_load(dst.now, True)
    assert ids_of(dst("QPEEK", "q", 10)) == sorted(ids)


# ---------------------------------------------------------------------------------------------
# Idle queue eviction


def test_idle_empty_queue_is_evicted_after_300_s(n: Node) -> None:
    a = n.add("q")
    n("GETJOB", "FROM", "q")
    n("ACKJOB", a)
    assert n.queues() == 1
    n.run_until(T0 + 299_000)
    assert n.queues() == 1
    assert n("QSCAN", "BUSYLOOP")[1] == [b"q"]
    n.run_until(T0 + 301_000)
    assert n.queues() == 0
    assert n("QSCAN", "BUSYLOOP")[1] == []
    assert n("QSTAT", "q") is NULL_ARRAY


def test_queue_access_delays_eviction(n: Node) -> None:
    a = n.add("q", "x", "TTL", 1000, "RETRY", 0)
    n.run_until(T0 + 200_000)
    n("GETJOB", "FROM", "q")  # a fetch counts as access
    n("ACKJOB", a)
    n.run_until(T0 + 400_000)
    assert n.queues() == 1
    n.run_until(T0 + 501_000)
    assert n.queues() == 0


def test_paused_or_waited_on_queues_are_not_evicted(n: Node) -> None:
    n("PAUSE", "p", "in")
    waiting = Client(2)
    assert n("GETJOB", "FROM", "w", client=waiting) is BLOCKED
    n("GETJOB", "NOHANG", "FROM", "plain")
    assert n.queues() == 3
    n.run_until(T0 + 700_000)
    assert n.queues() == 2
    names = sorted(n("QSCAN", "BUSYLOOP")[1])
    assert names == [b"p", b"w"]
    # once the client goes and the pause is cleared, they become evictable
    n.b.client_gone(waiting)
    n("PAUSE", "p", "none")
    n.run_until(T0 + 702_000)
    assert n.queues() == 0


def test_queue_holding_jobs_is_not_evicted(n: Node) -> None:
    j = n.add("q", "x", "TTL", 1000)
    n.run_until(T0 + 400_000)
    assert n.queues() == 1
    assert n.show(j)[b"state"] == b"queued"


# ---------------------------------------------------------------------------------------------
# QSCAN / JSCAN


def _scan_all(n: Node, cmd: str, between=None, count: int = 10) -> tuple[set[bytes], int]:
    seen: set[bytes] = set()
    cursor = b"0"
    calls = 0
    while True:
        calls += 1
        assert calls < 100_000
        reply = n(cmd, cursor, "COUNT", count)
        cursor, items = reply
        seen.update(bytes(x, "ascii") if isinstance(x, str) else x for x in items)
        if cursor == b"0":
            return seen, calls
        if between is not None:
            between(calls)


def test_jscan_returns_every_job(n: Node) -> None:
    ids = {n.add("q", str(i)) for i in range(250)}
    seen, _ = _scan_all(n, "JSCAN")
    assert seen == ids
    reply = n("JSCAN", "BUSYLOOP", "STATE", "queued")
    assert reply[0] == b"0" and len(reply[1]) == 250
    assert all(type(x) is Status for x in reply[1])


def test_jscan_skips_nothing_when_jobs_are_deleted_mid_scan(n: Node) -> None:
    ids = [n.add("q", str(i), "TTL", 3600) for i in range(3000)]
    stay = set(ids[::3])
    goners = [j for j in ids if j not in stay]
    epoch_before = n.b.job_scan._epoch

    def delete_some(calls: int) -> None:
        if goners:
            # oldest first: compaction then moves the survivors the cursor has not reached yet
            batch = [goners.pop(0) for _ in range(min(150, len(goners)))]
            assert n("DELJOB", *batch) == len(batch)

    seen, _ = _scan_all(n, "JSCAN", delete_some, count=25)
    assert not goners
    assert n.b.job_scan._epoch > epoch_before, "the test did not force a compaction"
    assert stay <= seen
    assert n.jobs() == len(stay)


def test_jscan_skips_nothing_when_jobs_are_added_and_deleted(n: Node) -> None:
    ids = [n.add("q", str(i)) for i in range(2400)]
    stay = set(ids[::3])
    goners = [j for j in ids if j not in stay]
    added: list[bytes] = []

    def churn(calls: int) -> None:
        for _ in range(100):
            if goners:
                n("ACKJOB", goners.pop(0))
        added.append(n.add("q", "new"))

    epoch_before = n.b.job_scan._epoch
    seen, _ = _scan_all(n, "JSCAN", churn, count=30)
    assert n.b.job_scan._epoch > epoch_before, "the test did not force a compaction"
    assert stay <= seen  # jobs added meanwhile may or may not be returned


def test_qscan_skips_nothing_when_queues_are_evicted_mid_scan(n: Node) -> None:
    keep = set()
    for i in range(3500):
        if i % 4 == 3:  # survivors spread over the whole scan order
            keep.add(f"keep{i}".encode())
            n("PAUSE", f"keep{i}", "in")
        else:
            n("GETJOB", "NOHANG", "FROM", f"gone{i}")
    assert len(keep) == 875
    assert n.queues() == 3500
    epoch_before = n.b.queue_scan._epoch

    def evict(calls: int) -> None:
        if calls == 20:
            n.run_until(T0 + 301_000)
            assert n.queues() == len(keep)

    seen, _ = _scan_all(n, "QSCAN", evict, count=50)
    assert n.b.queue_scan._epoch > epoch_before, "the test did not force a compaction"
    assert keep <= seen


# ---------------------------------------------------------------------------------------------
# Refused commands change nothing


def _state(n: Node) -> tuple:
    return (n.jobs(), n.queues(), n.qlen(), len(n.log), n("QSCAN", "BUSYLOOP")[1])


def test_refused_addjob_changes_nothing(n: Node) -> None:
    n.log.clear()  # only what follows is under test
    n.add()
    n.add()
    n.log.clear()
    before = _state(n)
    refusals = [
        (("ADDJOB", "q", "x", 0, "MAXLEN", 2), "MAXLEN Queue is already longer than the specified MAXLEN count"),
        (("ADDJOB", "q", "x", 0, "REPLICATE", 2), "NOREPL Not enough reachable nodes for the requested replication level"),
        (("ADDJOB", "other", "x", 0, "REPLICATE", 3), "NOREPL Not enough reachable nodes for the requested replication level"),
        (("ADDJOB", "q", "x", 0, "DELAY", 10, "TTL", 10), "ERR The specified DELAY is greater than TTL. Job refused since would never be delivered"),
        (("ADDJOB", "q", "x", 0, "RETRY", 0, "REPLICATE", 2), "ERR With RETRY set to 0 please explicitly set  REPLICATE to 1 (at-most-once delivery)"),
        (("ADDJOB", "q", "x", -1), "ERR timeout is negative"),
        (("ADDJOB", "q", "x", 0, "TTL"), "ERR syntax error"),
    ]
    for argv, text in refusals:
        reply = n(*argv)
        assert reply == Error(text), argv
        assert _state(n) == before, argv
    n("PAUSE", "q", "in")
    n.log.clear()
    before = _state(n)
    assert n("ADDJOB", "q", "x", 0) == Error("PAUSED Queue paused in input, try later")
    assert n("ADDJOB", "q", "x", 0, "MAXLEN", 1).startswith("MAXLEN")  # MAXLEN checked first
    assert _state(n) == before
    n("PAUSE", "q", "none")
    n("CLUSTER", "LEAVING", "yes")
    n.log.clear()
    before = _state(n)
    assert n("ADDJOB", "new", "x", 0) == Error(
        "NOREPL Not enough reachable nodes for the requested replication level, since I'm "
        "unable to hold a copy of the message for the following reason: I'm leaving the cluster")
    assert _state(n) == before


def test_refused_getjob_changes_nothing(n: Node) -> None:
    n.add()
    before = _state(n)
    assert n("GETJOB", "COUNT", 0, "FROM", "q").startswith("ERR")
    assert n("GETJOB", "TIMEOUT", -1, "FROM", "q").startswith("ERR")
    assert n("GETJOB", "FROM") == Error("ERR syntax error")
    assert _state(n) == before


# ---------------------------------------------------------------------------------------------
# Append-log hooks


def test_addjob_logs_a_job_record_and_undo_removes_it(n: Node) -> None:
    n.log.clear()  # only what follows is under test
    a = n.add()
    assert len(n.log) == 1
    kind, record, prev = n.log[0]
    assert kind == "job" and prev is None
    assert record[0] == a and record[3] == "queued"
    n.b.undo_entry(n.log.pop(), n.now)
    assert n.show(a) is None
    assert n.qlen() == 0
    assert n.jobs() == 0
    assert n("GETJOB", "NOHANG", "FROM", "q") is NULL_ARRAY
    n.run_until(T0 + 400_000)
    assert n.jobs() == 0 and n.qlen() == 0


def test_ackjob_logs_and_undo_puts_the_queued_job_back(n: Node) -> None:
    a, b = n.add(), n.add()
    n.log.clear()  # only what follows is under test
    assert n("ACKJOB", a) == 1
    assert len(n.log) == 1
    kind, payload, prev = n.log[0]
    assert kind == "ack" and payload == a
    assert prev is not None and prev[0] == a and prev[3] == "queued"
    n.b.undo_entry(n.log.pop(), n.now)
    s = n.show(a)
    assert s is not None and s[b"state"] == b"queued"
    assert n.qlen() == 2
    assert ids_of(n("QPEEK", "q", 10)) == [a, b]
    assert n.jobs() == 2
    assert ids_of(n("GETJOB", "FROM", "q")) == [a]
    # and it is a normal job again: requeued after its retry, ackable
    n.run_until(T0 + 300_300)
    assert n.show(a)[b"state"] == b"queued"
    assert n("ACKJOB", a) == 1


def test_undo_ackjob_of_a_delivered_job_keeps_its_requeue_time(n: Node) -> None:
    a = n.add()
    qtime = _requeue_at(n, a)
    n("GETJOB", "FROM", "q")
    n.log.clear()  # only what follows is under test
    n("ACKJOB", a)
    n.b.undo_entry(n.log.pop(), n.now)
    assert n.show(a)[b"state"] == b"active"
    assert n.qlen() == 0
    n.run_until(qtime - 1)
    assert n.qlen() == 0
    n.run_until(T0 + 300_300)
    assert n.qlen() == 1


def test_undo_ackjob_serves_a_client_that_blocked_meanwhile(n: Node) -> None:
    """The ACK's write failed, so the job is back in its queue: a client that blocked on the
    queue in the meantime must get it, as after any other command that makes a queue ready
    (semantics §1b step 8), instead of waiting while the job sits in the queue."""
    a = n.add()
    n.log.clear()  # only what follows is under test
    n("ACKJOB", a)
    entry = n.log.pop()
    c = Client(8)
    assert n("GETJOB", "FROM", "q", client=c) is BLOCKED
    n.b.undo_entry(entry, n.now)
    assert n.take_replies() == [(c, [[b"q", a, b"body"]])]
    assert n.qlen() == 0


def test_other_commands_log_and_undo(n: Node) -> None:
    n.log.clear()  # only what follows is under test
    a, b = n.add(), n.add()
    n.log.clear()
    assert n("DELJOB", a) == 1
    kind, payload, prev = n.log.pop()
    assert (kind, payload) == ("del", a)
    n.b.undo_entry((kind, payload, prev), n.now)
    assert n.show(a)[b"state"] == b"queued"
    n("GETJOB", "FROM", "q")
    n.log.clear()
    assert n("NACK", a) == 1
    entry = n.log.pop()
    assert entry[0] == "job" and entry[1][10] == 1  # nacks
    n.b.undo_entry(entry, n.now)
    s = n.show(a)
    assert s[b"state"] == b"active" and s[b"nacks"] == 0
    assert ids_of(n("QPEEK", "q", 10)) == [b]


def test_ttl_expiry_is_logged(n: Node) -> None:
    n.log.clear()  # only what follows is under test
    a = n.add("q", "x", "TTL", 10)
    n.log.clear()
    n.run_until(T0 + 11_000)
    assert [(k, p) for k, p, _ in n.log] == [("del", a)]


# ---------------------------------------------------------------------------------------------
# Loading


def _loaded(records: list, at: int, once: bool) -> Node:
    dst = Node(at)
    for r in records:
        dst.b.load_record(r, at)
    dst.b.finish_load(at, once)
    return dst


def _source() -> tuple[Node, dict[str, bytes]]:
    src = Node()
    jobs = {
        "delivered": src.add("q", "0", "RETRY", 10),
        "amo_delivered": src.add("q", "1", "RETRY", 0),
    }
    src("GETJOB", "COUNT", 2, "FROM", "q")
    jobs.update({
        "queued1": src.add("q", "2", "RETRY", 10),
        "queued2": src.add("q", "3", "RETRY", 10),
        "delayed": src.add("q", "4", "RETRY", 10, "DELAY", 5),
        "amo_queued": src.add("q", "5", "RETRY", 0),
        "acked": src.add("q", "6", "RETRY", 10),
    })
    src("ACKJOB", jobs["acked"])
    assert src.qlen() == 3
    return src, jobs


def test_normal_load_does_not_trust_the_queues() -> None:
    src, jobs = _source()
    records = list(src.b.snapshot())
    t1 = T0 + 60_000
    dst = _loaded(records, t1, False)
    assert dst.jobs() == 6
    assert dst.show(jobs["acked"]) is None
    assert dst.qlen() == 0
    assert all(dst.show(j)[b"state"] == b"active" for k, j in jobs.items() if k != "acked")
    assert dst("GETJOB", "NOHANG", "FROM", "q") is NULL_ARRAY
    dst.run_until(t1 + 10_000 - 251)
    assert dst.qlen() == 0
    dst.run_until(t1 + 10_300)
    back = set(ids_of(dst("QPEEK", "q", 10)))
    assert back == {jobs["delivered"], jobs["queued1"], jobs["queued2"]}
    dst.run_until(t1 + 15_300)  # delay + retry
    back = set(ids_of(dst("QPEEK", "q", 10)))
    assert back == {jobs["delivered"], jobs["queued1"], jobs["queued2"], jobs["delayed"]}
    dst.run_until(t1 + 200_000)
    assert dst.show(jobs["amo_queued"])[b"state"] == b"active"
    assert dst.show(jobs["amo_delivered"])[b"state"] == b"active"
    assert dst.qlen() == 4
    # counters and bodies survived
    assert dst.show(jobs["queued1"])[b"body"] == b"2"


def test_controlled_restart_restores_queues_exactly() -> None:
    src, jobs = _source()
    records = list(src.b.snapshot())
    dst = _loaded(records, T0 + 60_000, True)
    assert dst.qlen() == src.qlen() == 3
    assert dst("QPEEK", "q", 10) == src("QPEEK", "q", 10)
    assert dst.show(jobs["delivered"])[b"state"] == b"active"
    got = ids_of(dst("GETJOB", "COUNT", 10, "FROM", "q"))
    assert got == [jobs["queued1"], jobs["queued2"], jobs["amo_queued"]]
    dst.run_until(T0 + 200_000)
    # the at-most-once job, once delivered, never comes back
    assert jobs["amo_queued"] not in ids_of(dst("QPEEK", "q", 10))


def test_load_replays_the_log_and_skips_expired_jobs() -> None:
    src = Node()
    src.log.clear()  # only what follows is under test
    a = src.add("q", "a", "TTL", 100)
    b = src.add("q", "b")
    c = src.add("q", "c")
    src("ACKJOB", b)
    src("DELJOB", c)
    log = [(k, p) for k, p, _ in src.log]
    dst = _loaded(log, T0 + 100_000, False)
    assert dst.show(a) is None  # expired while down
    assert dst.show(b) is None and dst.show(c) is None
    assert dst.jobs() == 0
    dst = _loaded(log, T0 + 50_000, True)
    assert ids_of(dst("QPEEK", "q", 10)) == [a]


# ---------------------------------------------------------------------------------------------
# QSTAT counters, pause and delayed jobs


def _qstat(n: Node, queue: str = "q") -> dict[bytes, object]:
    reply = n("QSTAT", queue)
    return dict(zip(reply[::2], reply[1::2], strict=True))


def test_qstat_counts_queueings_and_fetches(n: Node) -> None:
    a, b = n.add(), n.add()
    n("GETJOB", "FROM", "q")  # a
    n("NACK", a)  # in 3
    n("WORKING", b)  # dequeued, not a fetch
    n("DEQUEUE", a)
    s = _qstat(n)
    assert (s[b"len"], s[b"jobs-in"], s[b"jobs-out"]) == (0, 3, 1)
    c = Client(2)
    n("GETJOB", "FROM", "q", client=c)
    assert _qstat(n)[b"blocked"] == 1
    n("ENQUEUE", a)
    s = _qstat(n)
    assert (s[b"len"], s[b"jobs-in"], s[b"jobs-out"], s[b"blocked"]) == (0, 4, 2, 0)
    assert n("QSTAT", "missing") is NULL_ARRAY


def test_pause_in_still_queues_a_delayed_at_most_once_job(n: Node) -> None:
    amo = n.add("q", "x", "RETRY", 0, "DELAY", 3)
    retried = n.add("q", "y", "RETRY", 10, "DELAY", 3)
    n("PAUSE", "q", "in")
    n.run_until(T0 + 3_000)
    assert ids_of(n("QPEEK", "q", 10)) == [amo]
    assert n.show(retried)[b"state"] == b"active"
    n("PAUSE", "q", "none")
    n.run_until(T0 + 13_300)
    assert n.show(retried)[b"state"] == b"queued"
