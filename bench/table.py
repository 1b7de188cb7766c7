"""``make bench``: trisque-server next to the reference Disque and redis-server, in one run.

Starts its own servers on free loopback ports, each in a temporary directory with the log off
unless the case says otherwise: trisque-server; the reference Disque when a binary is given
(``TRISQUE_BENCH_DISQUE=/path/to/disque-server`` or ``--disque``, built from
https://github.com/antirez/disque); redis-server, the yardstick, always. 50 connections and
16-byte bodies throughout:

  (a) ADDJOB, no pipeline                       Disque: ADDJOB        redis: LPUSH
  (b) ADDJOB, pipeline 16                       Disque: ADDJOB        redis: LPUSH
  (c) GETJOB NOHANG on a preloaded queue        Disque: GETJOB NOHANG redis: RPOP
      (as many jobs as requests: every request takes one)
  (d) resident memory per queued job, RSS growth over 200,000 ADDJOBs (redis: LPUSH); (d2)
      the same with the bodies in the append log (appendonly yes, body-memory-max 8): what
      a job costs without its body, against the same Disque figure
  (e) ADDJOB with appendonly yes, appendfsync always: against Disque and redis-server with
      the same settings, and (e1) against trisque without the log
  (m) RSS growth per million jobs processed (ADDJOB, GETJOB, ACKJOB) with an empty queue:
      what finished jobs leave behind (``bench/memory.py``); against Disque only
  (t) ADDJOB over TLS (tls-port, mutual TLS, redis-benchmark --tls) against plaintext on the
      same node, interleaved

Then, after the table: (k) the HTTP API next to RESP (``bench/http.py``), (p) ``trisque
--pipe`` next to ``redis-cli --pipe`` into the same node (``bench/pipe.py``) and (f) the
Spark data source (``python -m bench.spark``). ``python -m bench.cluster`` has the
cluster rows (g)-(j) and (l), against Disque's own three-node cluster.

Each throughput case first gives every server one short unmeasured run (warm-up, and the rate
that sizes its runs to ``--duration``), then runs every server ``--runs`` times, interleaved,
the order rotating from run to run; the table has the medians, and the machine's 1-minute load
average at the start of the runs of each row (the machine is shared: read ratios, not absolute
numbers).

Load generators: the server shares the machine's cores with the generator that drives it.
redis-benchmark (C, one thread) needs the least CPU per request, so it takes the least from
whichever server it drives, and it drives Disque, redis and trisque alike: it is the primary
generator, and its ratios are the ones judged (PASS/MISS against the targets).
trisque-benchmark (Python, 2 processes) needs about a core of its own at these rates, so what
it measures depends on how much CPU it leaves each server (a fast server is held back by it
without pipelining, a pipelined one less): its figures are printed under each row for
comparison, never judged. redis-benchmark counts error replies as requests, so after each of
its runs the queue's length is checked (QLEN, LLEN): a run whose jobs are not all there, or
not all taken, fails instead of counting.

Results also go to ``bench-results/latest.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import trio

from bench.report import (
    DISQUE_TARGETS,
    REDIS_TARGETS,
    Figures,
    Row,
    Sample,
    parse_redis_benchmark_csv,
    render,
)
from bench.servers import (
    DISQUE_ENV,
    REPO,
    BenchServer,
    DisqueServer,
    command,
    disque_binary,
)
from cli.bench import run_benchmark
from cli.bench_load import BenchError, Spec, preload
from cli.certs import CertSet, generate
from client.tls import TlsOptions
from tests.support.server import free_port

BODY = 16
QUEUE = "rbq"
CASES = "a,b,c,d,e,m,t,k,p,f"
C_GENERATOR = "redis-benchmark"
PY_GENERATOR = "trisque-benchmark"


@dataclass
class Settings:
    runs: int = 5
    duration: float = 2.0
    alt_runs: int = 3  # trisque-benchmark runs per server and case (0: none)
    procs: int = 2  # trisque-benchmark client processes
    max_requests: int = 500_000  # per redis-benchmark run, preloaded jobs included
    memory_jobs: int = 200_000
    churn_jobs: int = 1_000_000


_STARTED = time.monotonic()


def log(msg: str) -> None:
    """Progress, on stderr: seconds since the start, then the message."""
    print(f"[{time.monotonic() - _STARTED:4.0f} s] {msg}", file=sys.stderr, flush=True)


def load_now() -> float:
    return os.getloadavg()[0]


# ---------------------------------------------------------------------------------------------
# Contenders: one server in one case


class TlsPort:
    """Case (t): a trisque node's tls-port and the files its clients present."""

    def __init__(self, port: int, certs: CertSet) -> None:
        assert certs.client is not None
        self.port = port
        self.options = TlsOptions(cacert=str(certs.ca_cert), cert=str(certs.client[0]),
                                  key=str(certs.client[1]), check_hostname=False)

    def c_args(self) -> list[str]:
        o = self.options
        return ["--tls", "--cacert", str(o.cacert), "--cert", str(o.cert), "--key", str(o.key)]


