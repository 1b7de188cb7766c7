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

Federation (handled by ``cluster.federation.FederationCore``, ``FED_TYPES``):

    NEEDJOBS  queue (bytes), count (int 1..NEEDJOBS_MAX_COUNT: how many jobs the sender
              would like; a hint)
    YOURJOBS  jobs (1..NEEDJOBS_MAX_REQUEST job records, each as in REPLJOB: state
              ``active``, its holders 40-hex node IDs)

Batches (``Batch``): SETACK, GOTACK, DELJOB, WILLQUEUE and QUEUED are sent once per job,
often for many jobs to the same node at once (an ACKJOB or FASTACK of many IDs, a GC round);
the job core packs a run of them to one node into one frame of the matching ``*_BATCH``
type, whose body is ``items``: 2..``MAX_BATCH`` entries, each the single message's fields
in order (a DELJOB or WILLQUEUE entry is just the ID; SETACK ``[id, mayhave]``, GOTACK
``[id, known]``, QUEUED ``[id, nack, deliv]``), checked as strictly as the single message.

``id`` is a job ID (bytes) that passes ``protocol.jobid.is_valid``. NACK has a number in
``cluster.wire.MessageType`` but no body here: Disque propagates a NACK as QUEUED with the
nack flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from broker.job import REC_DELIVERED, REC_STATE, Job, record_problem
from cluster.messages import int_field, is_node_id
from cluster.wire import Frame, MalformedBody, MessageType, received_body
from protocol.jobid import is_valid

MAX_QUEUE_NAME = 64 * 1024
MAX_NODES = 10_000  # nodes a REPLJOB may name as holders


NEEDJOBS_MAX_REQUEST = 100  # Disque's: the most jobs one NEEDJOBS asks for, one YOURJOBS moves
#: The most jobs one NEEDJOBS may ask for here (answered in YOURJOBS frames of at most
#: NEEDJOBS_MAX_REQUEST): a busy consumer node gets more per round trip than Disque's 100.
NEEDJOBS_MAX_COUNT = 1000
MAX_BATCH = 1000  # the most entries one batched frame carries (a 40 KiB frame of DELJOBs)


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
        return repljob_body(self.record, self.noreply)

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


@dataclass(frozen=True, slots=True)
class NeedJobs:
    queue: bytes
    count: int
    type: MessageType = MessageType.NEEDJOBS

    def body(self) -> dict[str, Any]:
        return {"queue": self.queue, "count": self.count}


@dataclass(frozen=True, slots=True)
class YourJobs:
    records: list[list[Any]]
    type: MessageType = MessageType.YOURJOBS

    def body(self) -> dict[str, Any]:
        return {"jobs": self.records}


@dataclass(frozen=True, slots=True)
class Batch:
    """Several messages of one type (``single``: SETACK, GOTACK, DELJOB, WILLQUEUE, QUEUED)
    to one node in one frame; ``items`` are their wire entries (``batch_item``)."""

    type: MessageType  # the *_BATCH type
    items: list[Any]

    def body(self) -> dict[str, Any]:
        return {"items": self.items}

    def messages(self) -> list[JobRef | SetAck | GotAck | Queued]:
        single = SINGLE_OF[self.type]
        if single is MessageType.SETACK:
            return [SetAck(i[0], i[1]) for i in self.items]
        if single is MessageType.GOTACK:
            return [GotAck(i[0], i[1]) for i in self.items]
        if single is MessageType.QUEUED:
            return [Queued(i[0], i[1], i[2]) for i in self.items]
        return [JobRef(single, i) for i in self.items]


#: Single message type -> the type of a frame carrying several of them.
BATCH_OF: dict[MessageType, MessageType] = {
    MessageType.SETACK: MessageType.SETACK_BATCH,
    MessageType.GOTACK: MessageType.GOTACK_BATCH,
    MessageType.DELJOB: MessageType.DELJOB_BATCH,
    MessageType.WILLQUEUE: MessageType.WILLQUEUE_BATCH,
    MessageType.QUEUED: MessageType.QUEUED_BATCH,
}
SINGLE_OF: dict[MessageType, MessageType] = {b: s for s, b in BATCH_OF.items()}


