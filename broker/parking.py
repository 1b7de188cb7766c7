"""A script worker's failed job leaves its queue: ``QPOLICY PARK`` (docs/worker.md).

Theory of operation
-------------------
RQ parks a message whose script failed in its ``err`` state, for an operator to look at; it is
not run again unless someone asks. ``trisque worker`` does the same with
``QPOLICY PARK job-id exit-code|none log-file reason``, which moves a job this node holds out
of its queue, now, as a dead letter (``dead_letters.move_to_dead_letters``: the original is
acknowledged, the dead letter keeps its body and counters and records its origin, so
``QPOLICY REDRIVE`` runs it again):

* into the queue's dead-letter queue when it has a redrive policy whose dead-letter queue
  exists;
* otherwise into ``<queue>.err``, the queue's *error queue*. Its policy is created with the
  defaults (a day's retention) when it has none, so that ``QPOLICY REDRIVE``, the HTTP API and
  the dashboard know it; the operator may change it (a longer ``RETENTION``, say).

Why, with the exit status and the job's log file, is kept as the dead letter's *note* (log
record ``["note", id, reason, exit_code | None, log_file, parked_ms]``, dropped with the job
on a rewrite); ``QPOLICY ORIGIN`` returns it after the origin and the dashboard shows it.

Nothing here runs unless a client sends PARK: a client that never does sees Disque's replies.
The reply is ``[queue, dead-letter-id]``; ``-NOJOB`` when this node does not hold the job or it
was acknowledged already.
"""

from __future__ import annotations

from typing import Any, Final

from broker.dead_letters import move_to_dead_letters
from broker.effects import LogRecord
from broker.job import JobState
from broker.policies import new_stamp, store
from broker.policy_table import RECORD_KIND, Policy, PolicyBroker
from protocol import errors
from protocol.commands import QPolicy

ERROR_QUEUE_SUFFIX: Final = b".err"


def error_queue(queue: bytes) -> bytes:
    """Where a failed job of ``queue`` without a redrive policy goes."""
    return queue + ERROR_QUEUE_SUFFIX


def park(b: PolicyBroker, cmd: QPolicy, now_ms: int) -> Any:
    table = b.policies
    job = b.jobs.get(cmd.target)
    if job is None or job.state is JobState.ACKED:
        return errors.NOJOB
    fields = dict(cmd.changes)
    p = table.get(job.queue)
    dlq = table.get(p.redrive[1]) if p is not None and p.redrive is not None else None
    if dlq is None:
        name = error_queue(job.queue)
        dlq = table.get(name)
        if dlq is None:
            dlq = Policy(name, stamp=new_stamp(b, name, now_ms))
            store(b, dlq)
    new_id = move_to_dead_letters(b, job, dlq, job.nacks, job.deliveries, now_ms)
    note = (fields["reason"], fields["exit"], fields["log"], now_ms)
    table.notes[new_id] = note
    b.outbox.append(LogRecord(RECORD_KIND, ["note", new_id, *note], None))
    return [dlq.name, new_id]
