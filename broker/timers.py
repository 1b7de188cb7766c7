"""One structure for every timer: a wheel of buckets ordered by due time.

Theory of operation
-------------------
``schedule(item, due_ms)`` appends ``item`` to the bucket ``due_ms // resolution``; a heap of
bucket keys makes "what is due now" one query (``pop_due``). The item records the key of its
current bucket (``Timed.timer_key``), which is all that says which of its entries is live:
scheduling it elsewhere or ``cancel`` leaves its old entry in place as a stale one (O(1), and
an append is what ADDJOB pays, nothing more), and a bucket that comes due yields only the
items whose key is still its own. A job that goes away (acknowledged, deleted, expired) or a
blocked client that is served cancels its timer.

Stale entries are counted, and compacted away as soon as they outnumber the live ones (plus
``COMPACT_SLACK``): every bucket is filtered, emptied buckets dropped and the heap rebuilt,
O(entries) once per that many stale entries, so O(1) amortised. The wheel's memory is thus
bounded by the live items, whatever the number that went through it; a stale entry keeps its
item's object (a job's body is emptied when it is unregistered) until then.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Final

RESOLUTION_MS: Final = 16
NOT_SCHEDULED: Final = -1
# Stale entries tolerated beyond the live ones before a compaction.
COMPACT_SLACK: Final = 1024


class Timed:
    """What the wheel holds: jobs and blocked clients. ``timer_key`` is the bucket the item is
    due in, ``NOT_SCHEDULED`` when none (only the wheel writes it)."""

    __slots__ = ("timer_key",)

    def __init__(self) -> None:
        self.timer_key = NOT_SCHEDULED


class TimerWheel:
    __slots__ = ("_buckets", "_keys", "resolution", "_live", "_stale")

    def __init__(self, resolution: int = RESOLUTION_MS) -> None:
        self.resolution = resolution
        self._buckets: dict[int, list[Timed]] = {}
        self._keys: list[int] = []  # a heap of the buckets' keys
        self._live = 0  # items scheduled
        self._stale = 0  # entries left behind by moves and cancels

    def schedule(self, item: Timed, due_ms: int) -> None:
        """Arm ``item``'s one timer at ``due_ms`` (moving it if it was armed already)."""
        key = due_ms // self.resolution
        old = item.timer_key
        if old == key:
            return
        if old == NOT_SCHEDULED:
            self._live += 1
        else:
            self._stale += 1
        item.timer_key = key
        bucket = self._buckets.get(key)
        if bucket is None:
            self._buckets[key] = [item]
            heapq.heappush(self._keys, key)
        else:
            bucket.append(item)
        if self._stale > self._live + COMPACT_SLACK:
            self._compact()

    def cancel(self, item: Timed) -> None:
        """Disarm ``item``'s timer, if any."""
        if item.timer_key != NOT_SCHEDULED:
            item.timer_key = NOT_SCHEDULED
            self._live -= 1
            self._stale += 1
            if self._stale > self._live + COMPACT_SLACK:
                self._compact()

    def _compact(self) -> None:
        buckets: dict[int, list[Timed]] = {}
        for key, items in self._buckets.items():
            kept = [item for item in items if item.timer_key == key]
            if kept:
                # An item moved away and back has two entries here: keep one.
                buckets[key] = list(dict.fromkeys(kept)) if len(kept) > 1 else kept
        keys = list(buckets)
        heapq.heapify(keys)
        self._buckets = buckets
        self._keys = keys
        self._stale = 0

    def next_due(self) -> int | None:
        """The start of the earliest bucket (ms), or None. It may hold only stale entries
        (then ``pop_due`` finds nothing in it)."""
        return self._keys[0] * self.resolution if self._keys else None

    def pop_due(self, now_ms: int) -> list[tuple[int, list[Timed]]]:
        """Remove and return (key, items) for every bucket whose start is <= now, with only its
        live items, each once; they are no longer scheduled. Some may be not quite due (same
        bucket, later ms): the caller checks and schedules them again."""
        out = []
        keys = self._keys
        buckets = self._buckets
        limit = now_ms // self.resolution
        while keys and keys[0] <= limit:
            key = heapq.heappop(keys)
            entries = buckets.pop(key)
            items = []
            for item in entries:
                if item.timer_key == key:
                    item.timer_key = NOT_SCHEDULED
                    items.append(item)
            self._live -= len(items)
            self._stale -= len(entries) - len(items)
            if items:
                out.append((key, items))
        return out

    def entries(self) -> Iterator[tuple[int, Timed]]:
        """Every live (bucket key, item), for tests and checks."""
        for key, items in self._buckets.items():
            for item in dict.fromkeys(items):
                if item.timer_key == key:
                    yield key, item

    def clear(self) -> None:
        for items in self._buckets.values():
            for item in items:
                item.timer_key = NOT_SCHEDULED
        self._buckets.clear()
        self._keys.clear()
        self._live = 0
        self._stale = 0

    def __len__(self) -> int:
        """The items scheduled."""
        return self._live

    def stale(self) -> int:
        """Entries left behind by moves and cancels, not yet compacted."""
        return self._stale
