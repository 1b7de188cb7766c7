"""Where row (i)'s jobs wait: the saturated federation run, traced second by second.

Runs ``bench.cluster``'s row (i) workload (producers ADDJOB REPLICATE 1 on node 1, consumers
GETJOB + ACKJOB on node 2) on three-node clusters of trisque checkouts and of Disque, one
after the other, and meanwhile samples QLEN on nodes 1 and 2 (and, on trisque, INFO
federation) every ``--sample-ms``. Each consumed job's production and consumption times are
kept too (the load generator's workers are forked, so a recording array is slipped into them),
which gives, per interval: jobs produced and consumed, both backlogs, the mean and max age of
the jobs consumed. Debugging aid, not a benchmark of record: the sampler costs each node a
command per interval.

    python -m bench.fedtrace --trisque new=. --trisque old=../other-checkout \\
        --disque /path/to/disque-server --runs 3
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any

from bench.cluster import info_field
from bench.servers import command, cpu_seconds
from cli import bench_load
from cli.bench import percentiles, run_benchmark
from cli.bench_load import Spec
from client.blocking import Connection
from protocol.resp import encode_command

QUEUE = "bench-federation"
_TRACE_DIR = tempfile.mkdtemp(prefix="fedtrace-")


class _Traced(array):  # type: ignore[type-arg]
    """The consumers' e2e array: also keeps when each sample was taken, and writes both to a
    file of this process when the worker hands its results over (``tobytes``)."""

    def __new__(cls, typecode: str) -> _Traced:
        self = super().__new__(cls, typecode)
        self.at = array("q")  # type: ignore[attr-defined]
        return self

    def append(self, value: int) -> None:
        self.at.append(perf_counter_ns())  # type: ignore[attr-defined]
        super().append(value)

    def tobytes(self) -> bytes:
        with open(os.path.join(_TRACE_DIR, f"{os.getpid()}.bin"), "ab") as f:
            pairs = array("q")
            for t, d in zip(self.at, self, strict=True):  # type: ignore[attr-defined]
                pairs.append(t - d)  # produced
                pairs.append(t)  # consumed
            f.write(pairs.tobytes())
        return super().tobytes()


_original_init = bench_load.Stats.__init__


def _traced_init(self: Any, shared: Any, index: int) -> None:
    _original_init(self, shared, index)
    self.e2e_ns = _Traced("q")


bench_load.Stats.__init__ = _traced_init  # type: ignore[method-assign]
_original_consumer = bench_load.cycle_consumer


async def _consumer(spec: Spec, sock: Any, reader: Any, stats: Any, hard_deadline: float
                    ) -> None:
    """The consumers' request latencies apart from the producers' (``latency_ms`` of the
    result is then the producers' alone)."""
    own = copy.copy(stats)
    own.lat_ns = array("q")
    own.consumed = own.errors = own.empty_replies = 0
    try:
        await _original_consumer(spec, sock, reader, own, hard_deadline)
    finally:
        stats.consumed += own.consumed
        stats.errors += own.errors
        stats.empty_replies += own.empty_replies
        with open(os.path.join(_TRACE_DIR, f"lat-{os.getpid()}.bin"), "ab") as f:
            f.write(own.lat_ns.tobytes())


bench_load.cycle_consumer = _consumer


@dataclass
class Node:
    argv: list[str]
    env: dict[str, str]
    port: int
    http: int = 0
    proc: subprocess.Popen[bytes] | None = None
    tmp: Any = None

    def start(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="fedtrace-node-")
        argv = self.argv + ["--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                            self.tmp.name, "--appendonly", "no", "--cluster-node-timeout", "3000"]
        if self.http:
            argv += ["--http-port", str(self.http)]
        log = open(os.path.join(self.tmp.name, "log"), "wb")
        self.proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     cwd=self.tmp.name, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if command(self.port, "PING") == b"PONG":
                    return
            except OSError:
                time.sleep(0.1)
            if self.proc.poll() is not None:
                break
        with open(os.path.join(self.tmp.name, "log"), "rb") as f:
            tail = f.read()[-2000:].decode(errors="replace")
        raise RuntimeError(f"node on {self.port} did not start: {tail}")

    def cpu(self) -> float:
        assert self.proc is not None
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.tmp is not None:
            self.tmp.cleanup()
        self.proc = self.tmp = None


@dataclass
class Cluster:
    label: str
    nodes: list[Node] = field(default_factory=list)
    disque: bool = False

    def start(self) -> None:
        for n in self.nodes:
            n.start()
            nice = n.env.get("FEDTRACE_NICE")
            if nice and n is self.nodes[0] and n.proc is not None:
                os.setpriority(os.PRIO_PROCESS, n.proc.pid, int(nice))
        for n in self.nodes[1:]:
            command(n.port, "CLUSTER", "MEET", "127.0.0.1", str(self.nodes[0].port))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            infos = [command(n.port, "CLUSTER", "INFO") for n in self.nodes]
            if all(b"cluster_reachable_nodes:2" in i for i in infos):
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.label} did not join")

    def flush(self) -> None:
        for n in self.nodes:
            command(n.port, "DEBUG", "FLUSHALL")

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


_TAKEN: set[int] = set()


def free_pair() -> int:
    """A port of 23000-23499 that binds, its bus port (+10000) too, not handed out before."""
    for _ in range(1000):
        port = 23000 + random.randrange(500)
        if port in _TAKEN:
            continue
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        _TAKEN.add(port)
        return port
    raise RuntimeError("no free port pair in 23000-23499")


def start(c: Cluster) -> None:
    """Start the cluster, on other ports if some are taken: the bus ports (+10000) are in
    Linux's ephemeral range, where any outgoing connection may hold one."""
    for attempt in range(10):
        try:
            c.start()
            return
        except RuntimeError:
            c.stop()
            if attempt == 9:
                raise
            for n in c.nodes:
                n.port = free_pair()


def make_cluster(label: str, where: str) -> Cluster:
    if label == "disque":
        argv, env, disque = [where], dict(os.environ), True
    else:
        argv = [sys.executable, "-m", "cli.server"]
        env, disque = dict(os.environ, PYTHONPATH=os.path.abspath(where)), False
    return Cluster(label, [Node(argv, env, free_pair(), 0 if disque else free_pair())
                           for _ in range(3)], disque)


def bus_sent(n: Node) -> dict[str, float]:
    """Frames sent by type (trisque's /metrics)."""
    import urllib.request
    out: dict[str, float] = {}
    with urllib.request.urlopen(f"http://127.0.0.1:{n.http}/metrics", timeout=10) as f:
        for line in f.read().decode().splitlines():
            if line.startswith("trisque_bus_messages_sent_total{"):
                kind = line.split('type="', 1)[1].split('"', 1)[0]
                out[kind] = float(line.rsplit(" ", 1)[1])
    return out


def sample_loop(c: Cluster, every_s: float, stop: threading.Event,
                out: list[tuple[int, int, int, int, int, float, float, float]]) -> None:
    """(time ns, QLEN node 1, QLEN node 2, exported node 1, imported node 2, CPU s node 1,
    CPU s node 2)."""
    one, two = (Connection(("127.0.0.1", n.port), 10) for n in c.nodes[:2])

    def call(conn: Connection, *args: str) -> Any:
        return conn.exchange(encode_command(*args), 1, 10)[0]

    while not stop.is_set():
        t = perf_counter_ns()
        q1, q2 = call(one, "QLEN", QUEUE), call(two, "QLEN", QUEUE)
        e = i = 0
        if not c.disque:
            e = info_field(call(one, "INFO", "federation"), "jobs_exported")
            i = info_field(call(two, "INFO", "federation"), "jobs_imported")
        with open("/proc/stat") as f:
            busy = sum(int(x) for x in f.readline().split()[1:4]) / os.sysconf("SC_CLK_TCK")
        out.append((t, int(q1), int(q2), e, i, c.nodes[0].cpu(), c.nodes[1].cpu(), busy))
        stop.wait(every_s)


def run(c: Cluster, opts: argparse.Namespace) -> dict[str, Any]:
    for f in os.listdir(_TRACE_DIR):
        os.unlink(os.path.join(_TRACE_DIR, f))
    c.flush()
    spec = Spec("cycle", [("127.0.0.1", c.nodes[0].port), ("127.0.0.1", c.nodes[1].port)],
                opts.producers + opts.consumers, body_size=16, jobs=50_000_000,
                duration=opts.duration, queues=[QUEUE], replicate=1, ack="ackjob",
                producers=opts.producers, rate=opts.rate,
                produce_nodes=[("127.0.0.1", c.nodes[0].port)],
                consume_nodes=[("127.0.0.1", c.nodes[1].port)])
    samples: list[tuple[int, int, int, int, int, float, float, float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_loop, args=(c, opts.sample_ms / 1000, stop, samples))
    cpu0 = [n.cpu() for n in c.nodes]
    sent0 = [{} if c.disque else bus_sent(n) for n in c.nodes[:2]]
    stats0 = [command(n.port, "CLUSTER", "INFO") for n in c.nodes]
    fed0 = [b"" if c.disque else command(n.port, "INFO", "federation") for n in c.nodes]
    spies = []
    if opts.pyspy and not c.disque:
        for i in (0, 1):
            out = os.path.join(opts.pyspy, f"{c.label}-node{i + 1}.txt")
            proc = c.nodes[i].proc
            assert proc is not None
            spies.append(subprocess.Popen(
                ["py-spy", "record", "--native", "-r", "200", "-p", str(proc.pid),
                 "-f", "raw", "-o", out, "-d", str(int(opts.duration + 2))],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.5)
    sampler.start()
    t0 = perf_counter_ns()
    try:
        result = run_benchmark(spec, procs=opts.procs)
    finally:
        stop.set()
        sampler.join()
        for spy in spies:
            spy.wait()
    cpu = [n.cpu() - c0 for n, c0 in zip(c.nodes, cpu0, strict=True)]
    by_type = []
    for n, before in zip(c.nodes[:2], sent0, strict=False):
        after = {} if c.disque else bus_sent(n)
        by_type.append({k: int(v - before.get(k, 0)) for k, v in after.items()
                        if v - before.get(k, 0) > 0})
    msgs = sum(info_field(command(n.port, "CLUSTER", "INFO"), "cluster_stats_messages_sent")
               - info_field(s, "cluster_stats_messages_sent") for n, s in zip(c.nodes, stats0, strict=False))
    fed = {}
    if not c.disque:
        for key in ("needjobs_sent", "yourjobs_sent"):
            fed[key] = sum(info_field(command(n.port, "INFO", "federation"), key)
                           - info_field(f, key) for n, f in zip(c.nodes, fed0, strict=False))
    pairs = array("q")
    consumer_lat = array("q")
    for f in os.listdir(_TRACE_DIR):
        with open(os.path.join(_TRACE_DIR, f), "rb") as fh:
            (consumer_lat if f.startswith("lat-") else pairs).frombytes(fh.read())
    jobs = [(pairs[i], pairs[i + 1]) for i in range(0, len(pairs), 2)]
    return {"result": result, "samples": samples, "jobs": jobs, "t0": t0, "cpu": cpu,
            "consumer_lat": percentiles(consumer_lat), "by_type": by_type,
            "msgs": msgs, "fed": fed}


def report(label: str, r: dict[str, Any], bucket_ms: int) -> str:
    res = r["result"]
    e2e = res["e2e_latency_ms"]
    ops = max(1, res["ops"])
    lines = [f"== {label}: {res['ops_per_sec']:,.0f}/s, {res['ops']:,} jobs of "
             f"{res['produced']:,}, e2e p50 {e2e['p50']:.0f} p99 {e2e['p99']:.0f} max "
             f"{e2e['max']:.0f} ms, elapsed {res['elapsed_s']:.2f} s; CPU per job (us) "
             + " / ".join(f"{c / ops * 1e6:.1f}" for c in r["cpu"])
             + f"; bus msgs/job {r['msgs'] / ops:.3f} {r['fed']}; request p50/p99 (ms): "
             f"ADDJOB {res['latency_ms']['p50']:.2f}/{res['latency_ms']['p99']:.2f}, GETJOB "
             f"{r['consumer_lat']['p50']:.2f}/{r['consumer_lat']['p99']:.2f}"]
    taken = sorted(consumed for _, consumed in r["jobs"])
    gaps = [b - a for a, b in zip(taken, taken[1:], strict=False) if b - a > 2_000_000]
    lines[0] += (f"\n   consumption stalls over 2 ms: {len(gaps)}, {sum(gaps) / 1e6:.0f} ms in all, "
                 f"longest {max(gaps, default=0) / 1e6:.0f} ms")
    for i, sent in enumerate(r["by_type"]):
        lines[0] += f"\n   node {i + 1} sent: {sent}"
    t0 = r["t0"]
    step = bucket_ms * 1_000_000
    buckets: dict[int, list[Any]] = {}
    for produced, consumed in r["jobs"]:
        b = buckets.setdefault((consumed - t0) // step, [0, 0, 0, 0])
        age = consumed - produced
        b[0] += 1
        b[1] += age
        b[2] = max(b[2], age)
        pb = buckets.setdefault((produced - t0) // step, [0, 0, 0, 0])
        pb[3] += 1
    samples: dict[int, Any] = {}
    for t, q1, q2, e, i, c1, c2, busy in r["samples"]:
        samples.setdefault((t - t0) // step, (q1, q2, e, i, c1, c2, busy))
    lines.append("   t(ms)  made  taken  mean-age  max-age   qlen1   qlen2  exported  cpu1  cpu2"
                 "   all")
    keys = sorted(set(buckets) | set(samples))
    for k in keys:
        n, total, mx, made = buckets.get(k, [0, 0, 0, 0])
        q1, q2, e, _, c1, c2, busy = samples.get(k, (-1, -1, -1, -1, 0.0, 0.0, 0.0))
        after = samples.get(k + 1)
        u1 = u2 = ua = 0.0
        if after is not None and k in samples:
            u1, u2 = (after[4] - c1) * 1000 / bucket_ms, (after[5] - c2) * 1000 / bucket_ms
            ua = (after[6] - busy) * 1000 / bucket_ms
        mean = total / n / 1e6 if n else 0
        lines.append(f"  {k * bucket_ms:6d} {made:5d} {n:6d} {mean:9.1f} {mx / 1e6:8.1f} "
                     f"{q1:7d} {q2:7d} {e:9d} {u1:5.2f} {u2:5.2f} {ua:5.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fedtrace", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trisque", action="append", default=[],
                   metavar="LABEL=CHECKOUT[,NAME=VALUE...]",
                   help="environment of its nodes (FEDTRACE_NICE=n: node 1 runs at nice n)")
    p.add_argument("--disque", metavar="PATH")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--producers", type=int, default=25)
    p.add_argument("--consumers", type=int, default=25)
    p.add_argument("--rate", type=float, default=0.0, help="jobs/s in all (0: saturated)")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--sample-ms", type=float, default=100.0)
    p.add_argument("--bucket-ms", type=int, default=250)
    p.add_argument("--pyspy", metavar="DIR", help="py-spy nodes 1 and 2 (raw stacks in DIR)")
    p.add_argument("--summary", action="store_true", help="one line per run, no table")
    opts = p.parse_args(argv)
    clusters = []
    for spec in opts.trisque:
        label, rest = spec.split("=", 1)
        where, *env = rest.split(",")
        c = make_cluster(label, where)
        for n in c.nodes:
            n.env.update(e.split("=", 1) for e in env)
        clusters.append(c)
    if opts.disque:
        clusters.append(make_cluster("disque", opts.disque))
    try:
        for c in clusters:
            start(c)
        for i in range(opts.runs):
            order = clusters if i % 2 == 0 else clusters[::-1]
            for c in order:
                load = os.getloadavg()[0]
                text = report(f"{c.label} run {i + 1} (load {load:.1f})", run(c, opts),
                              opts.bucket_ms)
                print(text.split("\n   t(ms)")[0] if opts.summary else text, flush=True)
    finally:
        for c in clusters:
            c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
