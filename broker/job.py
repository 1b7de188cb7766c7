"""Jobs and their state machine.

Theory of operation
-------------------
A job is a message with delivery bookkeeping. It lives in ``Broker.jobs`` (ID -> Job) from
the moment it is created until it is acknowledged and garbage collected, deleted, or its TTL
runs out. Being *registered* (in memory) is distinct from being *queued* (deliverable here):

    WAIT_REPL --replicated--> ACTIVE <--enqueue/dequeue--> QUEUED
         any state --ACKJOB / SETACK--> ACKED

``transition()`` is the only place a state changes; a transition not in ``_ALLOWED`` raises,
so a bug shows up as an exception instead of a silently wrong job.

Times are integers in milliseconds on the node's wall clock, passed in by the caller. ``ctime``
is ``ms * 1_000_000 + n`` (n counts jobs created in the same millisecond), which orders jobs
created on one node exactly. ``qtime`` is when the job is due to be queued again (0: never),
``awake`` when the job next needs attention (its key in the timer wheel), computed from the
others (``compute_awake``).
"""

from __future__ import annotations

import enum
from typing import Any, Final

from broker.timers import NOT_SCHEDULED, Timed
from protocol import core_build
from protocol.commands import MAX_JOB_SECONDS, MAX_PARENTS
from protocol.jobid import is_valid


class JobState(enum.Enum):
    WAIT_REPL = "wait-repl"  # created, waiting to be replicated to enough nodes
    ACTIVE = "active"  # held here, not queued: delivered, delayed, or a replica
    QUEUED = "queued"  # in its queue, ready to be delivered by GETJOB
    ACKED = "acked"  # processed; kept only until the cluster forgets it


_ALLOWED: Final = {
    (JobState.WAIT_REPL, JobState.ACTIVE),
    (JobState.WAIT_REPL, JobState.QUEUED),
    (JobState.ACTIVE, JobState.QUEUED),
    (JobState.QUEUED, JobState.ACTIVE),
    (JobState.WAIT_REPL, JobState.ACKED),
    (JobState.ACTIVE, JobState.ACKED),
    (JobState.QUEUED, JobState.ACKED),
}

STATE_BY_NAME: Final = {s.value: s for s in JobState}
_WAIT_REPL: Final = JobState.WAIT_REPL
_ACTIVE: Final = JobState.ACTIVE
_QUEUED: Final = JobState.QUEUED
_ACKED: Final = JobState.ACKED

# Flags (bit set in Job.flags)
FLAG_DELIVERED: Final = 1  # handed to a client at least once (GETJOB)
FLAG_WILLQUEUE: Final = 2  # wake up WILLQUEUE_ADVANCE_MS before qtime (set when a retry is armed)
FLAG_QUEUED_BEFORE: Final = 4  # queued at least once: a later queueing is an additional delivery
# Held as part of a cluster (created or received with replication on): an ACKED record of it
# is replayed as an acked job that takes part in ack GC again, not dropped.
FLAG_REPLICA: Final = 8
# Waiting out its queue's backoff (broker/backoff.py) before it is queued again: its NACK or
# additional delivery was counted when the wait began, so the queueing counts nothing.
FLAG_BACKOFF: Final = 16

# A job is re-queued WILLQUEUE_ADVANCE ms after it wakes up: in a cluster the wake-up tells
# the other holders first, so they can object if they already queued it.
WILLQUEUE_ADVANCE_MS: Final = 500


# The fields of a job record (``Job.to_record()``), by index: Final, so compiled code reads a
# constant, not a name.
REC_ID: Final = 0
REC_QUEUE: Final = 1
REC_BODY: Final = 2
REC_STATE: Final = 3
REC_REPL: Final = 4
REC_TTL: Final = 5
REC_RETRY: Final = 6
REC_DELAY: Final = 7
REC_CTIME: Final = 8
REC_QTIME: Final = 9
REC_NACKS: Final = 10
REC_DELIVERIES: Final = 11
REC_DELIVERED: Final = 12  # nodes that may hold a copy
REC_CONFIRMED: Final = 13
REC_FLAGS: Final = 14
REC_DTIME: Final = 15
REC_PRIORITY: Final = 16  # present when not 0, or when REC_AFTER is (RECORD_FIELDS)
REC_AFTER: Final = 17  # only in the record of a job waiting for its parents

