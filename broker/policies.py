"""Queue policies: per-queue defaults, dead letters and deduplication (issue 13).

Theory of operation
-------------------
Disque queues exist implicitly and have no settings. A *policy* is an optional addition, in the
style of mqs: a queue "exists" for the policy commands (and the HTTP
API's ``/queues``) when it has one. A client that never sets a policy sees Disque's replies and
counters unchanged; every hook in the broker is behind a check on this table being non-empty.

A ``Policy`` holds

* ``retention_timeout`` - the TTL of a job added without TTL (1 .. INT32_MAX seconds);
* ``visibility_timeout`` - the RETRY of a job added without RETRY (0 .. INT32_MAX);
* ``message_delay`` - the DELAY of a job added without DELAY (0 .. INT32_MAX);
* ``redrive`` - ``(max_receives, dead_letter_queue)`` or None: a job whose next delivery would be
  delivery number ``max_receives + 1`` (deliveries = 1 + nacks + additional-deliveries, the
  WITHCOUNTERS fields) is moved to the dead-letter queue instead of being queued again
  (``dead_letter``); the dead-letter queue must have a policy itself;
* ``message_deduplication`` - ADDJOB of a body equal to a job of the queue that was added on
  this node and is still present here returns that job's ID and creates nothing (``addjob``).
  The scope is this node: a job added on another node (even one this node holds a copy of),
  or a job acked or expired, is not a duplicate; a partition changes nothing (each side
  deduplicates what was added on its own nodes), and jobs are never merged.

Explicit ADDJOB options always win over a policy's defaults. Jobs keep the parameters they were
created with; the redrive policy in force when a job would be queued again is the one applied.

Versions: each change is stamped ``(ms, node_id)``; a deletion leaves a tombstone with its stamp.
``merge`` keeps the greater stamp, so every node that has seen the same changes holds the same
table whatever the order (the replication core, ``cluster/policy_sync.py``, relies on it).

Dead letters and the cluster: the dead letter of job J gets an ID derived from J's
(``dead_letter_id``), the same on every node. When two holders of J dead-letter it at once, both
hold one job under one ID: each ACKs J (SETACK to the holders) and then sends WILLQUEUE for the
dead letter, whose answer (QUEUED, no counters) makes the holder with the smaller node ID
dequeue its copy - Disque's own tie-break. A holder that receives the SETACK first never
dead-letters J, and TCP keeps SETACK ahead of the WILLQUEUE sent after it. So one job reaches
the dead-letter queue, queued on one node; its ACK reaches every copy.

A dead letter is never dead-lettered again (chains of dead-letter queues would otherwise make
a cycle of queues move a job forever). Its origin (original ID and queue) is kept in
``origins`` and logged; ``QPOLICY ORIGIN <id>`` returns it.

Redrive (``QPOLICY REDRIVE dlq [COUNT n]``, ``redrive_dead_letters``): each dead letter queued on this node
in ``dlq`` whose origin is known goes back to its original queue as a new job (an ADDJOB of
its body: the original queue's policy applies, counters start from zero, so it is not
dead-lettered again at once), then the dead letter is acknowledged. The new job's record
comes before the ACK's in the same log batch, so a crash between them can leave both, never
neither: a job may be delivered twice, never lost. Dead letters being processed (not queued)
and jobs added to the dead-letter queue by hand (no origin) stay where they are.

Log records (kind ``qpolicy``): ``["queue", name, fields | None, stamp_ms, stamp_node]`` (None:
deleted), ``["origin", dead_letter_id, original_id, original_queue]`` and ``["ctype", job_id,
content_type]`` (the Content-Type of a job added over HTTP, returned when it is received over
HTTP on this node; RESP never sees it).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Final

from broker.clients import Client
from broker.effects import LogRecord
from broker.job import FLAG_QUEUED_BEFORE, Job, JobState
from protocol import errors
from protocol.commands import INT32_MAX, AddJob, QPolicy
from protocol.jobid import is_valid, ttl_field
from protocol.resp import Error, Status

#: ``broker.core.Broker``, which imports this module: naming the class here would be an import
#: cycle (tests/test_layering.py), so the hooks take it untyped, as broker/cluster_jobs.py does.
Broker = Any

RECORD_KIND: Final = "qpolicy"
DEFAULT_RETENTION: Final = 24 * 3600
DEFAULT_VISIBILITY: Final = 300

NO_POLICY: Final = Error("NOQUEUE No such queue (it has no policy): create it with QPOLICY CREATE")
EXISTS: Final = Error("EXISTS The queue already exists (it has a policy)")
NO_DLQ: Final = Error("ERR The dead letter queue does not exist (it has no policy)")

FIELDS: Final = ("retention_timeout", "visibility_timeout", "message_delay",
                 "message_deduplication", "redrive")


@dataclass(frozen=True)
class Policy:
    name: bytes
    retention_timeout: int = DEFAULT_RETENTION
    visibility_timeout: int = DEFAULT_VISIBILITY
    message_delay: int = 0
    message_deduplication: bool = False
    redrive: tuple[int, bytes] | None = None
    stamp: tuple[int, str] = (0, "")
    deleted: bool = False

    def fields(self) -> dict[str, Any]:
        return {
            "retention_timeout": self.retention_timeout,
            "visibility_timeout": self.visibility_timeout,
            "message_delay": self.message_delay,
            "message_deduplication": self.message_deduplication,
            "redrive": list(self.redrive) if self.redrive else None,
        }

    def to_record(self) -> list[Any]:
        return ["queue", self.name, None if self.deleted else self.fields(), self.stamp[0],
                self.stamp[1]]

    @classmethod
    def from_record(cls, rec: list[Any]) -> Policy:
        _, name, fields, ms, node = rec
        stamp = (int(ms), str(node))
        if fields is None:
            return cls(bytes(name), stamp=stamp, deleted=True)
        redrive = fields["redrive"]
        return cls(
            bytes(name), int(fields["retention_timeout"]), int(fields["visibility_timeout"]),
            int(fields["message_delay"]), bool(fields["message_deduplication"]),
            (int(redrive[0]), bytes(redrive[1])) if redrive else None, stamp)

    def reply(self) -> list[Any]:
        """The RESP shape of GET and LIST entries: field/value pairs, as QSTAT."""
        return [
            b"name", self.name,
            b"redrive-max-receives", self.redrive[0] if self.redrive else None,
            b"dead-letter-queue", self.redrive[1] if self.redrive else None,
            b"retention-timeout", self.retention_timeout,
            b"visibility-timeout", self.visibility_timeout,
            b"message-delay", self.message_delay,
            b"message-deduplication", int(self.message_deduplication),
        ]


def _num(v: Any, low: int) -> bool:
    return type(v) is int and low <= v <= INT32_MAX


def validate_record(data: Any) -> str | None:
    """Why a ``qpolicy`` log record is not one a node could write, or None."""
    if not isinstance(data, list) or not data:
        return "qpolicy record is not a list"
    if data[0] == "ctype":
        if len(data) != 3 or not isinstance(data[1], bytes) or not is_valid(data[1]) \
                or not isinstance(data[2], str) or len(data[2]) > 1024:
            return "qpolicy ctype record malformed"
        return None
    if data[0] == "note":
        # ["note", dead_letter_id, reason, exit_code | None, log_file, parked_ms]
        if (len(data) != 6 or not isinstance(data[1], bytes) or not is_valid(data[1])
                or not isinstance(data[2], str) or len(data[2]) > 4096
                or not (data[3] is None or type(data[3]) is int)
                or not isinstance(data[4], str) or len(data[4]) > 4096
                or type(data[5]) is not int):
            return "qpolicy note record malformed"
        return None
    if data[0] == "origin":
        if len(data) != 4 or not all(isinstance(x, bytes) for x in data[1:]):
            return "qpolicy origin record malformed"
        if not (is_valid(data[1]) and is_valid(data[2])):
            return "qpolicy origin record with an invalid job ID"
        return None
    if data[0] != "queue" or len(data) != 5:
        return "qpolicy record of unknown shape"
    _, name, fields, ms, node = data
    if not isinstance(name, bytes) or type(ms) is not int or not isinstance(node, str):
        return "qpolicy queue record malformed"
    if fields is None:
        return None
    if not isinstance(fields, dict) or set(fields) != set(FIELDS):
        return "qpolicy queue record with wrong fields"
    redrive = fields["redrive"]
    if not (_num(fields["retention_timeout"], 1) and _num(fields["visibility_timeout"], 0)
            and _num(fields["message_delay"], 0)
            and isinstance(fields["message_deduplication"], bool)
            and (redrive is None or (isinstance(redrive, list) and len(redrive) == 2
                                     and _num(redrive[0], 1) and isinstance(redrive[1], bytes)))):
        return "qpolicy queue record with a value out of range"
    return None


def dead_letter_id(original: bytes, ttl: int, retry: int) -> bytes:
    """The dead letter's ID: a function of the original's, so every holder computes the same.
    It keeps the original's node field and is a valid Disque ID (TTL field included)."""
    digest = hashlib.sha1(b"trisque-dead-letter:" + original).digest()[:18]
    return (original[:11] + base64.b64encode(digest) + b"-%04x" % ttl_field(ttl, retry))


