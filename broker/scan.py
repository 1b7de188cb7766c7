"""Cursors for QSCAN and JSCAN that return every element present for the whole iteration.

Theory of operation
-------------------
Elements are appended to a list when they are registered and their slot is set to None when
they go away, so positions never move and a cursor is simply a position. The holes are
squeezed out only when they outnumber the live elements; that moves positions, so the cursor
also carries the low 16 bits of a compaction epoch and a cursor from an older epoch starts
again from the beginning. A restart can only repeat elements, which SCAN-style commands are
allowed to do; it never skips one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

_EPOCH_BITS = 16
_EPOCH_MASK = (1 << _EPOCH_BITS) - 1


class ScanList(Generic[T]):
    __slots__ = ("_items", "_holes", "_epoch")

    def __init__(self) -> None:
        self._items: list[T | None] = []
        self._holes = 0
        self._epoch = 0

    def add(self, item: T) -> None:
        self._items.append(item)

    def discard(self, alive: Callable[[T], bool]) -> None:
        """Note that an element went away. ``alive`` tells live elements apart; holes are found
        lazily when the list is compacted, so removal costs nothing per element."""
        self._holes += 1
        if self._holes > 1024 and self._holes * 2 > len(self._items):
            self._items = [x for x in self._items if x is not None and alive(x)]
            self._holes = 0
            self._epoch += 1

    def compact(self, alive: Callable[[T], bool]) -> None:
        """Squeeze out every hole now, however few live elements remain."""
        if self._holes:
            self._items = [x for x in self._items if x is not None and alive(x)]
            self._holes = 0
            self._epoch += 1

    def clear(self) -> None:
        self._items = []
        self._holes = 0
        self._epoch += 1

    def scan(self, cursor: int, count: int, alive: Callable[[T], bool]) -> tuple[int, list[T]]:
        """Visit about ``count`` slots from ``cursor``; returns (next cursor or 0, live items)."""
        pos = cursor >> _EPOCH_BITS
        if cursor and (cursor & _EPOCH_MASK) != (self._epoch & _EPOCH_MASK):
            pos = 0
        items = self._items
        end = len(items) if count <= 0 else min(len(items), pos + count)
        found = [x for x in items[pos:end] if x is not None and alive(x)]
        if end >= len(items):
            return 0, found
        return (end << _EPOCH_BITS) | (self._epoch & _EPOCH_MASK), found
