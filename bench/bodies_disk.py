"""Bodies in the append log (``body-memory-max``, docs/persistence.md) at scale: one node takes
``--jobs`` jobs with 1 KB bodies, pipelined, then serves GETJOB + ACKJOB for every one of them,
checking each body; it is killed with SIGKILL half way and restarted. Each phase prints its
time, rate and the node's RSS (and its peak).

Phases: add every job (all held at once); get and acknowledge half of them; kill -9 and
restart (the replay: no acknowledged job may be lost, none acknowledged may come back); get
and acknowledge the rest. Then, on ``--compare`` jobs, ADDJOB and GETJOB + ACKJOB throughput of the
same build with every body in memory (``body-memory-max 0``) against bodies on disk with a warm
page cache and with a cold one (``/proc/sys/vm/drop_caches``, needs root: said when refused).
``python -m bench.bodies_disk --help``; the data lives under ``--dir`` and is removed after.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import hiredis

from bench.servers import BenchServer, command, cpu_seconds

QUEUE = b"bodies"
WINDOW = 500  # commands in flight on the connection
GET_COUNT = 100  # jobs per GETJOB


class BenchFailed(Exception):
    """A phase did not see what it must (a lost job, a wrong body, an error reply)."""


def body_of(i: int, size: int, pad: bytes) -> bytes:
    """Job ``i``'s body: its number, then bytes that differ from one job to the next."""
    head = b"%010d" % i
    start = i % 997
    return head + pad[start:start + size - len(head)]


class Pipe:
    """One connection that keeps up to ``WINDOW`` commands in flight."""

    def __init__(self, port: int, deadline: float) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()
        self.deadline = deadline

    def replies(self, n: int) -> list[Any]:
        out: list[Any] = []
        while len(out) < n:
            reply = self.reader.gets()
            if reply is not False:
                out.append(reply)
                continue
            if time.monotonic() > self.deadline:
                raise BenchFailed("out of time (--timeout)")
            data = self.sock.recv(1 << 20)
            if not data:
                raise BenchFailed("the node closed the connection")
            self.reader.feed(data)
        return out

    def call(self, commands: list[bytes]) -> list[Any]:
        self.sock.sendall(b"".join(commands))
        return self.replies(len(commands))

    def close(self) -> None:
        self.sock.close()


def _resp(*args: bytes) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(parts)


def add_jobs(port: int, numbers: range, size: int, pad: bytes, deadline: float) -> None:
    pipe = Pipe(port, deadline)
    try:
        batch: list[bytes] = []
        for i in numbers:
            batch.append(_resp(b"ADDJOB", QUEUE, body_of(i, size, pad), b"0", b"RETRY", b"3600"))
            if len(batch) == WINDOW:
                _check_added(pipe.call(batch))
                batch = []
        if batch:
            _check_added(pipe.call(batch))
    finally:
        pipe.close()


def _check_added(replies: list[Any]) -> None:
    for r in replies:
        if not isinstance(r, bytes):
            raise BenchFailed(f"ADDJOB refused: {r!r}")


