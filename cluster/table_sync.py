"""A table every node holds whole, replicated over the bus (sans-IO): the shared half of the
queue policy core (``cluster/policy_sync.py``) and the periodic timer core
(``cluster/periodic_sync.py``).

Theory of operation
-------------------
The table is a set of records, each a version of one name; merging two versions of a name keeps
the greater one (a stamp, or a progress counter), so a version received twice or out of order
changes nothing and every node that has seen the same versions holds the same table. One
message type per table carries ``{<key>: [record, ...]}``, plus ``"full": true`` when the
records are the sender's whole table and ``"answer": true`` when they answer one:

* a change made here goes at once to every reachable node with a link (``broadcast``);
* when a node gets an outbound link (it joined, came back, or the link was re-made), seen at
  the next ``tick`` (the runtime ticks every core every 100 ms), the whole table goes to it:
  a node that joins later gets everything. (Watching links at the tick instead of a
  ``link_up`` event keeps the runtime's side to routing frames and ticking.)
* every ``SYNC_PERIOD_MS`` the whole table goes to one random node with a link (anti-entropy:
  a change whose broadcast was lost still reaches everyone);
* a whole table is answered with the records the receiver holds that are newer than the
  sender's or missing from it (push-pull: a node that nobody picks, or that others see as
  failing, still catches up by sending its own table). A subclass that must know when a peer
  has told it everything (``ALWAYS_ANSWER``) is answered even when nothing is newer.

A subclass names its message type, body key and log kind, and says how records are parsed,
applied, compared and sized. Frames from a node not in the table (or in handshake) are
ignored, a malformed body is logged (key ``malformed-<kind>:<ip>``) and dropped
(``cluster/peer_frames.py``).
"""

from __future__ import annotations

import random
from typing import Any, Final

from cluster.batches import cut
from cluster.effects import EffectQueue, LinkId, Send
from cluster.membership import Membership
from cluster.peer_frames import accept
from cluster.wire import Frame, MalformedBody, MessageType, received_body

SYNC_PERIOD_MS: Final = 5_000
MAX_RECORDS_PER_FRAME: Final = 10_000

UNREACHABLE: Final = frozenset({"myself", "handshake", "leaving", "pfail", "fail", "noaddr"})


class TableSync(EffectQueue):
    MESSAGE: MessageType
    KEY: str  # the body field holding the records
    KIND: str  # names the core in log keys
    ALWAYS_ANSWER = False  # answer a whole table even when nothing here is newer

    def __init__(self, membership: Membership, rng: random.Random | None, now_ms: int) -> None:
        self.membership = membership
        self.rng = rng or random.Random()
        self.outbox = []
        self.next_sync = now_ms + SYNC_PERIOD_MS
        self.stats = {"sent": 0, "received": 0, "malformed": 0, "applied": 0}
        self._linked_before: set[str] = set()  # nodes with an outbound link at the last tick

    # -- what a subclass provides -----------------------------------------------------------

    def records(self) -> list[Any]:
        """Every record of the table, tombstones included."""
        raise NotImplementedError

    def parse_record(self, rec: Any) -> Any:
        """A record as received, typed; raises ``MalformedBody``."""
        raise NotImplementedError

    def apply(self, item: Any, sender: str, now_ms: int) -> bool:
        """Merge one received version; True if it changed the table."""
        raise NotImplementedError

    def newer_than(self, items: list[Any]) -> list[Any]:
        """Records held here that are newer than ``items`` (a whole table) or missing there."""
        raise NotImplementedError

    def whole_table_from(self, sender: str, now_ms: int) -> None:
        """``sender`` has sent its whole table, or answered ours (after ``apply``)."""

    def record_size(self, rec: Any) -> int:
        return 64

    def empty(self) -> bool:
        return not self.records()

    # -- the runtime's side (cluster/effects.py) ------------------------------------------------

    def tick(self, now_ms: int) -> None:
        linked = set(self.linked())
        empty = not self.ALWAYS_ANSWER and self.empty()
        if not empty:
            for node_id in sorted(linked - self._linked_before):
                self.send_all(node_id)
        self._linked_before = linked
        if now_ms < self.next_sync:
            return
        self.next_sync = now_ms + SYNC_PERIOD_MS
        targets = self.linked()
        if targets and not empty:
            self.send_all(self.rng.choice(targets))

    def receive(self, frame: Frame, link: LinkId, peer_ip: str, local_ip: str,
                outbound_to: str | None, now_ms: int) -> None:
        accepted = accept(self.membership, frame, peer_ip, self._parse, self.stats, self.outbox,
                          self.KIND)
        if accepted is None:
            return
        (items, full, answer), sender = accepted
        for item in items:
            if self.apply(item, sender, now_ms):
                self.stats["applied"] += 1
        if full or answer:
            self.whole_table_from(sender, now_ms)
        if full:
            newer = self.newer_than(items)
            if newer:
                for batch in cut(newer, self.record_size, MAX_RECORDS_PER_FRAME):
                    self.send(sender, batch, answer=self.ALWAYS_ANSWER)
            elif self.ALWAYS_ANSWER:
                self.send(sender, newer, answer=True)

    # -- sending ----------------------------------------------------------------------------------

    def reachable(self) -> list[str]:
        return [n.node_id for n in self.membership.nodes.values()
                if not n.flags & UNREACHABLE and n.link is not None]

    def linked(self) -> list[str]:
        return [n.node_id for n in self.membership.nodes.values()
                if n.link is not None and n is not self.membership.myself
                and "handshake" not in n.flags]

    def broadcast(self, records: list[Any]) -> None:
        for node_id in self.reachable():
            self.send(node_id, records)

    def send_all(self, node_id: str) -> None:
        records = self.records()
        if not records:
            self.send(node_id, [], full=True)
            return
        for batch in cut(records, self.record_size, MAX_RECORDS_PER_FRAME):
            self.send(node_id, batch, full=True)

    def send(self, node_id: str, records: list[Any], full: bool = False,
             answer: bool = False) -> None:
        self.stats["sent"] += 1
        self.membership.messages_sent += 1
        body: dict[str, Any] = {self.KEY: records}
        if full:
            body["full"] = True
        if answer:
            body["answer"] = True
        self.outbox.append(Send(node_id, self.MESSAGE, body))

    def _parse(self, frame: Frame) -> tuple[list[Any], bool, bool]:
        """The records a frame carries, whether they are the sender's whole table, and
        whether they answer ours."""
        body = received_body(frame)
        if not isinstance(body, dict) or not set(body) <= {self.KEY, "full", "answer"}:
            raise MalformedBody(f"fields other than {self.KEY}, full and answer")
        full = body.get("full", False)
        answer = body.get("answer", False)
        if not isinstance(full, bool) or not isinstance(answer, bool):
            raise MalformedBody("full or answer is not a boolean")
        records = body.get(self.KEY)
        if not isinstance(records, list) or len(records) > MAX_RECORDS_PER_FRAME:
            raise MalformedBody(f"{self.KEY} is not a list of at most {MAX_RECORDS_PER_FRAME}")
        return [self.parse_record(rec) for rec in records], full, answer
