"""Periodic timers: a durable, cluster-wide table of jobs to add every period.

Theory of operation
-------------------
A *timer* is a name, a period, a queue, a body and the ADDJOB options (``params``) a job is
added with at each *due time*. Due times are ``start_ms + k * period_ms`` (k >= 0), in Unix
milliseconds, so every node computes the same ones. (Not ``broker/timers.py``: that is the
broker's internal timer wheel for jobs and blocked clients.)

Each name holds two things, replicated to every node and merged so that the order in which
versions arrive does not matter:

* its *definition* (period, queue, body, params, start, paused), changed by commands and
  stamped ``(ms, node_id)`` like a queue policy: the greater stamp wins, a deletion is a
  tombstone with its stamp;
* its *progress* ``(done_ms, seq, holder, fired_due_ms, fired_by)``: the latest due time
  done (fired, or skipped for good when a node took over from one it could not reach), a
  counter, the node allowed to fire the next one (the *holder* of the baton), and the latest
  due time actually fired with the node that fired it (shown to users). Versions are ordered
  by ``(done_ms, seq, holder)``; the greater wins. Only the holder fires, and a fire or a
  hand-over makes a greater version.

This module is the table, its log records, the TIMER command and the fire itself (an ADDJOB
with a job ID derived from the name and the due time: the deduplication key). *When* to fire
and *who* fires needs the membership view, so it is decided by the cluster core
(``cluster/periodic_sync.py``), whose view of the owners the listing shows (``owner_of``, set
by ``cluster/wiring.py``); without that core (a broker alone, in tests) nothing fires by
itself.

Log records (kind ``timer``): ``[name, fields | None, stamp_ms, stamp_node, [done_ms, seq,
holder, fired_due_ms, fired_by]]``, the whole state of one name; replay keeps the greatest of
each part, as a merge does. The fired jobs are ordinary jobs with their own records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

from broker import policies
from broker.clients import Client
from broker.effects import LogRecord
from broker.policy_table import PolicyBroker
from protocol import errors
from protocol.commands import AddJob, Timer, parse_addjob
from protocol.resp import Error, Status

RECORD_KIND: Final = "timer"
Record = list[Any]  # (an alias: PeriodicTable.list shadows the builtin in its class body)
#: A timer's body travels in every full-table exchange and log rewrite: bigger payloads belong
#: in a file or a store the job names.
MAX_BODY: Final = 1024 * 1024

NO_TIMER: Final = Error("NOTIMER No such timer")
EXISTS: Final = Error("EXISTS The timer already exists (TIMER ADD ... REPLACE changes it)")

FIELDS: Final = ("period_ms", "queue", "body", "params", "start_ms", "not_before_ms", "paused",
                 "origin")


@dataclass(frozen=True)
class Definition:
    """What the user set; replicated last-writer-wins (``Entry.stamp``)."""

    period_ms: int
    queue: bytes
    body: bytes
    params: tuple[bytes, ...]  # ADDJOB options after the timeout, as given (REPLICATE 2 ...)
    start_ms: int  # the first due time; the others follow every period_ms
    not_before_ms: int  # due times before it are never fired (set by ADD and RESUME)
    paused: bool = False
    origin: str = ""  # the node that took the ADD: the node field of the fired jobs' IDs

    def fields(self) -> dict[str, Any]:
        return {"period_ms": self.period_ms, "queue": self.queue, "body": self.body,
                "params": list(self.params), "start_ms": self.start_ms,
                "not_before_ms": self.not_before_ms, "paused": self.paused,
                "origin": self.origin}

    @classmethod
    def from_fields(cls, f: dict[str, Any]) -> Definition:
        return cls(int(f["period_ms"]), bytes(f["queue"]), bytes(f["body"]),
                   tuple(bytes(p) for p in f["params"]), int(f["start_ms"]),
                   int(f["not_before_ms"]), bool(f["paused"]), str(f["origin"]))

    # -- the schedule ---------------------------------------------------------------------------

    def latest_due(self, t: int) -> int | None:
        """The latest due time at or before ``t``, or None before the first one."""
        if t < self.start_ms:
            return None
        return self.start_ms + (t - self.start_ms) // self.period_ms * self.period_ms

    def first_due_after(self, t: int) -> int:
        if t < self.start_ms:
            return self.start_ms
        return self.start_ms + ((t - self.start_ms) // self.period_ms + 1) * self.period_ms

    def next_due(self, done_ms: int, now_ms: int) -> int:
        """The due time to fire next, given the last one fired: the first one after it (and
        not before ``not_before_ms``) if it is still ahead, else the latest one that has come:
        after a stop of several periods a timer fires once, for the latest due time, not once
        per due time missed."""
        floor = max(done_ms, self.not_before_ms - 1)
        first = self.first_due_after(floor)
        if first > now_ms:
            return first
        latest = self.latest_due(now_ms)
        return first if latest is None else max(first, latest)


@dataclass(frozen=True, order=True)
class Progress:
    """Where the firing stands; ordered by (done_ms, seq, holder): the merge order."""

    done_ms: int = 0  # no due time at or before it fires (again); 0: none done yet
    seq: int = 0
    holder: str = ""  # the node that may fire the next due time
    fired_due_ms: int = field(default=0, compare=False)  # the last due time fired (0: none)
    fired_by: str = field(default="", compare=False)

    def to_record(self) -> list[Any]:
        return [self.done_ms, self.seq, self.holder, self.fired_due_ms, self.fired_by]

    @classmethod
    def from_record(cls, rec: list[Any]) -> Progress:
        return cls(int(rec[0]), int(rec[1]), str(rec[2]), int(rec[3]), str(rec[4]))


@dataclass
class Entry:
    """One timer name on this node: the replicated parts and what this node did with it."""

    name: bytes
    definition: Definition | None  # None: deleted (a tombstone, kept for the merge)
    stamp: tuple[int, str]
    progress: Progress
    # This node only (not replicated, not logged): shown by TIMER GET.
    fires: int = 0  # due times this node fired since it started
    last_job: bytes | None = None  # the job this node added at its last fire
    last_error: str = ""  # why this node's last fire added no job ("" if it did)
    # The record, made once: every whole-table exchange sends every entry. Entries change by
    # replacement (``dataclasses.replace`` leaves this out), never in place. A factory, not
    # default=None: for an init=False field with a plain default, __init__ leaves the value to
    # the class attribute, which mypyc's compiled dataclass does not have (AttributeError).
    _record: list[Any] | None = field(default_factory=lambda: None, init=False, repr=False,
                                      compare=False)

    def to_record(self) -> list[Any]:
        """The log and wire record; shared, so not to be modified by the caller."""
        if self._record is None:
            d = self.definition
            self._record = [self.name, None if d is None else d.fields(), self.stamp[0],
                            self.stamp[1], self.progress.to_record()]
        return self._record

    @classmethod
    def from_record(cls, rec: list[Any]) -> Entry:
        name, fields, ms, node, progress = rec
        return cls(bytes(name), None if fields is None else Definition.from_fields(fields),
                   (int(ms), str(node)), Progress.from_record(progress))


@dataclass(frozen=True)
class Periodic:
    """A live timer as this node sees it: what ``PeriodicTable.list()`` returns (the
    dashboard and TIMER GET/LIST read these)."""

    name: bytes
    period_ms: int
    queue: bytes
    body: bytes
    params: tuple[bytes, ...]  # the ADDJOB options each fire uses
    next_due_ms: int  # the due time that fires next (in the past: overdue)
    last_fired_due_ms: int  # 0 if never fired
    owner: str  # the node that owns it in this node's view ("" if unknown)
    paused: bool
    start_ms: int = 0
    last_fired_by: str = ""
    holder: str = ""
    fires: int = 0  # fires made by this node since it started
    last_job: bytes | None = None
    last_error: str = ""


class PeriodicTable:
    """Every timer this node knows, tombstones included."""

    def __init__(self) -> None:
        self.entries: dict[bytes, Entry] = {}
        self.live = 0  # entries that are not tombstones
        # Set by cluster/wiring.py to the cluster core's: who owns a timer in this node's view
        # (the listing shows it), and what to do with an entry changed here (send it to the
        # other nodes).
        self.owner_of: Callable[[bytes], str] | None = None
        self.on_change: Callable[[Entry], None] | None = None
        self.now_ms = 0  # the latest time this table was told (commands, core ticks)

    def get(self, name: bytes) -> Entry | None:
        e = self.entries.get(name)
        return None if e is None or e.definition is None else e

    def view(self, e: Entry, now_ms: int | None = None) -> Periodic:
        d = e.definition
        assert d is not None
        now = self.now_ms if now_ms is None else now_ms
        p = e.progress
        return Periodic(
            e.name, d.period_ms, d.queue, d.body, d.params, d.next_due(p.done_ms, now),
            p.fired_due_ms, self.owner_of(e.name) if self.owner_of is not None else "",
            d.paused, d.start_ms, p.fired_by, p.holder, e.fires, e.last_job, e.last_error)

    def list(self, now_ms: int | None = None) -> list[Periodic]:
        """Every live timer, sorted by name."""
        return [self.view(e, now_ms) for name, e in sorted(self.entries.items())
                if e.definition is not None]

    def put(self, e: Entry) -> None:
        old = self.entries.get(e.name)
        self.live += (e.definition is not None) - (old is not None and old.definition is not None)
        self.entries[e.name] = e

    def merge(self, incoming: Entry) -> Entry | None:
        """A version from a peer or the log: each part kept if greater. Returns the entry as
        it now stands if anything changed, else None."""
        old = self.entries.get(incoming.name)
        if old is None:
            self.put(incoming)
            return incoming
        newer_def = incoming.stamp > old.stamp
        newer_progress = incoming.progress > old.progress
        if not newer_def and not newer_progress:
            return None
        merged = replace(old, definition=incoming.definition if newer_def else old.definition,
                         stamp=incoming.stamp if newer_def else old.stamp,
                         progress=incoming.progress if newer_progress else old.progress)
        self.put(merged)
        return merged

    # -- log ----------------------------------------------------------------------------------

    def snapshot(self) -> Iterator[tuple[str, Any]]:
        for e in list(self.entries.values()):
            yield (RECORD_KIND, e.to_record())

    def load(self, data: Record) -> None:
        self.merge(Entry.from_record(data))

    def undo(self, data: Record, prev: Any) -> None:
        name = bytes(data[0])
        current = self.entries.get(name)
        if prev is None:
            if current is not None:
                self.live -= current.definition is not None
                del self.entries[name]
            return
        restored = Entry.from_record(prev)
        if current is not None:  # this node's counters are not part of the record
            restored.fires, restored.last_job = current.fires, current.last_job
            restored.last_error = current.last_error
        self.put(restored)


class PeriodicBroker(PolicyBroker, Protocol):
    """The broker core with its timer table (``Broker.periodic``); a fire is an ADDJOB, which
    a queue's policy may change (broker/policies.py)."""

    periodic: PeriodicTable


