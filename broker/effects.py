"""What the broker core leaves for the runtime to do, in one outbox.

Theory of operation
-------------------
Commands and timers change the core's state and append effects to ``Broker.outbox`` in the
order they happen; the runtime takes them (``Broker.take_effects()``) after each command or
tick and routes each by its type, in one place (``node/server.py``):

* ``LogRecord`` - an append-log record: ``kind`` ``job`` (payload: ``Job.to_record()``),
  ``ack``, ``del`` (payload: the job ID) or ``flushall``; ``undo`` is the job's record before
  the change (None: it did not exist), which ``Broker.undo_entry`` restores when the write
  fails. Or the advisory ``dlv`` (payload: ``[job_id, dtime_ms]``, a job's first delivery;
  ``undo`` None): never undone, never waited for (``broker.aof.ADVISORY_KINDS``). Emitted
  whether or not the log is on: the runtime drops them when it is off, so the core has no
  branch on it. A reply waits for the log only if its own command emitted a record that is
  not advisory.
* ``Reply`` - a reply to a client other than the one being served: a blocked GETJOB that got
  a job, timed out, or was told the node is leaving.

The cluster's intents (replicate, will-queue, queued, ack GC, need-jobs, pause broadcast) join
this union as the cluster issues add them. Effects are immutable tuples: cheap to make on the
hot path, and a (kind, payload, undo) record is what the append log's encoder takes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from broker.clients import Client


class LogRecord(NamedTuple):
    kind: str
    payload: Any
    undo: Any


class Reply(NamedTuple):
    client: Client
    value: Any


Effect = LogRecord | Reply