class PolicyTable:
    """Every queue policy this node knows (tombstones included), the dead letters' origins
    and the deduplication index."""

    def __init__(self) -> None:
        self.by_name: dict[bytes, Policy] = {}
        self.live = 0  # policies that are not tombstones: 0 means every hook is skipped
        self.redrive = 0  # live policies with a redrive policy
        self.origins: dict[bytes, tuple[bytes, bytes]] = {}
        self.content_types: dict[bytes, str] = {}  # job ID -> Content-Type (HTTP API)
        # Dead letters parked by a script worker -> why (broker/parking.py's Note).
        self.notes: dict[bytes, Any] = {}
        self._dedup: dict[tuple[bytes, bytes], bytes] = {}  # (queue, sha1(body)) -> job ID
        self._indexed: set[bytes] = set()
        self.last_duplicate = False  # the last ADDJOB returned an existing job (HTTP: 200)
        # Jobs moved to a dead-letter queue, per original queue (read by /metrics; bounded
        # by the queues that ever had a redrive policy).
        self.dead_lettered: dict[bytes, int] = {}
        # Called with each policy changed here or by a log replay (not by ``merge``): the
        # replication core sends it to the other nodes.
        self.on_change: Callable[[Policy], None] | None = None

    def get(self, name: bytes) -> Policy | None:
        p = self.by_name.get(name)
        return None if p is None or p.deleted else p

    def policies(self) -> list[Policy]:
        return sorted((p for p in self.by_name.values() if not p.deleted), key=lambda p: p.name)

    def put(self, p: Policy) -> None:
        old = self.by_name.get(p.name)
        if old is not None and not old.deleted:
            self.live -= 1
            self.redrive -= old.redrive is not None
        self.by_name[p.name] = p
        if not p.deleted:
            self.live += 1
            self.redrive += p.redrive is not None
        if p.deleted or not p.message_deduplication:
            self._indexed.discard(p.name)

    def merge(self, p: Policy) -> bool:
        """A peer's version: kept if its stamp is newer. Returns whether it was."""
        old = self.by_name.get(p.name)
        if old is not None and old.stamp >= p.stamp:
            return False
        self.put(p)
        return True

    # -- deduplication ---------------------------------------------------------------------------

    def find_duplicate(self, b: Broker, queue: bytes, body: bytes) -> bytes | None:
        if queue not in self._indexed:
            # First use since start (or since deduplication was turned on): index the jobs of
            # the queue this node holds. (When turned on by a command, the table is marked
            # indexed at once: as mqs says, jobs already there are not considered.)
            self._indexed.add(queue)
            mine = b"D-" + b.node_id[:8].encode()
            for job in b.jobs.values():
                if (job.queue == queue and job.state is not JobState.ACKED
                        and job.id.startswith(mine)):
                    self._dedup[(queue, hashlib.sha1(job.body).digest())] = job.id
        job_id = self._dedup.get((queue, hashlib.sha1(body).digest()))
        if job_id is None:
            return None
        job = b.jobs.get(job_id)
        if job is None or job.queue != queue or job.body != body or job.state is JobState.ACKED:
            return None
        return job_id

    def remember(self, b: Broker, queue: bytes, body: bytes, job_id: bytes) -> None:
        if len(self._dedup) > 2 * len(b.jobs) + 1024:
            self._dedup = {k: v for k, v in self._dedup.items() if v in b.jobs}
        self._dedup[(queue, hashlib.sha1(body).digest())] = job_id

    def mark_indexed(self, queue: bytes) -> None:
        self._indexed.add(queue)

    # -- log ----------------------------------------------------------------------------------

    def snapshot(self, live_jobs: dict[bytes, Job]) -> Iterator[tuple[str, Any]]:
        for p in self.by_name.values():
            yield (RECORD_KIND, p.to_record())
        for new_id, (orig, queue) in self.origins.items():
            if new_id in live_jobs:
                yield (RECORD_KIND, ["origin", new_id, orig, queue])
        for job_id, ctype in self.content_types.items():
            if job_id in live_jobs:
                yield (RECORD_KIND, ["ctype", job_id, ctype])
        for job_id, note in self.notes.items():
            if job_id in live_jobs:
                yield (RECORD_KIND, ["note", job_id, *note])

    def set_content_type(self, b: Broker, job_id: bytes, ctype: str) -> None:
        if len(self.content_types) > 2 * len(b.jobs) + 1024:
            self.content_types = {k: v for k, v in self.content_types.items() if k in b.jobs}
        self.content_types[job_id] = ctype
        b.outbox.append(LogRecord(RECORD_KIND, ["ctype", job_id, ctype], None))

    def set_origin(self, b: Broker, dead_letter: bytes, original: bytes, queue: bytes) -> None:
        # Pruned like the Content-Types: entries of jobs gone never outnumber the live jobs.
        if len(self.origins) > 2 * len(b.jobs) + 1024:
            self.origins = {k: v for k, v in self.origins.items() if k in b.jobs}
        self.origins[dead_letter] = (original, queue)
        b.outbox.append(LogRecord(RECORD_KIND, ["origin", dead_letter, original, queue], None))

    def forget_gone(self, live_jobs: dict[bytes, Job]) -> None:
        """Drop what is kept about jobs no longer here: a log replay loads the origins and
        Content-Types of every job the log names, most of them long gone."""
        self.origins = {k: v for k, v in self.origins.items() if k in live_jobs}
        self.content_types = {k: v for k, v in self.content_types.items() if k in live_jobs}
        self._dedup = {k: v for k, v in self._dedup.items() if v in live_jobs}

    def load(self, data: list[Any]) -> None:
        if data[0] == "ctype":
            self.content_types[bytes(data[1])] = str(data[2])
        elif data[0] == "note":
            self.notes[bytes(data[1])] = tuple(data[2:])
        elif data[0] == "origin":
            self.origins[bytes(data[1])] = (bytes(data[2]), bytes(data[3]))
        else:
            self.put(Policy.from_record(data))

    def undo(self, data: list[Any], prev: Any) -> None:
        if data[0] == "ctype":
            self.content_types.pop(bytes(data[1]), None)
            return
        if data[0] == "note":
            self.notes.pop(bytes(data[1]), None)
            return
        if data[0] == "origin":
            self.origins.pop(bytes(data[1]), None)
            return
        name = bytes(data[1])
        if prev is None:
            old = self.by_name.get(name)
            if old is not None:
                self.put(Policy(name, stamp=old.stamp, deleted=True))
                del self.by_name[name]
        else:
            self.put(Policy.from_record(prev))


