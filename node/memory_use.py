"""The runtime's share of ``used_memory`` and INFO's memory section (broker/memory.py is the
model): client query and output buffers, the append log's buffers, and the process RSS,
reported beside the counted bytes rather than as them.

``runtime_bytes`` walks the connections, so it runs once a second (``Server._sample``), at
INFO and before a body of 1 MB or more is judged, never per request.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from broker.memory import CLIENT_BYTES

if TYPE_CHECKING:
    from node.connection import Connection
    from node.log_core import LogCore

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _malloc_trim() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to call
        return None


_TRIM = _malloc_trim()


def release_free_heap() -> None:
    """Give the heap's free pages back to the kernel (glibc's ``malloc_trim``). Big buffers
    freed by a log rewrite otherwise stay in RSS: once a large block has been freed, glibc
    serves the next ones from the heap instead of separate mappings, and a freed block in the
    middle of the heap is not returned. Costs a walk of the heap: called after rare events."""
    if _TRIM is not None:
        _TRIM(0)


def read_rss() -> int:
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def human(n: int) -> str:
    for unit in ("B", "K", "M", "G"):
        if n < 1024 or unit == "G":
            return f"{n:.2f}{unit}" if unit != "B" else f"{n}B"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def client_bytes(connections: Iterable[Connection]) -> int:
    """Each connection's objects and its buffers: unread input, replies the round has yet to
    write, replies queued behind its waiting ADDJOBs, replies the socket did not take."""
    total = 0
    for conn in connections:
        total += CLIENT_BYTES + conn.parser.buffered
        for chunk in conn.out:
            total += len(chunk)
        for entry in conn.waiting:
            if entry is not None:
                total += len(entry[0])
        for chunk in conn.pending:
            total += len(chunk)
    return total


def log_bytes(append_log: LogCore) -> int:
    """The open batch, the batch being written, and a rewrite's buffer of new records."""
    total = len(append_log.open_batch.data)
    if append_log.in_flight is not None:
        total += len(append_log.in_flight.data)
    if append_log.rewrite_buf is not None:
        total += len(append_log.rewrite_buf)
    return total


class MemoryReport:
    """INFO's memory section: Disque's fields in Disque's order, then trisque's."""

    def __init__(self) -> None:
        self.startup_rss = read_rss()  # the interpreter and its modules, before any data
        self.peak = 0

    def note(self, used: int) -> None:
        self.peak = max(self.peak, used)

    def fields(self, used: int, maxmemory: int) -> list[tuple[str, Any]]:
        self.note(used)
        rss = read_rss()
        # What the process holds over what it should: the footprint at start plus the counted
        # bytes. About 1 when the count is right (Redis divides RSS by used_memory alone).
        ratio = rss / (self.startup_rss + used) if self.startup_rss + used else 1.0
        return [
            ("used_memory", used), ("used_memory_human", human(used)),
            ("used_memory_rss", rss), ("used_memory_peak", self.peak),
            ("used_memory_peak_human", human(self.peak)),
            ("mem_fragmentation_ratio", f"{ratio:.2f}"), ("mem_allocator", "pymalloc"),
            ("maxmemory", maxmemory), ("used_memory_startup", self.startup_rss),
        ]
