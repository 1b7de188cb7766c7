"""Backoff: a queue's job that failed comes back after a growing wait, not at once.

``QPOLICY SET q BACKOFF base max`` (broker/policy_table.py). When a job of ``q`` is NACKed,
or its RETRY elapses after a delivery, it is queued again after
``min(max, base * 2^(deliveries - 1))`` seconds, +-10 % drawn from the broker's random
generator, where deliveries = 1 + nacks + additional-deliveries (the WITHCOUNTERS fields)
before this failure. Meanwhile the job is ACTIVE with ``qtime`` at the end of the wait (SHOW's
``next-requeue-within``) and flag ``FLAG_BACKOFF``; the NACK or additional delivery is counted
when the wait begins, and ``Broker.enqueue_job`` counts nothing for the queueing that ends it.

On a cluster the node that starts the wait sends QUEUED to the other holders, as a requeue
does: they count the failure and move their own retry time, so they do not queue their copy
meanwhile unless the wait is longer than the job's RETRY.
"""

from __future__ import annotations

from typing import Final

from broker.job import (
    FLAG_BACKOFF,
    FLAG_DELIVERED,
    FLAG_QUEUED_BEFORE,
    FLAG_WILLQUEUE,
    Job,
    JobState,
)
from broker.policy_table import PolicyBroker

JITTER: Final = 0.1
_MAX_SHIFT: Final = 40  # past 2^40 any max (at most INT32_MAX seconds) is reached


def wait_ms(base: int, top: int, deliveries: int, draw: float) -> int:
    """The wait before the next queueing (ms): ``draw`` in [0, 1) gives the jitter."""
    shift = min(max(deliveries - 1, 0), _MAX_SHIFT)
    wait = min(top * 1000, (base * 1000) << shift)
    return wait + int(wait * JITTER * (2 * draw - 1))


def start(b: PolicyBroker, job: Job, now_ms: int, nack: bool) -> bool:
    """Called instead of queueing ``job`` again (NACK, or its RETRY elapsed), only while some
    policy has a backoff. True: the job now waits (or already waited) and must not be queued."""
    p = b.policies.get(job.queue)
    if p is None or p.backoff is None or job.state is not JobState.ACTIVE or not job.retry:
        return False
    if job.flags & FLAG_BACKOFF:
        return nack  # a NACK while it waits changes nothing; its own timer ends the wait
    if (not nack and job.delay and not job.flags & (FLAG_QUEUED_BEFORE | FLAG_DELIVERED)
            and not job.nacks + job.deliveries):
        return False  # the end of a DELAY: the first queueing, not a failure
    if not job.qtime:
        return False
    base, top = p.backoff
    wait = wait_ms(base, top, 1 + job.nacks + job.deliveries, b.rng.random())
    if b.replication is not None and len(job.delivered) > 1:
        b.replication.queued(job, nack)
    q = b.queues.get(job.queue)
    if nack:
        job.nacks += 1
        if q is not None:
            q.nacks += 1
    else:
        job.deliveries += 1
        if q is not None:
            q.requeues += 1
    job.flags |= FLAG_BACKOFF | FLAG_WILLQUEUE | FLAG_QUEUED_BEFORE
    job.qtime = now_ms + wait
    b.reschedule(job)
    return True
