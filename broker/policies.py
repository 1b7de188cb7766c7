"""What queue policies do: the QPOLICY command, ADDJOB's defaults and deduplication, redrive.

The policies themselves, their versions and log records are broker/policy_table.py; moving a
job to its dead-letter queue is broker/dead_letters.py.

Redrive (``QPOLICY REDRIVE dlq [COUNT n]``, ``redrive_dead_letters``): each dead letter queued on this node
in ``dlq`` whose origin is known goes back to its original queue as a new job (an ADDJOB of
its body: the original queue's policy applies, counters start from zero, so it is not
dead-lettered again at once), then the dead letter is acknowledged. The new job's record
comes before the ACK's in the same log batch, so a crash between them can leave both, never
neither: a job may be delivered twice, never lost. Dead letters being processed (not queued)
and jobs added to the dead-letter queue by hand (no origin) stay where they are. A body the
append log holds (``body-memory-max``) is read back through the node (``read_body``) for the
new job; one that cannot be read keeps its dead letter in place.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final

from broker.clients import Client
from broker.effects import LogRecord
from broker.job import JobState
from broker.policy_table import (
    DEFAULT_RETENTION,
    DEFAULT_VISIBILITY,
    RECORD_KIND,
    Policy,
    PolicyBroker,
)
from protocol import errors
from protocol.commands import AddJob, QPolicy
from protocol.resp import Error, Status

NO_POLICY: Final = Error("NOQUEUE No such queue (it has no policy): create it with QPOLICY CREATE")
EXISTS: Final = Error("EXISTS The queue already exists (it has a policy)")
NO_DLQ: Final = Error("ERR The dead letter queue does not exist (it has no policy)")


# =============================================================================================
# Changes made on this node, and the QPOLICY command


def new_stamp(b: PolicyBroker, name: bytes, now_ms: int) -> tuple[int, str]:
    """A stamp newer than every version of ``name`` this node has seen, tombstones included
    (another node's clock may be ahead: a change made here must still win)."""
    old = b.policies.by_name.get(name)
    ms = max(now_ms, old.stamp[0] + 1) if old is not None else now_ms
    return (ms, b.node_id)


def store(b: PolicyBroker, p: Policy) -> None:
    """Install a policy changed on this node: log it and tell the replication core."""
    table = b.policies
    old = table.by_name.get(p.name)
    prev = old.to_record() if old is not None else None
    table.put(p)
    b.outbox.append(LogRecord(RECORD_KIND, p.to_record(), prev))
    if table.on_change is not None:
        table.on_change(p)


def apply_remote(b: PolicyBroker, p: Policy) -> bool:
    """A peer's version of a policy (cluster/policy_sync.py): kept and logged if newer, not
    sent on (the sender's own broadcast and the periodic exchange reach every node)."""
    table = b.policies
    old = table.by_name.get(p.name)
    if not table.merge(p):
        return False
    if p.message_deduplication and not (old and not old.deleted and old.message_deduplication):
        table.mark_indexed(p.name)
    b.outbox.append(LogRecord(RECORD_KIND, p.to_record(), old.to_record() if old else None))
    return True


def command(b: PolicyBroker, cmd: QPolicy, client: Client, now_ms: int) -> Any:
    table = b.policies
    sub = cmd.sub
    if sub == "REDRIVE":
        return redrive_dead_letters(b, cmd.target, cmd.limit, client, now_ms,
                                    dict(cmd.changes).get("job"))
    if sub == "LIST":
        items = table.policies()
        end = None if cmd.limit is None else cmd.offset + cmd.limit
        return [len(items), [p.reply() for p in items[cmd.offset:end]]]
    if sub == "ORIGIN":
        origin = table.origins.get(cmd.target)
        if origin is None or cmd.target not in b.jobs:
            return None
        note = table.notes.get(cmd.target)
        if note is None:
            return list(origin)
        reason, exit_code, log_file, parked_ms = note
        return [*origin, reason.encode(), exit_code, log_file.encode(), parked_ms]
    current = table.get(cmd.target)
    if sub == "GET":
        return None if current is None else current.reply()
    if sub == "DEL":
        if current is None:
            return NO_POLICY
        delete(b, current, now_ms)
        return 1
    if sub == "CREATE" and current is not None:
        return EXISTS
    if sub == "UPDATE" and current is None:
        return NO_POLICY
    changes = dict(cmd.changes)
    redrive = changes.get("redrive")
    if redrive is not None and table.get(redrive[1]) is None:
        return NO_DLQ
    base = current if current is not None else Policy(cmd.target)
    if current is None and "visibility_timeout" not in changes:
        # Disque's default RETRY for the TTL (ADDJOB: max(1, min(300, TTL / 10))).
        ttl = changes.get("retention_timeout", DEFAULT_RETENTION)
        changes["visibility_timeout"] = max(1, min(DEFAULT_VISIBILITY, ttl // 10))
    new = replace(base, **changes, stamp=new_stamp(b, cmd.target, now_ms), deleted=False)
    if new.message_deduplication and not (current and current.message_deduplication):
        table.mark_indexed(new.name)
    store(b, new)
    return new.reply()


def delete(b: PolicyBroker, p: Policy, now_ms: int) -> list[bytes]:
    """Delete a queue's policy; policies using it as their dead-letter queue lose their
    redrive policy (mqs). Returns the IDs of this node's jobs of the queue, which the caller
    may delete (the HTTP API does, as mqs deletes the queue's messages)."""
    table = b.policies
    for other in table.policies():
        if other.redrive is not None and other.redrive[1] == p.name and other.name != p.name:
            store(b, replace(other, redrive=None, stamp=new_stamp(b, other.name, now_ms)))
    store(b, Policy(p.name, stamp=new_stamp(b, p.name, now_ms), deleted=True))
    return [j.id for j in b.jobs.values() if j.queue == p.name]


def purge(b: PolicyBroker, queue: bytes, now_ms: int) -> int:
    """Delete the jobs of ``queue`` this node holds, everywhere (FASTACK: DELJOB to holders)."""
    ids = tuple(j.id for j in b.jobs.values() if j.queue == queue)
    if not ids:
        return 0
    result = b.fastack_jobs(ids, now_ms)
    return int(result)


# =============================================================================================
# ADDJOB into a queue with a policy (Broker.execute, periodic timers), and redrive


def addjob(b: PolicyBroker, cmd: AddJob, client: Client, now_ms: int) -> Any:
    """ADDJOB into a queue with a policy: its defaults, then deduplication."""
    table = b.policies
    table.last_duplicate = False
    p = table.get(cmd.queue)
    if p is None:
        return b.addjob_without_policy(cmd, client, now_ms)
    ttl = cmd.ttl if cmd.ttl is not None else p.retention_timeout
    retry = cmd.retry if cmd.retry is not None else p.visibility_timeout
    delay = cmd.delay if cmd.delay_given else p.message_delay
    replicate = cmd.replicate
    if retry == 0 and replicate is None:
        replicate = 1  # a policy's visibility 0 makes at-most-once jobs: one copy
    if retry == 0 and replicate is not None and replicate > 1:
        return errors.RETRY0_REPLICATE
    if delay >= ttl:
        return errors.DELAY_GT_TTL
    cmd = AddJob(cmd.queue, cmd.body, cmd.timeout_ms, replicate, delay, retry, ttl, cmd.maxlen,
                 cmd.async_, True, cmd.id_key, cmd.priority, cmd.after)
    if p.message_deduplication:
        existing = table.find_duplicate(b, cmd.queue, cmd.body, now_ms)
        if existing is not None:
            table.last_duplicate = True
            return Status(existing.decode("ascii"))
    before = len(b.jobs)
    reply = b.addjob_without_policy(cmd, client, now_ms)
    if p.message_deduplication and len(b.jobs) > before:
        # The job just registered is the newest key (dicts keep insertion order).
        job_id = next(reversed(b.jobs))
        table.remember(b, cmd.queue, cmd.body, job_id, now_ms)
    return reply


def redrive_dead_letters(b: PolicyBroker, dlq: bytes, count: int | None, client: Client,
                         now_ms: int, only: bytes | None = None) -> Any:
    """Move up to ``count`` (None: all) dead letters queued here in ``dlq`` back to their
    original queues (see the module's docstring); ``only``: just that one (JOB id). The number
    moved; an ADDJOB's error when the first one could not be moved (paused, out of memory, no
    replicas), as nothing moved."""
    table = b.policies
    if table.get(dlq) is None:
        return NO_POLICY
    q = b.queues.get(dlq)
    if q is None:
        return 0
    limit = len(q) if count is None else count
    moved = 0
    picked = ([b.jobs[only]] if only is not None and only in b.jobs else [] if only
              else q.peek(len(q)))
    for job in picked:
        if moved >= limit:
            break
        origin = table.origins.get(job.id)
        if (origin is None or b.jobs.get(job.id) is not job or job.state is not JobState.QUEUED
                or job.queue != dlq):
            continue
        ref = job.ref
        body = job.body if ref is None else b.read_body(ref)  # a body the log holds: read back
        if body is None:
            # Unreadable (the node logged why): moved back without its body it would be lost
            # for good, so the dead letter stays.
            b.warn("redrive-body-unreadable", f"QPOLICY REDRIVE left dead letter "
                   f"{job.id.decode(errors='replace')} in {dlq.decode(errors='replace')}: "
                   "its body cannot be read back from the append log")
            continue
        # On a cluster the new job is replicated in the background (ASYNC): the command must
        # not block, and the dead letter is acknowledged only after its copy exists here.
        add = AddJob(origin[1], body, 0, None, 0, None, None, None,
                     b.replication is not None, priority=job.priority)
        reply = addjob(b, add, client, now_ms)
        if isinstance(reply, Error):
            return reply if moved == 0 else moved
        new_id = str(reply).encode("ascii")
        ctype = table.content_types.get(job.id)
        if ctype is not None and not table.last_duplicate and new_id in b.jobs:
            table.set_content_type(b, new_id, ctype)
        b.ack_jobs((job.id,), now_ms)
        moved += 1
    return moved
