"""``make bench``'s cluster cases: replicated ADDJOB, federation.

Starts one standalone trisque-server and three joined into a cluster (free loopback ports,
temporary directories, the log off as in the other throughput cases), then, with the runs
interleaved and the medians reported (the machine is shared and noisy):

  (g) ADDJOB REPLICATE 3 through the 3 nodes, 50 connections spread round robin, vs
      ADDJOB on the standalone node, 50 connections: the ratio (target >= 0.5; the
      reference Disque does about 0.6 here)
  (h) produce -> consume -> ACKJOB across the cluster: half the connections add jobs with
      REPLICATE 3, half take them with GETJOB and acknowledge them with ACKJOB (whose
      SETACK/GOTACK/DELJOB collect the three copies); end-to-end latency p50/p99 (from the
      ADDJOB to the GETJOB reply) and the cycle rate. GETJOB is local, as in Disque: a job
      is consumed on the node that queued it; the other copies are the replicas.

  (i) federation: a cycle whose 25 producers add jobs (REPLICATE 1) on node0
      while its 25 consumers take them on node1 (GETJOB TIMEOUT, ACKJOB): every job
      reaches its consumer through NEEDJOBS/YOURJOBS. Sustained rate (the run ends when
      every job added was consumed) vs the same cycle on the standalone node: the ratio
      (target >= 0.5). Then a steady load: 2 producers adding 1000 jobs/s in all,
      evenly spaced (``--rate``), 8 consumers, the same nodes; and the same on the
      standalone node, each after a 1 s warm-up (node1 then knows node0 as a source):
      end-to-end p50/p99.
  (j) an idle cluster: 10 consumers blocked for ``--idle`` seconds (default 60) on an
      empty queue, 5 on node1 and 5 on node2: the NEEDJOBS they cause (INFO federation;
      Disque's backoff allows 5 broadcasts per node in 60 s: 0, 4, 12, 28, 58 s, each to
      the 2 other nodes, so 20) and every bus message sent by the 3 nodes (CLUSTER INFO's
      cluster_stats_messages_sent, PING/PONG included).
  (l) a big job: one ADDJOB of a 40 MB body with REPLICATE 3 on node0, synchronous
      (answered once three nodes hold a copy), then FASTACK: seconds, median of the runs.

``--disque PATH`` (or ``TRISQUE_BENCH_DISQUE=PATH``, as for ``bench.table``) runs the
same cases against Disque's own server binary (loopback only), for its ratio in the same run.
The load generator is ``trisque-benchmark``'s (cycles and blocked consumers are beyond
redis-benchmark). ``--quick``: one run of 1 s per case, 10 s idle. Each case also prints
the CPU time the servers used per operation (all nodes together, from /proc): on a machine
with fewer cores than busy processes (3 nodes + the load generator) the throughput ratio
mostly measures the machine, the CPU per job measures the code.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import sys
import time
from typing import Any

from bench.servers import DISQUE_ENV, BenchServer, DisqueServer, command, disque_binary
from cli.bench import run_benchmark
from cli.bench_load import BenchError, Spec
from protocol.resp import encode_command

BODY = 16
NODE_TIMEOUT_MS = "3000"
STEADY_RATE = 1000.0  # (i): jobs/s, well under what one node or the cluster sustains here
BIG_BODY = 40 * 1024 * 1024  # (l)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def start(kind: str, label: str, binary: str | None) -> BenchServer:
    if kind == "disque":
        assert binary is not None
        server: BenchServer = DisqueServer(binary, label,
                                           **{"cluster-node-timeout": NODE_TIMEOUT_MS})
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


def info_field(port: int, text: bytes | str, name: str) -> int:
    """An integer field of an INFO / CLUSTER INFO reply (0 when absent: Disque has no
    federation section)."""
    if isinstance(text, bytes):
        text = text.decode()
    for line in text.split("\r\n"):
        if line.startswith(name + ":"):
            return int(line.split(":", 1)[1])
    return 0


def idle_messages(nodes: list[BenchServer], seconds: float) -> dict[str, Any]:
    """(j): consumers blocked on an empty queue on node1 and node2 for ``seconds``."""
    def sample() -> tuple[int, int]:
        sent = needjobs = 0
        for n in nodes:
            sent += info_field(n.port, command(n.port, "CLUSTER", "INFO"),
                               "cluster_stats_messages_sent")
            needjobs += info_field(n.port, command(n.port, "INFO", "federation"),
                                   "needjobs_sent")
        return sent, needjobs

    consumers = []
    try:
        before = sample()
        for i in range(10):
            s = socket.create_connection(("127.0.0.1", nodes[1 + i % 2].port), timeout=5)
            s.sendall(encode_command("GETJOB", "TIMEOUT", "0", "FROM", "idle-queue"))
            consumers.append(s)
        time.sleep(seconds)
        after = sample()
    finally:
        for s in consumers:
            s.close()
    return {"idle_s": seconds, "bus_sent": after[0] - before[0],
            "needjobs": after[1] - before[1]}


def big_job_seconds(nodes: list[BenchServer], runs: int) -> float | None:
    """(l): the median time of a 40 MB ADDJOB REPLICATE 3 on node0; None if one failed."""
    body = b"k" * BIG_BODY
    times = []
    for _ in range(runs):
        start = time.monotonic()
        reply = command(nodes[0].port, "ADDJOB", "bench-big", body, "10000", "REPLICATE", "3",
                        timeout=60)
        took = time.monotonic() - start
        if not (isinstance(reply, bytes) and reply.startswith(b"D-")):
            log(f"(l): ADDJOB of 40 MB answered {reply!r} after {took:.2f} s")
            return None
        times.append(took)
        command(nodes[0].port, "FASTACK", reply)
    return float(statistics.median(times))


def measure(kind: str, binary: str | None, runs: int, duration: float,
            procs: int, idle_s: float) -> dict[str, Any]:
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
        fed_one: list[dict[str, Any]] = []
        fed_three: list[dict[str, Any]] = []
        steady_one: list[dict[str, Any]] = []
        steady_three: list[dict[str, Any]] = []
        single_addr = [("127.0.0.1", single.port)]
        for i in range(runs):
            log(f"{kind}: federation run {i + 1}/{runs}")
            for n in (single, *nodes):
                n.flush()
            fed_one.append(run(Spec("cycle", single_addr, 50, body_size=BODY,
                                    jobs=50_000_000, duration=duration, queues=["fed-cycle"],
                                    ack="ackjob", producers=25), procs, [single]))
            fed_three.append(run(Spec("cycle", addr[:2], 50, body_size=BODY, jobs=50_000_000,
                                      duration=duration, queues=["fed-cycle"], replicate=1,
                                      ack="ackjob", producers=25, produce_nodes=addr[:1],
                                      consume_nodes=addr[1:2]), procs, nodes))
            steady = Spec("cycle", single_addr, 10, body_size=BODY, jobs=50_000_000,
                          duration=duration, queues=["fed-steady"], ack="ackjob", producers=2,
                          rate=STEADY_RATE)
            across = Spec("cycle", addr[:2], 10, body_size=BODY, jobs=50_000_000,
                          duration=duration, queues=["fed-steady"], replicate=1, ack="ackjob",
                          producers=2, produce_nodes=addr[:1], consume_nodes=addr[1:2],
                          rate=STEADY_RATE)
            # Steady state: node1 must already know node0 as a source of the queue. From
            # cold, consumers that block before the first job exists wait for the next
            # broadcast NEEDJOBS (4 s later, Disque's backoff), as they do on Disque.
            for spec, where, out in ((steady, [single], steady_one),
                                     (across, nodes, steady_three)):
                run(Spec(**{**spec.__dict__, "duration": 1.0}), 1, where)
                out.append(run(spec, 1, where))
        log(f"{kind}: 40 MB jobs")
        big_s = big_job_seconds(nodes, runs)
        idle = idle_messages(nodes, idle_s) if idle_s > 0 else {}
        if kind == "disque":
            idle["needjobs"] = None  # Disque counts no federation message anywhere

        def e2e(runs: list[dict[str, Any]], q: str) -> float:
            return float(statistics.median(r["e2e_latency_ms"][q] for r in runs))

        p50 = statistics.median(c["e2e_latency_ms"]["p50"] for c in cycles)
        p99 = statistics.median(c["e2e_latency_ms"]["p99"] for c in cycles)
        def med(runs: list[dict[str, Any]], key: str) -> float:
            return float(statistics.median(r[key] for r in runs))

        return {"single": med(one, "ops_per_sec"), "repl3": med(three, "ops_per_sec"),
                "cpu_single": med(one, "cpu_us_per_op"), "cpu_repl3": med(three, "cpu_us_per_op"),
                "cycle": med(cycles, "ops_per_sec"), "cpu_cycle": med(cycles, "cpu_us_per_op"),
                "p50": p50, "p99": p99,
                "fed_single": med(fed_one, "ops_per_sec"), "fed_three": med(fed_three, "ops_per_sec"),
                "cpu_fed": med(fed_three, "cpu_us_per_op"),
                "fed_p99": e2e(fed_three, "p99"),
                "steady_rate_one": med(steady_one, "ops_per_sec"),
                "steady_rate_three": med(steady_three, "ops_per_sec"),
                "steady_p50_one": e2e(steady_one, "p50"), "steady_p99_one": e2e(steady_one, "p99"),
                "steady_p50_three": e2e(steady_three, "p50"),
                "steady_p99_three": e2e(steady_three, "p99"),
                "idle_needjobs": idle.get("needjobs", 0), "idle_bus": idle.get("bus_sent", 0),
                "big_s": big_s}
    finally:
        for n in (single, *nodes):
            n.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, help="runs per case (default 3, quick 1)")
    p.add_argument("--duration", type=float,
                   help="seconds per run (default 2, quick 1)")
    p.add_argument("--procs", type=int, default=2, help="load generator processes (default 2)")
    p.add_argument("--disque", metavar="PATH",
                   help=f"also measure this disque-server binary (default: ${DISQUE_ENV} if set)")
    p.add_argument("--idle", type=float,
                   help="(j): seconds of idle blocked consumers (default 60, quick 10; 0 skips it)")
    p.add_argument("--quick", action="store_true",
                   help="one run of 1 s per case and 10 s of idle consumers, for iteration")
    opts = p.parse_args(argv)
    opts.runs = opts.runs or (1 if opts.quick else 3)
    opts.duration = opts.duration or (1.0 if opts.quick else 2.0)
    if opts.idle is None:
        opts.idle = 10.0 if opts.quick else 60.0
    if opts.runs < 1 or opts.duration <= 0 or opts.idle < 0:
        p.error("--runs and --duration must be positive, --idle at least 0")
    try:
        opts.disque = disque_binary(opts.disque)
    except ValueError as exc:
        p.error(str(exc))
    load = os.getloadavg()
    print(f"# cluster benchmark: {platform.node()} {os.cpu_count()} CPUs, load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {opts.runs} runs of {opts.duration:g} s, "
          f"medians; 50 connections, {BODY}-byte bodies")
    sides = [("trisque", None)] + ([("disque", opts.disque)] if opts.disque else [])
    results = {}
    try:
        for kind, binary in sides:
            results[kind] = measure(kind, binary, opts.runs, opts.duration, opts.procs,
                                    opts.idle)
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
        ("(i) cycle standalone /s", "fed_single", "{:.0f}"),
        ("(i) cycle node0 -> node1 /s", "fed_three", "{:.0f}"),
        ("(i) ratio (issue: >= 0.5)", "fed_ratio", "{:.2f}"),
        ("(i) server CPU us per job, 3 nodes", "cpu_fed", "{:.0f}"),
        ("(i) saturated end-to-end p99 ms", "fed_p99", "{:.1f}"),
        ("(i) steady standalone /s", "steady_rate_one", "{:.0f}"),
        ("(i) steady standalone p50 ms", "steady_p50_one", "{:.2f}"),
        ("(i) steady standalone p99 ms", "steady_p99_one", "{:.2f}"),
        ("(i) steady node0 -> node1 /s", "steady_rate_three", "{:.0f}"),
        ("(i) steady node0 -> node1 p50 ms", "steady_p50_three", "{:.2f}"),
        ("(i) steady node0 -> node1 p99 ms", "steady_p99_three", "{:.2f}"),
        (f"(j) idle {opts.idle:g} s: NEEDJOBS sent", "idle_needjobs", "{:.0f}"),
        (f"(j) idle {opts.idle:g} s: bus messages", "idle_bus", "{:.0f}"),
        ("(l) 40 MB ADDJOB REPLICATE 3, s", "big_s", "{:.2f}"),
    ]
    for title, key, fmt in rows:
        cells = []
        for r in results.values():
            if key == "fed_ratio":
                value = r["fed_three"] / r["fed_single"]
            else:
                value = r["repl3"] / r["single"] if key is None else r[key]
            cells.append("n/a" if value is None else fmt.format(value))
        print(f"{title:34}" + "".join(f"{c:>16}" for c in cells))
    load = os.getloadavg()
    print(f"# load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