_INT64_MAX: Final = (1 << 63) - 1
# Range of each integer field of a job record (index -> (name, min, max)): what the command
# parsers let in, so a record outside them was not written by a sane node. ``record_problem``
# compares with the same bounds written out (tests/broker check that both agree).
_RECORD_INTS: Final = {
    REC_REPL: ("repl", 1, 65535), REC_TTL: ("ttl", 1, MAX_JOB_SECONDS),
    REC_RETRY: ("retry", 0, MAX_JOB_SECONDS), REC_DELAY: ("delay", 0, MAX_JOB_SECONDS),
    REC_CTIME: ("ctime", 0, _INT64_MAX), REC_QTIME: ("qtime", 0, _INT64_MAX),
    REC_NACKS: ("nacks", 0, _INT64_MAX), REC_DELIVERIES: ("deliveries", 0, _INT64_MAX),
    REC_FLAGS: ("flags", 0, 255), REC_DTIME: ("dtime", 0, _INT64_MAX),
    REC_PRIORITY: ("priority", 0, 9),
}
# The largest machine integer of compiled code: a bound above it (the 64-bit ones) is a Python
# object, slow to compare with, so a value is compared with it only when above this.
_SHORT_MAX: Final = (1 << 62) - 1
# A record has 16 fields; logs written before ``dtime`` (field 15: the first delivery, unix
# ms, 0 = not delivered yet) have 15 and still load, with dtime 0. A job with a priority
# (ADDJOB ... PRIORITY n) has a 17th, ``priority``: without one, the record (and REPLJOB, which
# carries it) is the one nodes wrote before priorities existed.
RECORD_FIELDS: Final = 16
OLD_RECORD_FIELDS: Final = 15
PRIORITY_RECORD_FIELDS: Final = 17
# A job waiting for its parents (ADDJOB ... AFTER) has an 18th, ``after`` (a list of job IDs),
# and then always the 17th (priority, possibly 0) before it.
AFTER_RECORD_FIELDS: Final = 18


def _bytes(value: Any) -> bytes:
    """``bytes(value)`` without the call when it is bytes already (a record from msgpack)."""
    return value if type(value) is bytes else bytes(value)


def shown(value: Any) -> str:
    """A value for an error text: short, and cheap whatever a peer or a damaged log sent (the
    repr of a 100,000-element list is neither)."""
    if isinstance(value, (bytes, str)) and len(value) > 60:
        return f"{value[:60]!r}..."
    if isinstance(value, (list, dict)):
        return f"a {type(value).__name__} of {len(value)}"
    return repr(value)


