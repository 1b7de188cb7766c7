"""Group commit, in-process (a program, not a test): ``python -m bench.aof_group_commit``.

C client tasks each run ADDJOB through the real broker core and wait for the log before their
next command, as a connection does, for D seconds; once with ``appendfsync always`` and once
with the log off. Prints ops/s, fsyncs, jobs per fsync and the fsync latency. No sockets, so
this is the ceiling the disk and the batching allow, not the server's throughput.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import trio

from broker.clients import Client
from broker.config import Config
from broker.core import Broker
from node.persistence import Persistence


async def run(directory: str, appendonly: bool, clients: int, seconds: float) -> None:
    config = Config()
    config.set("dir", [directory])
    config.set("appendfsync", ["always"])
    config.appendonly = appendonly
    now = int(time.time() * 1000)
    broker = Broker(config, "abcdef01" * 5, os.urandom(8), now_ms=now)
    p = Persistence(config, broker)
    p.load(now)
    done = 0
    waits: list[float] = []

    async def client(k: int, deadline: float) -> None:
        nonlocal done
        c = Client(k)
        argv = [b"ADDJOB", b"q%d" % (k % 8), b"x" * 64, b"0"]
        while time.monotonic() < deadline:
            broker.execute(argv, c, int(time.time() * 1000))
            ticket = p.submit(broker.take_effects())  # ADDJOB emits only its log record
            if ticket:
                t0 = time.perf_counter()
                await p.wait_durable(ticket)
                waits.append(time.perf_counter() - t0)
            else:
                await trio.sleep(0)
            done += 1

    async with trio.open_nursery() as n:
        await n.start(p.run)
        deadline = time.monotonic() + seconds
        async with trio.open_nursery() as cs:
            for k in range(clients):
                cs.start_soon(client, k, deadline)
        n.cancel_scope.cancel()
    label = "always" if appendonly else "off"
    line = f"appendonly {label:6}: {done / seconds:9.0f} ADDJOB/s"
    if appendonly:
        waits.sort()
        line += (f", {p.fsync_count / seconds:6.0f} fsync/s, {done / max(p.fsync_count, 1):5.1f}"
                 f" jobs/fsync, last fsync {p.last_fsync_usec} us, wait p50 "
                 f"{waits[len(waits) // 2] * 1e3:.2f} ms p99 {waits[len(waits) * 99 // 100] * 1e3:.2f} ms")
    print(line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-c", type=int, default=50)
    ap.add_argument("-d", type=float, default=3.0)
    args = ap.parse_args()
    for appendonly in (False, True):
        with tempfile.TemporaryDirectory(dir=".") as d:
            trio.run(run, d, appendonly, args.c, args.d)


if __name__ == "__main__":
    main()
