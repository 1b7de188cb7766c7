"""Queues: the jobs ready for delivery on this node, oldest first.

Theory of operation
-------------------
A queue keeps its jobs in a Python list sorted by ``(ctime, id)``, read from a moving head
index. Jobs created here arrive in order, so adding is an append; a re-queued job (older) is
placed with a binary search. Taking the oldest job advances the head; the dead prefix is cut
once it outweighs the live part, so both ends cost O(1) amortised and the list is one pointer
per queued job. Removing a job from the middle (DEQUEUE, ACKJOB of a queued job) finds it by
binary search on the same key.

Priorities (ADDJOB ... PRIORITY n, 1 to 9; 0 is the default): jobs with a priority live in
one more list per level, in ``_upper`` (None until the queue's first such job), each kept as
the main list is; ``pop`` takes from the highest non-empty level first, the main list when
``_upper_len`` is 0. A queue that never saw a priority costs one attribute test more per push
and pop. ``peek`` and iteration follow the order ``pop`` takes.

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


MAX_PRIORITY: Final = 9


class Lane:
    """The jobs of one priority above 0, sorted as ``Queue``'s main list is."""

    __slots__ = ("items", "head")

    def __init__(self) -> None:
        self.items: list[Job | None] = []
        self.head = 0

    def __len__(self) -> int:
        return len(self.items) - self.head

    def push(self, job: Job) -> None:
        items = self.items
        last = items[-1] if len(items) > self.head else None
        # As Queue.push: the usual push appends, with no key tuples built.
        if last is None or last.ctime < job.ctime or (last.ctime == job.ctime
                                                      and last.id <= job.id):
            items.append(job)
        else:
            i = bisect.bisect_right(items, _key(job), lo=self.head, key=_key)  # type: ignore[arg-type]
            items.insert(i, job)

    def pop(self) -> Job | None:
        items = self.items
        if self.head >= len(items):
            return None
        job = items[self.head]
        items[self.head] = None
        self.head += 1
        if self.head >= _COMPACT_MIN and self.head * 2 >= len(items):
            del items[:self.head]
            self.head = 0
        return job

    def remove(self, job: Job) -> bool:
        items = self.items
        i = bisect.bisect_left(items, _key(job), lo=self.head, key=_key)  # type: ignore[arg-type]
        if i < len(items) and items[i] is job:
            del items[i]
            return True
        return False

    def live(self) -> list[Job]:
        return self.items[self.head:]  # type: ignore[return-value]


class Queue:
    __slots__ = ("name", "_items", "_head", "ctime", "atime", "jobs_in", "jobs_out",
                 "nacks", "requeues", "pause", "waiters", "fed", "low_water", "_upper",
                 "_upper_len", "_top")

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
        # Taking a job that leaves this many or fewer tells the federation core (0: only the
        # last one); the core raises it to what its consumers take in one bus round trip.
        self.low_water = 0
        # Jobs with a priority: index n - 1 holds priority n (see the module's docstring).
        self._upper: list[Lane] | None = None
        self._upper_len = 0
        self._top = 0  # the highest priority that may have jobs (no level above it has any)

    def __len__(self) -> int:
        return len(self._items) - self._head + self._upper_len

    def push(self, job: Job) -> None:
        if job.priority:
            self._push_upper(job)
            return
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

    def _push_upper(self, job: Job) -> None:
        upper = self._upper
        if upper is None:
            upper = self._upper = [Lane() for _ in range(MAX_PRIORITY)]
        priority = job.priority
        upper[priority - 1].push(job)
        if priority > self._top:
            self._top = priority
        self._upper_len += 1
        self.jobs_in += 1

    def pop(self) -> Job | None:
        """Take the oldest job of the highest priority."""
        if self._upper_len:
            return self._pop_upper()
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

    def _pop_upper(self) -> Job | None:
        upper = self._upper
        assert upper is not None
        top = self._top
        while top > 0:
            lane = upper[top - 1]
            if lane.head < len(lane.items):
                self._top = top
                self._upper_len -= 1
                self.jobs_out += 1
                return lane.pop()
            top -= 1
        self._top = 0
        return None  # not reached: _upper_len counts the lanes' jobs

    def remove(self, job: Job) -> bool:
        if job.priority:
            if self._upper is None or not self._upper[job.priority - 1].remove(job):
                return False
            self._upper_len -= 1
            return True
        items = self._items
        i = bisect.bisect_left(items, _key(job), lo=self._head, key=_key)  # type: ignore[arg-type]
        if i < len(items) and items[i] is job:
            del items[i]
            return True
        return False

    def peek(self, count: int) -> list[Job]:
        """The ``count`` jobs ``pop`` would take first, or with a negative count the ones
        it would take last, the last first."""
        if self._upper_len:
            return self._peek_upper(count)
        if count >= 0:
            return self._items[self._head : self._head + count]  # type: ignore[return-value]
        start = max(len(self._items) + count, self._head)
        return self._items[start:][::-1]  # type: ignore[return-value]

    def _peek_upper(self, count: int) -> list[Job]:
        """``peek`` across the levels, reading only the jobs it returns (federation peeks at
        the head once per job it moves)."""
        assert self._upper is not None
        lists: list[tuple[list[Job | None], int]] = [(lane.items, lane.head)
                                                     for lane in reversed(self._upper)]
        lists.append((self._items, self._head))
        out: list[Job] = []
        want = abs(count)
        if count < 0:
            lists.reverse()
        for items, head in lists:
            if len(out) >= want:
                break
            left = want - len(out)
            if count >= 0:
                out += items[head:head + left]  # type: ignore[arg-type]
            else:
                out += items[max(len(items) - left, head):][::-1]  # type: ignore[arg-type]
        return out

    def ordered(self) -> list[Job]:
        """Every job, in the order ``pop`` takes them."""
        out: list[Job] = []
        if self._upper is not None:
            for lane in reversed(self._upper):
                out += lane.live()
        out += self._items[self._head:]  # type: ignore[arg-type]
        return out

    def __iter__(self):  # type: ignore[no-untyped-def]
        if self._upper_len:
            return iter(self.ordered())
        return iter(self._items[self._head :])

    def is_idle_empty(self) -> bool:
        """Nothing keeps the queue alive: no jobs, nobody waiting, not paused."""
        return len(self) == 0 and not self.waiters and self.pause == PAUSE_NONE
