"""Throttling: a queue's MAXINFLIGHT and RATE (broker/policy_table.py) hold deliveries back.

``QPOLICY SET q MAXINFLIGHT n``: at most n jobs of q delivered and neither acked, nacked nor
queued again. ``QPOLICY SET q RATE n``: at most n deliveries a second. GETJOB skips a queue
that is held back, as if it were empty: it waits (or, with NOHANG, returns nothing), and the
broker's tick serves the clients waiting on such a queue as soon as it is no longer held
back (``Broker.next_deadline`` asks for a tick every ``POLL_MS`` meanwhile).

Both limits are for the whole cluster, kept as per-node shares without messages: a node that
reaches N nodes (itself included) allows ``ceil(n / N)`` jobs in flight and ``n / N``
deliveries a second (a token bucket that holds at most one second's share, or one job). With
every node up the cluster delivers at most ``n`` a second and holds at most ``n + N - 1`` in
flight (exactly ``n`` when N divides n); consumers served by one node only get that node's
share. Under a partition each side counts only the nodes it reaches, so each side allows
about ``n``: the limits degrade towards ``n`` per side, never to zero.

In flight, per queue: the jobs delivered here, each with its counters (nacks + additional
deliveries) at delivery. One still counts while it is registered, ACTIVE, not waiting out a
backoff, and its counters unchanged; an ACK, a NACK, a requeue (here, or told by another
holder with QUEUED) or its removal ends it. The entries are checked when counted, so no hook
is needed on those paths; a GETJOB looks at them only when there are at least as many as the
node's share (below it the answer is known: stale entries only over-count), so a queue under
its limit pays O(1) and one at its limit one pass over at most share + stale entries.

The state is kept per queue whose policy throttles it: ``PolicyTable.put`` drops a queue's
state when its policy stops throttling (MAXINFLIGHT and RATE 0, or deleted), so it is bounded
by the live throttled queues.
"""

from __future__ import annotations

from typing import Final

from broker.job import FLAG_BACKOFF, Job, JobState
from broker.policy_table import PolicyBroker
from broker.queue import Queue

_ACTIVE: Final = JobState.ACTIVE
# How often the tick looks at throttled queues with waiting clients.
POLL_MS: Final = 50


class Throttle:
    """What a node counts for one throttled queue."""

    __slots__ = ("inflight", "tokens", "refilled")

    def __init__(self, now_ms: int) -> None:
        self.inflight: dict[bytes, int] = {}  # job ID -> its nacks + deliveries at delivery
        self.tokens = 1.0
        self.refilled = now_ms


def _state(b: PolicyBroker, queue: bytes, now_ms: int) -> Throttle:
    t: Throttle | None = b.policies.throttle_state.get(queue)
    if t is None:
        t = b.policies.throttle_state[queue] = Throttle(now_ms)
    return t


def inflight(b: PolicyBroker, queue: bytes, now_ms: int) -> int:
    """Jobs of ``queue`` delivered here and still out (the stale entries are dropped)."""
    t = _state(b, queue, now_ms)
    jobs = b.jobs
    live: dict[bytes, int] = {}
    for job_id, counters in t.inflight.items():
        job = jobs.get(job_id)
        if (job is not None and job.state is _ACTIVE and not job.flags & FLAG_BACKOFF
                and job.nacks + job.deliveries == counters):
            live[job_id] = counters
    t.inflight = live
    return len(live)


def nodes(b: PolicyBroker) -> int:
    return 1 + b.reachable_nodes()


def holds(b: PolicyBroker, q: Queue, now_ms: int) -> bool:
    """Whether ``q``'s policy holds its next delivery back now (False without a policy)."""
    p = b.policies.get(q.name)
    if p is None or not (p.max_inflight or p.rate):
        return False
    n = nodes(b)
    if p.max_inflight:
        slots = -(-p.max_inflight // n)
        # Stale entries only over-count, so fewer entries than the share is an answer without
        # looking at them: O(1) below the limit; at it, one pass that drops the stale ones.
        t = _state(b, q.name, now_ms)
        if len(t.inflight) >= slots and inflight(b, q.name, now_ms) >= slots:
            return True
    if p.rate:
        t = _state(b, q.name, now_ms)
        share = p.rate / n
        elapsed = max(0, now_ms - t.refilled)  # the wall clock may step back
        t.tokens = min(max(1.0, share), t.tokens + elapsed * share / 1000)
        t.refilled = max(t.refilled, now_ms)
        if t.tokens < 1.0:
            return True
    return False


def delivered(b: PolicyBroker, job: Job, now_ms: int) -> None:
    """``job`` was just delivered here: count it (only if its queue is throttled)."""
    p = b.policies.get(job.queue)
    if p is None or not (p.max_inflight or p.rate):
        return
    t = _state(b, job.queue, now_ms)
    if p.max_inflight:
        t.inflight[job.id] = job.nacks + job.deliveries
    if p.rate:
        t.tokens -= 1.0


def qstat_fields(b: PolicyBroker, q: Queue, now_ms: int) -> list[object]:
    """QSTAT's ``inflight`` and ``throttled`` of a throttled queue; nothing for the others,
    whose QSTAT stays Disque's."""
    p = b.policies.get(q.name)
    if p is None or not (p.max_inflight or p.rate):
        return []
    return [b"inflight", inflight(b, q.name, now_ms), b"throttled", int(holds(b, q, now_ms))]


def waiting(b: PolicyBroker) -> list[Queue]:
    """The throttled queues with clients waiting and jobs queued (the tick serves them)."""
    out = []
    for name in b.policies.throttle_state:
        q = b.queues.get(name)
        if q is not None and q.waiters and len(q):
            out.append(q)
    return out
