"""One structure for every timer: a wheel of buckets ordered by due time.

Theory of operation
-------------------
Items (jobs, blocked clients) carry their due time in ``item.awake``. ``schedule(item)`` puts
the item in the bucket ``awake // resolution``; a heap of bucket keys makes "what is due now"
one query (``pop_due``). An item is never removed from a bucket when its due time changes:
the caller just schedules it again and, when an old bucket comes due, skips entries whose
``awake`` no longer points at that bucket (``is_current``). This keeps every change O(1) and
costs one pointer per pending timer, which matters at hundreds of thousands of jobs.
"""

from __future__ import annotations

import heapq
from typing import Any, Final

RESOLUTION_MS: Final = 16


class TimerWheel:
    __slots__ = ("_buckets", "_keys", "resolution")

    def __init__(self, resolution: int = RESOLUTION_MS) -> None:
        self.resolution = resolution
        self._buckets: dict[int, list[Any]] = {}
        self._keys: list[int] = []

    def schedule(self, item: Any) -> None:
        key = item.awake // self.resolution
        bucket = self._buckets.get(key)
        if bucket is None:
            self._buckets[key] = [item]
            heapq.heappush(self._keys, key)
        else:
            bucket.append(item)

    def is_current(self, item: Any, key: int) -> bool:
        return bool(item.awake // self.resolution == key)

    def next_due(self) -> int | None:
        """The start of the earliest non-empty bucket (ms), or None."""
        return self._keys[0] * self.resolution if self._keys else None

    def pop_due(self, now_ms: int) -> list[tuple[int, list[Any]]]:
        """Remove and return (key, items) for every bucket whose start is <= now. Items may be
        stale or not quite due (same bucket, later ms): the caller checks and reschedules."""
        out = []
        keys = self._keys
        limit = now_ms // self.resolution
        while keys and keys[0] <= limit:
            key = heapq.heappop(keys)
            out.append((key, self._buckets.pop(key)))
        return out

    def clear(self) -> None:
        self._buckets.clear()
        self._keys.clear()

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())