def _is_int(v: Any, low: int = 0) -> bool:
    return type(v) is int and v >= low


def version_problem(data: Any) -> str | None:
    """What is wrong with the version part of a ``timer`` record (name, stamp, progress),
    or None: enough to compare it with the entry held here, before the costlier rest."""
    if not isinstance(data, list) or len(data) != 5:
        return "timer record is not a list of 5"
    name, fields, ms, node, progress = data
    if not isinstance(name, bytes) or not _is_int(ms) or not isinstance(node, str) \
            or not (fields is None or isinstance(fields, dict)):
        return "timer record malformed"
    if not (isinstance(progress, list) and len(progress) == 5 and _is_int(progress[0])
            and _is_int(progress[1]) and isinstance(progress[2], str)
            and _is_int(progress[3]) and isinstance(progress[4], str)):
        return "timer record with a malformed progress"
    return None


def validate_record(data: Any) -> str | None:
    """Why a ``timer`` record (log or bus) is not one a node could write, or None."""
    problem = version_problem(data)
    if problem is not None:
        return problem
    fields = data[1]
    if fields is None:
        return None
    if not isinstance(fields, dict) or set(fields) != set(FIELDS):
        return "timer record with wrong fields"
    params = fields["params"]
    if not (_is_int(fields["period_ms"], 1) and isinstance(fields["queue"], bytes)
            and isinstance(fields["body"], bytes) and len(fields["body"]) <= MAX_BODY
            and isinstance(params, list) and all(isinstance(p, bytes) for p in params)
            and _is_int(fields["start_ms"]) and _is_int(fields["not_before_ms"])
            and isinstance(fields["paused"], bool) and isinstance(fields["origin"], str)
            and len(fields["origin"]) >= 8):
        return "timer record with a value out of range"
    if not isinstance(parse_addjob([b"ADDJOB", fields["queue"], b"", b"0", *params]), AddJob):
        return "timer record with ADDJOB options ADDJOB refuses"
    return None


