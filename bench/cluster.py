"""``make bench``'s cluster rows: three trisque nodes against three reference Disque nodes.

Starts two clusters of three nodes on free loopback ports, each joined with CLUSTER MEET, the
log off: trisque-server, and Disque's own server when a binary is given (``--disque PATH`` or
``TRISQUE_BENCH_DISQUE``; without one its cells print n/a). Every row runs on both clusters,
the runs interleaved (the order alternating from run to run, every node flushed before each
run), and prints the medians, trisque / Disque, and PASS/MISS against the resolve bar and the
goal (``bench/cluster_report.py``):

  (g) ADDJOB REPLICATE 3 on node 1, redis-benchmark with 1, 10 and 50 connections, and
      ADDJOB REPLICATE 3 ASYNC with 50: the rate (bar >= 0.8x Disque), and with one
      connection the p50 latency too (bar <= 1.2x Disque's). Every job must be queued after
      the run (QLEN), or the run fails: redis-benchmark counts error replies as requests.
  (h) 20,000 ADDJOB REPLICATE 3 pipelined 100 at a time on one connection to node 1 (the
      load generator), then the same jobs taken on node 2 with GETJOB TIMEOUT COUNT 100 on one
      connection, each batch's FASTACK sent with the next GETJOB (raw socket): both rates.
  (i) saturated federation: 25 producers add jobs (REPLICATE 1) on node 1 as fast as they
      can while 25 consumers take them on node 2 (GETJOB TIMEOUT, ACKJOB): the rate, and the
      p99 from ADDJOB to GETJOB's reply (bar: <= Disque's).
  (j) idle: 10 consumers blocked for ``--idle`` seconds on an empty queue, 5 on node 2, 5 on
      node 3, both clusters at once: the NEEDJOBS sent (INFO federation; Disque counts none,
      its backoff allows 20 in 60 s) and every bus message (cluster_stats_messages_sent).
  (l) one ADDJOB of a 40 MB body with REPLICATE 3 on node 1, then FASTACK: seconds.
  (u) ADDJOB REPLICATE 3 with 50 connections on three trisque nodes with ``tls-cluster yes``
      (certificates from ``cli.certs``) against the trisque cluster without it, in a table
      of its own: the rate (bar >= 0.6x the plaintext bus) and the CPU per job.

Each row also has the servers' CPU time per job, all three nodes together (/proc): on a
machine with fewer cores than busy processes the rates mostly measure the machine, the CPU
per job measures the code. The load column is the 1-minute load average at the start of the
row's runs. ``--quick``: one run of 1 s per row, 5,000 pipelined jobs, 10 s idle (about a
minute); ``--rows i``: only the rows named (here the federation row). Results also go to
``bench-results/cluster.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cluster_report import (
    FEDERATION_P99,
    ONE_CONNECTION_P50,
    RATE,
    TLS_RATE,
    Row,
    Side,
    Target,
    p99_lower_bound,
    render,
)
from bench.servers import (
    DISQUE_ENV,
    REPO,
    BenchServer,
    DisqueServer,
    command,
    cpu_seconds,
    disque_binary,
)
from bench.table import redis_benchmark
from cli.bench import run_benchmark
from cli.bench_load import BenchError, Spec
from cli.certs import generate
from protocol.resp import NEED_DATA, Error, ReplyReader, encode_command

BODY = 16
NODE_TIMEOUT_MS = "3000"
QUEUE = "bench"
PIPELINE = 100  # (h)
BIG_BODY = 40 * 1024 * 1024  # (l)
NO_DISQUE = f"no reference Disque in this run (--disque PATH or {DISQUE_ENV})"
_STARTED = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - _STARTED:4.0f} s] {msg}", file=sys.stderr, flush=True)


def load_now() -> float:
    return os.getloadavg()[0]


@dataclass
class Cluster:
    """Three joined nodes of one kind ("trisque" or "disque"); node 1 is ``nodes[0]``."""

    kind: str
    nodes: list[BenchServer]

    def port(self, i: int) -> int:
        return self.nodes[i].port

    def addr(self, i: int) -> tuple[str, int]:
        return ("127.0.0.1", self.nodes[i].port)

    def flush(self) -> None:
        for n in self.nodes:
            n.flush()

    def cpu_seconds(self) -> float:
        """User + system CPU time the three servers used so far (Linux /proc)."""
        return sum(cpu_seconds(n.pid) for n in self.nodes)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def start_cluster(kind: str, binary: str | None, timeout: float = 30.0,
                  per_node: list[dict[str, str]] | None = None) -> Cluster:
    settings = {"cluster-node-timeout": NODE_TIMEOUT_MS}
    nodes: list[BenchServer] = []
    cluster = Cluster(kind, nodes)
    try:
        for i in range(3):
            label = f"{kind} node {i + 1}"
            extra = per_node[i] if per_node else {}
            node = (DisqueServer(binary, label, **settings) if binary
                    else BenchServer("trisque", label, **settings, **extra))
            nodes.append(node)
            node.start()
            if not node.ok:
                raise BenchError(f"{label}: {node.failure}")
        for n in nodes[1:]:
            command(n.port, "CLUSTER", "MEET", "127.0.0.1", str(nodes[0].port))
        deadline = time.monotonic() + timeout
        while not all("cluster_reachable_nodes:2" in command(n.port, "CLUSTER", "INFO").decode()
                      for n in nodes):
            if time.monotonic() > deadline:
                raise BenchError(f"the 3 {kind} nodes did not join within {timeout:.0f} s")
            time.sleep(0.1)
    except (BenchError, OSError):
        cluster.stop()
        raise
    return cluster


# ---------------------------------------------------------------------------------------------
# Interleaved runs


Reading = tuple[float, float | None]  # (value, server CPU us per job, or None)
Measure = Callable[[Cluster], dict[str, Reading]]


def interleaved(title: str, clusters: list[Cluster], runs: int, keys: list[str],
                measure: Measure) -> dict[str, dict[str, Side]]:
    """``runs`` runs of ``measure`` on each cluster, alternating which goes first; for each
    key it returns, one ``Side`` per cluster kind. A cluster whose run fails skips its other
    runs of this row (its cells then say why)."""
    sides = {key: {c.kind: Side() for c in clusters} for key in keys}
    for i in range(runs):
        for c in (clusters if i % 2 == 0 else clusters[::-1]):
            if sides[keys[0]][c.kind].failure is not None:
                continue
            load = load_now()
            try:
                c.flush()
                readings = measure(c)
            except (BenchError, OSError) as exc:
                log(f"{title}: {c.kind}: run {i + 1}/{runs} failed: {exc}")
                for key in keys:
                    sides[key][c.kind].failure = f"{title}, {c.kind} run {i + 1}: {exc}"
                continue
            for key, (value, cpu_us) in readings.items():
                side = sides[key][c.kind]
                side.values.append(value)
                side.loads.append(load)
                if cpu_us is not None:
                    side.cpu_us.append(cpu_us)
            shown = ", ".join(f"{k} {v:,.3f}" for k, (v, _) in readings.items())
            log(f"{title}: {c.kind}: run {i + 1}/{runs}: {shown} (load {load:.2f})")
    return sides


def row(title: str, unit: str, sides: dict[str, Side], target: Target | None = None,
        show_cpu: bool = True) -> Row:
    return Row(title, unit, sides["trisque"], sides.get("disque", Side(failure=NO_DISQUE)),
               target, show_cpu)


# ---------------------------------------------------------------------------------------------
# (g): redis-benchmark


def addjob_args(asynchronous: bool) -> list[str]:
    return ["ADDJOB", QUEUE, "x" * BODY, "0", "REPLICATE", "3"] + (["ASYNC"] if asynchronous
                                                                   else [])


def addjob_run(c: Cluster, clients: int, requests: int, asynchronous: bool,
               timeout: float) -> dict[str, Reading]:
    """One redis-benchmark run on node 1, checked: every job queued there afterwards."""
    c.flush()
    before = c.cpu_seconds()
    sample = redis_benchmark(c.port(0), addjob_args(asynchronous), requests, 1, timeout,
                             clients=clients)
    if asynchronous:
        time.sleep(0.3)  # the copies still on their way count too
    used = c.cpu_seconds() - before
    queued = command(c.port(0), "QLEN", QUEUE)
    if queued != requests:
        raise BenchError(f"{queued} jobs queued after {requests} ADDJOBs: not every reply "
                         "was a job")
    readings: dict[str, Reading] = {"rate": (sample.ops_per_sec, used / requests * 1e6)}
    if sample.p50_ms is not None:
        readings["p50"] = (sample.p50_ms, None)
    return readings


def addjob_rows(clusters: list[Cluster], runs: int, duration: float, clients: int,
                asynchronous: bool) -> list[Row]:
    timeout = max(60.0, 15 * duration + 30)
    title = (f"(g) ADDJOB REPLICATE 3{' ASYNC' if asynchronous else ''}, "
             f"{clients} conn{'s' if clients > 1 else ''}")
    log(f"{title} ...")
    requests: dict[str, int] = {}
    for c in clusters:  # unmeasured: warms up, and its rate sizes the runs to ``duration``
        probe = {1: 300, 10: 1_000}.get(clients, 5_000)
        try:
            rate = addjob_run(c, clients, probe, asynchronous, timeout)["rate"][0]
        except (BenchError, OSError) as exc:
            log(f"{title}: {c.kind}: first run failed: {exc}")
            rate = probe / duration  # the measured runs fail again and say why
        requests[c.kind] = int(min(400_000, max(200, rate * duration)))
    sides = interleaved(title, clusters, runs, ["rate", "p50"], lambda c: addjob_run(
        c, clients, requests[c.kind], asynchronous, timeout))
    rows = [row(title, "/s", sides["rate"], RATE)]
    if clients == 1:
        rows.append(row("    p50 latency, 1 conn", "ms", sides["p50"], ONE_CONNECTION_P50,
                        show_cpu=False))
    return rows


# ---------------------------------------------------------------------------------------------
# (h): pipelined on node 1, consumed on node 2


def consume_all(port: int, queue: str, jobs: int, deadline_s: float) -> float:
    """Take ``jobs`` jobs from ``queue`` on one connection (GETJOB TIMEOUT COUNT 100, the
    previous batch's FASTACK in the same write); seconds until the last FASTACK's reply."""
    getjob = encode_command("GETJOB", "TIMEOUT", "1000", "COUNT", PIPELINE, "FROM", queue)
    reader = ReplyReader()
    with socket.create_connection(("127.0.0.1", port), timeout=10.0) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = time.monotonic()
        taken = 0
        pending: list[bytes] = []
        while taken < jobs or pending:
            if time.monotonic() - start > deadline_s:
                raise BenchError(f"took {taken} of {jobs} jobs in {deadline_s:.0f} s")
            payload = encode_command("FASTACK", *pending) if pending else b""
            if taken < jobs:
                payload += getjob
            replies: list[Any] = []
            sock.sendall(payload)
            want = (1 if pending else 0) + (1 if taken < jobs else 0)
            while len(replies) < want:
                reply = reader.next()
                if reply is NEED_DATA:
                    data = sock.recv(256 * 1024)
                    if not data:
                        raise BenchError("the node closed the connection")
                    reader.feed(data)
                    continue
                if isinstance(reply, Error):
                    raise BenchError(f"error reply: {reply}")
                replies.append(reply)
            got = replies[-1] if taken < jobs else None
            pending = [job[1] for job in got or ()]
            taken += len(pending)
        return time.monotonic() - start


def pipelined_run(c: Cluster, jobs: int) -> dict[str, Reading]:
    queue = "bench-pipelined"
    cpu0 = c.cpu_seconds()
    produced = run_benchmark(Spec("produce", [c.addr(0)], 1, pipeline=PIPELINE, body_size=BODY,
                                  jobs=jobs, duration=max(120.0, jobs / 100), queues=[queue],
                                  replicate=3), procs=1)
    cpu1 = c.cpu_seconds()
    if produced["errors"] or produced["ops"] != jobs:
        raise BenchError(f"{produced['ops']} of {jobs} jobs added, {produced['errors']} error "
                         f"replies (first: {produced['first_error']})")
    seconds = consume_all(c.port(1), queue, jobs, max(60.0, jobs / 500))
    cpu2 = c.cpu_seconds()
    return {"add": (produced["ops_per_sec"], (cpu1 - cpu0) / jobs * 1e6),
            "take": (jobs / seconds, (cpu2 - cpu1) / jobs * 1e6)}


def pipelined_rows(clusters: list[Cluster], runs: int, jobs: int) -> list[Row]:
    title = f"(h) {jobs:,} ADDJOB REPL 3 pipelined {PIPELINE}, node 1"
    log(f"{title} ...")
    sides = interleaved(title, clusters, runs, ["add", "take"],
                        lambda c: pipelined_run(c, jobs))
    return [row(title, "/s", sides["add"], RATE),
            row("(h) the same taken on node 2, COUNT 100+FASTACK", "/s", sides["take"], RATE)]


# ---------------------------------------------------------------------------------------------
# (i): federation


def federation_run(c: Cluster, duration: float, procs: int) -> dict[str, Reading]:
    spec = Spec("cycle", [c.addr(0), c.addr(1)], 50, body_size=BODY, jobs=50_000_000,
                duration=duration, queues=["bench-federation"], replicate=1, ack="ackjob",
                producers=25, produce_nodes=[c.addr(0)], consume_nodes=[c.addr(1)])
    before = c.cpu_seconds()
    result = run_benchmark(spec, procs=procs)
    used = c.cpu_seconds() - before
    if result["errors"]:
        raise BenchError(f"{result['errors']} error replies, first: {result['first_error']}")
    p99 = result["e2e_latency_ms"]["p99"]
    left = result["produced"] - result["ops"]
    if left > 0:
        # The consumers went on waiting after the producers stopped, then gave up: the jobs
        # left behind waited at least that long.
        waited_ms = max(0.0, result["elapsed_s"] - duration) * 1000
        p99 = p99_lower_bound(p99, result["ops"], left, waited_ms)
        log(f"(i): {c.kind}: {left:,} of {result['produced']:,} jobs not consumed when the "
            f"run ended; p99 counted as at least {p99:,.0f} ms")
    return {"rate": (result["ops_per_sec"], used / max(1, result["ops"]) * 1e6),
            "p99": (p99, None), "left": (float(left), None)}


def federation_rows(clusters: list[Cluster], runs: int, duration: float, procs: int
                    ) -> list[Row]:
    title = "(i) federation: produce node 1, consume node 2"
    log(f"{title} ...")
    sides = interleaved(title, clusters, runs, ["rate", "p99", "left"],
                        lambda c: federation_run(c, duration, procs))
    for kind, side in sides["left"].items():
        if any(side.values):
            sides["p99"][kind].notes.append(
                f"{kind}: jobs not consumed when the run ended, in {sum(map(bool, side.values))}"
                f" of {len(side.values)} run(s): their wait counts (a lower bound)")
    return [row(title, "/s", sides["rate"], RATE),
            row("    end-to-end p99", "ms", sides["p99"], FEDERATION_P99, show_cpu=False)]


# ---------------------------------------------------------------------------------------------
# (l) and (j)


def big_job_run(c: Cluster) -> dict[str, Reading]:
    body = b"k" * BIG_BODY
    start = time.monotonic()
    # Disque needs several seconds on a busy machine: its ADDJOB may wait a minute.
    reply = command(c.port(0), "ADDJOB", "bench-big", body, "60000", "REPLICATE", "3",
                    timeout=90)
    took = time.monotonic() - start
    if not (isinstance(reply, bytes) and reply.startswith(b"D-")):
        raise BenchError(f"ADDJOB of 40 MB answered {reply!r} after {took:.2f} s")
    command(c.port(0), "FASTACK", reply)
    return {"s": (took, None)}


def info_field(text: bytes | str, name: str) -> int:
    """An integer field of an INFO / CLUSTER INFO reply (0 when absent: Disque has no
    federation section)."""
    if isinstance(text, bytes):
        text = text.decode()
    for line in text.split("\r\n"):
        if line.startswith(name + ":"):
            return int(line.split(":", 1)[1])
    return 0


def idle_rows(clusters: list[Cluster], seconds: float) -> list[Row]:
    """(j): 10 consumers blocked on an empty queue, 5 on node 2 and 5 on node 3 of each
    cluster, all at once, for ``seconds``."""
    def sample(c: Cluster) -> tuple[int, int]:
        sent = needjobs = 0
        for n in c.nodes:
            sent += info_field(command(n.port, "CLUSTER", "INFO"), "cluster_stats_messages_sent")
            needjobs += info_field(command(n.port, "INFO", "federation"), "needjobs_sent")
        return sent, needjobs

    log(f"(j) idle, {seconds:g} s ...")
    consumers: list[socket.socket] = []
    load = load_now()
    try:
        for c in clusters:
            c.flush()
        before = {c.kind: sample(c) for c in clusters}
        for c in clusters:
            for i in range(10):
                s = socket.create_connection(("127.0.0.1", c.port(1 + i % 2)), timeout=5)
                s.sendall(encode_command("GETJOB", "TIMEOUT", "0", "FROM", "idle-queue"))
                consumers.append(s)
        time.sleep(seconds)
        after = {c.kind: sample(c) for c in clusters}
    finally:
        for s in consumers:
            s.close()
    bus: dict[str, Side] = {}
    needjobs: dict[str, Side] = {}
    for c in clusters:
        bus[c.kind] = Side([after[c.kind][0] - before[c.kind][0]], loads=[load])
        needjobs[c.kind] = Side([after[c.kind][1] - before[c.kind][1]], loads=[load])
    if "disque" in needjobs:
        needjobs["disque"] = Side(failure="Disque counts no NEEDJOBS", loads=[load])
    return [row(f"(j) idle {seconds:g} s: NEEDJOBS sent", "", needjobs, show_cpu=False),
            row(f"(j) idle {seconds:g} s: bus messages, 3 nodes", "", bus, show_cpu=False)]


# ---------------------------------------------------------------------------------------------
# (u): tls-cluster against the plaintext bus


def tls_rows(plain: Cluster, runs: int, duration: float) -> list[Row]:
    """(g)'s 50-connection row on a ``tls-cluster yes`` cluster, interleaved with the same
    runs on ``plain``; the TLS cluster runs only for this row."""
    title = "(u) ADDJOB REPLICATE 3, 50 conns, tls-cluster"
    log(f"{title} ...")
    with tempfile.TemporaryDirectory(prefix="trisque-bench-certs-") as directory:
        certs = generate(Path(directory), nodes=3, days=1)
        per_node = [{"tls-cluster": "yes", "tls-cert-file": str(cert),
                     "tls-key-file": str(key), "tls-ca-cert-file": str(certs.ca_cert)}
                    for cert, key in certs.nodes]
        try:
            tls = start_cluster("trisque-tls", None, per_node=per_node)
        except (BenchError, OSError) as exc:
            return [Row(title, "/s", Side(failure=f"the TLS cluster did not start: {exc}"),
                        Side(), TLS_RATE)]
        try:
            timeout = max(60.0, 15 * duration + 30)
            requests: dict[str, int] = {}
            for c in (tls, plain):  # warm-up, sizing the runs to ``duration``
                try:
                    rate = addjob_run(c, 50, 5_000, False, timeout)["rate"][0]
                except (BenchError, OSError) as exc:
                    log(f"{title}: {c.kind}: first run failed: {exc}")
                    rate = 5_000 / duration
                requests[c.kind] = int(min(400_000, max(200, rate * duration)))
            sides = interleaved(title, [tls, plain], runs, ["rate", "p50"], lambda c: addjob_run(
                c, 50, requests[c.kind], False, timeout))
        finally:
            tls.stop()
    return [Row(title, "/s", sides["rate"]["trisque-tls"], sides["rate"]["trisque"],
                TLS_RATE)]


# ---------------------------------------------------------------------------------------------
# The run


ROWS = "ghilju"


def measure(clusters: list[Cluster], opts: argparse.Namespace) -> list[Row]:
    rows = []
    if "g" in opts.rows:
        for clients, asynchronous in ((1, False), (10, False), (50, False), (50, True)):
            rows += addjob_rows(clusters, opts.runs, opts.duration, clients, asynchronous)
    if "h" in opts.rows:
        rows += pipelined_rows(clusters, opts.runs, opts.jobs)
    if "i" in opts.rows:
        rows += federation_rows(clusters, opts.runs, opts.duration, opts.procs)
    if "l" in opts.rows:
        log("(l) 40 MB job ...")
        rows.append(row("(l) 40 MB ADDJOB REPLICATE 3, node 1", "s",
                        interleaved("(l)", clusters, opts.runs, ["s"], big_job_run)["s"],
                        show_cpu=False))
    if opts.idle > 0 and "j" in opts.rows:
        rows += idle_rows(clusters, opts.idle)
    return rows


def _loadavg() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, help="runs per row and cluster (default 3, quick 1)")
    p.add_argument("--duration", type=float, help="seconds per run (default 2, quick 1)")
    p.add_argument("--jobs", type=int, help="(h): jobs pipelined (default 20,000, quick 5,000)")
    p.add_argument("--procs", type=int, default=2,
                   help="(i): load generator processes (default 2)")
    p.add_argument("--disque", metavar="PATH",
                   help=f"the reference disque-server binary (default: ${DISQUE_ENV} if set)")
    p.add_argument("--idle", type=float,
                   help="(j): seconds of idle blocked consumers (default 60, quick 10; 0 skips it)")
    p.add_argument("--quick", action="store_true",
                   help="one run of 1 s per row, 5,000 pipelined jobs, 10 s idle")
    p.add_argument("--no-tls", dest="tls", action="store_false",
                   help="skip (u), the tls-cluster row")
    p.add_argument("--only-tls", action="store_true",
                   help="run (u) alone (the plaintext trisque cluster and the TLS one)")
    p.add_argument("--rows", default=ROWS, metavar="LETTERS",
                   help=f"the rows to run, e.g. --rows i for the federation row alone "
                        f"(default all: {ROWS})")
    p.add_argument("--out", default=str(REPO / "bench-results" / "cluster.json"))
    opts = p.parse_args(argv)
    opts.runs = opts.runs or (1 if opts.quick else 3)
    opts.duration = opts.duration or (1.0 if opts.quick else 2.0)
    opts.jobs = opts.jobs or (5_000 if opts.quick else 20_000)
    if opts.idle is None:
        opts.idle = 10.0 if opts.quick else 60.0
    if opts.runs < 1 or opts.duration <= 0 or opts.jobs < 1 or opts.procs < 1 or opts.idle < 0:
        p.error("--runs, --duration, --jobs and --procs must be positive, --idle at least 0")
    if not opts.rows or set(opts.rows) - set(ROWS):
        p.error(f"--rows takes letters of {ROWS}")
    if opts.only_tls:
        opts.rows = "u"
    opts.tls = opts.tls and "u" in opts.rows
    try:
        disque = disque_binary(opts.disque)
    except ValueError as exc:
        p.error(str(exc))
    load_before = _loadavg()
    started = time.monotonic()
    clusters: list[Cluster] = []
    disque_failure = NO_DISQUE
    try:
        try:
            clusters.append(start_cluster("trisque", None))
        except (BenchError, OSError) as exc:
            print(f"cluster benchmark failed: trisque: {exc}")
            return 1
        if disque and opts.rows != "u":
            try:
                clusters.append(start_cluster("disque", disque))
            except (BenchError, OSError) as exc:
                disque_failure = f"the Disque cluster did not start: {exc}"
                log(disque_failure)
        rows = measure(clusters, opts)
        tls = tls_rows(clusters[0], opts.runs, opts.duration) if opts.tls else []
    finally:
        for c in clusters:
            c.stop()
    for r in rows:
        if r.disque.failure == NO_DISQUE:
            r.disque.failure = disque_failure
    elapsed = time.monotonic() - started
    header = [
        f"# cluster benchmark, {time.strftime('%Y-%m-%d %H:%M %Z')}: 3 trisque nodes against "
        f"3 Disque nodes{'' if disque else ' (none given)'}, {platform.node()} "
        f"({os.cpu_count()} CPUs), loopback",
        f"# medians of {opts.runs} interleaved run(s) of ~{opts.duration:g} s; {BODY}-byte bodies;"
        f" load average (1, 5, 15 min) {load_before} at the start, {_loadavg()} at the end; "
        f"{elapsed:.0f} s",
        "# (g): redis-benchmark on node 1; (h), (i): trisque-benchmark's generator and a raw "
        "socket; bar and goal bound trisque / Disque; CPU: the 3 servers' per job (us)",
    ]
    text = render(rows, header) if rows else "\n".join(header)
    if tls:
        text += "\n\n" + render(tls, ["# (u): the same trisque cluster with and without "
                                      "tls-cluster (mutual TLS on every bus link)"],
                                 columns=("tls", "plain"))
    print(text, flush=True)
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "reference_disque": disque,
        "load_before": load_before, "load_after": _loadavg(), "elapsed_s": round(elapsed, 1),
        "settings": {k: v for k, v in vars(opts).items() if k != "out"},
        "rows": [r.to_json() for r in rows], "tls_rows": [r.to_json() for r in tls],
        "table": text}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