class Contender:
    """One server in one throughput case: the command each generator sends it, the runs it
    did (``primary`` with redis-benchmark, ``alt`` with trisque-benchmark) and the number of
    requests that makes one of its redis-benchmark runs last about ``duration``. With
    ``tls`` the generators connect to the node's tls-port."""

    def __init__(self, server: BenchServer, pipeline: int = 1, consume: bool = False,
                 name: str | None = None, tls: TlsPort | None = None) -> None:
        self.server = server
        self.name = name or server.label
        self.pipeline = pipeline
        self.consume = consume
        self.tls = tls
        self.port = tls.port if tls else server.port
        self.is_redis = server.kind == "redis"
        self.primary = Figures(failure=server.failure)
        self.alt = Figures(failure=server.failure)
        self.requests = 0

    def c_args(self) -> list[str]:
        if self.consume:
            return ["RPOP", QUEUE] if self.is_redis else ["GETJOB", "NOHANG", "FROM", QUEUE]
        return ["LPUSH", QUEUE, "x" * BODY] if self.is_redis else ["ADDJOB", QUEUE, "x" * BODY, "0"]

    def queue_length(self) -> int:
        reply = command(self.server.port, "LLEN" if self.is_redis else "QLEN", QUEUE)
        if not isinstance(reply, int):
            raise BenchError(f"{self.name}: queue length query answered {reply!r}")
        return reply

    def fill(self, jobs: int) -> None:
        loaded = bounded_preload(self.server.port, QUEUE, jobs, self.is_redis)
        if loaded != jobs:
            raise BenchError(f"{self.name}: preloaded {loaded} of {jobs} jobs")

    def c_run(self, requests: int, timeout: float) -> Sample:
        """One redis-benchmark run of ``requests`` requests, checked against the queue."""
        self.server.flush()
        if self.consume:
            self.fill(requests)
        load = load_now()
        sample = redis_benchmark(self.port, self.c_args(), requests, self.pipeline, timeout,
                                 tls=self.tls.c_args() if self.tls else [])
        left = self.queue_length()
        want = 0 if self.consume else requests
        if left != want:
            raise BenchError(f"{left} jobs in the queue after {requests} requests, expected "
                             f"{want}: not every reply was a job")
        sample.load = load
        return sample

    def py_run(self, s: Settings) -> Sample:
        """One trisque-benchmark run of ``duration`` (a consume run on a preloaded queue)."""
        self.server.flush()
        workload = {(False, False): "produce", (False, True): "consume",
                    (True, False): "lpush", (True, True): "rpop"}[(self.is_redis, self.consume)]
        jobs = max(self.requests, 2_000) if self.consume else 50_000_000
        spec = Spec(workload=workload, nodes=[("127.0.0.1", self.port)], clients=50,
                    pipeline=self.pipeline, body_size=BODY, jobs=jobs, duration=s.duration,
                    queues=[QUEUE], ack="none", producers=25,
                    tls=self.tls.options if self.tls else None)
        load = load_now()
        result = run_benchmark(spec, procs=s.procs, preload_jobs=jobs if self.consume else None)
        if result["errors"]:
            raise BenchError(f"{result['errors']} error replies, first: {result['first_error']}")
        lat = result["latency_ms"]
        return Sample(float(result["ops_per_sec"]), lat["p50"], lat["p99"], load)


