"""The one way the runtime reads time.

Theory of operation
-------------------
The broker is given ``now_ms`` by the runtime; the runtime reads it here and nowhere else, so a
test can run a whole node in-process on a fake clock. ``WallClock`` is production's: Unix time
for ``now_ms`` (job times are wall-clock times, as in Disque, and survive restarts in the
log), ``time.monotonic`` for intervals. ``TrioClock`` ties both to trio's clock, so under
``trio.testing.MockClock(autojump_threshold=0)`` a five-minute RETRY passes in milliseconds.
"""

from __future__ import annotations

import time
from typing import Protocol

import trio

from node.reactor_core import wall_ms


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def monotonic(self) -> float: ...


class WallClock:
    # Functions rather than methods: read for every reactor round and bus read, a method
    # would cost an interpreted frame each time.
    now_ms = staticmethod(wall_ms)
    monotonic = staticmethod(time.monotonic)


class TrioClock:
    """Wall time that advances with trio's clock (real or mocked) from ``start_ms``."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._start_ms = start_ms
        self._origin = trio.current_time()

    def now_ms(self) -> int:
        return self._start_ms + int((trio.current_time() - self._origin) * 1000)

    def monotonic(self) -> float:
        return trio.current_time()