def take_jobs(port: int, count: int, size: int, pad: bytes, seen: bytearray,
              deadline: float) -> int:
    """GETJOB + ACKJOB ``count`` jobs, checking each body and that no job comes twice."""
    pipe = Pipe(port, deadline)
    taken = 0
    try:
        pending: list[bytes] = []  # ACKJOBs to send with the next GETJOBs
        while taken < count:
            want = min(8, -(-(count - taken) // GET_COUNT))
            gets = [_resp(b"GETJOB", b"NOHANG", b"COUNT", b"%d" % GET_COUNT, b"FROM", QUEUE)] * want
            replies = pipe.call(pending + gets)[len(pending):]
            pending = []
            got_any = False
            for reply in replies:
                for _queue, job_id, body in reply or []:
                    got_any = True
                    if not isinstance(body, bytes):
                        raise BenchFailed(f"job {job_id!r}: body unreadable: {body!r}")
                    i = int(body[:10])
                    if body != body_of(i, size, pad):
                        raise BenchFailed(f"job {job_id!r}: wrong body for job number {i}")
                    if seen[i]:
                        raise BenchFailed(f"job number {i} delivered twice")
                    seen[i] = 1
                    taken += 1
                    pending.append(job_id)
            if pending:
                pending = [_resp(b"ACKJOB", *pending)]
            if not got_any:
                raise BenchFailed(f"queue empty after {taken} of {count} jobs")
        if pending:
            pipe.call(pending)
    finally:
        pipe.close()
    return taken


def _info(port: int, section: str) -> dict[str, str]:
    text = command(port, "INFO", section, timeout=120).decode()
    return dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def drop_caches() -> str | None:
    """Empty the page cache; the reason when this process may not."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as exc:
        return f"{exc.strerror or exc}"
    return None


GB = 1 << 30


def _server(directory: str, label: str, settings: dict[str, str]) -> BenchServer:
    """A trisque node keeping its data in a new folder under ``directory``."""
    before = tempfile.tempdir
    tempfile.tempdir = directory
    try:
        return BenchServer("trisque", label, **settings)
    finally:
        tempfile.tempdir = before


class Report:
    def __init__(self, out: Callable[[str], None]) -> None:
        self.out = out

    def phase(self, name: str, seconds: float, jobs: int, node: BenchServer) -> None:
        rate = jobs / seconds if seconds > 0 and jobs else 0.0
        self.out(f"{name:<34} {seconds:9.2f} s {rate:11,.0f} jobs/s   RSS "
                 f"{node.rss() / GB:6.2f} GB (peak {_peak_rss(node.pid) / GB:5.2f} GB)")


def scale_run(n: int, size: int, directory: str, maxmemory: str, fsync: str, deadline: float,
              out: Callable[[str], None], port: int = 0) -> dict[str, float]:
    """The 4 phases on one node; returns each phase's seconds."""
    pad = random.Random(7).randbytes(2048)
    seen = bytearray(n)
    report = Report(out)
    times: dict[str, float] = {}
    settings = {"appendonly": "yes", "appendfsync": fsync, "maxmemory": maxmemory,
                "body-memory-max": "256", "auto-aof-rewrite-percentage": "0"}
    node = _server(directory, "bodies-on-disk", settings)
    if port:
        # A port of its own: a free port picked at random may be taken by another process
        # while the node replays after its kill, which would then answer in its place.
        node.port = port
    with node:
        if not node.ok:
            raise BenchFailed(f"node: {node.failure}")
        half = n // 2
        t = time.perf_counter()
        add_jobs(node.port, range(n), size, pad, deadline)
        times["add"] = time.perf_counter() - t
        report.phase(f"ADDJOB {n:,} (pipelined)", times["add"], n, node)
        info = _info(node.port, "persistence")
        out(f"  all {n:,} held: {info.get('jobs_bodies_on_disk')} bodies on disk, log "
            f"{int(info['log_bytes']) / GB:.2f} GB")
        t = time.perf_counter()
        take_jobs(node.port, half, size, pad, seen, deadline)
        times["take"] = time.perf_counter() - t
        report.phase(f"GETJOB+ACKJOB {half:,}", times["take"], half, node)
        assert node.proc is not None
        node.proc.kill()
        node.proc.wait()
        t = time.perf_counter()
        node.settings["aof-enqueue-jobs-once"] = "yes"  # loaded jobs queued at once, not at RETRY
        node.start(timeout=max(30.0, deadline - time.monotonic()))
        if not node.ok:
            raise BenchFailed(f"restart: {node.failure}")
        times["restart"] = time.perf_counter() - t
        answering = _info(node.port, "server").get("process_id")
        if answering != str(node.pid):
            raise BenchFailed(f"another process (pid {answering}) answers on port {node.port} "
                              "after the restart: give the bench a --port of its own")
        report.phase("kill -9, restart (replay)", times["restart"], n - half, node)
        left = int(command(node.port, "QLEN", QUEUE, timeout=60))
        if left != n - half:
            with open(node.log_path, errors="replace") as f:
                log = "".join(f.readlines()[-8:])
            raise BenchFailed(f"after the restart the queue holds {left:,} jobs, "
                              f"{n - half:,} expected; INFO jobs: "
                              f"{_info(node.port, 'jobs')}; the node's log ends:\n{log}")
        t = time.perf_counter()
        take_jobs(node.port, n - half, size, pad, seen, deadline)
        times["take2"] = time.perf_counter() - t
        report.phase(f"GETJOB+ACKJOB {n - half:,}", times["take2"], n - half, node)
        if seen.count(1) != n or int(command(node.port, "QLEN", QUEUE)) != 0:
            raise BenchFailed(f"{seen.count(1):,} distinct jobs served, {n:,} added")
        out(f"every one of {n:,} bodies served once and right; peak RSS "
            f"{_peak_rss(node.pid) / GB:.2f} GB")
    return times


Rates = tuple[float, float, float, float]  # ADDJOB, GETJOB+ACKJOB: jobs/s, node CPU us/job


def _throughput(directory: str, n: int, size: int, body_max: str, fsync: str, cold: bool,
                deadline: float) -> tuple[Rates, str | None]:
    pad = random.Random(7).randbytes(2048)
    settings = {"appendonly": "yes", "appendfsync": fsync, "maxmemory": "8gb",
                "body-memory-max": body_max, "auto-aof-rewrite-percentage": "0"}
    with _server(directory, f"body-memory-max {body_max}", settings) as node:
        if not node.ok:
            raise BenchFailed(f"node: {node.failure}")
        t, cpu = time.perf_counter(), cpu_seconds(node.pid)
        add_jobs(node.port, range(n), size, pad, deadline)
        add = n / (time.perf_counter() - t)
        add_cpu = (cpu_seconds(node.pid) - cpu) / n * 1e6
        refused = drop_caches() if cold else None
        t, cpu = time.perf_counter(), cpu_seconds(node.pid)
        take_jobs(node.port, n, size, pad, bytearray(n), deadline)
        take = n / (time.perf_counter() - t)
        take_cpu = (cpu_seconds(node.pid) - cpu) / n * 1e6
    return (add, take, add_cpu, take_cpu), refused


def compare(directory: str, n: int, size: int, fsync: str, runs: int, deadline: float,
            out: Callable[[str], None]) -> dict[str, float]:
    """ADDJOB and GETJOB+ACKJOB rates and the node's CPU time per job, bodies in memory
    against on disk (warm, cold): the medians of ``runs`` interleaved runs, and the ratios of
    the rates and of the CPU times (the latter less sensitive to a busy machine)."""
    rates: dict[str, list[Rates]] = {"memory": [], "warm": [], "cold": []}
    refused: str | None = None
    load_before = os.getloadavg()[0]
    for _ in range(runs):
        rates["memory"].append(_throughput(directory, n, size, "0", fsync, False, deadline)[0])
        rates["warm"].append(_throughput(directory, n, size, "256", fsync, False, deadline)[0])
        cold, refused = _throughput(directory, n, size, "256", fsync, True, deadline)
        rates["cold"].append(cold)

    def median(mode: str, k: int) -> float:
        values = sorted(r[k] for r in rates[mode])
        return values[len(values) // 2]

    result: dict[str, float] = {}
    out(f"{n:,} jobs of {size} bytes, appendfsync {fsync}, medians of {runs} interleaved "
        f"run(s), load {load_before:.2f}-{os.getloadavg()[0]:.2f}, jobs/s:")
    for mode in ("memory", "warm", "cold"):
        for k, op in enumerate(("add", "take", "add_cpu", "take_cpu")):
            result[f"{mode}_{op}"] = median(mode, k)
        out(f"  {mode:<7} ADDJOB {result[f'{mode}_add']:10,.0f} ({result[f'{mode}_add_cpu']:5.1f}"
            f" us CPU/job)   GETJOB+ACKJOB {result[f'{mode}_take']:10,.0f} "
            f"({result[f'{mode}_take_cpu']:5.1f} us CPU/job)")
    for mode, floor in (("warm", 0.8), ("cold", 0.5)):
        for op in ("add", "take"):
            ratio = result[f"{mode}_{op}"] / result[f"memory_{op}"]
            used = result[f"{mode}_{op}_cpu"]  # 0 on a run shorter than the clock's tick
            by_cpu = result[f"memory_{op}_cpu"] / used if used else 0.0
            result[f"ratio_{mode}_{op}"], result[f"cpu_ratio_{mode}_{op}"] = ratio, by_cpu
            name = "ADDJOB" if op == "add" else "GETJOB+ACKJOB"
            out(f"  {mode} / memory, {name}: {ratio:.2f}x by rate, {by_cpu:.2f}x by node CPU "
                f"(target {floor}x: {'PASS' if min(ratio, by_cpu) >= floor else 'MISS'})")
    if refused is not None:
        out(f"  the cold runs were NOT cold: dropping the page cache was refused ({refused})")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=1_000_000, help="jobs in the scale run")
    p.add_argument("--body", type=int, default=1024, help="body size in bytes")
    p.add_argument("--compare", type=int, default=200_000,
                   help="jobs in each throughput run (0: skip the comparison)")
    p.add_argument("--runs", type=int, default=1, help="throughput runs per mode")
    p.add_argument("--maxmemory", default="4gb")
    p.add_argument("--appendfsync", default="everysec", choices=["always", "everysec", "no"])
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the nodes keep their logs")
    p.add_argument("--timeout", type=float, default=4 * 3600, help="give up after (seconds)")
    p.add_argument("--skip-scale", action="store_true", help="only the comparison")
    p.add_argument("--port", type=int, default=0,
                   help="the scale run's node port (default: a free one, which another "
                        "process may take while the node restarts)")
    args = p.parse_args(argv)
    if args.body < 16:
        p.error("--body must be at least 16 bytes")
    deadline = time.monotonic() + args.timeout

    def out(line: str) -> None:
        print(line, flush=True)

    try:
        if not args.skip_scale:
            out(f"scale: {args.jobs:,} jobs of {args.body} bytes, maxmemory {args.maxmemory}, "
                f"appendfsync {args.appendfsync}, data under {args.dir}")
            scale_run(args.jobs, args.body, args.dir, args.maxmemory, args.appendfsync,
                      deadline, out, args.port)
        if args.compare:
            compare(args.dir, args.compare, args.body, args.appendfsync, args.runs, deadline, out)
    except BenchFailed as exc:
        out(f"FAILED: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