def batch_item(msg: JobRef | SetAck | GotAck | Queued) -> Any:
    """A batchable message's entry in a ``Batch`` (see the module docstring)."""
    if isinstance(msg, SetAck):
        return [msg.job_id, msg.may_have]
    if isinstance(msg, GotAck):
        return [msg.job_id, msg.known]
    if isinstance(msg, Queued):
        return [msg.job_id, msg.nack, msg.deliv]
    return msg.job_id


def single_body(single: MessageType, item: Any) -> dict[str, Any]:
    """The body of the single message whose batch entry is ``item`` (``batch_item``)."""
    if single is MessageType.SETACK:
        return {"id": item[0], "mayhave": item[1]}
    if single is MessageType.GOTACK:
        return {"id": item[0], "known": item[1]}
    if single is MessageType.QUEUED:
        return {"id": item[0], "nack": item[1], "deliv": item[2]}
    return {"id": item}


JobMessage = JobRef | ReplJob | Enqueue | Queued | SetAck | GotAck | PauseQueue | Batch
FedMessage = NeedJobs | YourJobs
FED_TYPES = frozenset({MessageType.NEEDJOBS, MessageType.YOURJOBS})

_REF_TYPES = frozenset({MessageType.GOTJOB, MessageType.WILLQUEUE, MessageType.DELJOB,
                        MessageType.WORKING})
JOB_TYPES = _REF_TYPES | frozenset({MessageType.REPLJOB, MessageType.ENQUEUE,
                                    MessageType.QUEUED, MessageType.SETACK,
                                    MessageType.GOTACK, MessageType.PAUSE}) | frozenset(SINGLE_OF)


def parse(frame: Frame) -> JobMessage:
    """The typed message of a job frame; MalformedBody if it is not one."""
    body = received_body(frame)
    if not isinstance(body, dict):
        raise MalformedBody("body is not a map")
    t = frame.type
    if t in _REF_TYPES:
        return JobRef(t, _id(body))
    if t is MessageType.REPLJOB:
        record, noreply = repljob_fields(body)
        return ReplJob(record, noreply)
    if t is MessageType.ENQUEUE:
        return Enqueue(_id(body), int_field(body, "delay", 0, 2**31))
    if t is MessageType.QUEUED:
        return Queued(_id(body), _bool(body, "nack"), _bool(body, "deliv"))
    if t is MessageType.SETACK:
        return SetAck(_id(body), int_field(body, "mayhave", 0, 2**31))
    if t is MessageType.GOTACK:
        return GotAck(_id(body), _bool(body, "known"))
    if t is MessageType.PAUSE:
        return PauseQueue(_queue(body), int_field(body, "flags", 0, 3))
    if t in SINGLE_OF:
        return Batch(t, batch_items(body, SINGLE_OF[t]))
    raise MalformedBody(f"{t.name} is not a job message")


def repljob_body(record: list[Any], noreply: bool) -> dict[str, Any]:
    """A REPLJOB's wire body: what ``ReplJob.body`` makes, for the job core's hot path (a
    frozen dataclass costs an interpreted ``__init__`` per message, even compiled)."""
    return {"job": record, "noreply": noreply}


def repljob_fields(body: dict[str, Any]) -> tuple[list[Any], bool]:
    """A REPLJOB body's checked record and noreply flag (``parse`` without the message
    object); MalformedBody if it is not one."""
    return _active_record(body.get("job"), "job"), _bool(body, "noreply")