# =============================================================================================
# Changes made on this node


def _stamp(b: PeriodicBroker, name: bytes, now_ms: int) -> tuple[int, str]:
    """A stamp newer than every version of ``name`` this node has seen, tombstones included
    (another node's clock may be ahead: a change made here must still win)."""
    old = b.periodic.entries.get(name)
    ms = max(now_ms, old.stamp[0] + 1) if old is not None else now_ms
    return (ms, b.node_id)


def store(b: PeriodicBroker, e: Entry, prev: Entry | None) -> None:
    """Install a version made on this node: log it and tell the cluster core."""
    table = b.periodic
    undo = prev.to_record() if prev is not None else None
    table.put(e)
    b.outbox.append(LogRecord(RECORD_KIND, e.to_record(), undo))
    if table.on_change is not None:
        table.on_change(e)


def apply_remote(b: PeriodicBroker, incoming: Entry) -> bool:
    """A peer's version (cluster/periodic_sync.py): merged, and logged if it changed
    anything. Not sent on: the sender's broadcast and the periodic exchange reach every node."""
    table = b.periodic
    old = table.entries.get(incoming.name)
    undo = old.to_record() if old is not None else None
    merged = table.merge(incoming)
    if merged is None:
        return False
    b.outbox.append(LogRecord(RECORD_KIND, merged.to_record(), undo))
    return True