# =============================================================================================
# The command


def _stamp(b: Broker, name: bytes, now_ms: int) -> tuple[int, str]:
    """A stamp newer than every version of ``name`` this node has seen, tombstones included
    (another node's clock may be ahead: a change made here must still win)."""
    old = b.policies.by_name.get(name)
    ms = max(now_ms, old.stamp[0] + 1) if old is not None else now_ms
    return (ms, b.node_id)


def store(b: Broker, p: Policy) -> None:
    """Install a policy changed on this node: log it and tell the replication core."""
    table = b.policies
    old = table.by_name.get(p.name)
    prev = old.to_record() if old is not None else None
    table.put(p)
    b.outbox.append(LogRecord(RECORD_KIND, p.to_record(), prev))
    if table.on_change is not None:
        table.on_change(p)


def apply_remote(b: Broker, p: Policy) -> bool:
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


def command(b: Broker, cmd: QPolicy, client: Client, now_ms: int) -> Any:
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
    new = replace(base, **changes, stamp=_stamp(b, cmd.target, now_ms), deleted=False)
    if new.message_deduplication and not (current and current.message_deduplication):
        table.mark_indexed(new.name)
    store(b, new)
    return new.reply()


def delete(b: Broker, p: Policy, now_ms: int) -> list[bytes]:
    """Delete a queue's policy; policies using it as their dead-letter queue lose their
    redrive policy (mqs). Returns the IDs of this node's jobs of the queue, which the caller
    may delete (the HTTP API does, as mqs deletes the queue's messages)."""
    table = b.policies
    for other in table.policies():
        if other.redrive is not None and other.redrive[1] == p.name and other.name != p.name:
            store(b, replace(other, redrive=None, stamp=_stamp(b, other.name, now_ms)))
    store(b, Policy(p.name, stamp=_stamp(b, p.name, now_ms), deleted=True))
    return [j.id for j in b.jobs.values() if j.queue == p.name]


