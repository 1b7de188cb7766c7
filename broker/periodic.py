"""Periodic timers: a durable, cluster-wide table of jobs to add every period (issue 14).

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
* its *progress* ``(fired_due_ms, seq, holder, fired_by)``: the latest due time fired, a
  counter, the node allowed to fire the next one (the *holder* of the baton) and the node
  that fired the last one. Versions are ordered by ``(fired_due_ms, seq, holder)``; the
  greater wins. Only the holder fires, and a fire or a hand-over makes a greater version.

This module is the table, its log records, the TIMER command and the fire itself (an ADDJOB
with a job ID derived from the name and the due time: the deduplication key). *When* to fire
and *who* fires needs the membership view, so it is decided by the cluster core
(``cluster/periodic_sync.py``), which also sets ``owner_of`` for the listing; without that
core (a broker alone, in tests) nothing fires by itself.

Log records (kind ``timer``): ``[name, fields | None, stamp_ms, stamp_node, [fired_due_ms,
seq, holder, fired_by]]``, the whole state of one name; replay keeps the greatest of each
part, as a merge does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

RECORD_KIND: Final = "timer"

FIELDS: Final = ("period_ms", "queue", "body", "params", "start_ms", "not_before_ms", "paused")


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

    def fields(self) -> dict[str, Any]:
        return {"period_ms": self.period_ms, "queue": self.queue, "body": self.body,
                "params": list(self.params), "start_ms": self.start_ms,
                "not_before_ms": self.not_before_ms, "paused": self.paused}

    @classmethod
    def from_fields(cls, f: dict[str, Any]) -> Definition:
        return cls(int(f["period_ms"]), bytes(f["queue"]), bytes(f["body"]),
                   tuple(bytes(p) for p in f["params"]), int(f["start_ms"]),
                   int(f["not_before_ms"]), bool(f["paused"]))

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

    def next_due(self, fired_due_ms: int, now_ms: int) -> int:
        """The due time to fire next, given the last one fired: the first one after it (and
        not before ``not_before_ms``) if it is still ahead, else the latest one that has come:
        after a stop of several periods a timer fires once, for the latest due time, not once
        per due time missed."""
        floor = max(fired_due_ms, self.not_before_ms - 1)
        first = self.first_due_after(floor)
        if first > now_ms:
            return first
        latest = self.latest_due(now_ms)
        return first if latest is None else max(first, latest)


@dataclass(frozen=True, order=True)
class Progress:
    """Where the firing stands; ordered by (fired_due_ms, seq, holder) — the merge order."""

    fired_due_ms: int = 0  # 0: never fired
    seq: int = 0
    holder: str = ""  # the node that may fire the next due time
    fired_by: str = field(default="", compare=False)

    def to_record(self) -> list[Any]:
        return [self.fired_due_ms, self.seq, self.holder, self.fired_by]

    @classmethod
    def from_record(cls, rec: list[Any]) -> Progress:
        return cls(int(rec[0]), int(rec[1]), str(rec[2]), str(rec[3]))


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

    def to_record(self) -> list[Any]:
        d = self.definition
        return [self.name, None if d is None else d.fields(), self.stamp[0], self.stamp[1],
                self.progress.to_record()]

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
        # Set by the cluster core: who owns a timer in this node's view (the listing shows
        # it), and what to do with an entry changed here (send it to the other nodes).
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
            e.name, d.period_ms, d.queue, d.body, d.params, d.next_due(p.fired_due_ms, now),
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
