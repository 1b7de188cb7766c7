"""Periodic timers across the cluster (issue 14): the table replicated to every node, and which
node fires each due time (sans-IO).

Theory of operation
-------------------
The table (``broker.periodic.PeriodicTable``) travels as ``cluster/table_sync.py`` describes,
in ``TIMER`` (41) frames of ``{"timers": [record, ...]}``: a change at once to every reachable
node, the whole table to a node that gains a link and every 5 s to one random node. Here a
whole table is always answered, even with nothing newer, so a node knows which peers have
told it everything they know since it started (``synced``).

Ownership. The *owner* of a timer is chosen by rendezvous hashing of its name over the
*candidates*: this node (unless leaving) and every node it considers reachable (not
handshake, leaving, pfail, fail or noaddr). Nodes that share a view agree without talking;
when a node joins only the timers it wins move, when one fails only its timers move.

The baton. Agreeing on an owner is not enough: views differ while a failure is being
detected, and a new owner must not fire a due time the old one already fired. So each timer's
replicated *progress* names one *holder*, the only node that may fire, and the last due time
done (fired, or skipped for good) — ``broker.periodic.Progress``, merged by (done, seq,
holder). At each tick, for each timer:

* the holder that is not the owner in its own view hands the baton to the owner (at most
  once a second per timer, so two nodes whose views disagree do not fill their logs);
* the owner that holds the baton fires the next due time when it has come (``Definition.
  next_due``: after a stop of several periods, once, for the latest), provided it holds the
  *lease*: itself plus the nodes that answered a PING within 3/4 of the node timeout *and*
  sent their whole timer table since this node started or last lost them, are a majority of
  the cluster (Disque's size: every entry not in handshake). A fire logs and announces the
  new progress to every node, then adds the job with the ID derived from the name and the due
  time (``broker.periodic.fire``);
* the owner that does not hold the baton waits for the hand-over while the holder is
  reachable. When the holder is unreachable (failed, partitioned away, leaving, unknown for a
  node timeout) it takes the baton itself, with the lease, and marks done every due time up
  to ``U - node_timeout / 8``, where U is when this node first saw the holder unreachable.

Why that bound: the old holder fires only while it holds its lease, that is within 3/4 of a
node timeout of the last PONG it had from the majority; a node flags a peer pfail only after a
PING unanswered for a node timeout, sent at most one round trip before the silence began. So
the old holder's last possible fire is before ``U - node_timeout/4 + RTT``, and with round
trips and clock offsets under node_timeout/8, every due time it may have fired is skipped by
the new holder. A due time that fell in that window when the holder really died is missed
(docs/timers.md says so); one after it is fired, late, when the new holder takes over.

A minority partition never fires (no lease); the majority takes over after the node timeout.
What is left, and documented: two nodes each holding a majority lease with views that keep
disagreeing (an asymmetric partition), or round trips or clock offsets beyond node_timeout/8,
can fire one due time twice. Both jobs then carry the same ID, and a node never adds a job
whose ID it already holds.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Final

from broker.core import Broker
from broker.periodic import Entry, apply_remote, fire, pass_baton, validate_record
from broker.periodic import Progress as Progress
from cluster.effects import LogLine
from cluster.membership import Membership
from cluster.table_sync import UNREACHABLE, TableSync
from cluster.wire import MalformedBody, MessageType
from protocol.resp import Error

#: A node hands a timer's baton on at most this often (views that disagree would otherwise
#: pass it back and forth at every tick).
PASS_INTERVAL_MS: Final = 1_000


class PeriodicSync(TableSync):
    HANDLES: frozenset[MessageType] = frozenset({MessageType.TIMER})
    MESSAGE = MessageType.TIMER
    KEY = "timers"
    KIND = "timer"
    ALWAYS_ANSWER = True

    def __init__(self, broker: Broker, membership: Membership,
                 rng: random.Random | None = None, now_ms: int = 0) -> None:
        super().__init__(membership, rng, now_ms)
        self.broker = broker
        self.table = broker.periodic
        # Peers that sent their whole table since this node started or last saw them
        # unreachable: only they count towards the lease.
        self.synced: set[str] = set()
        self.unreachable_since: dict[str, int] = {}  # node ID -> first seen unreachable
        self._passed: dict[bytes, int] = {}  # timer -> when this node last handed it on
        self._owners: dict[bytes, str] = {}  # rendezvous results for ``_owners_for``
        self._owners_for: tuple[str, ...] = ()
        self._next_due: int | None = None
        self.table.owner_of = self.owner
        self.table.on_change = self._changed
        self.table.now_ms = max(self.table.now_ms, now_ms)
        self.counters = {"fired": 0, "failed": 0, "handed_over": 0, "taken_over": 0}

    # -- the table's records (cluster/table_sync.py) ------------------------------------------

    def records(self) -> list[Any]:
        return [e.to_record() for e in self.table.entries.values()]

    def parse_record(self, rec: Any) -> Entry:
        if validate_record(rec) is not None:
            raise MalformedBody("a timer record a node could not have written")
        return Entry.from_record(rec)

    def apply(self, item: Entry, sender: str, now_ms: int) -> bool:
        if not apply_remote(self.broker, item):
            return False
        self._note(self.table.entries[item.name])
        return True

    def newer_than(self, items: list[Entry]) -> list[Any]:
        theirs = {e.name: e for e in items}
        out = []
        for e in self.table.entries.values():
            t = theirs.get(e.name)
            if t is None or t.stamp < e.stamp or t.progress < e.progress:
                out.append(e.to_record())
        return out

    def whole_table_from(self, sender: str, now_ms: int) -> None:
        self.synced.add(sender)

    def record_size(self, rec: Any) -> int:
        fields = rec[1]
        if fields is None:
            return 128 + len(rec[0])
        return (256 + len(rec[0]) + len(fields["queue"]) + len(fields["body"])
                + sum(len(p) + 2 for p in fields["params"]))

    def _changed(self, e: Entry) -> None:
        self.broadcast([e.to_record()])
        self._note(e)

    # -- ownership ------------------------------------------------------------------------------

    def candidates(self) -> tuple[str, ...]:
        m = self.membership
        ids = [n.node_id for n in m.nodes.values() if not n.flags & UNREACHABLE]
        if "leaving" not in m.myself.flags:
            ids.append(m.myself_id)
        return tuple(sorted(ids))

    def owner(self, name: bytes) -> str:
        """The owner of ``name`` in this node's view ("" when no node may own it)."""
        cands = self.candidates()
        if cands != self._owners_for:
            self._owners, self._owners_for = {}, cands
        found = self._owners.get(name)
        if found is None:
            found = max(cands, key=lambda n: hashlib.sha1(name + b"\0" + n.encode()).digest(),
                        default="")
            if len(self._owners) < 100_000:
                self._owners[name] = found
        return found

    def lease(self, now_ms: int) -> bool:
        """Whether this node may fire now: it hears from a majority (see the docstring)."""
        m = self.membership
        fresh_ms = m.node_timeout() * 3 // 4
        heard = 1 + sum(1 for n in m.nodes.values()
                        if n is not m.myself and not n.flags & UNREACHABLE
                        and n.node_id in self.synced and now_ms - n.pong_received <= fresh_ms)
        return heard >= m.size() // 2 + 1

    # -- time -----------------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        return self._next_due

    def tick(self, now_ms: int) -> None:
        super().tick(now_ms)
        self.table.now_ms = max(self.table.now_ms, now_ms)
        self._track(now_ms)
        self._next_due = None
        lease = self.lease(now_ms)
        for e in list(self.table.entries.values()):
            if e.definition is not None:
                self._consider(e, now_ms, lease)

    def _track(self, now_ms: int) -> None:
        m = self.membership
        for n in m.nodes.values():
            if n is m.myself:
                continue
            if n.flags & UNREACHABLE:
                self.unreachable_since.setdefault(n.node_id, now_ms)
                self.synced.discard(n.node_id)
            else:
                self.unreachable_since.pop(n.node_id, None)
        if len(self.unreachable_since) > 2 * len(m.nodes) + 64:
            holders = {e.progress.holder for e in self.table.entries.values()}
            self.unreachable_since = {k: v for k, v in self.unreachable_since.items()
                                      if k in m.nodes or k in holders}

    def _consider(self, e: Entry, now_ms: int, lease: bool) -> None:
        me = self.membership.myself_id
        owner = self.owner(e.name)
        holder = e.progress.holder
        if holder == me and owner != me:
            if owner and now_ms - self._passed.get(e.name, -PASS_INTERVAL_MS) >= PASS_INTERVAL_MS:
                self._passed[e.name] = now_ms
                self.counters["handed_over"] += 1
                pass_baton(self.broker, e, owner)
            return
        if owner != me or not lease:
            return
        if holder != me:
            if not self._take_over(e, holder, now_ms):
                return
            e = self.table.entries[e.name]
        d = e.definition
        assert d is not None
        if d.paused:
            return
        due = d.next_due(e.progress.done_ms, now_ms)
        if due > now_ms:
            self._next_due = due if self._next_due is None else min(self._next_due, due)
            return
        reply = fire(self.broker, e, due, now_ms)
        if isinstance(reply, Error):
            self.counters["failed"] += 1
            self.outbox.append(LogLine(
                "warning", f"Timer {e.name.decode('utf-8', 'replace')}: the job of due time "
                f"{due} was refused: {reply}", key=f"timer-fire:{e.name!r}"))
        else:
            self.counters["fired"] += 1
        d_next = d.next_due(due, now_ms)
        self._next_due = d_next if self._next_due is None else min(self._next_due, d_next)

    def _take_over(self, e: Entry, holder: str, now_ms: int) -> bool:
        """Take the baton from ``holder`` if it is unreachable; False if it must be waited
        for."""
        m = self.membership
        known = m.nodes.get(holder)
        since = self.unreachable_since.setdefault(holder, now_ms)
        if known is not None and "handshake" not in known.flags:
            if not known.flags & UNREACHABLE:
                return False  # reachable: its hand-over will come
        elif now_ms - since < m.node_timeout():
            return False  # not (yet) in our table: it may be alive, give it a node timeout
        floor = since - m.node_timeout() // 8
        p = e.progress
        self.counters["taken_over"] += 1
        self.outbox.append(LogLine(
            "notice", f"Timer {e.name.decode('utf-8', 'replace')}: taking over from "
            f"unreachable node {holder[:8] or '(none)'}; due times up to {floor} are not "
            "fired again", key=f"timer-takeover:{holder}"))
        pass_baton(self.broker, e, m.myself_id, done_ms=max(p.done_ms, floor))
        return True

    def _note(self, e: Entry) -> None:
        """An entry changed between ticks: tick at its next due time if this node holds it."""
        d = e.definition
        if d is None or d.paused or e.progress.holder != self.membership.myself_id:
            return
        due = d.next_due(e.progress.done_ms, self.table.now_ms)
        self._next_due = due if self._next_due is None else min(self._next_due, due)
