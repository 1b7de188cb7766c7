"""One structure for every timer: a wheel of buckets ordered by due time.

Theory of operation
-------------------
``schedule(item, due_ms)`` puts ``item`` in the bucket ``due_ms // resolution``; a heap of
bucket keys makes "what is due now" one query (``pop_due``). An item is never removed from a
bucket when its due time changes: the caller schedules it again and, when an old bucket comes
due, skips entries whose current due time no longer falls in that bucket (``in_bucket``). This
keeps every change O(1) and costs one pointer per pending timer, which matters at hundreds of
thousands of jobs.

Jobs are scheduled by ID, not by object: the ID is the key of ``Broker.jobs`` and already in
memory, and a job deleted before its timer comes due (acknowledged, say) is freed at once
instead of being kept alive, body and all, until its retry time or TTL.
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

    def schedule(self, item: Any, due_ms: int) -> None:
        key = due_ms // self.resolution
        bucket = self._buckets.get(key)
        if bucket is None:
            self._buckets[key] = [item]
            heapq.heappush(self._keys, key)
        else:
            bucket.append(item)

    def in_bucket(self, due_ms: int, key: int) -> bool:
        """Whether an item now due at ``due_ms`` belongs to bucket ``key`` (else it is a stale
        entry left behind when the item was rescheduled)."""
        return due_ms // self.resolution == key

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
