"""What the broker asks of the cluster's federation core, and the job moves federation makes.

Theory of operation
-------------------
Federation (Disque's README, "Federation"; ``queue.c``'s ``needJobsForQueue``,
``receiveNeedJobs``, ``receiveYourJobs``) moves queued jobs towards the nodes where
consumers wait. The messages (NEEDJOBS, YOURJOBS), the per-queue backoff state and the
import rate belong to ``cluster.federation.FederationCore``; the broker may not import
``cluster``, so it calls that core through the ``Federation`` Protocol below, held in
``Broker.federation``. ``None`` (the default) is a node without a cluster bus: every path is
then the single-node one, byte for byte (QSTAT shows ``import-from`` empty and
``import-rate`` 0, INFO has no federation fields).

The broker calls ``need_jobs`` where Disque calls ``needJobsForQueue``: a GETJOB finds a
queue empty (``reached_zero`` False), and a job taken by GETJOB or by a blocked client
leaves its queue empty, or at its ``low_water`` mark if the core set one (``reached_zero``
True); and ``job_queued`` when a job is queued with
no client here to take it, so a node that asked for the queue lately gets it without asking
again. The core only emits messages and updates its own state; it never calls back into a
broker command.

The two functions below are the only job changes federation makes, each with its append-log
record, so every state change of a job still happens in ``broker/``:

* ``export_jobs`` (the node answering NEEDJOBS): the oldest jobs leave the local queue.
  At-least-once jobs stay here ACTIVE with their retry armed, so a lost YOURJOBS is
  recovered by the normal requeue; at-most-once jobs (RETRY 0) are deleted here, which keeps
  the README's safety rule: the job is here, on the wire, or at the receiver, never two.
* ``import_job`` (the node receiving YOURJOBS): the job is queued here without a QUEUED
  broadcast (it only moved) and served to a blocked client at once if one waits.
"""

from __future__ import annotations

from typing import Any, Protocol

from broker.cluster_jobs import ReplicatingBroker
from broker.effects import LogRecord
from broker.job import (
    FLAG_DELIVERED,
    FLAG_QUEUED_BEFORE,
    FLAG_REPLICA,
    REC_CONFIRMED,
    REC_FLAGS,
    Job,
    JobState,
)
from broker.queue import Queue


class Federation(Protocol):
    def need_jobs(self, q: Queue, reached_zero: bool, now_ms: int) -> None:
        """The queue has no job for a client (``reached_zero`` False: a GETJOB found it
        empty), or a client just took a job that left it at ``q.low_water`` jobs or fewer
        (True: its last job, unless the core raised the mark). May emit NEEDJOBS."""
        ...

    def job_queued(self, q: Queue, now_ms: int) -> None:
        """A job was queued in ``q`` and no client here waited for it (only called once the
        core keeps state for the queue, ``q.fed``). May emit YOURJOBS to a node that asked
        for this queue lately and got less than it asked for."""
        ...

    def import_from(self, q: Queue, now_ms: int) -> list[str]:
        """QSTAT ``import-from``: the node IDs that recently sent jobs of this queue."""
        ...

    def import_rate(self, q: Queue, now_ms: int) -> int:
        """QSTAT ``import-rate`` (jobs/s received through YOURJOBS, Disque's estimate)."""
        ...

    def info(self) -> list[tuple[str, Any]]:
        """Fields added to INFO's Jobs section on a cluster node."""
        ...

    def forget_jobs(self) -> None:
        """DEBUG FLUSHALL: drop what is kept about jobs (the window of recent imports)."""
        ...


def export_jobs(b: ReplicatingBroker, q: Queue, count: int, to_node: str, now_ms: int,
                max_body: int) -> list[list[Any]]:
    """Take up to ``count`` of the oldest jobs out of ``q`` for a YOURJOBS to ``to_node``,
    stopping at a job whose body is over ``max_body`` (it could not be sent: it stays).

    Returns the jobs' records as they must be sent (ACTIVE, ``confirmed`` empty). An at-least-once job stays registered here,
    ACTIVE, its requeue time unchanged, and learns that ``to_node`` has a copy (so the ack
    GC, QUEUED and WILLQUEUE reach it); an at-most-once job is deleted here."""
    out: list[list[Any]] = []
    while len(out) < count:
        head = q.peek(1)
        if head and head[0].body_size > max_body:
            break
        job = q.pop()
        if job is None:
            break
        # The record before the change, for the undo: only when a log will write one.
        prev = job.to_record() if b.log_wanted else None
        job.transition(JobState.ACTIVE)
        q.atime = now_ms
        if to_node not in job.delivered:
            job.delivered += (to_node,)
        record = job.to_record()
        record[REC_CONFIRMED] = []
        record[REC_FLAGS] &= ~FLAG_DELIVERED  # a local fact (Disque clears it in every job message)
        out.append(record)
        if job.retry == 0:
            b.ending_as("moved")  # broker/results.py: it lives on, on to_node
            b.unregister(job)
            b.ending_as("deleted")
            if b.log_wanted:
                b.outbox.append(LogRecord("del", job.id, prev))
        else:
            b.log_job(job, prev)
    return out


def import_job(b: ReplicatingBroker, job: Job, myself: str, now_ms: int) -> bool:
    """A job received in YOURJOBS: queue it here. Returns whether it was queued (Disque
    counts only those towards the import rate and the sources of the queue)."""
    if b.disk_full(job.body_size):
        return False  # past maxdisk: its source keeps it and requeues it in time
    existing = b.jobs.get(job.id)
    if existing is not None:
        job = existing
        if job.state is not JobState.ACTIVE:
            return False  # queued here already (a duplicate), acked, or still replicating
        if job.flags & FLAG_DELIVERED and (job.retry == 0 or job.qtime > now_ms):
            # Handed to a client here and its retry not due yet (or never, at most once): a
            # duplicated or late YOURJOBS must not deliver it a second time.
            return False
        prev: Any = job.to_record() if b.log_wanted else None
    else:
        if job.retry == 0 and job.flags & FLAG_DELIVERED:
            return False
        job.confirmed = ()
        job.flags |= FLAG_REPLICA
        b.register(job, schedule=False)  # enqueue_job arms its timer (or it goes again)
        prev = None
    if myself not in job.delivered:
        job.delivered += (myself,)
    # Only moved between queues: no QUEUED broadcast and no additional delivery counted.
    job.flags &= ~FLAG_QUEUED_BEFORE
    if not job.qtime:
        job.qtime = now_ms  # an at-most-once job: queued once more (any value will do)
    if not b.enqueue_job(job, now_ms):
        if prev is None:
            b.unregister(job)
        return False
    b.log_job(job, prev)
    return True