def bounded_preload(port: int, queue: str, jobs: int, is_redis: bool) -> int:
    """Fill a queue with ``jobs`` jobs (ADDJOB, or LPUSH on redis) before a run, unmeasured;
    a server that stops answering fails it after a minute plus 1 ms a job, not never."""
    async def go() -> int:
        with trio.fail_after(60.0 + jobs / 1000):
            return await preload([("127.0.0.1", port)], [queue], jobs, BODY, is_redis, None)

    try:
        return trio.run(go)
    except trio.TooSlowError:
        raise BenchError(f"preloading {jobs:,} jobs did not finish in time") from None


def redis_benchmark(port: int, args: list[str], requests: int, pipeline: int,
                    timeout: float, clients: int = 50, tls: list[str] | None = None) -> Sample:
    exe = shutil.which("redis-benchmark")
    if exe is None:
        raise BenchError("redis-benchmark is not installed")
    argv = [exe, "-h", "127.0.0.1", "-p", str(port), "-c", str(clients), "-n", str(requests),
            "-P", str(pipeline), *(tls or []), "--csv", *args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise BenchError(f"redis-benchmark did not finish within {timeout:.0f} s") from None
    sample = parse_redis_benchmark_csv(done.stdout)
    if sample is None:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise BenchError(f"redis-benchmark exited with {done.returncode}: {last}")
    return sample


def throughput_case(title: str, contenders: list[Contender], s: Settings, c_gen: bool) -> None:
    """Size, then run every contender ``s.runs`` times with the primary generator and
    ``s.alt_runs`` times with the other, interleaved; the figures land in the contenders."""
    timeout = max(60.0, 15 * s.duration + 30)
    live = [c for c in contenders if c.server.ok]
    for c in live:
        # The unmeasured run: warms the server up and gives the rate that sizes the others.
        probe = 5_000 if c.pipeline == 1 else 40_000
        try:
            if c_gen:
                rate = c.c_run(probe, timeout).ops_per_sec
            else:
                c.requests = probe
                rate = c.py_run(Settings(**{**s.__dict__, "duration": min(1.0, s.duration)})
                                ).ops_per_sec
        except (BenchError, OSError) as exc:
            c.primary.failure = c.alt.failure = f"first run: {exc}"
            log(f"  {title}: {c.name}: first run failed: {exc}")
            continue
        requests = int(min(s.max_requests, max(2_000, rate * s.duration)))
        # A whole number of pipelines: redis-benchmark sends its last pipeline whole, so
        # another count would put more jobs in the queue than it reports.
        c.requests = -(-requests // c.pipeline) * c.pipeline
        log(f"  {title}: {c.name}: warm-up {rate:,.0f} ops/s, runs of {c.requests:,} requests")
    live = [c for c in live if c.primary.failure is None]
    phases = [(C_GENERATOR if c_gen else PY_GENERATOR, s.runs, "primary")]
    if c_gen and s.alt_runs:
        phases.append((PY_GENERATOR, s.alt_runs, "alt"))
    for gen, runs, slot in phases:
        for i in range(runs):
            for j in range(len(live)):
                c = live[(i + j) % len(live)]  # rotate the order from run to run
                figures: Figures = getattr(c, slot)
                if figures.failure is not None:
                    continue
                try:
                    sample = (c.c_run(c.requests, timeout) if gen == C_GENERATOR
                              else c.py_run(s))
                except (BenchError, OSError) as exc:
                    # Its other runs with this generator are skipped: a server that failed
                    # once (error replies, a timeout) would only make the table wait.
                    figures.failure = str(exc)
                    log(f"  {title}: {c.name}: {gen} run {i + 1}/{runs} failed: {exc}; "
                        "its other runs are skipped")
                    continue
                figures.samples.append(sample)
                log(f"  {title}: {c.name}: {gen} run {i + 1}/{runs}: "
                    f"{sample.ops_per_sec:,.0f} ops/s (load {sample.load:.2f})")


# ---------------------------------------------------------------------------------------------
# The memory case


# (d2): every 16-byte body goes to the log; the log is on so that it can hold them.
ON_DISK_SETTINGS: Final = {"appendonly": "yes", "body-memory-max": "8"}


def memory_case(kinds: list[tuple[str, str, str | None]], jobs: int) -> dict[str, Figures]:
    """(d): RSS growth per job over ``jobs`` ADDJOBs (LPUSHes) on a fresh server of each
    ``(name, kind, Disque binary)``; the name "trisque-disk" runs with ``ON_DISK_SETTINGS``."""
    out: dict[str, Figures] = {}
    for name, kind, binary in kinds:
        settings = ON_DISK_SETTINGS if name == "trisque-disk" else {}
        server = (DisqueServer(binary, "disque (memory)") if binary
                  else BenchServer(kind, f"{name} (memory)", **settings))
        figures = out[name] = Figures()
        with server:
            if not server.ok:
                figures.failure = server.failure
                continue
            time.sleep(0.3)
            before = server.rss()
            load = load_now()
            try:
                loaded = bounded_preload(server.port, "memq", jobs, kind == "redis")
            except (BenchError, OSError) as exc:
                figures.failure = str(exc)
                continue
            time.sleep(0.3)
            after = server.rss()
            per_job = (after - before) / max(1, loaded)
            figures.samples.append(Sample(per_job, load=load))
            log(f"  (d) memory: {name}: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB "
                f"for {loaded:,} jobs = {per_job:.0f} B/job")
    return out


# ---------------------------------------------------------------------------------------------
# The run


def run_table(s: Settings, disque: str | None, only: set[str], c_gen: bool
              ) -> tuple[list[Row], list[Row]]:
    """Every case asked for; the rows against Disque and the rows against redis-server."""
    vs_disque: list[Row] = []
    vs_redis: list[Row] = []
    alt = c_gen and s.alt_runs > 0

    def add(key: str, title_d: str, title_r: str, by_kind: dict[str, Contender]) -> None:
        t, r, d = by_kind["trisque"], by_kind["redis"], by_kind.get("disque")
        if d is not None:
            vs_disque.append(Row(key, title_d, t.primary, d.primary, t.alt if alt else None,
                                 d.alt if alt else None, target=DISQUE_TARGETS[key]))
        vs_redis.append(Row(key, title_r, t.primary, r.primary, t.alt if alt else None,
                            r.alt if alt else None, target=REDIS_TARGETS[key]))

    def servers(suffix: str = "", **settings: str) -> list[BenchServer]:
        kinds: list[BenchServer] = [BenchServer("trisque", "trisque" + suffix, **settings)]
        if disque:
            kinds.append(DisqueServer(disque, "disque" + suffix, **settings))
        kinds.append(BenchServer("redis", "redis" + suffix, **settings))
        return kinds

    plain = servers()
    try:
        for server in plain:
            server.start()
            log(f"{server.label}: " + (f"port {server.port}" if server.ok
                                       else f"n/a: {server.failure}"))
        for key, pipeline, consume, d_title, r_title in (
                ("a", 1, False, "(a) ADDJOB, 50 conn, no pipeline",
                 "(a) ADDJOB vs LPUSH, 50 conn"),
                ("b", 16, False, "(b) ADDJOB, 50 conn, pipeline 16",
                 "(b) ADDJOB vs LPUSH, 50 conn, pipeline 16"),
                ("c", 1, True, "(c) GETJOB NOHANG, preloaded, 50 conn",
                 "(c) GETJOB NOHANG vs RPOP, 50 conn")):
            if key not in only:
                continue
            log(f"{d_title} ...")
            by_kind = {srv.kind: Contender(srv, pipeline, consume) for srv in plain}
            throughput_case(f"({key})", list(by_kind.values()), s, c_gen)
            add(key, d_title, r_title, by_kind)
        if "e" in only:
            log("(e) ADDJOB, appendfsync always ...")
            always = servers(" always", appendonly="yes", appendfsync="always")
            try:
                for server in always:
                    server.start()
                by_kind = {srv.kind: Contender(srv) for srv in always}
                no_log = Contender(plain[0], name="trisque (no log)")
                throughput_case("(e)", [*by_kind.values(), no_log], s, c_gen)
            finally:
                for server in always:
                    server.stop()
            t, r, d = by_kind["trisque"], by_kind["redis"], by_kind.get("disque")
            if d is not None:
                vs_disque.append(Row("e", "(e) ADDJOB, appendfsync always, 50 conn", t.primary,
                                     d.primary, t.alt if alt else None, d.alt if alt else None,
                                     target=DISQUE_TARGETS["e"]))
            vs_redis.append(Row("e1", "(e1) ADDJOB always vs trisque without log", t.primary,
                                no_log.primary, t.alt if alt else None,
                                no_log.alt if alt else None, target=REDIS_TARGETS["e1"]))
            vs_redis.append(Row("e2", "(e2) ADDJOB always vs LPUSH always", t.primary,
                                r.primary, t.alt if alt else None, r.alt if alt else None,
                                target=REDIS_TARGETS["e2"]))
    finally:
        for server in plain:
            server.stop()
    if "d" in only:
        log(f"(d) memory per queued job, {s.memory_jobs:,} jobs ...")
        kinds: list[tuple[str, str, str | None]] = [
            ("trisque", "trisque", None), ("trisque-disk", "trisque", None),
            ("redis", "redis", None)]
        if disque:
            kinds.insert(2, ("disque", "disque", disque))
        mem = memory_case(kinds, s.memory_jobs)
        title = f"(d) RSS per queued {BODY}-byte job"
        if disque:
            vs_disque.append(Row("d", title, mem["trisque"], mem["disque"], unit="B/job",
                                 target=DISQUE_TARGETS["d"]))
            vs_disque.append(Row("d2", "(d2) the same, trisque's bodies in the log",
                                 mem["trisque-disk"], mem["disque"], unit="B/job",
                                 target=DISQUE_TARGETS["d"]))
        vs_redis.append(Row("d", title, mem["trisque"], mem["redis"], unit="B/job",
                            target=REDIS_TARGETS["d"], absolute=True))
    if "m" in only:
        from bench.memory import churn_case

        log(f"(m) RSS growth over {s.churn_jobs:,} jobs through an empty queue ...")
        churn_kinds: list[tuple[str, str | None]] = [("trisque", None)]
        if disque:
            churn_kinds.append(("disque", disque))
        churned = churn_case(churn_kinds, s.churn_jobs, log)
        ref = churned.get("disque") or Figures(failure="no reference Disque in this run")
        vs_disque.append(Row("m", "(m) RSS growth per million jobs, empty queue",
                             churned["trisque"], ref, unit="B", target=DISQUE_TARGETS["m"],
                             absolute=True))
    if "t" in only:
        vs_redis.append(tls_case(s, c_gen, alt))
    order = "abcdemt"
    vs_disque.sort(key=lambda r: order.index(r.key[0]))
    vs_redis.sort(key=lambda r: (order.index(r.key[0]), r.key))
    return vs_disque, vs_redis


def tls_case(s: Settings, c_gen: bool, alt: bool) -> Row:
    """(t): ADDJOB over TLS against plaintext, on one node with both ports (mutual TLS, the
    certificates of ``trisque certs``), the two interleaved run by run."""
    log("(t) ADDJOB over TLS vs plaintext, same node ...")
    with tempfile.TemporaryDirectory(prefix="trisque-bench-certs-") as tmp:
        certs = generate(Path(tmp), nodes=1, days=1)
        cert, key = certs.nodes[0]
        tls_port = free_port()
        server = BenchServer("trisque", "trisque tls", **{
            "tls-port": str(tls_port), "tls-cert-file": str(cert), "tls-key-file": str(key),
            "tls-ca-cert-file": str(certs.ca_cert)})
        over_tls = Contender(server, name="trisque over TLS", tls=TlsPort(tls_port, certs))
        plaintext = Contender(server, name="trisque plaintext")
        with server:
            if not server.ok:
                over_tls.primary.failure = plaintext.primary.failure = server.failure
            else:
                throughput_case("(t)", [over_tls, plaintext], s, c_gen)
    return Row("t", "(t) ADDJOB over TLS vs plaintext, same node, 50 conn", over_tls.primary,
               plaintext.primary, over_tls.alt if alt else None,
               plaintext.alt if alt else None, target=REDIS_TARGETS["t"])


def _loadavg() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def table(s: Settings, disque: str | None, only: set[str], c_gen: bool, out: Path) -> None:
    """Run the table's cases, print the table, write it with every run to ``out`` (JSON)."""
    primary = C_GENERATOR if c_gen else PY_GENERATOR
    secondary = PY_GENERATOR if c_gen and s.alt_runs else None
    started = time.monotonic()
    load_before = _loadavg()
    log(f"make bench: reference {'Disque ' + disque if disque else 'redis-server only'}; "
        f"{s.runs} run(s) of {s.duration:g} s per server and case; load average {load_before}")
    vs_disque, vs_redis = run_table(s, disque, only, c_gen)
    elapsed = time.monotonic() - started
    header = [
        f"trisque vs {'the reference Disque and ' if disque else ''}redis-server on this machine "
        f"({os.cpu_count()} CPUs, {platform.platform(terse=True)}), same run; "
        f"{BODY}-byte bodies, 50 connections",
        f"medians of {s.runs} interleaved run(s) of ~{s.duration:g} s per server; load average "
        f"(1, 5, 15 min) {load_before} at the start, {_loadavg()} at the end; {elapsed:.0f} s",
        f"primary load generator: {primary}"
        + (" (C, one thread: it takes the least CPU from the server it shares the cores "
           "with); its ratios are judged" if c_gen else
           " (redis-benchmark is not installed: install it for the honest ratios)"),
    ]
    if secondary:
        header.append(f"'{secondary} driving both' lines: the Python generator ({s.procs} "
                      "processes, about a core of its own), for comparison only")
    if not disque:
        header.append(f"no reference Disque: set {DISQUE_ENV}=/path/to/disque-server for "
                      "the targets")
    sections = [("against the reference Disque (targets)", "Disque", vs_disque),
                ("against redis-server, the yardstick (targets of the first make bench)",
                 "redis", vs_redis)]
    footer = []
    if "d" in only:
        footer.append("(d): RSS growth of the server process / jobs queued; against Disque the "
                      "target is the ratio, against redis trisque's own bytes. (d2): the "
                      "same with trisque's bodies in the append log (body-memory-max 8): "
                      "the job without its body.")
    if "e" in only:
        footer.append("(e1): trisque with appendfsync always against the same binary without "
                      "the log.")
    if "t" in only:
        footer.append("(t): trisque over TLS (tls-port, mutual TLS) against the same node's "
                      "plaintext port; its target is the ratio.")
    if "m" in only:
        footer.append("(m): RSS after the jobs minus RSS after a warm-up, per million jobs "
                      "(bytes; 0: nothing left behind); its target bounds trisque's own value.")
    text = render(sections, header, primary, secondary, footer)
    print(text, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpus": os.cpu_count(), "load_before": load_before, "load_after": _loadavg()},
        "reference_disque": disque, "primary_generator": primary,
        "secondary_generator": secondary, "settings": s.__dict__,
        "elapsed_s": round(elapsed, 1),
        "vs_disque": [r.to_json() for r in vs_disque],
        "vs_redis": [r.to_json() for r in vs_redis],
        "table": text,
    }, indent=2, default=str))
    print(f"results written to {out}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.table", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--disque", metavar="PATH",
                   help=f"the reference disque-server binary (default: ${DISQUE_ENV} if set; "
                   "without one the table is against redis-server only)")
    p.add_argument("--quick", action="store_true",
                   help="for iteration: 1 run of 1 s per case, no trisque-benchmark lines, "
                   "(d) at 100,000 jobs, quick extras (a few minutes)")
    p.add_argument("--runs", type=int, help="redis-benchmark runs per server and case "
                   "(default 5, quick 1)")
    p.add_argument("--duration", type=float, help="seconds per run (default 2, quick 1)")
    p.add_argument("--alt-runs", type=int, help="trisque-benchmark runs per server and case, "
                   "printed for comparison (default 3, quick 0)")
    p.add_argument("--procs", type=int, default=2, help="trisque-benchmark client processes "
                   "(default 2)")
    p.add_argument("--only", default=CASES, help=f"comma-separated cases (default {CASES})")
    p.add_argument("--out", default=str(REPO / "bench-results" / "latest.json"))
    opts = p.parse_args(argv)
    s = Settings(runs=opts.runs or (1 if opts.quick else 5),
                 duration=opts.duration or (1.0 if opts.quick else 2.0),
                 alt_runs=(0 if opts.quick else 3) if opts.alt_runs is None else opts.alt_runs,
                 procs=opts.procs, memory_jobs=100_000 if opts.quick else 200_000,
                 churn_jobs=200_000 if opts.quick else 1_000_000)
    if s.runs < 1 or s.duration <= 0 or s.alt_runs < 0 or s.procs < 1:
        p.error("--runs, --duration and --procs must be positive, --alt-runs at least 0")
    only = {c.strip() for c in opts.only.split(",") if c.strip()}
    unknown = only - set(CASES.split(","))
    if unknown:
        p.error(f"unknown case(s) {','.join(sorted(unknown))}; the cases are {CASES}")
    try:
        disque = disque_binary(opts.disque)
    except ValueError as exc:
        p.error(str(exc))
    c_gen = shutil.which(C_GENERATOR) is not None
    if only & set("abcdemt"):
        table(s, disque, only, c_gen, Path(opts.out))
    if "k" in only:
        http_case(s, opts.quick)
    if "p" in only:
        pipe_case(s, opts.quick)
    if "f" in only:
        spark_case(opts.quick)
    return 0


