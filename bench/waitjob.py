"""WAITJOB's round trip on three nodes: ADDJOB on node 1, GETJOB and RESOLVE on node 2, and
the result read by a WAITJOB on node 3, sent right after the ADDJOB (the client that waits for
its job's result). One job at a time, one connection per node; p50 and p99 of the time from
sending ADDJOB to WAITJOB's reply and of the last leg alone (RESOLVE sent on node 2 to the
result on node 3), the rate, and the nodes' CPU time per round trip (utime + stime from
/proc). Most of a round trip is node 2's GETJOB waiting for federation to bring it the job,
which node 1 queued (Disque's design, bench.cluster measures it on its own).

    .venv/bin/python -m bench.waitjob [--count 2000] [--seconds 30] [--replicate 2]

Bounded by count and time; everything on 127.0.0.1 (ports picked free).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.resp import encode_command
from tests.support.cluster import LocalCluster, wait_until

CLK_TCK = os.sysconf("SC_CLK_TCK")


class Connection:
    """One RESP connection to one node (no node switching, unlike the client library)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")

    def send(self, *args: bytes | str | int) -> None:
        self.sock.sendall(encode_command(*args))

    def read(self) -> Any:
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind in (b"+", b"-"):
            return rest.decode() if kind == b"+" else RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)
            return data[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError(f"unexpected reply {line!r}")

    def call(self, *args: bytes | str | int) -> Any:
        self.send(*args)
        return self.read()

    def close(self) -> None:
        self.file.close()
        self.sock.close()


@dataclass
class Result:
    count: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_trip: float
    leg_p50_ms: float
    leg_p99_ms: float

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        return (f"WAITJOB round trip, 3 nodes: {self.count} jobs in {self.seconds:.1f} s "
                f"({self.rate:.0f}/s), p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms, "
                f"nodes' CPU {self.cpu_ms_per_trip:.2f} ms per round trip; RESOLVE on node 2 to the "
                f"result on node 3: p50 {self.leg_p50_ms:.2f} ms, p99 {self.leg_p99_ms:.2f} ms")


def cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total


def round_trips(ports: list[int], pids: list[int], count: int, seconds: float,
                replicate: int) -> Result:
    add, work, wait = (Connection(p) for p in ports)
    latencies: list[float] = []
    legs: list[float] = []
    try:
        body = b"x" * 64
        cpu0, start = cpu_ticks(pids), time.perf_counter()
        deadline = start + seconds
        while len(latencies) < count and time.perf_counter() < deadline:
            t0 = time.perf_counter()
            job_id = add.call("ADDJOB", "wq", body, 5000, "REPLICATE", replicate)
            if not isinstance(job_id, str):
                raise RuntimeError(f"ADDJOB: {job_id!r}")
            wait.send("WAITJOB", job_id, "TIMEOUT", 10_000)
            got = work.call("GETJOB", "TIMEOUT", 10_000, "FROM", "wq")
            if not got:
                raise RuntimeError("GETJOB on node 2 got nothing in 10 s")
            t1 = time.perf_counter()
            work.call("RESOLVE", got[0][1], b"done:" + got[0][1])
            result = wait.read()
            if result != b"done:" + job_id.encode():
                raise RuntimeError(f"WAITJOB on node 3: {result!r}")
            t2 = time.perf_counter()
            latencies.append((t2 - t0) * 1000)
            legs.append((t2 - t1) * 1000)
        elapsed = time.perf_counter() - start
        cpu_ms = (cpu_ticks(pids) - cpu0) * 1000 / CLK_TCK
    finally:
        for conn in (add, work, wait):
            conn.close()
    return Result(len(latencies), elapsed, statistics.median(latencies), _p99(latencies),
                  cpu_ms / max(1, len(latencies)), statistics.median(legs), _p99(legs))


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def run(count: int, seconds: float, replicate: int) -> Result:
    with tempfile.TemporaryDirectory(prefix="bench-waitjob-") as base:
        cluster = LocalCluster(Path(base), 3).start()
        try:
            ids = [cluster.myid(i) for i in range(3)]
            for i in (1, 2):
                cluster.meet(i, 0)
            wait_until(lambda: cluster.mesh_ok([0, 1, 2], ids), 20.0, "a mesh of 3")
            pids = [node.proc.pid for node in cluster.nodes if node.proc is not None]
            return round_trips([cluster.port(i) for i in range(3)], pids, count, seconds,
                               replicate)
        finally:
            cluster.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.waitjob", description=__doc__.split("\n")[0])
    p.add_argument("--count", type=int, default=2000, help="round trips (default 2000)")
    p.add_argument("--seconds", type=float, default=30.0, help="at most this long (default 30)")
    p.add_argument("--replicate", type=int, default=2,
                   help="ADDJOB's REPLICATE (default 2: nodes 1 and 2 may hold it, node 3 "
                        "may have to ask)")
    ns = p.parse_args(argv)
    print(run(ns.count, ns.seconds, ns.replicate).line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