def record_problem(rec: Any) -> str | None:
    """Why ``rec`` is not a job record this node could have written, or None if it is one.

    The append log checks every record with this before replay applies it, so a damaged or
    foreign record is reported as damage at its offset instead of failing later (when its
    delay ends, at a rewrite, at shutdown). Every REPLJOB's job goes through it too: plain
    loops, no generators (about half the time of the generic version)."""
    if not isinstance(rec, list):
        return "job record is not a list of 15 to 18 fields"
    size = len(rec)
    if size != RECORD_FIELDS and size != OLD_RECORD_FIELDS and size != PRIORITY_RECORD_FIELDS \
            and size != AFTER_RECORD_FIELDS:
        return "job record is not a list of 15 to 18 fields"
    if size == AFTER_RECORD_FIELDS:
        after = rec[REC_AFTER]
        if not isinstance(after, list) or not after or len(after) > MAX_PARENTS or not all(
                isinstance(p, bytes) and is_valid(p) for p in after):
            return "job record whose parents are not a list of job IDs"
    job_id = rec[REC_ID]
    if not isinstance(job_id, bytes) or not is_valid(job_id):
        return "job record with an invalid job ID"
    body = rec[REC_BODY]
    # A BodyRef: a split record's body that replay left in the log (broker/aof.py).
    if not isinstance(rec[REC_QUEUE], bytes) or not (
            isinstance(body, bytes) or type(body) is BodyRef):
        return "job record whose queue or body is not bytes"
    state = rec[REC_STATE]
    # A str first: a map or a list from a peer or a damaged log is unhashable.
    if not isinstance(state, str) or not _is_state_name(state):
        return f"job record with an unknown state {shown(state)}"
    # Each integer field against its own constant bounds, in one expression (compiled: a
    # tagged compare per bound, no table to walk); the table below only names the first one
    # found wrong.
    if not (_within(rec[REC_REPL], 1, 65535) and _within(rec[REC_TTL], 1, MAX_JOB_SECONDS)
            and _within(rec[REC_RETRY], 0, MAX_JOB_SECONDS)
            and _within(rec[REC_DELAY], 0, MAX_JOB_SECONDS) and _within64(rec[REC_CTIME])
            and _within64(rec[REC_QTIME]) and _within64(rec[REC_NACKS])
            and _within64(rec[REC_DELIVERIES]) and _within(rec[REC_FLAGS], 0, 255)
            and (size <= REC_DTIME or _within64(rec[REC_DTIME]))
            and (size <= REC_PRIORITY or _within(rec[REC_PRIORITY], 0, 9))):
        return _int_problem(rec, size)
    delivered = rec[REC_DELIVERED]
    confirmed = rec[REC_CONFIRMED]
    if type(delivered) is not list or type(confirmed) is not list or not (
            _all_str(delivered) and _all_str(confirmed)):
        return "job record whose node lists are not lists of node IDs"
    return None


def _is_state_name(name: str) -> bool:
    """``name in STATE_BY_NAME`` without hashing a string msgpack has just made."""
    return name == "active" or name == "queued" or name == "acked" or name == "wait-repl"


def _state_named(name: str) -> JobState:
    """``STATE_BY_NAME[name]`` by comparison: a string msgpack has just made is not hashed
    yet (KeyError for no state's name, as the lookup)."""
    if name == "active":
        return _ACTIVE
    if name == "queued":
        return _QUEUED
    if name == "acked":
        return _ACKED
    if name == "wait-repl":
        return _WAIT_REPL
    raise KeyError(name)


def _within(value: object, low: int, high: int) -> bool:
    """An int (not a bool) in [low, high]; the bounds fit a machine word."""
    if type(value) is not int:
        return False
    n: int = value
    return low <= n <= high


def _within64(value: object) -> bool:
    """An int (not a bool) in [0, 2**63 - 1]: compared with the wide bound only when above
    a machine word's."""
    if type(value) is not int:
        return False
    n: int = value
    return n >= 0 and (n <= _SHORT_MAX or n <= _INT64_MAX)


def _all_str(items: list[Any]) -> bool:
    for item in items:
        if not isinstance(item, str):
            return False
    return True


def _int_problem(rec: list[Any], size: int) -> str:
    """The message for the first integer field of ``rec`` out of its range."""
    for index, (name, low, high) in _RECORD_INTS.items():
        if index < size:  # dtime is absent from a 15-field record, priority from a 16-field one
            value = rec[index]
            if type(value) is not int or not low <= value <= high:
                return f"job record with {name} {shown(value)} outside [{low}, {high}]"
    return "job record with an integer field out of range"


def validate_record(kind: str, data: Any) -> str | None:
    """Why an append-log record ``(kind, data)`` is not one a node could have written, or
    None. ``broker/aof.py`` calls it for every record it reads."""
    if kind == "job":
        return record_problem(data)
    if kind in ("ack", "del") and not (isinstance(data, bytes) and is_valid(data)):
        return f"{kind} record with an invalid job ID {shown(data)}"
    if kind == "dlv":
        # [job_id, dtime]: the first delivery of a job, unix ms (never 0: 0 means "none").
        if not (isinstance(data, list) and len(data) == 2 and isinstance(data[0], bytes)
                and is_valid(data[0])):
            return f"dlv record that is not [job ID, time] {shown(data)}"
        if type(data[1]) is not int or not 0 < data[1] <= _INT64_MAX:
            return f"dlv record with dtime {shown(data[1])} outside [1, {_INT64_MAX}]"
    return None


