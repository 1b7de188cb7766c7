"""The compiled core against the pure-Python one: two single nodes, the same load, interleaved.

``python -m bench.builds [--runs 5] [--requests 200000]`` (after ``make build``) starts one
trisque node on the pure-Python core (``TRISQUE_CORE=pure``) and one on the compiled core
(``TRISQUE_CORE=compiled``: it refuses to start on anything else), then runs every case with
redis-benchmark against each node in turn, the order alternating from one round to the next,
and prints the medians: requests per second as redis-benchmark reports them, and the node's
CPU time per request (user + system, from /proc, over the whole run). The machine's load
average is recorded before and after each round: on a shared machine the ratio of one round
is what to trust, not the absolute numbers. Between rounds each node is emptied with DEBUG
FLUSHALL, so every round starts from the same state.

Cases (50 connections): ADDJOB; GETJOB NOHANG on the jobs the ADDJOB case left (each one a
real delivery); ADDJOB pipelined 16 deep. Then the core alone, without sockets or trio: a
process per build and per round parses ADDJOB requests fed one at a time, executes them on a
broker wired as a node wires it (membership, job and federation cores), takes the effects,
encodes the log records and the replies; then the same for GETJOB NOHANG. That figure is the
CPU the compiled modules themselves save. The results go to bench-results/core-builds.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.servers import REPO, BenchServer, command, cpu_seconds
from bench.table import redis_benchmark
from cli.bench_load import BenchError

BUILDS = ("pure", "compiled")
CASES = (  # (key, title, redis-benchmark arguments, pipeline depth)
    ("addjob", "ADDJOB, 50 connections", ["ADDJOB", "q", "body", "0"], 1),
    ("getjob", "GETJOB NOHANG, 50 connections", ["GETJOB", "NOHANG", "FROM", "q"], 1),
    ("addjob_p16", "ADDJOB, 50 connections, pipelined 16", ["ADDJOB", "q", "body", "0"], 16),
)


@contextmanager
def node(build: str) -> Iterator[BenchServer]:
    """A node on the given core: TRISQUE_CORE is read at its start, from our environment."""
    saved = os.environ.get("TRISQUE_CORE")
    os.environ["TRISQUE_CORE"] = build
    try:
        server = BenchServer("trisque", f"trisque ({build})").start()
    finally:
        if saved is None:
            del os.environ["TRISQUE_CORE"]
        else:
            os.environ["TRISQUE_CORE"] = saved
    try:
        if not server.ok:
            raise SystemExit(f"bench.builds: the {build} node did not start: {server.failure}")
        info = command(server.port, "INFO", "server")
        shown = next((line.split(":", 1)[1] for line in info.decode().split("\r\n")
                      if line.startswith("trisque_core:")), "?")
        if shown != build:
            raise SystemExit(f"bench.builds: the {build} node runs the {shown} core")
        yield server
    finally:
        server.stop()


def one_run(server: BenchServer, args: list[str], pipeline: int, n: int) -> dict[str, Any]:
    """One redis-benchmark run with 50 connections (``n`` a whole number of pipelines)."""
    before = cpu_seconds(server.pid)
    try:
        sample = redis_benchmark(server.port, args, n, pipeline, timeout=600)
    except BenchError as exc:
        raise SystemExit(f"bench.builds: {server.label}: {exc}") from None
    cpu = cpu_seconds(server.pid) - before
    return {"rps": sample.ops_per_sec, "cpu_us_per_request": cpu / n * 1e6}


def core_loop(n: int) -> dict[str, float]:
    """In this process: microseconds of CPU per ADDJOB, then per GETJOB NOHANG, through the
    sans-IO core as a node drives it (its build is whatever this process loaded)."""
    import gc
    import random

    from broker.aof import encode_records
    from broker.clients import Client
    from broker.config import Config
    from broker.core import Broker
    from broker.effects import LogRecord
    from cluster.federation import FederationCore
    from cluster.jobs import JobCore
    from cluster.membership import Membership
    from cluster.wiring import attach
    from protocol.resp import NEED_DATA, RequestParser, encode_command, encode_into

    gc.set_threshold(50_000, 20, 100)  # as a node runs (node/server.py)
    gc.freeze()
    now = 1_700_000_000_000
    config = Config()
    node_id = "ab" * 20
    broker = Broker(config, node_id, b"seed" * 5, now_ms=now, rng=random.Random(1))
    membership = Membership(config, node_id, random.Random(2), now, None)
    jobs = JobCore(broker, membership, random.Random(3))
    federation = FederationCore(broker, membership)
    attach(broker, membership=membership, jobs=jobs, federation=federation)
    cores: list[JobCore | FederationCore] = [jobs, federation]
    client = Client(1)
    out: dict[str, float] = {}
    for name, request in (("addjob", encode_command("ADDJOB", "q", "body", "0")),
                          ("getjob", encode_command("GETJOB", "NOHANG", "FROM", "q"))):
        parser = RequestParser()
        replies: list[bytes] = []
        started = time.process_time()
        for _ in range(n):  # one request per read, as from clients that do not pipeline
            parser.feed(request)
            while (argv := parser.next()) is not NEED_DATA:
                assert isinstance(argv, list)
                reply = broker.execute(argv, client, now)
                records = [e for e in broker.take_effects() if type(e) is LogRecord]
                if records:
                    encode_records(records)
                for core in cores:
                    core.take_effects()
                encode_into(reply, replies)
            replies.clear()
        out[name] = (time.process_time() - started) / n * 1e6
    assert not broker.queues[b"q"], "every job added was delivered"
    return out


def core_run(build: str, n: int) -> dict[str, float]:
    """``core_loop`` in a child process on the given core."""
    env = dict(os.environ, TRISQUE_CORE=build)
    child = subprocess.run([sys.executable, "-m", "bench.builds", "--core-loop", str(n)],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if child.returncode != 0:
        raise SystemExit(f"bench.builds: the {build} core loop failed:\n{child.stderr}")
    result: dict[str, float] = json.loads(child.stdout.strip().splitlines()[-1])
    return result


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.builds", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="rounds (default 5)")
    p.add_argument("--requests", type=int, default=200_000, help="requests per run")
    p.add_argument("--out", default=str(REPO / "bench-results" / "core-builds.json"))
    p.add_argument("--core-loop", type=int, metavar="N", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.core_loop:
        print(json.dumps(core_loop(args.core_loop)))
        return 0
    if not shutil.which("redis-benchmark"):
        print("bench.builds: redis-benchmark is needed (apt-get install redis-tools)",
              file=sys.stderr)
        return 1
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        key: {b: [] for b in BUILDS} for key, *_ in CASES}
    loads: list[tuple[float, float]] = []
    core: dict[str, list[dict[str, float]]] = {b: [] for b in BUILDS}
    with node("pure") as pure, node("compiled") as compiled:
        servers = {"pure": pure, "compiled": compiled}
        for r in range(args.runs):
            order = BUILDS if r % 2 == 0 else BUILDS[::-1]
            load_before = os.getloadavg()[0]
            for build in order:
                for key, _title, cmd, pipeline in CASES:
                    run = one_run(servers[build], cmd, pipeline, args.requests)
                    results[key][build].append(run)
                command(servers[build].port, "DEBUG", "FLUSHALL")
            loads.append((load_before, os.getloadavg()[0]))
            for build in order:
                core[build].append(core_run(build, args.requests))
            print(f"round {r + 1}/{args.runs}: load {loads[-1][0]:.2f} -> {loads[-1][1]:.2f}; "
                  + "; ".join(f"{key} " + " / ".join(
                      f"{b} {results[key][b][-1]['rps'] or 0:,.0f}" for b in BUILDS)
                      for key, *_ in CASES), flush=True)
    print()
    print(render(results, core, loads, args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M:%S"),
                                          "cpus": os.cpu_count(), "loads": loads,
                                          "requests": args.requests, "results": results,
                                          "core_loop_us": core}, indent=1))
    print(f"\n(raw results in {args.out})")
    return 0


def render(results: dict[str, dict[str, list[dict[str, Any]]]],
           core: dict[str, list[dict[str, float]]], loads: list[tuple[float, float]],
           args: argparse.Namespace) -> str:
    lines = [f"{args.runs} rounds of {args.requests:,} requests per case, interleaved; "
             f"load average {min(min(x) for x in loads):.2f}-{max(max(x) for x in loads):.2f} "
             f"on {os.cpu_count()} CPUs",
             "",
             "| case | pure ops/s | compiled ops/s | speed-up | pure CPU/request | "
             "compiled CPU/request | CPU saved |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for key, title, *_ in CASES:
        rps = {b: median([x["rps"] for x in results[key][b] if x["rps"]]) for b in BUILDS}
        cpu = {b: median([x["cpu_us_per_request"] for x in results[key][b]]) for b in BUILDS}
        lines.append(
            f"| {title} | {rps['pure']:,.0f} | {rps['compiled']:,.0f} | "
            f"{rps['compiled'] / rps['pure']:.2f}x | {cpu['pure']:.1f} us | "
            f"{cpu['compiled']:.1f} us | {1 - cpu['compiled'] / cpu['pure']:.0%} |")
    for key, title in (("addjob", "ADDJOB, the core alone (in process)"),
                       ("getjob", "GETJOB NOHANG, the core alone (in process)")):
        us = {b: median([x[key] for x in core[b]]) for b in BUILDS}
        lines.append(f"| {title} | | | {us['pure'] / us['compiled']:.2f}x | {us['pure']:.1f} us "
                     f"| {us['compiled']:.1f} us | {1 - us['compiled'] / us['pure']:.0%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
