"""Queues: the jobs ready for delivery on this node, oldest first.

Theory of operation
-------------------
A queue keeps its jobs in a Python list sorted by ``(ctime, id)``, read from a moving head
index. Jobs created here arrive in order, so adding is an append; a re-queued job (older) is
placed with a binary search. Taking the oldest job advances the head; the dead prefix is cut
once it outweighs the live part, so both ends cost O(1) amortised and the list is one pointer
per queued job. Removing a job from the middle (DEQUEUE, ACKJOB of a queued job) finds it by
binary search on the same key.

A queue object also carries what QSTAT reports (creation and access times, counters), the
counters only ``/metrics`` reads (NACKs, requeues after RETRY), the PAUSE flags, the FIFO of clients blocked on it and the federation core's state (``fed``). It exists while it holds jobs, has blocked
clients or is paused, and for a while after it empties (evicted when idle, see the broker).
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Any, Final

from broker.job import Job

PAUSE_NONE: Final = 0
PAUSE_IN: Final = 1
PAUSE_OUT: Final = 2
PAUSE_ALL: Final = 3
PAUSE_NAMES: Final = {PAUSE_NONE: "none", PAUSE_IN: "in", PAUSE_OUT: "out", PAUSE_ALL: "all"}

_COMPACT_MIN: Final = 256


def _key(job: Job) -> tuple[int, bytes]:
    return (job.ctime, job.id)


class Queue:
    __slots__ = ("name", "_items", "_head", "ctime", "atime", "jobs_in", "jobs_out",
                 "nacks", "requeues", "pause", "waiters", "fed")

    def __init__(self, name: bytes, now_ms: int) -> None:
        self.name = name
        self._items: list[Job | None] = []
        self._head = 0
        self.ctime = now_ms
        self.atime = now_ms
        self.jobs_in = 0
        self.jobs_out = 0
        self.nacks = 0  # jobs queued again by NACK
        self.requeues = 0  # jobs queued again otherwise (RETRY elapsed, ENQUEUE)
        self.pause = PAUSE_NONE
        self.waiters: deque[Any] = deque()  # blocked GETJOB clients, in arrival order
        # Federation state (sources, backoff, import rate), owned by the cluster's federation
        # core (broker/federation.py); None until it needs some.
        self.fed: Any = None

    def __len__(self) -> int:
        return len(self._items) - self._head

    def push(self, job: Job) -> None:
        items = self._items
        last = items[-1] if len(items) > self._head else None
        # _key(last) <= _key(job), spelt out: the usual push (a job just made here) appends,
        # and two key tuples per job were a tenth of the cost of queueing one.
        if last is None or last.ctime < job.ctime or (last.ctime == job.ctime
                                                      and last.id <= job.id):
            items.append(job)
        else:
            i = bisect.bisect_right(items, _key(job), lo=self._head, key=_key)  # type: ignore[arg-type]
            items.insert(i, job)
        self.jobs_in += 1

    def pop(self) -> Job | None:
        """Take the oldest job."""
        head = self._head
        items = self._items
        if head >= len(items):
            return None
        job = items[head]
        items[head] = None
        head += 1
        if head >= _COMPACT_MIN and head * 2 >= len(items):
            del items[:head]
            head = 0
        self._head = head
        self.jobs_out += 1
        return job

    def remove(self, job: Job) -> bool:
        items = self._items
        i = bisect.bisect_left(items, _key(job), lo=self._head, key=_key)  # type: ignore[arg-type]
        if i < len(items) and items[i] is job:
            del items[i]
            return True
        return False

    def peek(self, count: int) -> list[Job]:
        """The ``count`` oldest jobs, or with a negative count the newest, newest first."""
        if count >= 0:
            return self._items[self._head : self._head + count]  # type: ignore[return-value]
        start = max(len(self._items) + count, self._head)
        return self._items[start:][::-1]  # type: ignore[return-value]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._items[self._head :])

    def is_idle_empty(self) -> bool:
        """Nothing keeps the queue alive: no jobs, nobody waiting, not paused."""
        return len(self) == 0 and not self.waiters and self.pause == PAUSE_NONE
