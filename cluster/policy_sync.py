"""Queue policies replicated to every node (issue 13): a small core beside the job core.

Theory of operation
-------------------
Every node holds every policy (``broker.policies.PolicyTable``), each stamped ``(ms,
node_id)``; a deletion is a tombstone with its stamp. Merging keeps the greater stamp, so the
order in which versions arrive does not matter and a version received twice changes nothing.
One message type, ``QPOLICY`` (40), carries ``{"policies": [record, ...]}`` (the append log's
``["queue", name, fields | None, ms, node]`` records):

* a change made here (``QPOLICY`` command, HTTP) goes at once to every node with a link;
* when a node gets an outbound link (it joined, came back, or the link was re-made), seen at
  the next ``tick`` (the runtime ticks every core every 100 ms), the whole table goes to it:
  a node that joins later gets every policy. (Watching the table instead of a ``link_up``
  event keeps the runtime's side to routing frames and ticking, as for the job core.)
* every ``SYNC_PERIOD_MS`` the whole table goes to one random node with a link, failing or
  not (anti-entropy: a change whose broadcast was lost still reaches everyone);
* a whole table (``"full": true``) is answered with the versions the receiver holds that are
  newer than the sender's or missing from it (push-pull: a node that nobody picks, or that
  others see as failing, still catches up by sending its own table).

A received version that wins is applied and logged by ``broker.policies.apply_remote``: the
runtime must take the broker's effects (the ``qpolicy`` log records) after every frame, as it
does for the job core. Frames from a node not in the table (or in handshake) are ignored, a
malformed body is logged (key ``malformed-policy:<ip>``) and dropped.
"""

from __future__ import annotations

import random
from typing import Any, Final

from broker.core import Broker
from broker.policies import Policy, apply_remote, validate_record
from cluster.effects import ClusterEffect, LinkId, Send
from cluster.membership import Membership
from cluster.peer_frames import accept
from cluster.wire import Frame, MalformedBody, MessageType, received_body

SYNC_PERIOD_MS: Final = 5_000
MAX_POLICIES_PER_FRAME: Final = 10_000

_UNREACHABLE: Final = frozenset({"myself", "handshake", "leaving", "pfail", "fail", "noaddr"})




class PolicySync:
    HANDLES: frozenset[MessageType] = frozenset({MessageType.QPOLICY})

    def __init__(self, broker: Broker, membership: Membership,
                 rng: random.Random | None = None, now_ms: int = 0) -> None:
        self.broker = broker
        self.membership = membership
        self.rng = rng or random.Random()
        self.outbox: list[ClusterEffect] = []
        self.next_sync = now_ms + SYNC_PERIOD_MS
        self.stats = {"sent": 0, "received": 0, "malformed": 0, "applied": 0}
        self._linked_before: set[str] = set()  # nodes with an outbound link at the last tick
        broker.policies.on_change = self._changed

    # -- the runtime's side (cluster/effects.py) ------------------------------------------------

    def take_effects(self) -> list[ClusterEffect]:
        effects, self.outbox = self.outbox, []
        return effects

    def tick(self, now_ms: int) -> None:
        linked = set(self._linked())
        if self.broker.policies.by_name:
            for node_id in sorted(linked - self._linked_before):
                self._send_all(node_id)
        self._linked_before = linked
        if now_ms < self.next_sync:
            return
        self.next_sync = now_ms + SYNC_PERIOD_MS
        targets = self._linked()
        if targets and self.broker.policies.by_name:
            self._send_all(self.rng.choice(targets))


    def receive(self, frame: Frame, link: LinkId, peer_ip: str, local_ip: str,
                outbound_to: str | None, now_ms: int) -> None:
        accepted = accept(self.membership, frame, peer_ip, _parse, self.stats, self.outbox,
                          "policy")
        if accepted is None:
            return
        (policies, full), _sender = accepted
        for p in policies:
            if apply_remote(self.broker, p):
                self.stats["applied"] += 1
        if full:
            # The sender's whole table: answer with what it lacks or holds in an older version.
            theirs = {p.name: p.stamp for p in policies}
            newer = [p.to_record() for p in self.broker.policies.by_name.values()
                     if theirs.get(p.name, (-1, "")) < p.stamp]
            if newer:
                self._send(frame.sender, newer)

    # -- sending ----------------------------------------------------------------------------------

    def _reachable(self) -> list[str]:
        return [n.node_id for n in self.membership.nodes.values()
                if not n.flags & _UNREACHABLE and n.link is not None]

    def _linked(self) -> list[str]:
        return [n.node_id for n in self.membership.nodes.values()
                if n.link is not None and n is not self.membership.myself
                and "handshake" not in n.flags]

    def _changed(self, p: Policy) -> None:
        for node_id in self._reachable():
            self._send(node_id, [p.to_record()])

    def _send_all(self, node_id: str) -> None:
        records = [p.to_record() for p in self.broker.policies.by_name.values()]
        for start in range(0, len(records), MAX_POLICIES_PER_FRAME):
            self._send(node_id, records[start:start + MAX_POLICIES_PER_FRAME], full=True)

    def _send(self, node_id: str, records: list[Any], full: bool = False) -> None:
        self.stats["sent"] += 1
        self.membership.messages_sent += 1
        body: dict[str, Any] = {"policies": records}
        if full:
            body["full"] = True
        self.outbox.append(Send(node_id, MessageType.QPOLICY, body))


def _parse(frame: Frame) -> tuple[list[Policy], bool]:
    """The policies a QPOLICY frame carries and whether they are the sender's whole table."""
    body = received_body(frame)
    if not isinstance(body, dict) or not set(body) <= {"policies", "full"}:
        raise MalformedBody("fields other than policies and full")
    full = body.get("full", False)
    if not isinstance(full, bool):
        raise MalformedBody("full is not a boolean")
    records = body.get("policies")
    if not isinstance(records, list) or len(records) > MAX_POLICIES_PER_FRAME:
        raise MalformedBody(f"policies is not a list of at most {MAX_POLICIES_PER_FRAME}")
    out = []
    for rec in records:
        if validate_record(rec) is not None or rec[0] != "queue":
            raise MalformedBody("a policy record a node could not have written")
        out.append(Policy.from_record(rec))
    return out, full