def pass_baton(b: PeriodicBroker, e: Entry, holder: str, done_ms: int | None = None) -> None:
    """Make ``holder`` the node that fires the next due time: a hand-over to the owner, or
    this node taking over from a holder it cannot reach (which also marks the due times that
    holder may have fired as done: ``done_ms``)."""
    p = e.progress
    done = p.done_ms if done_ms is None else done_ms
    store(b, replace(e, progress=Progress(done, p.seq + 1, holder, p.fired_due_ms, p.fired_by)),
          e)


_TIMER_CLIENT: Final = Client(0, "timer")


def add_job(b: PeriodicBroker, d: Definition, now_ms: int, id_key: tuple[str, bytes] | None) -> Any:
    """ADDJOB of the timer's job, always asynchronous (nobody waits for a fire): the job ID,
    or the error ADDJOB gives (OOM, NOREPL, PAUSED, MAXLEN...)."""
    cmd = parse_addjob([b"ADDJOB", d.queue, d.body, b"0", *d.params])
    if not isinstance(cmd, AddJob):
        return cmd  # cannot happen: the options were checked by TIMER ADD and the log reader
    cmd = AddJob(cmd.queue, cmd.body, cmd.timeout_ms, cmd.replicate, cmd.delay, cmd.retry,
                 cmd.ttl, cmd.maxlen, True, cmd.delay_given, id_key, cmd.priority, cmd.after)
    if b.policies.live:
        return policies.addjob(b, cmd, _TIMER_CLIENT, now_ms)
    return b.addjob_without_policy(cmd, _TIMER_CLIENT, now_ms)


def fire(b: PeriodicBroker, e: Entry, due_ms: int, now_ms: int) -> Any:
    """Fire ``due_ms``: first the progress (logged and announced to every node), then the
    job, whose ID is derived from the timer's name and the due time. Called by the cluster
    core when this node holds the baton and owns the timer. Returns ADDJOB's reply."""
    d = e.definition
    assert d is not None
    p = e.progress
    store(b, replace(e, progress=Progress(due_ms, p.seq + 1, b.node_id, due_ms, b.node_id)), e)
    current = b.periodic.entries[e.name]
    reply = add_job(b, d, now_ms, (d.origin, b"%s@%d" % (e.name, due_ms)))
    current.fires += 1
    if isinstance(reply, Error):
        current.last_job, current.last_error = None, str(reply)
    else:
        current.last_job, current.last_error = str(reply).encode("ascii"), ""
    return reply


# =============================================================================================
# The command