def purge(b: Broker, queue: bytes, now_ms: int) -> int:
    """Delete the jobs of ``queue`` this node holds, everywhere (FASTACK: DELJOB to holders)."""
    ids = tuple(j.id for j in b.jobs.values() if j.queue == queue)
    if not ids:
        return 0
    result = b.fastack_jobs(ids, now_ms)
    return int(result)


# =============================================================================================
# Hooks called by the broker


def addjob(b: Broker, cmd: AddJob, client: Client, now_ms: int) -> Any:
    """ADDJOB into a queue with a policy: its defaults, then deduplication."""
    table = b.policies
    table.last_duplicate = False
    p = table.get(cmd.queue)
    if p is None:
        return b._addjob(cmd, client, now_ms)
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
                 cmd.async_, True, cmd.id_key)
    if p.message_deduplication:
        existing = table.find_duplicate(b, cmd.queue, cmd.body)
        if existing is not None:
            table.last_duplicate = True
            return Status(existing.decode("ascii"))
    before = len(b.jobs)
    reply = b._addjob(cmd, client, now_ms)
    if p.message_deduplication and len(b.jobs) > before:
        # The job just registered is the newest key (dicts keep insertion order).
        job_id = next(reversed(b.jobs))
        table.remember(b, cmd.queue, cmd.body, job_id)
    return reply


