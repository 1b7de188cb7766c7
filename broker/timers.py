"""One structure for every timer: a wheel of buckets ordered by due time.

Theory of operation
-------------------
``schedule(item, due_ms)`` puts ``item`` in the bucket ``due_ms // resolution``; a heap of
bucket keys makes "what is due now" one query (``pop_due``). Every item has at most one entry:
the item records the key of the bucket it is in (``Timed.timer_key``), so scheduling it again
moves it (nothing to do when the new time falls in the same bucket) and ``cancel`` takes it
out, both O(1): a bucket is an insertion-ordered dict used as a set. A job that goes away
(acknowledged, deleted, expired) or a blocked client that is served cancels its timer, so the
wheel holds exactly the live items, and each is freed at once, body and all.

A bucket emptied by cancels is dropped; its key stays in the heap until it comes due or the
stale keys outnumber the live buckets, when the heap is rebuilt from the buckets (amortised
O(1) per cancel). So the wheel's memory is bounded by the live items, whatever the number of
items that went through it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Final

RESOLUTION_MS: Final = 16
NOT_SCHEDULED: Final = -1
# The heap is rebuilt when it holds this many more keys than twice the live buckets.
_STALE_SLACK: Final = 64


class Timed:
    """What the wheel holds: jobs and blocked clients. ``timer_key`` is the bucket the item is
    in, ``NOT_SCHEDULED`` when it is in none (only the wheel writes it)."""

    __slots__ = ("timer_key",)

    def __init__(self) -> None:
        self.timer_key = NOT_SCHEDULED


class TimerWheel:
    __slots__ = ("_buckets", "_keys", "resolution", "_count")

    def __init__(self, resolution: int = RESOLUTION_MS) -> None:
        self.resolution = resolution
        self._buckets: dict[int, dict[Timed, None]] = {}
        self._keys: list[int] = []  # a heap; may hold keys of buckets emptied since
        self._count = 0

    def schedule(self, item: Timed, due_ms: int) -> None:
        """Arm ``item``'s one timer at ``due_ms`` (moving it if it was armed already)."""
        key = due_ms // self.resolution
        old = item.timer_key
        if old == key:
            return
        if old != NOT_SCHEDULED:
            self._remove(item, old)
        item.timer_key = key
        self._count += 1
        bucket = self._buckets.get(key)
        if bucket is None:
            self._buckets[key] = {item: None}
            heapq.heappush(self._keys, key)
        else:
            bucket[item] = None

    def cancel(self, item: Timed) -> None:
        """Disarm ``item``'s timer, if any."""
        old = item.timer_key
        if old != NOT_SCHEDULED:
            item.timer_key = NOT_SCHEDULED
            self._remove(item, old)

    def _remove(self, item: Timed, key: int) -> None:
        buckets = self._buckets
        bucket = buckets[key]
        del bucket[item]
        self._count -= 1
        if not bucket:
            del buckets[key]
            if len(self._keys) > 2 * len(buckets) + _STALE_SLACK:
                keys = list(buckets)
                heapq.heapify(keys)
                self._keys = keys

    def next_due(self) -> int | None:
        """The start of the earliest non-empty bucket (ms), or None."""
        keys = self._keys
        buckets = self._buckets
        while keys and keys[0] not in buckets:
            heapq.heappop(keys)
        return keys[0] * self.resolution if keys else None

    def pop_due(self, now_ms: int) -> list[tuple[int, list[Timed]]]:
        """Remove and return (key, items) for every bucket whose start is <= now; the items are
        no longer scheduled. Some may be not quite due (same bucket, later ms): the caller
        checks and schedules them again."""
        out = []
        keys = self._keys
        buckets = self._buckets
        limit = now_ms // self.resolution
        while keys and keys[0] <= limit:
            key = heapq.heappop(keys)
            bucket = buckets.pop(key, None)
            if bucket is None:
                continue  # emptied by cancels, or a duplicate key
            items = list(bucket)
            for item in items:
                item.timer_key = NOT_SCHEDULED
            self._count -= len(items)
            out.append((key, items))
        return out

    def entries(self) -> Iterator[tuple[int, Timed]]:
        """Every (bucket key, item), for tests and checks."""
        for key, bucket in self._buckets.items():
            for item in bucket:
                yield key, item

    def clear(self) -> None:
        for bucket in self._buckets.values():
            for item in bucket:
                item.timer_key = NOT_SCHEDULED
        self._buckets.clear()
        self._keys.clear()
        self._count = 0

    def __len__(self) -> int:
        return self._count
