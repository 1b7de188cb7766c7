"""What a real node's memory is doing: RSS (what the kernel and ``maxmemory`` see) and the
interpreter's allocated blocks (INFO allocations: one per live object, so a leak of one small
object per job shows after a few thousand jobs, where RSS needs a hundred thousand)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.churn import rss_bytes
from tests.support.server import send_command

MIB = 1 << 20


def info_fields(port: int, section: str) -> dict[str, int]:
    text = send_command(port, "INFO", section).decode()
    return {k: int(v) for k, v in (line.split(":", 1) for line in text.split("\r\n")
                                   if ":" in line and not line.startswith("#"))}


@dataclass
class Footprint:
    rss: int
    blocks: int
    jobs: int
    timers: int

    def growth_since(self, before: Footprint) -> str:
        return (f"RSS {before.rss / MIB:.2f} -> {self.rss / MIB:.2f} MiB, allocated blocks "
                f"{before.blocks:,} -> {self.blocks:,}, jobs {self.jobs}, timers {self.timers}")


def footprint(port: int, pid: int, settle_s: float = 0.3, *, flush: bool = True) -> Footprint:
    """Read once the node is idle (a round's garbage collected, timers run). With no job
    held, the bounded leftovers of the jobs that went are dropped with DEBUG FLUSHALL before
    the blocks are counted (thousands of blocks of noise otherwise): the job scan list keeps
    up to a thousand or so finished jobs' objects for JSCAN's cursors until it compacts, the
    HTTP Content-Types as many, federation the last 10 s of imported IDs. The jobs and timer
    entries are read before it. ``flush=False`` skips it, for what FLUSHALL would reset along
    with the leftovers (the results table: outcomes, blocked WAITJOBs, chained children)."""
    time.sleep(settle_s)
    alloc = info_fields(port, "allocations")
    if flush and alloc["registered_jobs"] == 0:
        assert send_command(port, "DEBUG", "FLUSHALL") == b"OK"
        time.sleep(0.05)
    blocks = info_fields(port, "allocations")["allocated_blocks"]
    return Footprint(rss_bytes(pid), blocks, alloc["registered_jobs"], alloc["timer_entries"])


# What the allocated blocks move by with no leak (allocator caches, interned values).
BLOCKS_NOISE = 500


def assert_flat(before: Footprint, after: Footprint, jobs: int, *, rss_slack: int = MIB,
                blocks_noise: int = BLOCKS_NOISE) -> None:
    """No job left behind: the node holds none, the timer wheel is empty, RSS moved by less
    than ``rss_slack`` and the allocated blocks by less than one per 20 jobs (plus noise)."""
    why = after.growth_since(before)
    assert after.jobs == 0 and after.timers == 0, why
    assert after.rss - before.rss < rss_slack, why
    assert after.blocks - before.blocks < blocks_noise + jobs // 20, why