def http_case(s: Settings, quick: bool) -> None:
    """(k): the HTTP API next to RESP, 16 clients each (bench/http.py)."""
    from bench import http

    log("(k) HTTP API ...")
    res = http.run(runs=1 if quick else min(s.runs, 3), duration=s.duration, procs=s.procs,
                   preload_jobs=40_000 if quick else 80_000)
    print("\n" + http.render(res), flush=True)
    out = REPO / "bench-results" / "http.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))


def pipe_case(s: Settings, quick: bool) -> None:
    """(p): trisque --pipe against redis-cli --pipe, 100,000 ADDJOB (bench/pipe.py)."""
    from bench import pipe

    log("(p) --pipe ...")
    try:
        res = pipe.run(runs=1 if quick else s.runs)
    except BenchError as exc:
        print(f"\n(p) --pipe: n/a: {exc}", flush=True)
        return
    print("\n" + pipe.render(res), flush=True)
    out = REPO / "bench-results" / "pipe.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))


def spark_case(quick: bool) -> None:
    """(f): bench.spark in a process of its own (it starts its node and a JVM)."""
    import importlib.util

    print("\n(f) Spark data source (python -m bench.spark)", flush=True)
    if importlib.util.find_spec("pyspark") is None or shutil.which("java") is None:
        print("n/a: the spark extra or Java 17 is not installed", flush=True)
        return
    argv = [sys.executable, "-m", "bench.spark"]
    if quick:
        argv += ["--jobs", "200000", "--runs", "1", "--stream-jobs", "50000"]
    out = REPO / "bench-results" / "spark.json"
    try:
        done = subprocess.run(argv + ["--json", str(out)], cwd=REPO, timeout=3600)
    except subprocess.TimeoutExpired:
        print("n/a: bench.spark did not finish within an hour", flush=True)
        return
    if done.returncode:
        print(f"n/a: bench.spark exited with {done.returncode}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
