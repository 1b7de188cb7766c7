"""The shared deduplication index, replicated to every node (sans-IO).

Theory of operation
-------------------
``broker.dedup.SharedIndex`` (``Broker.policies.shared``) holds one stamped entry per
``(queue, sha1(body))`` of a deduplicating queue; merging keeps the greater stamp. One message
type, ``DEDUP`` (52), carries ``{"entries": [entry, ...]}`` as ``cluster/table_sync.py`` sends
a table: an entry made here (a job added, or acked, deleted or dead-lettered here) at once to
every reachable node, and the whole index to a node that gains a link (a node that joins or
restarts, or a partition that heals). Unlike the policy table there is no periodic exchange:
the index follows the jobs, which may be many, and an entry lost in a frame only narrows the
window in which a duplicate is found. Expired entries are dropped every ``EXPIRE_PERIOD_MS``.

Tombstones (the entries of jobs that ended) are dropped once every known node has surely got
them: they went to every reachable node when made, and go again in the whole index when a link
comes up. So while any known node is not linked, or since the set of linked nodes last
changed, none is dropped; once every node has been linked for ``tombstone_ms`` (twice the node
timeout, at least ``MIN_TOMBSTONE_MS``: a link that stays up that long took what was sent on
it, or it would have been closed as slow), those older than that are dropped. A node that is
down and not forgotten (CLUSTER FORGET) keeps them all until their jobs' TTL, as before.
"""

from __future__ import annotations

import random
from typing import Any, Final

from broker.core import Broker
from broker.dedup import valid_entry
from cluster.membership import Membership
from cluster.table_sync import TableSync
from cluster.wire import MalformedBody, MessageType

EXPIRE_PERIOD_MS: Final = 5_000
MIN_TOMBSTONE_MS: Final = 2_000


class DedupSync(TableSync):
    HANDLES: frozenset[MessageType] = frozenset({MessageType.DEDUP})
    MESSAGE = MessageType.DEDUP
    KEY = "entries"
    KIND = "dedup"

    def __init__(self, broker: Broker, membership: Membership,
                 rng: random.Random | None = None, now_ms: int = 0) -> None:
        super().__init__(membership, rng, now_ms)
        self.broker = broker
        self.next_expire = now_ms + EXPIRE_PERIOD_MS
        self.calm_since = now_ms  # every known node linked, the same ones, since then

    def tick(self, now_ms: int) -> None:
        # The base's link watch, without its periodic whole-table exchange.
        linked = set(self.linked())
        if not self.empty():
            for node_id in sorted(linked - self._linked_before):
                self.send_all(node_id)
        if linked != self._linked_before or len(linked) != self.known_others():
            self.calm_since = now_ms
        self._linked_before = linked
        if now_ms >= self.next_expire:
            self.next_expire = now_ms + EXPIRE_PERIOD_MS
            shared = self.broker.policies.shared
            shared.expire(now_ms)
            if now_ms - self.calm_since >= self.tombstone_ms():
                shared.drop_tombstones(now_ms - self.tombstone_ms())

    def known_others(self) -> int:
        membership = self.membership
        return sum(1 for n in membership.nodes.values()
                   if n is not membership.myself and "handshake" not in n.flags)

    def tombstone_ms(self) -> int:
        return max(MIN_TOMBSTONE_MS, 2 * int(self.broker.config.cluster_node_timeout))

    def records(self) -> list[Any]:
        return list(self.broker.policies.shared.entries.values())

    def empty(self) -> bool:
        return not self.broker.policies.shared.entries

    def parse_record(self, rec: Any) -> list[Any]:
        if not valid_entry(rec):
            raise MalformedBody("a deduplication entry a node could not have written")
        entry: list[Any] = rec
        return entry

    def apply(self, item: list[Any], sender: str, now_ms: int) -> bool:
        return item[3] > now_ms and self.broker.policies.shared.merge(item, now_ms)

    def newer_than(self, items: list[list[Any]]) -> list[Any]:
        theirs = {(e[0], e[1]): (e[5], e[6]) for e in items}
        return [e for key, e in self.broker.policies.shared.entries.items()
                if theirs.get(key, (-1, "")) < (e[5], e[6])]

    def record_size(self, rec: Any) -> int:
        return 64 + len(rec[0]) + len(rec[2])

    def changed(self, entry: list[Any]) -> None:
        """An entry made here (``SharedIndex.on_change``): sent to every reachable node."""
        self.broadcast([entry])
