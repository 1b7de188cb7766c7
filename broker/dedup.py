"""Deduplication across the cluster: the index every node shares (sans-IO).

Theory of operation
-------------------
A queue whose policy has ``DEDUP yes`` treats an ADDJOB whose body equals a job of the queue
still present as a duplicate (broker/policies.py). Each node indexes the jobs it added
(``PolicyTable._dedup``); this index holds what every node added, so a duplicate is found on
any node: one entry per ``(queue, sha1(body))``, ``[queue, digest, job_id, until_ms, gone,
ms, node]``, stamped ``(ms, node)`` by the node that wrote it. The node that adds a job makes
its entry; any node where the job is acked, deleted or dead-lettered marks it ``gone``
(a newer stamp); the TTL ends it everywhere at ``until_ms`` without a message. Merging keeps
the greater stamp, so every node that has seen the same entries holds the same index
(``cluster/dedup_sync.py`` replicates it: a change to every reachable node at once, the whole
index to a node that gains a link).

The window is the job's life: from the moment its entry reaches a node (a frame's trip, well
under a millisecond on a LAN) until it is acked, deleted or expires. Two ADDJOBs of one body
on two nodes closer together than that, or on two sides of a partition, make two jobs; when
the partition heals both stay (jobs are never merged) and the newer entry wins. Entries are
in memory only: a node that restarts gets the index again from the first peer it links to.

A ``gone`` entry is a tombstone: it outlives its job only so that an older live entry held by
a node that missed the end cannot come back. It is needed until every node has it, so
``drop_tombstones`` forgets the tombstones that arrived or were made here before a time the
replication core chooses (cluster/dedup_sync.py: once every known node has been linked for
long enough that each one got them). Kept until the job's TTL instead, they made memory grow
with every job a deduplicating queue processed. ``tombstones`` lists them oldest first, with
this node's clock at arrival, so dropping costs only what is dropped. ``expiry`` is a heap of
the entries by ``until_ms`` for the same reason: the TTL sweep pops what is due instead of
walking the index (a second of stall every sweep with a million entries). An entry replaced
or dropped stays in the heap until popped and is skipped then; the heap is rebuilt from the
index when it holds more than twice the entries, so it never outgrows them.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import Any, Final

GONE: Final = 4  # index of the ``gone`` flag in an entry
_UNTIL: Final = 3


def newer(a: list[Any], b: list[Any] | None) -> bool:
    """Whether entry ``a`` wins over ``b``."""
    return b is None or (a[5], a[6]) > (b[5], b[6])


class SharedIndex:
    def __init__(self) -> None:
        self.entries: dict[tuple[bytes, bytes], list[Any]] = {}
        self.by_job: dict[bytes, tuple[bytes, bytes]] = {}  # job ID -> its entry's key
        # (arrival ms here, the gone entry), oldest first; an entry replaced since is skipped.
        self.tombstones: deque[tuple[int, list[Any]]] = deque()
        self.expiry: list[tuple[int, list[Any]]] = []  # (until_ms, entry), a heap
        # Set by the replication core: each entry made here goes to the other nodes.
        self.on_change: Callable[[list[Any]], None] | None = None

    def find(self, queue: bytes, digest: bytes, now_ms: int) -> bytes | None:
        entry = self.entries.get((queue, digest))
        if entry is None or entry[GONE] or entry[_UNTIL] <= now_ms:
            return None
        job_id: bytes = entry[2]
        return job_id

    def added(self, queue: bytes, digest: bytes, job_id: bytes, until_ms: int, node: str,
              now_ms: int) -> None:
        self._made([queue, digest, job_id, until_ms, False, now_ms, node], now_ms)

    def ended(self, job_id: bytes, node: str, now_ms: int) -> None:
        """The job was acked, deleted or dead-lettered here: no longer a duplicate anywhere."""
        key = self.by_job.get(job_id)
        if key is None:
            return
        entry = self.entries[key]
        if entry[GONE] or entry[2] != job_id:
            return
        stamp = max(now_ms, entry[5] + 1)
        self._made([entry[0], entry[1], job_id, entry[_UNTIL], True, stamp, node], now_ms)

    def merge(self, entry: list[Any], now_ms: int) -> bool:
        """A peer's entry; True if it won."""
        key = (entry[0], entry[1])
        if not newer(entry, self.entries.get(key)):
            return False
        self._put(entry, now_ms)
        return True

    def expire(self, now_ms: int) -> None:
        """Forget the entries whose job's TTL is over."""
        expiry = self.expiry
        while expiry and expiry[0][0] <= now_ms:
            entry = heapq.heappop(expiry)[1]
            key = (entry[0], entry[1])
            if self.entries.get(key) is entry:
                self._remove(key, entry)

    def drop_tombstones(self, before_ms: int) -> None:
        """Forget the gone entries that arrived or were made here at or before ``before_ms``."""
        tombstones = self.tombstones
        while tombstones and tombstones[0][0] <= before_ms:
            entry = tombstones.popleft()[1]
            key = (entry[0], entry[1])
            if self.entries.get(key) is entry:
                self._remove(key, entry)

    def _remove(self, key: tuple[bytes, bytes], entry: list[Any]) -> None:
        del self.entries[key]
        if self.by_job.get(entry[2]) == key:
            del self.by_job[entry[2]]
        if len(self.expiry) > 2 * len(self.entries) + 1024:
            self._rebuild_expiry()

    def _rebuild_expiry(self) -> None:
        expiry = self.expiry
        expiry[:] = [(e[_UNTIL], e) for e in self.entries.values()]
        heapq.heapify(expiry)

    def _made(self, entry: list[Any], now_ms: int) -> None:
        self._put(entry, now_ms)
        if self.on_change is not None:
            self.on_change(entry)

    def _put(self, entry: list[Any], now_ms: int) -> None:
        key = (entry[0], entry[1])
        old = self.entries.get(key)
        if old is not None and self.by_job.get(old[2]) == key:
            del self.by_job[old[2]]
        self.entries[key] = entry
        self.by_job[entry[2]] = key
        if entry[GONE]:
            self.tombstones.append((now_ms, entry))
        if len(self.expiry) > 2 * len(self.entries) + 1024:
            self._rebuild_expiry()  # with this entry
        else:
            heapq.heappush(self.expiry, (entry[_UNTIL], entry))


def valid_entry(entry: Any) -> bool:
    return (isinstance(entry, list) and len(entry) == 7 and isinstance(entry[0], bytes)
            and isinstance(entry[1], bytes) and len(entry[1]) == 20
            and isinstance(entry[2], bytes) and type(entry[3]) is int
            and isinstance(entry[4], bool) and type(entry[5]) is int
            and isinstance(entry[6], str) and 0 <= entry[3] < 2**63 and 0 <= entry[5] < 2**63)
