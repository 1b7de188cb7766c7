"""``make bench``'s cluster case (issue 9): replicated ADDJOB on a local 3-node cluster.

Starts one standalone trisque-server and three joined into a cluster (free loopback ports,
temporary directories, the log off as in the other throughput cases), then, with the runs
interleaved and the medians reported (the machine is shared and noisy):

  (g) ADDJOB REPLICATE 3 through the 3 nodes, 50 connections spread round robin, vs
      ADDJOB on the standalone node, 50 connections: the ratio (issue 9 asks >= 0.5; the
      reference Disque does about 0.6 here)
  (h) produce -> consume -> ACKJOB across the cluster: half the connections add jobs with
      REPLICATE 3, half take them with GETJOB and acknowledge them with ACKJOB (whose
      SETACK/GOTACK/DELJOB collect the three copies); end-to-end latency p50/p99 (from the
      ADDJOB to the GETJOB reply) and the cycle rate. GETJOB is local, as in Disque: a job
      is consumed on the node that queued it; the other copies are the replicas.

``--disque PATH`` runs the same cases against Disque's own server binary (loopback only),
for its ratio in the same run. The load generator is ``trisque-benchmark``'s. Each case
also prints the CPU time the servers used per operation (all nodes together, from /proc):
on a machine with fewer cores than busy processes (3 nodes + the load generator) the
throughput ratio mostly measures the machine, the CPU per job measures the code.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any

from cli.bench import run_benchmark
from cli.bench_load import BenchError, Spec
from cli.bench_servers import BenchServer, command

BODY = 16
NODE_TIMEOUT_MS = "3000"


class DisqueServer(BenchServer):
    """A Disque server process (``--disque``): same interface, its own command line."""

    def __init__(self, binary: str, label: str) -> None:
        super().__init__("disque", label)
        self.binary = binary

    def argv(self) -> list[str]:
        return [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                self.dir, "--appendonly", "no", "--cluster-node-timeout", NODE_TIMEOUT_MS]

    def flush(self) -> None:
        command(self.port, "DEBUG", "FLUSHALL", timeout=60.0)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def start(kind: str, label: str, binary: str | None) -> BenchServer:
    if kind == "disque":
        assert binary is not None
        server: BenchServer = DisqueServer(binary, label)
    else:
        server = BenchServer("trisque", label, **{"cluster-node-timeout": NODE_TIMEOUT_MS})
    server.start()
    if not server.ok:
        raise BenchError(f"{label}: {server.failure}")
    return server


def join(nodes: list[BenchServer], timeout: float = 30.0) -> None:
    for n in nodes[1:]:
        command(n.port, "CLUSTER", "MEET", "127.0.0.1", str(nodes[0].port))
    deadline = time.monotonic() + timeout
    want = f"cluster_reachable_nodes:{len(nodes) - 1}"
    while time.monotonic() < deadline:
        if all(want in command(n.port, "CLUSTER", "INFO").decode() for n in nodes):
            return
        time.sleep(0.1)
    raise BenchError(f"the {len(nodes)} nodes did not join within {timeout:.0f} s")


def cpu_seconds(servers: list[BenchServer]) -> float:
    """User + system CPU time the server processes used so far (Linux /proc)."""
    total = 0
    for server in servers:
        with open(f"/proc/{server.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / os.sysconf("SC_CLK_TCK")


def run(spec: Spec, procs: int, servers: list[BenchServer]) -> dict[str, Any]:
    """One run; adds ``cpu_us_per_op``: the servers' CPU time per operation (all nodes)."""
    before = cpu_seconds(servers)
    result = run_benchmark(spec, procs=procs)
    used = cpu_seconds(servers) - before
    if result["errors"]:
        raise BenchError(f"{result['errors']} error replies, first: {result['first_error']}")
    result["cpu_us_per_op"] = used / max(1, result["ops"]) * 1e6
    return result


