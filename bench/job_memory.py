"""What a job costs in memory, measured: the source of the constants in broker/memory.py.

    python -m bench.job_memory [--jobs N] [--body BYTES] [--on-disk] [--breakdown]

Adds N jobs to a single broker core (no runtime) and prints the bytes per job beyond its body:
traced by tracemalloc (exact for the pure core; the compiled core's objects are allocated by C
code tracemalloc still sees, but run ``TRISQUE_CORE=compiled`` for its figure) and the growth of
the process RSS (what the allocator took from the system, arenas included). Each job is queued,
as after ADDJOB; the same number again delivered (active, out of its queue) is printed second.
``--on-disk``: each body is handed to the job as the append log's (``body-memory-max``) right
after its ADDJOB, as the node does once the body is written, so what is left is the record.

``--breakdown`` prints where a queued job's bytes go, structure by structure: each object as
the allocator holds it (rounded up to its 16-byte size class), each container's share per job.
Jobs are added 20 to the millisecond, as a server taking 20,000 ADDJOBs a second: a timer
bucket (16 ms) then holds 320 of them.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import tracemalloc
import zlib

from broker.clients import Client
from broker.config import Config
from broker.core import Broker
from broker.job import BodyRef
from protocol import core_build


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _store(broker: Broker, at: int) -> None:
    """The newest job's body as if the append log held it at offset ``at``."""
    job = broker.jobs[next(reversed(broker.jobs))]
    body = job.body
    broker.body_stored(job, BodyRef(1, at, len(body), zlib.crc32(body)))


def measure(jobs: int, body: int, deliver: bool, trace: bool, on_disk: bool = False
            ) -> tuple[float, float, float]:
    """(traced bytes per job beyond the body, RSS bytes per job beyond it, the broker's
    own count per job beyond it; with ``on_disk``, per job and no body). Tracing costs
    memory itself: RSS is read untraced."""
    broker = Broker(Config(), "ab" * 20, b"seed" * 5, now_ms=1_700_000_000_000,
                    rng=random.Random(1))
    client = Client(1)
    payload = b"x" * body
    # One job first, so the queue, the timer bucket and the interned values exist.
    broker.execute([b"ADDJOB", b"q", payload, b"0"], client, 1_700_000_000_000)
    broker.take_effects()
    if on_disk:
        _store(broker, 16)
    gc.collect()
    counted0 = broker.used_memory
    if trace:
        tracemalloc.start()
    traced0 = tracemalloc.get_traced_memory()[0]
    rss0 = _rss()
    for i in range(jobs):
        # A new body object per job, as a client's ADDJOB brings.
        broker.execute([b"ADDJOB", b"q", payload[:-1] + bytes((i & 0x7F,)), b"0"], client,
                       1_700_000_000_000 + i)
        broker.take_effects()
        if on_disk:
            _store(broker, 16 + (i + 1) * body)
    if deliver:
        broker.execute([b"GETJOB", b"NOHANG", b"COUNT", str(jobs).encode(), b"FROM", b"q"],
                       client, 1_700_000_000_000 + jobs)
        broker.take_effects()
    gc.collect()
    rss = _rss() - rss0
    traced = tracemalloc.get_traced_memory()[0] - traced0
    tracemalloc.stop()
    counted = broker.used_memory - counted0
    beyond = 0 if on_disk else body
    return traced / jobs - beyond, rss / jobs - beyond, counted / jobs - beyond


def _allocated(size: int) -> int:
    """What the allocator hands out for ``size`` bytes: pymalloc's 16-byte classes."""
    return (size + 15) // 16 * 16 if size <= 512 else size


def breakdown(jobs: int, body: int, on_disk: bool = False) -> list[tuple[str, float]]:
    """(structure, bytes per queued job) for ``jobs`` jobs added as ``measure`` adds them."""
    broker = Broker(Config(), "ab" * 20, b"seed" * 5, now_ms=1_700_000_000_000,
                    rng=random.Random(1))
    client = Client(1)
    payload = b"x" * body
    for i in range(jobs):
        broker.execute([b"ADDJOB", b"q", payload[:-1] + bytes((i & 0x7F,)), b"0"], client,
                       1_700_000_000_000 + i // 20)
        broker.take_effects()
        if on_disk:
            _store(broker, 16 + i * body)
    gc.collect()
    size = sys.getsizeof
    job = next(reversed(broker.jobs.values()))
    timers = broker.timers
    buckets = timers._buckets
    queue = broker.queues[b"q"]
    rows = [
        ("Job object", float(_allocated(size(job)))),
        ("ID (bytes)", float(_allocated(size(job.id)))),
        ("job table (dict entry)", size(broker.jobs) / jobs),
        ("queue (list entry)", size(queue._items) / jobs),
        ("JSCAN list (entry)", size(broker.job_scan._items) / jobs),
        ("timer wheel (entry, bucket)", (size(buckets) + size(timers._keys)
                                         + sum(_allocated(size(b)) + size(k)
                                               for k, b in buckets.items())) / jobs),
    ]
    if core_build.kind() == core_build.PURE:
        # A Python class boxes its integers: one object each past the small-int cache, unless
        # shared (a compiled class keeps them unboxed in its struct).
        other = next(iter(broker.jobs.values()))
        slots = {n for cls in type(job).__mro__ for n in getattr(cls, "__slots__", ())}
        values = [(getattr(job, n), getattr(other, n)) for n in slots if hasattr(job, n)]
        rows.append(("boxed integers", float(sum(
            _allocated(size(v)) for v, w in values
            if type(v) is int and not -5 <= v <= 256 and v is not w))))
    rows.append(("all but the body", sum(b for _, b in rows)))
    if not on_disk:
        rows.append(("body (bytes)", float(_allocated(size(job.body)))))
    return rows


def _in_child(jobs: int, body: int, deliver: bool, trace: bool, on_disk: bool
              ) -> tuple[float, float, float]:
    """``measure`` in a fresh process: memory freed by an earlier run would hide RSS growth."""
    out = subprocess.run([sys.executable, "-m", "bench.job_memory", "--child",
                          json.dumps([jobs, body, deliver, trace, on_disk])],
                         check=True, capture_output=True, text=True).stdout
    traced, rss, counted = json.loads(out)
    return traced, rss, counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--body", type=int, default=100)
    parser.add_argument("--on-disk", action="store_true",
                        help="bodies held by the append log (body-memory-max), not memory")
    parser.add_argument("--breakdown", action="store_true",
                        help="where a queued job's bytes go, structure by structure")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.breakdown:
        print(f"core: {core_build.kind()}, {args.jobs} queued jobs of {args.body} bytes"
              + (", bodies on disk" if args.on_disk else ""))
        for name, per_job in breakdown(args.jobs, args.body, args.on_disk):
            print(f"  {name:<28} {per_job:6.1f} B")
        return
    if args.child:
        print(json.dumps(measure(*json.loads(args.child))))
        return
    print(f"core: {core_build.kind()}, {args.jobs} jobs of {args.body} bytes"
          + (", bodies on disk" if args.on_disk else ""))
    where = "without the body" if args.on_disk else "beyond the body"
    for deliver in (False, True):
        traced, _, counted = _in_child(args.jobs, args.body, deliver, True, args.on_disk)
        _, rss, _ = _in_child(args.jobs, args.body, deliver, False, args.on_disk)
        print(f"{'active' if deliver else 'queued'}: {where}, traced {traced:.0f} B, "
              f"RSS {rss:.0f} B, counted {counted:.0f} B per job")


if __name__ == "__main__":
    main()