def state_name(state: JobState) -> str:
    """``state.value`` without the enum's Python-level ``value`` descriptor (a per-record cost
    on the hot path, compiled or not)."""
    if state is _QUEUED:
        return "queued"
    if state is _ACTIVE:
        return "active"
    if state is _ACKED:
        return "acked"
    return "wait-repl"


class BodyRef:
    """Where a job's body lies in the append log, once the log holds it instead of memory
    (``body-memory-max``, docs/persistence.md): the log file's generation, the offset and
    length of the body's bytes in it, and their CRC-32. The broker never reads it: it puts the
    reference where a body goes (a reply, ``Job.to_record()``) and the node's encoders read
    the bytes (node/bodies.py)."""

    __slots__ = ("gen", "offset", "length", "crc")

    def __init__(self, gen: int, offset: int, length: int, crc: int) -> None:
        self.gen = gen
        self.offset = offset
        self.length = length
        self.crc = crc

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"BodyRef({self.gen}, {self.offset}, {self.length}, {self.crc:#x})"


class JobExtra:
    """The fields most jobs keep at their default (no DELAY, never NACKed or queued again, not
    replicated), and the nodes that may hold a copy: held apart so a queued job's object stays
    small (``Job.more`` holds the nodes' tuple alone until one of the others is set)."""

    __slots__ = ("delivered", "delay", "nacks", "deliveries", "confirmed", "after")

    def __init__(self, delivered: tuple[str, ...]) -> None:
        self.delivered = delivered
        self.delay = 0
        self.nacks = 0
        self.deliveries = 0  # Disque's "additional-deliveries"
        self.confirmed: tuple[str, ...] = ()
        # ADDJOB ... AFTER: the parents not done yet (broker/chains.py); while any, the job
        # waits (SHOW state ``waiting``) and is never queued.
        self.after: tuple[bytes, ...] = ()


# ``Job.bits``: the state's index in _STATES (2 bits), the flags (8 bits), the priority (4
# bits), ``repl`` - 1 (16 bits), whether ``dtime`` is set (1 bit), then ``dtime`` as ms after
# the creation's (signed: another node's clock may be behind; unboxed compiled while under 24
# days). In that order a job of one copy without a priority, not delivered, has bits under
# 128, which the pure core's interpreter shares instead of boxing per job.
# A tuple of any length to mypyc: one object indexed in place, where a fixed-length one is
# kept unboxed and boxed into a new tuple at every read of ``Job.state``.
_STATES: Final[tuple[JobState, ...]] = (
    JobState.WAIT_REPL, JobState.ACTIVE, JobState.QUEUED, JobState.ACKED)
_STATE_MASK: Final = 3
_FLAGS_SHIFT: Final = 2
_FLAGS_MASK: Final = 0xFF << _FLAGS_SHIFT
_PRIORITY_SHIFT: Final = 10
_PRIORITY_MASK: Final = 0xF << _PRIORITY_SHIFT
_REPL_SHIFT: Final = 14
_REPL_MASK: Final = 0xFFFF
_HAS_DTIME: Final = 1 << 30
_DTIME_SHIFT: Final = 31
_BELOW_DTIME: Final = (1 << _DTIME_SHIFT) - 1

# A body the log holds: ``Job.spot`` is the file's generation above the offset (40 bits: 1 TiB),
# ``Job.sized`` the length above a set bit above the CRC-32 (never 0, so 0 means "in memory").
# Compiled, each stays an unboxed word until a generation past 2**22 or a body past 512 MiB
# (then the int is an object, still exact).
_GEN_SHIFT: Final = 40
_OFFSET_MASK: Final = (1 << _GEN_SHIFT) - 1
_ON_DISK: Final = 1 << 32
_SIZE_SHIFT: Final = 33
_CRC_MASK: Final = 0xFFFF_FFFF


def _state_index(state: JobState) -> int:
    """The index of ``state`` in _STATES, by identity (hashing an enum member is a
    Python-level call even compiled)."""
    if state is _QUEUED:
        return 2
    if state is _ACTIVE:
        return 1
    if state is _ACKED:
        return 3
    return 0