def measure(kind: str, binary: str | None, runs: int, duration: float,
            procs: int) -> dict[str, Any]:
    single = start(kind, f"{kind} standalone", binary)
    nodes = [start(kind, f"{kind} node{i}", binary) for i in range(3)]
    try:
        join(nodes)
        addr = [("127.0.0.1", n.port) for n in nodes]
        one: list[dict[str, Any]] = []
        three: list[dict[str, Any]] = []
        cycles: list[dict[str, Any]] = []
        for i in range(runs):
            log(f"{kind}: run {i + 1}/{runs}")
            for n in (single, *nodes):
                n.flush()
            one.append(run(Spec("produce", [("127.0.0.1", single.port)], 50, body_size=BODY,
                                jobs=50_000_000, duration=duration, queues=["bench"]),
                           procs, [single]))
            three.append(run(Spec("produce", addr, 50, body_size=BODY, jobs=50_000_000,
                                  duration=duration, queues=["bench"], replicate=3),
                             procs, nodes))
            for n in nodes:
                n.flush()
            cycles.append(run(Spec("cycle", addr, 50, body_size=BODY, jobs=50_000_000,
                                   duration=duration, queues=["bench-cycle"], replicate=3,
                                   ack="ackjob", producers=25), procs, nodes))
        p50 = statistics.median(c["e2e_latency_ms"]["p50"] for c in cycles)
        p99 = statistics.median(c["e2e_latency_ms"]["p99"] for c in cycles)
        def med(runs: list[dict[str, Any]], key: str) -> float:
            return float(statistics.median(r[key] for r in runs))

        return {"single": med(one, "ops_per_sec"), "repl3": med(three, "ops_per_sec"),
                "cpu_single": med(one, "cpu_us_per_op"), "cpu_repl3": med(three, "cpu_us_per_op"),
                "cycle": med(cycles, "ops_per_sec"), "cpu_cycle": med(cycles, "cpu_us_per_op"),
                "p50": p50, "p99": p99}
    finally:
        for n in (single, *nodes):
            n.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cli.bench_cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--duration", type=float, default=2.0, help="seconds per run (default 2)")
    p.add_argument("--procs", type=int, default=2, help="load generator processes (default 2)")
    p.add_argument("--disque", metavar="PATH", help="also measure this disque-server binary")
    opts = p.parse_args(argv)
    load = os.getloadavg()
    print(f"# cluster benchmark: {platform.node()} {os.cpu_count()} CPUs, load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {opts.runs} runs of {opts.duration:g} s, "
          f"medians; 50 connections, {BODY}-byte bodies")
    sides = [("trisque", None)] + ([("disque", opts.disque)] if opts.disque else [])
    results = {}
    try:
        for kind, binary in sides:
            results[kind] = measure(kind, binary, opts.runs, opts.duration, opts.procs)
    except BenchError as exc:
        print(f"cluster benchmark failed: {exc}")
        return 1
    print(f"{'':34}" + "".join(f"{k:>16}" for k in results))
    rows = [
        ("(g) ADDJOB standalone, ops/s", "single", "{:.0f}"),
        ("(g) ADDJOB REPLICATE 3, 3 nodes", "repl3", "{:.0f}"),
        ("(g) ratio (issue: >= 0.5)", None, "{:.2f}"),
        ("(g) server CPU us/ADDJOB standalone", "cpu_single", "{:.0f}"),
        ("(g) server CPU us/ADDJOB REPL 3", "cpu_repl3", "{:.0f}"),
        ("(h) cycle REPLICATE 3 + ACKJOB /s", "cycle", "{:.0f}"),
        ("(h) server CPU us per cycle", "cpu_cycle", "{:.0f}"),
        ("(h) end-to-end p50 ms", "p50", "{:.2f}"),
        ("(h) end-to-end p99 ms", "p99", "{:.2f}"),
    ]
    for title, key, fmt in rows:
        cells = []
        for r in results.values():
            value = r["repl3"] / r["single"] if key is None else r[key]
            cells.append(fmt.format(value))
        print(f"{title:34}" + "".join(f"{c:>16}" for c in cells))
    load = os.getloadavg()
    print(f"# load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