def dead_letter(b: Broker, job: Job, now_ms: int, nack: bool) -> bool:
    """Called by ``Broker._enqueue`` before it queues ``job`` (only while some policy has a
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


def move_to_dead_letters(b: Broker, job: Job, dlq: Policy, nacks: int, deliveries: int,
                         now_ms: int) -> bytes:
    """Acknowledge ``job`` and create its dead letter in ``dlq`` (with these counters and its
    origin recorded); the dead letter's ID. Shared by the redrive policy and by a script
    worker parking a failed job (broker/parking.py)."""
    table = b.policies
    new_id = dead_letter_id(job.id, dlq.retention_timeout, dlq.visibility_timeout)
    original, queue, body, holders = job.id, job.queue, job.body, job.delivered
    # Acknowledge the original first: on a cluster its SETACK leaves before the dead letter's
    # WILLQUEUE, so a holder that learns of the dead letter already knows the original is acked.
    b.ack_jobs((original,), now_ms)
    if new_id in b.jobs:
        return new_id
    # (The ACK of a job on one node unregisters it and empties its body: the copies above.)
    dl = Job(new_id, dlq.name, body, repl=job.repl, ttl=dlq.retention_timeout,
             retry=dlq.visibility_timeout, delay=0, ctime=b._new_ctime(now_ms),
             delivered=holders if b.replication is not None else (b.node_id,))
    dl.nacks, dl.deliveries = nacks, deliveries
    dl.qtime = now_ms
    table.set_origin(b, new_id, original, queue)
    ctype = table.content_types.get(original)
    if ctype is not None:  # posted over HTTP with a Content-Type: the dead letter keeps it
        table.set_content_type(b, new_id, ctype)
    table.dead_lettered[queue] = table.dead_lettered.get(queue, 0) + 1
    b._register(dl, schedule=False)
    if not b._enqueue(dl, now_ms):
        b._reschedule(dl)
    b._log_job(dl, None)
    if b.replication is not None and len(dl.delivered) > 1:
        # The holders that dead-lettered the same job at the same moment answer with QUEUED:
        # the one with the smaller node ID dequeues its copy.
        b.replication.will_queue(dl)
    return new_id


def redrive_dead_letters(b: Broker, dlq: bytes, count: int | None, client: Client, now_ms: int,
                         only: bytes | None = None) -> Any:
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
    picked = [b.jobs[only]] if only is not None and only in b.jobs else [] if only else list(q)
    for job in picked:
        if moved >= limit:
            break
        origin = table.origins.get(job.id)
        if (origin is None or b.jobs.get(job.id) is not job or job.state is not JobState.QUEUED
                or job.queue != dlq):
            continue
        # On a cluster the new job is replicated in the background (ASYNC): the command must
        # not block, and the dead letter is acknowledged only after its copy exists here.
        add = AddJob(origin[1], job.body, 0, None, 0, None, None, None,
                     b.replication is not None)
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
