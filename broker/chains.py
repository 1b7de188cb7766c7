"""Chained jobs: ``ADDJOB ... AFTER id [AFTER id ...]`` (sans-IO).

Theory of operation
-------------------
A chained job (the *child*) is created and replicated like any other, but while its
``Job.after`` names parents that are not done it *waits*: ACTIVE with no retry armed
(``qtime`` 0), never queued (``Broker.enqueue_job`` refuses it), shown by SHOW as state
``waiting`` with its ``after`` list. Every holder of the child watches the parents through
the outcome table (``broker/results.py``, ``ResultTable.children``): a parent held here tells
it when it ends, and one held elsewhere is asked of the cluster (``ResultSync.ask``), again
every second until it is known.

When a parent is acked or resolved it leaves ``after`` (logged). When the last one has, the
child is released: its origin (the node its ID names, or the only holder) queues it, after
its DELAY if it has one, and the other holders arm their retry as replicas do, so a child
whose origin is down is queued after RETRY. When a parent expired, was deleted or
dead-lettered, or no node knows it (no proof it succeeded), the child goes to the dead-letter
queue of its queue's policy (the reason kept as the dead letter's note: ``QPOLICY ORIGIN`` and
SHOW give it) or, with none, is deleted everywhere (FASTACK).
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from broker import results
from broker.dead_letters import move_to_dead_letters
from broker.effects import LogRecord
from broker.job import Job, JobState
from broker.policy_table import RECORD_KIND, PolicyBroker

WAITING: Final = b"waiting"  # SHOW's state of a job held for its parents


class ChainBroker(results.ResultBroker, PolicyBroker, Protocol):
    """The broker with its outcome table and its queue policies."""


def hold(b: ChainBroker, job: Job, parents: tuple[bytes, ...], now_ms: int) -> None:
    """A new job (or a replica) with parents: it waits. Parents already done here are
    applied at once by ``watch``, which the caller runs once the job is registered."""
    job.after = parents
    job.qtime = 0


def watch(b: ChainBroker, job: Job, now_ms: int) -> None:
    """Follow the parents of a registered waiting ``job``; those already known are applied."""
    table = b.results
    for parent in job.after:
        table.children.setdefault(parent, set()).add(job.id)
        if parent not in table.outcomes and parent not in b.jobs and table.sync is not None:
            table.sync.ask(parent, now_ms)
    for parent in job.after:
        outcome = table.outcomes.get(parent)
        if outcome is not None:
            parent_ended(b, parent, outcome, now_ms)
        elif parent not in b.jobs and table.sync is None:
            # One node that does not know the parent: nothing says it succeeded (never added,
            # gone before this child came, or acked without an outcome kept), and waiting
            # would be forever: the child fails (docs/semantics.md, "Unknown parents").
            parent_ended(b, parent, [results.UNKNOWN_PARENT, b"", 0], now_ms)
        if b.jobs.get(job.id) is not job or not job.after:
            return


def parent_ended(b: ChainBroker, parent: bytes, outcome: list[Any], now_ms: int) -> None:
    """``parent`` ended with ``outcome``: its waiting children move on."""
    children = b.results.children.pop(parent, None)
    for child_id in sorted(children or ()):
        child = b.jobs.get(child_id)
        if child is None or parent not in child.after or child.state is JobState.ACKED:
            continue
        if outcome[0] == results.RESOLVED or outcome[0] == results.ACKED:
            prev = child.to_record()
            child.after = tuple(p for p in child.after if p != parent)
            if child.after:
                b.log_job(child, prev)
            else:
                _release(b, child, prev, now_ms)
        else:
            _fail(b, child, f"parent {parent.decode('ascii', 'replace')} {outcome[0]}", now_ms)


def _release(b: ChainBroker, job: Job, prev: Any, now_ms: int) -> None:
    origin = (b.replication is None or job.id[2:10] == b.node_id[:8].encode()
              or all(n == b.node_id for n in job.delivered))
    if origin:
        job.qtime = now_ms + job.delay * 1000 if job.delay else now_ms
        if not job.delay:
            b.enqueue_job(job, now_ms)
    elif job.retry:
        job.qtime = b.requeue_time(job, now_ms + job.delay * 1000)
    if b.jobs.get(job.id) is job and job.state is JobState.ACTIVE:
        b.reschedule(job)
    b.log_job(job, prev)


def _fail(b: ChainBroker, job: Job, reason: str, now_ms: int) -> None:
    table = b.policies
    p = table.get(job.queue)
    dlq = table.get(p.redrive[1]) if p is not None and p.redrive is not None else None
    forget(b, job)  # its other parents need not be watched for it any more
    job.after = ()
    if dlq is None:
        b.fastack_jobs((job.id,), now_ms)
        return
    new_id = move_to_dead_letters(b, job, dlq, job.nacks, job.deliveries, now_ms)
    note = (reason, None, "", now_ms)
    table.notes[new_id] = note
    b.outbox.append(LogRecord(RECORD_KIND, ["note", new_id, *note], None))


def forget(b: ChainBroker, job: Job) -> None:
    """A waiting job left the broker: its parents need not be watched for it."""
    children = b.results.children
    for parent in job.after:
        waiting = children.get(parent)
        if waiting is not None:
            waiting.discard(job.id)
            if not waiting:
                del children[parent]
