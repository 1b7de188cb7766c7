"""Typed bodies of the job messages: REPLJOB, GOTJOB, ENQUEUE, WILLQUEUE, QUEUED, SETACK,
GOTACK, DELJOB, WORKING and PAUSE.

Theory of operation
-------------------
As ``cluster/messages.py`` does for membership, ``parse`` is the only place that trusts
nothing about a peer's msgpack map: every field's type and range is checked and anything
wrong raises ``cluster.wire.MalformedBody``, so the job core only sees well-formed values.
``body()`` of each message is its wire form (a plain dict). Fields:

    REPLJOB   job      the job as ``broker.job.Job.to_record()`` (checked by
                       ``broker.job.record_problem``), its ``delivered`` the nodes that may
                       have a copy; noreply (bool): do not answer GOTJOB
    GOTJOB    id
    ENQUEUE   id, delay (seconds, >= 0)
    WILLQUEUE id
    QUEUED    id, nack (bool: count a NACK), deliv (bool: count an additional delivery)
    SETACK    id, mayhave (int: how many nodes the sender believes may have a copy)
    GOTACK    id, known (bool: the sender had the job)
    DELJOB    id
    WORKING   id
    PAUSE     queue (bytes), flags (int 0..3: in=1, out=2)

``id`` is a job ID (bytes) that passes ``protocol.jobid.is_valid``. NACK, NEEDJOBS and
YOURJOBS have numbers in ``cluster.wire.MessageType`` but no body here: Disque propagates a
NACK as QUEUED with the nack flag, and federation is issue 10.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.job import Job, record_problem
from cluster.messages import is_node_id
from cluster.wire import Frame, MalformedBody, MessageType
from protocol.jobid import is_valid

MAX_QUEUE_NAME = 64 * 1024
MAX_NODES = 10_000  # nodes a REPLJOB may name as holders


def _id(body: dict[str, Any]) -> bytes:
    value = body.get("id")
    if not isinstance(value, bytes) or not is_valid(value):
        raise MalformedBody("field 'id' must be a valid job ID")
    return value


def _bool(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise MalformedBody(f"field {key!r} must be a boolean")
    return value


def _int(body: dict[str, Any], key: str, lo: int, hi: int) -> int:
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise MalformedBody(f"field {key!r} must be an integer in [{lo}, {hi}]")
    return value


@dataclass(frozen=True, slots=True)
class JobRef:
    """GOTJOB, WILLQUEUE, DELJOB, WORKING: just a job ID."""

    type: MessageType
    job_id: bytes

    def body(self) -> dict[str, Any]:
        return {"id": self.job_id}


@dataclass(frozen=True, slots=True)
class ReplJob:
    record: list[Any]
    noreply: bool = False
    type: MessageType = MessageType.REPLJOB

    def body(self) -> dict[str, Any]:
        return {"job": self.record, "noreply": self.noreply}

    def job(self) -> Job:
        return Job.from_record(self.record)


@dataclass(frozen=True, slots=True)
class Enqueue:
    job_id: bytes
    delay: int
    type: MessageType = MessageType.ENQUEUE

    def body(self) -> dict[str, Any]:
        return {"id": self.job_id, "delay": self.delay}


@dataclass(frozen=True, slots=True)
class Queued:
    job_id: bytes
    nack: bool = False
    deliv: bool = False
    type: MessageType = MessageType.QUEUED

    def body(self) -> dict[str, Any]:
        return {"id": self.job_id, "nack": self.nack, "deliv": self.deliv}


@dataclass(frozen=True, slots=True)
class SetAck:
    job_id: bytes
    may_have: int
    type: MessageType = MessageType.SETACK

    def body(self) -> dict[str, Any]:
        return {"id": self.job_id, "mayhave": self.may_have}


@dataclass(frozen=True, slots=True)
class GotAck:
    job_id: bytes
    known: bool
    type: MessageType = MessageType.GOTACK

    def body(self) -> dict[str, Any]:
        return {"id": self.job_id, "known": self.known}


@dataclass(frozen=True, slots=True)
class PauseQueue:
    queue: bytes
    flags: int
    type: MessageType = MessageType.PAUSE

    def body(self) -> dict[str, Any]:
        return {"queue": self.queue, "flags": self.flags}


JobMessage = JobRef | ReplJob | Enqueue | Queued | SetAck | GotAck | PauseQueue

_REF_TYPES = frozenset({MessageType.GOTJOB, MessageType.WILLQUEUE, MessageType.DELJOB,
                        MessageType.WORKING})
JOB_TYPES = _REF_TYPES | frozenset({MessageType.REPLJOB, MessageType.ENQUEUE,
                                    MessageType.QUEUED, MessageType.SETACK,
                                    MessageType.GOTACK, MessageType.PAUSE})


def parse(frame: Frame) -> JobMessage:
    """The typed message of a job frame; MalformedBody if it is not one."""
    body = frame.body
    if not isinstance(body, dict):
        raise MalformedBody("body is not a map")
    t = frame.type
    if t in _REF_TYPES:
        return JobRef(t, _id(body))
    if t is MessageType.REPLJOB:
        record = body.get("job")
        problem = record_problem(record)
        if problem is not None:
            raise MalformedBody(f"field 'job': {problem}")
        assert isinstance(record, list)
        if record[3] != "active":
            raise MalformedBody("field 'job': a replicated job is sent active")
        if not record[12]:
            raise MalformedBody("field 'job': no node may have a copy")
        if len(record[12]) > MAX_NODES or not all(is_node_id(n) for n in record[12]):
            raise MalformedBody("field 'job': its nodes must be 40-hex node IDs")
        return ReplJob(record, _bool(body, "noreply"))
    if t is MessageType.ENQUEUE:
        return Enqueue(_id(body), _int(body, "delay", 0, 2**31))
    if t is MessageType.QUEUED:
        return Queued(_id(body), _bool(body, "nack"), _bool(body, "deliv"))
    if t is MessageType.SETACK:
        return SetAck(_id(body), _int(body, "mayhave", 0, 2**31))
    if t is MessageType.GOTACK:
        return GotAck(_id(body), _bool(body, "known"))
    if t is MessageType.PAUSE:
        queue = body.get("queue")
        if not isinstance(queue, bytes) or not 0 < len(queue) <= MAX_QUEUE_NAME:
            raise MalformedBody("field 'queue' must be a queue name")
        return PauseQueue(queue, _int(body, "flags", 0, 3))
    raise MalformedBody(f"{t.name} is not a job message")