HELP: Final = (
    "TIMER <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "ADD <name> <period> <queue> <body> [REPLICATE <n>] [DELAY <sec>] [RETRY <sec>] [TTL <sec>]"
    " [MAXLEN <n>] [ASYNC] [START <unix-ms>] [REPLACE]",
    "    Add a job to <queue> every <period> seconds, the first at START (default: now).",
    "    The options after <body> are ADDJOB's; REPLACE changes an existing timer.",
    "DEL <name> [<name> ...]",
    "    Delete timers; replies with the number deleted.",
    "GET <name>",
    "    Describe a timer: schedule, owner, last fire.",
    "LIST",
    "    Describe every timer, sorted by name.",
    "PAUSE <name>",
    "    Stop firing until RESUME.",
    "RESUME <name>",
    "    Fire again from the next due time (due times missed while paused are skipped).",
    "FIRE <name>",
    "    Add the timer's job now, on this node, off schedule; replies with its ID.",
    "HELP",
    "    Print this help.",
)


def reply(v: Periodic, now_ms: int) -> list[Any]:
    """The RESP shape of TIMER GET and of each TIMER LIST entry: field/value pairs."""
    return [
        b"name", v.name,
        b"period", v.period_ms // 1000,
        b"queue", v.queue,
        b"body", v.body,
        b"params", list(v.params),
        b"start", v.start_ms,
        b"paused", int(v.paused),
        b"next-due", v.next_due_ms,
        b"next-due-in", v.next_due_ms - now_ms,
        b"last-fired-due", v.last_fired_due_ms,
        b"last-fired-by", v.last_fired_by.encode(),
        b"owner", v.owner.encode(),
        b"holder", v.holder.encode(),
        b"fires", v.fires,
        b"last-job", v.last_job,
        b"last-error", v.last_error.encode(),
    ]


def command(b: PeriodicBroker, cmd: Timer, now_ms: int) -> Any:
    table = b.periodic
    table.now_ms = max(table.now_ms, now_ms)
    sub = cmd.sub
    if sub == "HELP":
        return [Status(line) for line in HELP]
    if sub == "LIST":
        return [reply(v, now_ms) for v in table.list(now_ms)]
    if sub == "DEL":
        deleted = 0
        for name in dict.fromkeys(cmd.names):
            e = table.get(name)
            if e is not None:
                store(b, replace(e, definition=None, stamp=_stamp(b, name, now_ms)), e)
                deleted += 1
        return deleted
    name = cmd.names[0]
    e = table.get(name)
    if sub == "GET":
        return None if e is None else reply(table.view(e, now_ms), now_ms)
    if sub == "ADD":
        return _add(b, cmd, e, now_ms)
    if e is None:
        return NO_TIMER
    d = e.definition
    assert d is not None
    if sub == "FIRE":
        return add_job(b, d, now_ms, None)
    paused = sub == "PAUSE"
    if d.paused != paused:
        # RESUME: the due times that passed while paused are not fired late.
        new = replace(d, paused=paused, not_before_ms=d.not_before_ms if paused else now_ms)
        store(b, replace(e, definition=new, stamp=_stamp(b, name, now_ms)), e)
    return Status("OK")


def _add(b: PeriodicBroker, cmd: Timer, e: Entry | None, now_ms: int) -> Any:
    if e is not None and not cmd.replace:
        return EXISTS
    least = b.config.timer_min_period
    if cmd.period < least:
        return errors.err(f"period must be at least {least} seconds (the timer-min-period "
                          "directive; CONFIG SET timer-min-period allows shorter ones)")
    if len(cmd.body) > MAX_BODY:
        return errors.err(f"a timer's body is at most {MAX_BODY} bytes")
    name = cmd.names[0]
    start = now_ms if cmd.start_ms is None else cmd.start_ms
    # A START in the past aligns the schedule; the due times already past are not fired.
    d = Definition(cmd.period * 1000, cmd.queue, cmd.body, cmd.params, start,
                   max(start, now_ms), False, b.node_id)
    old = b.periodic.entries.get(name)  # a tombstone's progress is kept: the merge needs it
    p = old.progress if old is not None else Progress()
    # This node holds the baton first; it hands it to the owner if that is another node.
    progress = Progress(p.done_ms, p.seq + 1, b.node_id, p.fired_due_ms, p.fired_by)
    store(b, Entry(name, d, _stamp(b, name, now_ms), progress), old)
    return Status("OK")
