"""A deleted job, its body above all, is freed at once.

Before the fix the timer wheel held every job object until its next timer (its retry time, or
its TTL for RETRY 0), so 20,000 x 10 KB jobs added and acknowledged kept 200 MB alive for five
minutes, and with the RSS-based ``maxmemory`` ADDJOB was refused while the node held no job.
"""

from __future__ import annotations

import gc

import pytest

from broker.clients import BLOCKED, Client
from broker.job import Job
from broker.timers import Timed, TimerWheel
from tests.broker.harness import Node


def _bodies_alive(marker: bytes) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Job and o.body.startswith(marker))


@pytest.mark.parametrize("verb, opts", [
    ("ACKJOB", ()), ("FASTACK", ()), ("DELJOB", ()), ("FASTACK", ("RETRY", 0)),
])
def test_deleted_jobs_keep_no_body(verb: str, opts: tuple[object, ...]) -> None:
    n = Node()
    marker = b"released-%s-" % verb.encode()
    ids = [n.add("q", (marker + b"x" * 100).decode(), *opts) for _ in range(3000)]
    for job_id in ids[:2000]:
        n("GETJOB", "NOHANG", "FROM", "q")
        assert n(verb, job_id) == 1
    assert _bodies_alive(marker) == 1000  # the 1000 not deleted, and only those
    for job_id in ids[2000:]:
        assert n(verb, job_id) == 1
    assert _bodies_alive(marker) == 0
    assert n.jobs() == 0


def test_timers_of_deleted_jobs_are_skipped() -> None:
    """A deleted job's timer goes with it; the job still held is served by its own timer."""
    n = Node()
    acked = n.add("q", "a", "RETRY", 1)
    assert n("ACKJOB", acked) == 1
    kept = n.add("q", "b", "RETRY", 1)
    n("GETJOB", "NOHANG", "FROM", "q")
    n.run_until(n.now + 3000)
    assert n.jobs() == 1 and n.qlen() == 1  # the kept job came back after its retry
    assert n.show(acked) is None and n.show(kept) is not None


def test_next_deadline_never_asks_for_a_time_already_ticked() -> None:
    """A job due later inside the timer bucket just run must not make the driver spin: the
    next deadline is after the last tick (found by the mock-clock node test, which hung)."""
    n = Node()
    n.add("q", "x", "DELAY", 1)  # due 1 s from now, wherever that falls in its bucket
    due = n.b.next_deadline()
    assert due is not None
    n.tick(due)  # the bucket's start: the job may not be due yet
    for _ in range(20):
        nxt = n.b.next_deadline()
        assert nxt is not None and nxt > n.now
        n.tick(nxt)
        if n.qlen() == 1:
            break
    assert n.qlen() == 1


@pytest.mark.parametrize("verb, opts", [
    ("ACKJOB", ()), ("FASTACK", ()), ("DELJOB", ()), ("DELJOB", ("RETRY", 0)),
    ("NACK", ()),
])
def test_the_timer_wheel_holds_only_live_jobs(verb: str, opts: tuple[object, ...]) -> None:
    """Every job has one timer entry while it lives and none once it is gone, however often
    it was rescheduled (a NACKed job is requeued: its entry moves)."""
    n = Node()
    ids = [n.add("q", "x", *opts) for _ in range(2000)]
    assert len(n("GETJOB", "NOHANG", "COUNT", 2000, "FROM", "q")) == 2000
    for job_id in ids:
        assert n(verb, job_id) == 1
    live = 2000 if verb == "NACK" else 0
    assert n.jobs() == live and len(n.b.timers) == live
    assert sorted(i.id for _, i in n.b.timers.entries()) == sorted(n.b.jobs)  # type: ignore[attr-defined]


def test_a_served_blocked_getjob_leaves_no_timer() -> None:
    n = Node()
    other = Client(2)
    for _ in range(100):
        assert n("GETJOB", "TIMEOUT", 3_600_000, "FROM", "w", client=other) is BLOCKED
        job_id = n.add("w", "x")
        assert n.replies[-1].client is other
        assert n("ACKJOB", job_id) == 1
    assert len(n.b.timers) == 0 and n.b.blocked_clients == 0


def test_the_wheel_moves_cancels_and_stays_bounded() -> None:
    wheel = TimerWheel()
    items = [Timed() for _ in range(3000)]
    for i, item in enumerate(items):
        wheel.schedule(item, 1_000 + i * 100)
        wheel.schedule(item, 2_000_000 + i * 100)  # moved: one live entry
        wheel.schedule(item, 1_000 + i * 100)  # and back: still one
    assert len(wheel) == 3000 and len(list(wheel.entries())) == 3000
    assert wheel.stale() <= len(wheel) + 1024
    for item in items[:2999]:
        wheel.cancel(item)
        wheel.cancel(item)  # twice: nothing
    assert len(wheel) == 1
    # Stale entries never outnumber the live ones by more than the slack.
    assert wheel.stale() <= 1 + 1024
    due = wheel.pop_due(3_000_000)
    assert [items_ for _, items_ in due] == [[items[2999]]]
    assert len(wheel) == 0 and wheel.pop_due(10**12) == []
    assert wheel.stale() == 0