def batch_items(body: dict[str, Any], single: MessageType) -> list[Any]:
    """A batch's entries, each checked as its single message's fields are; MalformedBody if
    any is not."""
    items = body.get("items")
    if not isinstance(items, list) or not 1 < len(items) <= MAX_BATCH:
        raise MalformedBody(f"field 'items' must be a list of 2..{MAX_BATCH} entries")
    if single in (MessageType.DELJOB, MessageType.WILLQUEUE):
        for job_id in items:
            if not isinstance(job_id, bytes) or not is_valid(job_id):
                raise MalformedBody("field 'items': each entry must be a valid job ID")
        return items
    # [id, mayhave] / [id, known] / [id, nack, deliv]
    width = 3 if single is MessageType.QUEUED else 2
    for entry in items:
        if not isinstance(entry, list) or len(entry) != width:
            raise MalformedBody(f"field 'items': each entry must be a list of {width} fields")
        job_id = entry[0]
        if not isinstance(job_id, bytes) or not is_valid(job_id):
            raise MalformedBody("field 'items': each entry must start with a valid job ID")
        if single is MessageType.SETACK:
            n = entry[1]
            if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= 2**31:
                raise MalformedBody("field 'items': mayhave must be an integer in [0, 2**31]")
        elif not all(isinstance(f, bool) for f in entry[1:]):
            raise MalformedBody("field 'items': the flags must be booleans")
    return items


def parse_federation(frame: Frame) -> FedMessage:
    """The typed NEEDJOBS or YOURJOBS of a frame; MalformedBody if it is not one."""
    body = received_body(frame)
    if not isinstance(body, dict):
        raise MalformedBody("body is not a map")
    if frame.type is MessageType.NEEDJOBS:
        return NeedJobs(_queue(body), int_field(body, "count", 1, NEEDJOBS_MAX_COUNT))
    if frame.type is MessageType.YOURJOBS:
        records = body.get("jobs")
        if not isinstance(records, list) or not 0 < len(records) <= NEEDJOBS_MAX_REQUEST:
            raise MalformedBody(f"field 'jobs' must be a list of 1..{NEEDJOBS_MAX_REQUEST} jobs")
        return YourJobs([_active_record(r, f"jobs[{i}]") for i, r in enumerate(records)])
    raise MalformedBody(f"{frame.type.name} is not a federation message")


def _queue(body: dict[str, Any]) -> bytes:
    queue = body.get("queue")
    if not isinstance(queue, bytes) or not 0 < len(queue) <= MAX_QUEUE_NAME:
        raise MalformedBody("field 'queue' must be a queue name")
    return queue


def _active_record(record: Any, field: str) -> list[Any]:
    """A job record as another node sends it: valid, ACTIVE, naming its holders."""
    problem = record_problem(record)
    if problem is not None:
        raise MalformedBody(f"field {field!r}: {problem}")
    rec: list[Any] = record
    state: str = rec[REC_STATE]  # a str: record_problem checked it
    if state != "active":
        raise MalformedBody(f"field {field!r}: a job is sent active")
    nodes: list[str] = rec[REC_DELIVERED]  # strings: record_problem checked them
    if not nodes:
        raise MalformedBody(f"field {field!r}: no node may have a copy")
    if len(nodes) > MAX_NODES:
        raise MalformedBody(f"field {field!r}: its nodes must be 40-hex node IDs")
    recent = _RECENT_IDS
    for i in range(len(nodes)):
        # The same few node IDs come in every REPLJOB: each is compared with the IDs found
        # well-formed lately (no hash of a string msgpack has just made) before its digits
        # are checked, and replaced by the one found: the jobs a node holds share their
        # holders' strings (and their hashes, once computed).
        n = nodes[i]
        known = _among(n, recent)
        if known is not None:
            nodes[i] = known
            continue
        if not is_node_id(n):
            raise MalformedBody(f"field {field!r}: its nodes must be 40-hex node IDs")
        if len(recent) >= _RECENT_MAX:  # bounded, whatever peers send
            recent.pop()
        recent.insert(0, n)
    return rec


def _among(node_id: str, known: list[str]) -> str | None:
    """The string of ``known`` equal to ``node_id``, or None."""
    for k in known:
        if k == node_id:
            return k
    return None


#: Node IDs lately found well-formed, newest first (a hit is exactly a value that passed).
_RECENT_IDS: Final[list[str]] = []
_RECENT_MAX: Final = 16