# ``Job.limits``: the TTL above the retry, 32 bits each (MAX_JOB_SECONDS).
_RETRY_MASK: Final = 0xFFFF_FFFF
# Interpreted, ``limits`` is an int object of its own per job unless shared: jobs mostly have
# a few TTL and retry pairs. Compiled, the word holds it unboxed and nothing is looked up.
_BOXED: Final = core_build.kind() == core_build.PURE
_LIMITS: Final[dict[int, int]] = {}


def _shared(limits: int) -> int:
    shared = _LIMITS.get(limits)
    if shared is not None:
        return shared
    if len(_LIMITS) < 4096:
        _LIMITS[limits] = limits
    return limits


class Job(Timed):
    # Memory per job is the reason for the layout (docs/benchmarks.md, "Memory"): small
    # integers share one word (``bits``: state, flags, priority, repl, dtime; ``limits``: TTL
    # and retry), the fields most jobs never set live in ``extra``, which shares its word with
    # the tuple of nodes holding a copy (``more``), a body the log holds is two words
    # (``spot``, ``sized``), and ``awake`` is computed. Compiled, a 128-byte object (224 with
    # every field a word of its own). The properties keep each field's name.
    __slots__ = (
        "id", "queue", "data", "bits", "limits", "ctime", "qtime", "more", "spot", "sized",
    )

    def __init__(self, job_id: bytes, queue: bytes, body: bytes, *, repl: int, ttl: int,
                 retry: int, delay: int, ctime: int, delivered: tuple[str, ...],
                 state: JobState = JobState.ACTIVE) -> None:
        self.id = job_id
        self.queue = queue
        # The body's bytes (b"" once the append log holds it instead of memory,
        # ``body-memory-max``); then ``spot`` is where it lies and ``sized`` its length and
        # CRC-32 (``ref``): two unboxed words, where a BodyRef was an object of 80 B per job.
        self.data = body
        self.spot = 0
        self.sized = 0  # 0: the body is in memory
        self.bits = ((repl - 1) & _REPL_MASK) << _REPL_SHIFT | _state_index(state)
        limits = ttl << 32 | retry
        if _BOXED:
            limits = _shared(limits)
        self.limits = limits
        self.ctime = ctime
        self.qtime = 0
        # The nodes that may hold a copy (a tuple shared by a node's own jobs), or a JobExtra
        # holding them once another of its fields is set.
        self.more: tuple[str, ...] | JobExtra = delivered
        self.timer_key = NOT_SCHEDULED  # the wheel's (broker/timers.py)
        if delay:
            self.delay = delay

    @property
    def state(self) -> JobState:
        return _STATES[self.bits & _STATE_MASK]

    @state.setter
    def state(self, value: JobState) -> None:
        self.bits = self.bits & ~_STATE_MASK | _state_index(value)

    @property
    def flags(self) -> int:
        return (self.bits & _FLAGS_MASK) >> _FLAGS_SHIFT

    @flags.setter
    def flags(self, value: int) -> None:
        self.bits = self.bits & ~_FLAGS_MASK | value << _FLAGS_SHIFT

    @property
    def priority(self) -> int:
        """0 to 9, higher served first (broker/queue.py)."""
        return (self.bits & _PRIORITY_MASK) >> _PRIORITY_SHIFT

    @priority.setter
    def priority(self, value: int) -> None:
        self.bits = self.bits & ~_PRIORITY_MASK | value << _PRIORITY_SHIFT

    @property
    def repl(self) -> int:
        return ((self.bits >> _REPL_SHIFT) & _REPL_MASK) + 1

    @property
    def ttl(self) -> int:
        return self.limits >> 32

    @property
    def retry(self) -> int:
        return self.limits & _RETRY_MASK

    @property
    def extra(self) -> JobExtra | None:
        more = self.more
        return more if isinstance(more, JobExtra) else None

    def _extra(self) -> JobExtra:
        more = self.more
        if isinstance(more, JobExtra):
            return more
        extra = JobExtra(more)
        self.more = extra
        return extra

    @property
    def delivered(self) -> tuple[str, ...]:
        """The nodes that may hold a copy."""
        more = self.more
        return more.delivered if isinstance(more, JobExtra) else more

    @delivered.setter
    def delivered(self, value: tuple[str, ...]) -> None:
        more = self.more
        if isinstance(more, JobExtra):
            more.delivered = value
        else:
            self.more = value

    @property
    def delay(self) -> int:
        more = self.more
        return more.delay if isinstance(more, JobExtra) else 0

    @delay.setter
    def delay(self, value: int) -> None:
        if value or isinstance(self.more, JobExtra):
            self._extra().delay = value

    @property
    def nacks(self) -> int:
        more = self.more
        return more.nacks if isinstance(more, JobExtra) else 0

    @nacks.setter
    def nacks(self, value: int) -> None:
        if value or isinstance(self.more, JobExtra):
            self._extra().nacks = value

    @property
    def deliveries(self) -> int:
        more = self.more
        return more.deliveries if isinstance(more, JobExtra) else 0

    @deliveries.setter
    def deliveries(self, value: int) -> None:
        if value or isinstance(self.more, JobExtra):
            self._extra().deliveries = value

    @property
    def dtime(self) -> int:
        """The first delivery (unix ms), 0 until then; logged for the report."""
        bits = self.bits
        if not bits & _HAS_DTIME:
            return 0
        return self.ctime // 1_000_000 + (bits >> _DTIME_SHIFT)

    @dtime.setter
    def dtime(self, value: int) -> None:
        bits = self.bits & _BELOW_DTIME & ~_HAS_DTIME
        if value:
            bits |= _HAS_DTIME | (value - self.ctime // 1_000_000) << _DTIME_SHIFT
        self.bits = bits

    @property
    def confirmed(self) -> tuple[str, ...]:
        """The nodes that confirmed holding a copy (replication)."""
        more = self.more
        return more.confirmed if isinstance(more, JobExtra) else ()

    @confirmed.setter
    def confirmed(self, value: tuple[str, ...]) -> None:
        if value or isinstance(self.more, JobExtra):
            self._extra().confirmed = value

    @property
    def after(self) -> tuple[bytes, ...]:
        """The parents not done yet (ADDJOB ... AFTER)."""
        more = self.more
        return more.after if isinstance(more, JobExtra) else ()

    @after.setter
    def after(self, value: tuple[bytes, ...]) -> None:
        if value or isinstance(self.more, JobExtra):
            self._extra().after = value

    @property
    def etime(self) -> int:
        """When the TTL runs out (ms): creation time plus TTL."""
        return self.ctime // 1_000_000 + self.ttl * 1000

    def transition(self, new: JobState) -> None:
        # ``_ALLOWED`` as identity tests: an acked job stays acked, nothing goes back to
        # WAIT_REPL, and every other change of state is allowed (tests/broker/test_job_states.py
        # tries all 16 pairs against the table). Looking the pair up in a table hashes enum
        # members, which is a Python-level __hash__ even in the compiled core (~0.3 us a time).
        old = self.state
        if old is _ACKED or new is old or new is _WAIT_REPL:
            raise ValueError(f"job {self.id!r}: {old.value} -> {new.value} is not allowed")
        self.state = new

    @property
    def awake(self) -> int:
        """When the job next needs attention (``compute_awake``): computed, not kept, so the
        job has no word for it. A job in WAIT_REPL is woken by its replication's own timer
        (broker/cluster_jobs.py), which this does not know."""
        return self.compute_awake()

    def compute_awake(self) -> int:
        """The next time this job needs attention: requeue (a little early, see
        WILLQUEUE_ADVANCE_MS), the end of its delay, or expiry."""
        at = self.etime + 1000
        if self.state is _ACKED:
            # An acked job kept for the cluster's ack GC: qtime is its next GC attempt.
            return min(at, self.qtime) if self.qtime else at
        if self.qtime:
            due = self.qtime - WILLQUEUE_ADVANCE_MS if self.flags & FLAG_WILLQUEUE else self.qtime
            at = min(at, due)
        return at

    @property
    def content(self) -> bytes | BodyRef:
        """What a reply or a record carries for the body: its bytes, or where the log holds
        them (a ``BodyRef`` made for the caller, which the node's encoders read)."""
        sized = self.sized
        if not sized:
            return self.data
        spot = self.spot
        return BodyRef(spot >> _GEN_SHIFT, spot & _OFFSET_MASK, sized >> _SIZE_SHIFT,
                       sized & _CRC_MASK)

    @property
    def body(self) -> bytes:
        """The body's bytes in memory; b"" while the log holds it (``ref``)."""
        return self.data

    @body.setter
    def body(self, value: bytes) -> None:
        # Bytes in memory replace a reference; emptying the body keeps it: only ``ref = None``
        # drops it (the order BrokerState.unregister relies on).
        if value:
            self.spot = self.sized = 0
        self.data = value

    @property
    def ref(self) -> BodyRef | None:
        """Where the append log holds the body (made for the caller), or None while it is in
        memory."""
        content = self.content
        return content if isinstance(content, BodyRef) else None

    @ref.setter
    def ref(self, value: BodyRef | None) -> None:
        if value is not None:
            self.spot = value.gen << _GEN_SHIFT | value.offset
            self.sized = value.length << _SIZE_SHIFT | _ON_DISK | value.crc
            self.data = b""
        else:
            self.spot = self.sized = 0

    @property
    def on_disk(self) -> bool:
        """The append log holds the body (``ref`` without making one)."""
        return self.sized != 0

    @property
    def body_size(self) -> int:
        sized = self.sized
        return sized >> _SIZE_SHIFT if sized else len(self.data)

    # -- persistence ---------------------------------------------------------------------------

    def to_record(self) -> list[Any]:
        """The job as msgpack-friendly primitives (for the append log and the cluster bus);
        the optional trailing fields only when needed: ``priority`` when not 0 or when
        ``after`` follows it, ``after`` (the parents) while there are any. A job using neither
        keeps the 16 fields nodes wrote before them. A body held by the log is its
        ``BodyRef``, which the node's packers read."""
        more = self.more  # read once: every record is built here (ADDJOB, ACKJOB, GETJOB)
        if isinstance(more, JobExtra):
            rec: list[Any] = [
                self.id, self.queue, self.content, state_name(self.state),
                self.repl, self.ttl, self.retry,
                more.delay, self.ctime, self.qtime, more.nacks, more.deliveries,
                list(more.delivered), list(more.confirmed), self.flags, self.dtime,
            ]
            if more.after:
                rec.append(self.priority)
                rec.append(list(more.after))
                return rec
        else:
            rec = [
                self.id, self.queue, self.content, state_name(self.state),
                self.repl, self.ttl, self.retry,
                0, self.ctime, self.qtime, 0, 0, list(more), [], self.flags, self.dtime,
            ]
        if self.priority:
            rec.append(self.priority)
        return rec

    @classmethod
    def from_record(cls, rec: list[Any]) -> Job:
        # Fields by index and ``Job`` itself, not ``cls``: compiled, a direct call with no
        # slice of the record and no keyword matching (every REPLJOB a replica takes).
        body = rec[REC_BODY]
        ref = body if type(body) is BodyRef else None  # an undo of a job whose body is on disk
        job = Job(_bytes(rec[REC_ID]), _bytes(rec[REC_QUEUE]), b"" if ref is not None else _bytes(body),
                  repl=rec[REC_REPL], ttl=rec[REC_TTL], retry=rec[REC_RETRY],
                  delay=rec[REC_DELAY], ctime=rec[REC_CTIME],
                  delivered=tuple(rec[REC_DELIVERED]), state=_state_named(rec[REC_STATE]))
        if ref is not None:
            job.ref = ref
        job.qtime = rec[REC_QTIME]
        job.nacks = rec[REC_NACKS]
        job.deliveries = rec[REC_DELIVERIES]
        job.confirmed = tuple(rec[REC_CONFIRMED])
        job.flags = rec[REC_FLAGS]
        if len(rec) > OLD_RECORD_FIELDS:
            job.dtime = rec[REC_DTIME]
        if len(rec) > RECORD_FIELDS:
            job.priority = rec[REC_PRIORITY]
            if len(rec) > PRIORITY_RECORD_FIELDS:
                job.after = tuple(bytes(p) for p in rec[REC_AFTER])
        return job
