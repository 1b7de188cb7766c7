"""Dead letters: a job delivered too often leaves its queue for its dead-letter queue.

A queue's redrive policy (broker/policy_table.py) names a dead-letter queue and how many
deliveries a job gets. ``Broker.enqueue`` asks ``dead_letter`` before it queues a job again
(only while some policy has a redrive policy); past the count the job is acknowledged and a
*dead letter* with its body and counters is queued in the dead-letter queue instead. A script
worker parking a failed job makes one the same way (broker/parking.py); ``QPOLICY REDRIVE``
sends dead letters back (broker/policies.py).

Dead letters and the cluster: the dead letter of job J gets an ID derived from J's
(``dead_letter_id``), the same on every node. When two holders of J dead-letter it at once, both
hold one job under one ID: each ACKs J (SETACK to the holders) and then sends WILLQUEUE for the
dead letter, whose answer (QUEUED, no counters) makes the holder with the smaller node ID
dequeue its copy - Disque's own tie-break. A holder that receives the SETACK first never
dead-letters J, and TCP keeps SETACK ahead of the WILLQUEUE sent after it. So one job reaches
the dead-letter queue, queued on one node; its ACK reaches every copy.

A dead letter is never dead-lettered again (chains of dead-letter queues would otherwise make
a cycle of queues move a job forever). Its origin (original ID and queue) is kept in
``PolicyTable.origins`` and logged; ``QPOLICY ORIGIN <id>`` returns it.
"""

from __future__ import annotations

from broker.job import FLAG_QUEUED_BEFORE, Job
from broker.policy_table import Policy, PolicyBroker, dead_letter_id


def dead_letter(b: PolicyBroker, job: Job, now_ms: int, nack: bool) -> bool:
    """Called by ``Broker.enqueue`` before it queues ``job`` (only while some policy has a
    redrive policy). True: the job went to its dead-letter queue instead, and the original
    is acknowledged (everywhere, on a cluster)."""
    table = b.policies
    p = table.get(job.queue)
    if p is None or p.redrive is None or job.id in table.origins:
        return False
    nacks = job.nacks + (1 if nack else 0)
    deliveries = job.deliveries + (1 if not nack and job.flags & FLAG_QUEUED_BEFORE else 0)
    max_receives, dlq_name = p.redrive
    if 1 + nacks + deliveries <= max_receives:
        return False
    dlq = table.get(dlq_name)
    if dlq is None:
        return False
    move_to_dead_letters(b, job, dlq, nacks, deliveries, now_ms)
    return True


def move_to_dead_letters(b: PolicyBroker, job: Job, dlq: Policy, nacks: int, deliveries: int,
                         now_ms: int) -> bytes:
    """Acknowledge ``job`` and create its dead letter in ``dlq`` (with these counters and its
    origin recorded); the dead letter's ID. Shared by the redrive policy and by a script
    worker parking a failed job (broker/parking.py)."""
    table = b.policies
    new_id = dead_letter_id(job.id, dlq.retention_timeout, dlq.visibility_timeout)
    original, queue, body, holders = job.id, job.queue, job.body, job.delivered
    ref = job.ref  # a body the log holds: the dead letter refers to the same bytes
    # Acknowledge the original first: on a cluster its SETACK leaves before the dead letter's
    # WILLQUEUE, so a holder that learns of the dead letter already knows the original is acked.
    b.ending_as("dead-lettered")  # broker/results.py: what a WAITJOB on it answers
    b.ack_jobs((original,), now_ms)
    b.ending_as("deleted")
    if new_id in b.jobs:
        return new_id
    # (The ACK of a job on one node unregisters it and empties its body: the copies above.)
    dl = Job(new_id, dlq.name, body, repl=job.repl, ttl=dlq.retention_timeout,
             retry=dlq.visibility_timeout, delay=0, ctime=b.new_ctime(now_ms),
             delivered=holders if b.replication is not None else (b.node_id,))
    dl.ref = ref
    dl.nacks, dl.deliveries = nacks, deliveries
    dl.priority = job.priority
    dl.qtime = now_ms
    table.set_origin(b, new_id, original, queue)
    ctype = table.content_types.get(original)
    if ctype is not None:  # posted over HTTP with a Content-Type: the dead letter keeps it
        table.set_content_type(b, new_id, ctype)
    table.dead_lettered[queue] = table.dead_lettered.get(queue, 0) + 1
    b.register(dl, schedule=False)
    if not b.enqueue_job(dl, now_ms):
        b.reschedule(dl)
    b.log_job(dl, None)
    if b.replication is not None and len(dl.delivered) > 1:
        # The holders that dead-lettered the same job at the same moment answer with QUEUED:
        # the one with the smaller node ID dequeues its copy.
        b.replication.will_queue(dl)
    return new_id
