"""Queue policies replicated to every node: a small core beside the job core.

Theory of operation
-------------------
Every node holds every policy (``broker.policy_table.PolicyTable``), each stamped ``(ms,
node_id)``; a deletion is a tombstone with its stamp. Merging keeps the greater stamp, so the
order in which versions arrive does not matter and a version received twice changes nothing.
One message type, ``QPOLICY`` (40), carries ``{"policies": [record, ...]}`` (the append log's
``["queue", name, fields | None, ms, node]`` records), sent as ``cluster/table_sync.py``
describes: a change at once to every reachable node, the whole table to a node that gains a
link and every 5 s to one random node, and a whole table answered with what the sender lacks.

A received version that wins is applied and logged by ``broker.policies.apply_remote``: the
runtime must take the broker's effects (the ``qpolicy`` log records) after every frame, as it
does for the job core.
"""

from __future__ import annotations

import random
from typing import Any

from broker.core import Broker
from broker.policies import apply_remote
from broker.policy_table import Policy, validate_record
from cluster.membership import Membership
from cluster.table_sync import TableSync
from cluster.wire import MalformedBody, MessageType


class PolicySync(TableSync):
    HANDLES: frozenset[MessageType] = frozenset({MessageType.QPOLICY})
    MESSAGE = MessageType.QPOLICY
    KEY = "policies"
    KIND = "policy"

    def __init__(self, broker: Broker, membership: Membership,
                 rng: random.Random | None = None, now_ms: int = 0) -> None:
        super().__init__(membership, rng, now_ms)
        self.broker = broker

    def records(self) -> list[Any]:
        return [p.to_record() for p in self.broker.policies.by_name.values()]

    def empty(self) -> bool:
        return not self.broker.policies.by_name

    def parse_record(self, rec: Any) -> Policy:
        if validate_record(rec) is not None or rec[0] != "queue":
            raise MalformedBody("a policy record a node could not have written")
        return Policy.from_record(rec)

    def apply(self, item: Policy, sender: str, now_ms: int) -> bool:
        return apply_remote(self.broker, item)

    def newer_than(self, items: list[Policy]) -> list[Any]:
        theirs = {p.name: p.stamp for p in items}
        return [p.to_record() for p in self.broker.policies.by_name.values()
                if theirs.get(p.name, (-1, "")) < p.stamp]

    def changed(self, p: Policy) -> None:
        """A policy changed on this node (``PolicyTable.on_change``): sent to every node."""
        self.broadcast([p.to_record()])
