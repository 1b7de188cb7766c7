"""Issue 15 case 6: a deleted job, its body above all, is freed at once.

Before the fix the timer wheel held every job object until its next timer (its retry time, or
its TTL for RETRY 0), so 20,000 x 10 KB jobs added and acknowledged kept 200 MB alive for five
minutes, and with the RSS-based ``maxmemory`` ADDJOB was refused while the node held no job.
"""

from __future__ import annotations

import gc

import pytest

from broker.job import Job
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
