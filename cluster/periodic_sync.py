"""Periodic timers across the cluster: the table replicated to every node, and which
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
* the owner that does not hold the baton waits for the hand-over while the holder has not
  *failed*. Once the holder is flagged ``fail`` (a majority of the cluster agrees it is
  unreachable: one node's suspicion, ``pfail``, is not enough, as another node may still
  reach it and see it as the owner) or has been unknown for a node timeout, the owner takes
  the baton itself, with the lease, and marks done every due time up to
  ``U - node_timeout / 8``, where U is when this node first saw the holder unreachable.

Why that bound: the old holder fires only while it holds its lease, that is within 3/4 of a
node timeout of the last PONG it had from the majority; a node flags a peer pfail only after a
PING unanswered for a node timeout, sent at most one round trip before the silence began. So
the old holder's last possible fire is before ``U - node_timeout/4 + RTT``, and with round
trips and clock offsets under node_timeout/8, every due time it may have fired is skipped by
the new holder. A due time that fell in that window when the holder really died is missed
(docs/timers.md says so); one after it is fired, late, when the new holder takes over.

A minority partition never fires (no lease); the majority takes over once the holder is
flagged ``fail``. Two nodes that cannot talk while both talk to the others (an asymmetric
partition) may each see itself as the owner, but neither takes the baton from a holder the
cluster has not agreed has failed. What is left, and documented: round trips or clock offsets
beyond node_timeout/8, or a FAIL agreed while the holder still reaches a majority (through
nodes that do not see it failing), can fire one due time twice. Both jobs then carry the same
ID, and a node never adds a job whose ID it already holds.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from broker.core import Broker
from broker.periodic import (
    Entry,
    Progress,
    apply_remote,
    fire,
    pass_baton,
    validate_record,
    version_problem,
)
from cluster.effects import LogLine
from cluster.membership import Membership
from cluster.table_sync import UNREACHABLE, TableSync
from cluster.wire import MalformedBody, MessageType
from protocol.resp import Error

#: A node hands a timer's baton on at most this often (views that disagree would otherwise
#: pass it back and forth at every tick).
PASS_INTERVAL_MS: Final = 1_000


class Version(NamedTuple):
    """A received record, checked only as far as comparing it needs: most records of a whole
    table are versions this node already holds, and those are dropped without the full check
    (which parses the ADDJOB options; ~25 us a record)."""

    name: bytes
    stamp: tuple[int, str]
    progress: Progress
    record: list[Any]


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
        # Work at a tick is proportional to what changed, not to the table: every timer is
        # looked at only when the view changed (candidates, failed nodes, the lease) or a
        # rescan is due; otherwise the timers changed since the last tick (``_dirty``) and
        # those whose due time came (``_due``, a heap of (due time, name) for the timers this
        # node holds and owns; entries may be stale, ``_consider`` rechecks each).
        self._dirty: set[bytes] = set(self.table.entries)
        self._due: list[tuple[int, bytes]] = []
        self._view: tuple[Any, ...] = ()
        self._rescan_at: int | None = now_ms
        self.table.now_ms = max(self.table.now_ms, now_ms)
        self.counters = {"fired": 0, "refused": 0, "handed_over": 0, "taken_over": 0}
        # What fires a due time. An attribute, so that a test can watch the fires: compiled
        # with mypyc, this module calls a module-level function directly, past any
        # replacement of it from outside.
        self.fire_due: Callable[[Broker, Entry, int, int], Any] = fire

    # -- the table's records (cluster/table_sync.py) ------------------------------------------

    def records(self) -> list[Any]:
        return [e.to_record() for e in self.table.entries.values()]

    def parse_record(self, rec: Any) -> Version:
        if version_problem(rec) is not None:
            raise MalformedBody("a timer record a node could not have written")
        name, _, ms, node, progress = rec
        return Version(name, (ms, node), Progress.from_record(progress), rec)

    def apply(self, item: Version, sender: str, now_ms: int) -> bool:
        old = self.table.entries.get(item.name)
        if old is not None and item.stamp <= old.stamp and item.progress <= old.progress:
            return False  # nothing newer: the usual case in a whole-table exchange
        problem = validate_record(item.record)
        if problem is not None:
            self.stats["malformed"] += 1
            self.outbox.append(LogLine("warning", f"malformed TIMER record from {sender[:8]}: "
                                       f"{problem}", f"malformed-timer:{sender}"))
            return False
        if not apply_remote(self.broker, Entry.from_record(item.record)):
            return False
        self._note(self.table.entries[item.name])
        return True

    def newer_than(self, items: list[Version]) -> list[Any]:
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

    def changed(self, e: Entry) -> None:
        """A timer changed on this node (``PeriodicTable.on_change``): sent to every node."""
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

    def info(self) -> list[tuple[str, Any]]:
        """INFO's ``# Timers`` section (``INFO timers``, ``INFO all``): trisque's own, like
        ``# Federation``, so ``INFO`` stays Disque's."""
        now = self.table.now_ms
        me = self.membership.myself_id
        live = [e for e in self.table.entries.values() if e.definition is not None]
        return [("timers", len(live)),
                ("timers_owned", sum(1 for e in live if self.owner(e.name) == me)),
                ("timers_held", sum(1 for e in live if e.progress.holder == me)),
                ("timer_lease", int(self.lease(now))),
                ("timer_fires", self.counters["fired"]),
                ("timer_fires_refused", self.counters["refused"]),
                ("timer_handovers", self.counters["handed_over"]),
                ("timer_takeovers", self.counters["taken_over"])]

    # -- time -----------------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        if self._dirty:
            return self.table.now_ms  # a change to look at: at once
        return self._due[0][0] if self._due else None

    def tick(self, now_ms: int) -> None:
        super().tick(now_ms)
        self.table.now_ms = max(self.table.now_ms, now_ms)
        self._track(now_ms)
        lease = self.lease(now_ms)
        m = self.membership
        view = (self.candidates(), lease, m.myself_id,
                frozenset(n.node_id for n in m.nodes.values() if "fail" in n.flags))
        entries = self.table.entries
        if view != self._view or (self._rescan_at is not None and now_ms >= self._rescan_at):
            self._view, self._rescan_at, self._due = view, None, []
            self._dirty.clear()
            names: Any = list(entries)
            if len(self._passed) > len(entries) + 64:
                self._passed = {k: v for k, v in self._passed.items() if k in entries}
        else:
            names = self._dirty
            self._dirty = set()
            while self._due and self._due[0][0] <= now_ms:
                names.add(heapq.heappop(self._due)[1])
        for name in names:
            e = entries.get(name)
            if e is not None and e.definition is not None:
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
            if not owner:
                return
            passed = self._passed.get(e.name, -PASS_INTERVAL_MS)
            if now_ms - passed >= PASS_INTERVAL_MS:
                self._passed[e.name] = now_ms
                self.counters["handed_over"] += 1
                pass_baton(self.broker, e, owner)
            else:
                self._rescan(passed + PASS_INTERVAL_MS)
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
            heapq.heappush(self._due, (due, e.name))
            return
        reply = self.fire_due(self.broker, e, due, now_ms)
        if isinstance(reply, Error):
            self.counters["refused"] += 1
            self.outbox.append(LogLine(
                "warning", f"Timer {e.name.decode('utf-8', 'replace')}: the job of due time "
                f"{due} was refused: {reply}", key=f"timer-fire:{e.name!r}"))
        else:
            self.counters["fired"] += 1
        heapq.heappush(self._due, (d.next_due(due, now_ms), e.name))

    def _take_over(self, e: Entry, holder: str, now_ms: int) -> bool:
        """Take the baton from ``holder`` if the cluster agrees it failed; False if it must
        be waited for."""
        m = self.membership
        known = m.nodes.get(holder)
        if known is not None and "handshake" not in known.flags and "noaddr" not in known.flags:
            if "fail" not in known.flags:
                # Reachable (its hand-over will come), leaving (it hands over as it leaves) or
                # only suspected here: another node may still reach it and see it as the
                # owner, so this node's view alone is not enough.
                return False
            since = self.unreachable_since.setdefault(holder, now_ms)
        else:
            # Not (or no longer) in the table: it may be alive elsewhere; give it a timeout.
            since = self.unreachable_since.setdefault(holder, now_ms)
            if now_ms - since < m.node_timeout():
                self._rescan(since + m.node_timeout())
                return False
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
        """An entry changed (here or by a peer): look at it at the next tick."""
        self._dirty.add(e.name)

    def _rescan(self, at: int) -> None:
        """Look at every timer again at ``at`` (a wait that ends with time, not an event)."""
        self._rescan_at = at if self._rescan_at is None else min(self._rescan_at, at)
