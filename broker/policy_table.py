"""Queue policies: the table, its versions and its log records.

Disque queues exist implicitly and have no settings. A *policy* is an optional addition, in the
style of mqs: a queue "exists" for the policy commands (and the HTTP
API's ``/queues``) when it has one. A client that never sets a policy sees Disque's replies and
counters unchanged; every hook in the broker is behind a check on this table being non-empty.
What the policies do is in broker/policies.py (QPOLICY, ADDJOB's defaults and deduplication,
redrive) and broker/dead_letters.py.

A ``Policy`` holds

* ``retention_timeout`` - the TTL of a job added without TTL (1 .. INT32_MAX seconds);
* ``visibility_timeout`` - the RETRY of a job added without RETRY (0 .. INT32_MAX);
* ``message_delay`` - the DELAY of a job added without DELAY (0 .. INT32_MAX);
* ``redrive`` - ``(max_receives, dead_letter_queue)`` or None: a job whose next delivery would be
  delivery number ``max_receives + 1`` (deliveries = 1 + nacks + additional-deliveries, the
  WITHCOUNTERS fields) is moved to the dead-letter queue instead of being queued again
  (``dead_letters.dead_letter``); the dead-letter queue must have a policy itself;
* ``message_deduplication`` - ADDJOB of a body equal to a live job of the queue returns that
  job's ID and creates nothing (``policies.addjob``): one this node added (``_dedup``), or one
  any node added (``shared``, broker/dedup.py, replicated by cluster/dedup_sync.py); a job
  acked, deleted or expired is not a duplicate, and jobs are never merged;
* ``backoff`` - ``(base, max)`` seconds or None: a job NACKed, or whose RETRY elapsed, is
  queued again after ``min(max, base * 2^(deliveries-1))`` seconds, +-10 % (broker/backoff.py);
* ``max_inflight`` - at most this many jobs of the queue delivered and not yet acked, nacked
  or requeued, across the cluster (0: no limit; broker/throttle.py);
* ``rate`` - at most this many deliveries a second across the cluster (0: no limit).

The last three are optional in a record (absent: off), so a policy that sets none of them has
the record and the QPOLICY GET reply it had before they existed.

Explicit ADDJOB options always win over a policy's defaults. Jobs keep the parameters they were
created with; the redrive policy in force when a job would be queued again is the one applied.

Versions: each change is stamped ``(ms, node_id)``; a deletion leaves a tombstone with its stamp.
``merge`` keeps the greater stamp, so every node that has seen the same changes holds the same
table whatever the order (the replication core, ``cluster/policy_sync.py``, relies on it).

Log records (kind ``qpolicy``): ``["queue", name, fields | None, stamp_ms, stamp_node]`` (None:
deleted), ``["origin", dead_letter_id, original_id, original_queue]`` (a dead letter's origin),
``["note", dead_letter_id, ...]`` (why a script worker parked it: broker/parking.py) and
``["ctype", job_id, content_type]`` (the Content-Type of a job added over HTTP, returned when
it is received over HTTP on this node; RESP never sees it).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Protocol

from broker.core_api import BrokerCore
from broker.dedup import SharedIndex
from broker.effects import LogRecord
from broker.job import BodyRef, Job, JobState
from protocol.checksum import crc32
from protocol.commands import INT32_MAX
from protocol.jobid import is_valid, ttl_field

RECORD_KIND: Final = "qpolicy"
DEFAULT_RETENTION: Final = 24 * 3600
DEFAULT_VISIBILITY: Final = 300

FIELDS: Final = ("retention_timeout", "visibility_timeout", "message_delay",
                 "message_deduplication", "redrive")
# Fields a record carries only when set (see the module's docstring).
OPTIONAL_FIELDS: Final = ("backoff", "max_inflight", "rate")
# What an HTTP header's value may hold (RFC 9110: visible characters, spaces, tabs, and
# bytes past ASCII): a Content-Type is sent back with its message.
_NOT_IN_HEADER: Final = re.compile("[\x00-\x08\x0a-\x1f\x7f]")


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
    backoff: tuple[int, int] | None = None
    max_inflight: int = 0
    rate: int = 0

    def fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "retention_timeout": self.retention_timeout,
            "visibility_timeout": self.visibility_timeout,
            "message_delay": self.message_delay,
            "message_deduplication": self.message_deduplication,
            "redrive": list(self.redrive) if self.redrive else None,
        }
        if self.backoff is not None:
            fields["backoff"] = list(self.backoff)
        if self.max_inflight:
            fields["max_inflight"] = self.max_inflight
        if self.rate:
            fields["rate"] = self.rate
        return fields

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
        backoff = fields.get("backoff")
        return cls(
            bytes(name), int(fields["retention_timeout"]), int(fields["visibility_timeout"]),
            int(fields["message_delay"]), bool(fields["message_deduplication"]),
            (int(redrive[0]), bytes(redrive[1])) if redrive else None, stamp,
            backoff=(int(backoff[0]), int(backoff[1])) if backoff else None,
            max_inflight=int(fields.get("max_inflight", 0)), rate=int(fields.get("rate", 0)))

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
            *self.extension_reply(),
        ]

    def extension_reply(self) -> list[Any]:
        """The optional fields' pairs, only those set (a policy without them replies as
        before they existed)."""
        out: list[Any] = []
        if self.backoff is not None:
            out += [b"backoff-base", self.backoff[0], b"backoff-max", self.backoff[1]]
        if self.max_inflight:
            out += [b"max-inflight", self.max_inflight]
        if self.rate:
            out += [b"rate", self.rate]
        return out


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
    if not isinstance(fields, dict) or set(fields).difference(OPTIONAL_FIELDS) != set(FIELDS):
        return "qpolicy queue record with wrong fields"
    backoff = fields.get("backoff")
    if backoff is not None and not (isinstance(backoff, list) and len(backoff) == 2
                                    and _num(backoff[0], 1) and _num(backoff[1], backoff[0])):
        return "qpolicy queue record with a value out of range"
    if not (_num(fields.get("max_inflight", 0), 0) and _num(fields.get("rate", 0), 0)):
        return "qpolicy queue record with a value out of range"
    redrive = fields["redrive"]
    if not (_num(fields["retention_timeout"], 1) and _num(fields["visibility_timeout"], 0)
            and _num(fields["message_delay"], 0)
            and isinstance(fields["message_deduplication"], bool)
            and (redrive is None or (isinstance(redrive, list) and len(redrive) == 2
                                     and _num(redrive[0], 1) and isinstance(redrive[1], bytes)))):
        return "qpolicy queue record with a value out of range"
    return None


def same_body(job: Job, body: bytes) -> bool:
    """Whether ``job``, found under ``body``'s SHA-1, holds ``body``. A body the log holds is
    compared by its length and CRC-32 (the reference keeps them), not read back: with the
    digest's match, as sure as comparing the bytes, and an ADDJOB makes no read."""
    ref = job.ref
    if ref is None:
        return job.body == body
    return ref.length == len(body) and ref.crc == crc32(body)


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
        self.backoff = 0  # live policies with a backoff
        self.throttles = 0  # live policies with MAXINFLIGHT or RATE
        # Per throttled queue: what broker/throttle.py counts (in-flight jobs, rate tokens).
        self.throttle_state: dict[bytes, Any] = {}
        self.origins: dict[bytes, tuple[bytes, bytes]] = {}
        self.content_types: dict[bytes, str] = {}  # job ID -> Content-Type (HTTP API)
        # Dead letters parked by a script worker -> why (broker/parking.py's Note).
        self.notes: dict[bytes, Any] = {}
        self._dedup: dict[tuple[bytes, bytes], bytes] = {}  # (queue, sha1(body)) -> job ID
        # What every node added, for a duplicate added on another node (broker/dedup.py).
        self.shared = SharedIndex()
        self._indexed: set[bytes] = set()
        # Jobs indexed since the start whose body the log holds, by (queue, length, CRC-32),
        # which their references keep: indexing them reads nothing; a hit is read once.
        self._on_disk: dict[tuple[bytes, int, int], bytes] = {}
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
            self.backoff -= old.backoff is not None
            self.throttles -= bool(old.max_inflight or old.rate)
        self.by_name[p.name] = p
        if not p.deleted:
            self.live += 1
            self.redrive += p.redrive is not None
            self.backoff += p.backoff is not None
            self.throttles += bool(p.max_inflight or p.rate)
        if p.deleted or not p.message_deduplication:
            self._indexed.discard(p.name)
        if self.throttle_state and (p.deleted or not (p.max_inflight or p.rate)):
            self.throttle_state.pop(p.name, None)  # bounded by the throttled queues

    def merge(self, p: Policy) -> bool:
        """A peer's version: kept if its stamp is newer. Returns whether it was."""
        old = self.by_name.get(p.name)
        if old is not None and old.stamp >= p.stamp:
            return False
        self.put(p)
        return True

    # -- deduplication ---------------------------------------------------------------------------

    def find_duplicate(self, b: PolicyBroker, queue: bytes, body: bytes,
                       now_ms: int = 0) -> bytes | None:
        if self.shared.entries:
            # The cluster's entry first: after a partition every node answers the same job.
            found = self.shared.find(queue, hashlib.sha1(body).digest(), now_ms)
            if found is not None:
                job = b.jobs.get(found)
                if job is None or (job.state is not JobState.ACKED and same_body(job, body)):
                    return found
        return self._find_local(b, queue, body)

    def _find_local(self, b: PolicyBroker, queue: bytes, body: bytes) -> bytes | None:
        if queue not in self._indexed:
            # First use since start (or since deduplication was turned on): index the jobs of
            # the queue this node holds. (When turned on by a command, the table is marked
            # indexed at once: as mqs says, jobs already there are not considered.) A body the
            # log holds is indexed by what its reference knows, so this reads no file.
            self._indexed.add(queue)
            mine = b"D-" + b.node_id[:8].encode()
            for job in b.jobs.values():
                if (job.queue == queue and job.state is not JobState.ACKED
                        and job.id.startswith(mine)):
                    ref = job.ref
                    if ref is None:
                        self._dedup[(queue, hashlib.sha1(job.body).digest())] = job.id
                    else:
                        self._on_disk[(queue, ref.length, ref.crc)] = job.id
        digest = hashlib.sha1(body).digest()
        job_id = self._dedup.get((queue, digest))
        if job_id is None:
            if not self._on_disk:
                return None
            return self._find_on_disk(b, queue, body, digest)
        found = b.jobs.get(job_id)
        if (found is None or found.queue != queue or found.state is JobState.ACKED
                or not same_body(found, body)):
            return None
        return job_id

    def _find_on_disk(self, b: PolicyBroker, queue: bytes, body: bytes,
                      digest: bytes) -> bytes | None:
        """A job indexed at the start with the same length and CRC-32 as ``body``: its body
        is read back once and compared (a CRC-32 is no digest), then indexed by its SHA-1."""
        key = (queue, len(body), crc32(body))
        job_id = self._on_disk.get(key)
        if job_id is None:
            return None
        found = b.jobs.get(job_id)
        if found is None or found.queue != queue or found.state is JobState.ACKED:
            del self._on_disk[key]
            return None
        ref = found.ref
        content = found.body if ref is None else b.read_body(ref)
        if content != body:
            return None  # another body, or unreadable (the node logged why): not a duplicate
        del self._on_disk[key]
        self._dedup[(queue, digest)] = job_id
        return job_id

    def remember(self, b: BrokerCore, queue: bytes, body: bytes, job_id: bytes,
                 now_ms: int = 0) -> None:
        if len(self._dedup) + len(self._on_disk) > 2 * len(b.jobs) + 1024:
            self._dedup = {k: v for k, v in self._dedup.items() if v in b.jobs}
            self._on_disk = {k: v for k, v in self._on_disk.items() if v in b.jobs}
        digest = hashlib.sha1(body).digest()
        self._dedup[(queue, digest)] = job_id
        job = b.jobs.get(job_id)
        if job is not None and b.replication is not None:
            self.shared.added(queue, digest, job_id, job.etime, b.node_id, now_ms)

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

    def set_content_type(self, b: BrokerCore, job_id: bytes, ctype: str) -> None:
        if len(self.content_types) > 2 * len(b.jobs) + 1024:
            self.content_types = {k: v for k, v in self.content_types.items() if k in b.jobs}
        self.content_types[job_id] = ctype
        b.outbox.append(LogRecord(RECORD_KIND, ["ctype", job_id, ctype], None))

    def set_origin(self, b: BrokerCore, dead_letter: bytes, original: bytes, queue: bytes) -> None:
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
        self._on_disk = {k: v for k, v in self._on_disk.items() if v in live_jobs}

    def load(self, data: list[Any]) -> None:
        if data[0] == "ctype":
            if is_header_value(str(data[2])):  # older logs took any Content-Type
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


class PolicyBroker(BrokerCore, Protocol):
    """The broker core with its policy table (``Broker.policies``)."""

    policies: PolicyTable
    warn: Callable[[str, str], None]
    read_body: Callable[[BodyRef], bytes | None]


def is_header_value(text: str) -> bool:
    """Whether ``text`` (a Content-Type as the HTTP API read it, latin-1) can be sent back
    as a header's value."""
    return _NOT_IN_HEADER.search(text) is None
