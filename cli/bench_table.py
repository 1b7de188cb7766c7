"""``make bench``: trisque-server and redis-server side by side, in the same run.

Starts its own servers on free loopback ports (temporary directories), then measures:

  (a) 50 connections, no pipeline:   ADDJOB  vs LPUSH
  (b) 50 connections, pipeline 16:   ADDJOB  vs LPUSH
  (c) GETJOB NOHANG, preloaded queue vs RPOP
  (d) resident memory per queued small job at 200,000 jobs (redis LPUSH of the same bodies for
      reference)
  (e) durability: ADDJOB with appendfsync always vs the same server without the log, and vs
      redis-server LPUSH with appendfsync always
  (f) the Spark data source (issue 11): ``python -m pipeline.bench`` in its own process, bulk
      load of 1,000,000 jobs vs trisque-benchmark's pipelined ADDJOB on the same node, and the
      stream consumption rate; printed after the table (skipped without the spark extra)
  (h) the HTTP API (issue 13): produce and consume with 16 concurrent HTTP clients next to RESP
      ADDJOB / GETJOB with 16 connections on the same node in the same run (cli/bench_http.py);
      printed after the table, also in ``bench-results/http.json``

Each throughput case runs several short times, trisque and redis interleaved, and the medians
are reported: the machine is shared and noisy. The primary figures come from our load generator
(``trisque-benchmark``) driving both servers; ``redis-benchmark`` (C) driving both servers is
shown under each row for transparency, because a Python load generator can be the bottleneck
against redis-server without pipelining. Results also go to ``bench-results/latest.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from cli.bench import run_benchmark
from cli.bench_load import BenchError, Spec, preload
from cli.bench_servers import REPO, BenchServer

BODY = 16
MEMORY_JOBS = 200_000


@dataclass
class Settings:
    runs: int = 5
    duration: float = 2.0
    preload: int = 60_000
    procs: int = 2
    redis_benchmark: bool = True


TARGETS = {
    "a": (">=", 0.30), "b": (">=", 0.50), "c": (">=", 0.30), "d": ("<=", 600.0),
    "e_vs_noaof": (">=", 0.50), "e_vs_redis": (">=", 0.35),
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


# ---------------------------------------------------------------------------------------------
# One measurement


def ours(server: BenchServer, workload: str, s: Settings, *, clients: int = 50, pipeline: int = 1,
         queue: str = "bench", jobs: int = 50_000_000, preload_jobs: int | None = None,
         ack: str = "none") -> dict[str, Any]:
    spec = Spec(workload=workload, nodes=[("127.0.0.1", server.port)], clients=clients,
                pipeline=pipeline, body_size=BODY, jobs=jobs, duration=s.duration,
                queues=[queue], ack=ack, producers=clients // 2)
    result = run_benchmark(spec, procs=s.procs, preload_jobs=preload_jobs)
    if result["errors"]:
        raise BenchError(f"{server.label}: {result['errors']} error replies, first: "
                         f"{result['first_error']}")
    return result


def redis_benchmark(server: BenchServer, args: Sequence[str], n: int, *, clients: int = 50,
                    pipeline: int = 1, timeout: float = 60.0) -> float | None:
    """requests/s that redis-benchmark reports for one command, or None if it could not run."""
    exe = shutil.which("redis-benchmark")
    if not exe:
        return None
    argv = [exe, "-h", "127.0.0.1", "-p", str(server.port), "-c", str(clients), "-n", str(n),
            "-P", str(pipeline), "-q", *args]
    try:
        out = subprocess.run(argv, capture_output=True, timeout=timeout, text=True,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None
    rates = re.findall(r"([\d.]+) requests per second", out.stdout)
    return float(rates[-1]) if rates else None


@dataclass
class Row:
    key: str
    title: str
    trisque: float | str | None = None  # median ops/s (or bytes/job), or "n/a: why"
    redis: float | str | None = None
    trisque_rb: float | None = None  # redis-benchmark driving trisque
    redis_rb: float | None = None
    unit: str = "ops/s"
    detail: dict[str, Any] | None = None

    def ratio(self) -> float | None:
        if isinstance(self.trisque, float) and isinstance(self.redis, float) and self.redis:
            return self.trisque / self.redis
        return None

    def rb_ratio(self) -> float | None:
        if self.trisque_rb and self.redis_rb:
            return self.trisque_rb / self.redis_rb
        return None


Side = tuple[BenchServer, Callable[[int], dict[str, Any]], Callable[[int], float | None] | None]


def interleave(sides: Sequence[Side], s: Settings, title: str) -> tuple[list[list[dict[str, Any]]],
                                                                         list[list[float]]]:
    """Run every side ``s.runs`` times, round robin, then the same with redis-benchmark."""
    ours_res: list[list[dict[str, Any]]] = [[] for _ in sides]
    rb_res: list[list[float]] = [[] for _ in sides]
    for i in range(s.runs):
        for (server, run, _), out in zip(sides, ours_res, strict=True):
            if not server.ok:
                continue
            server.flush()
            try:
                out.append(run(i))
            except (BenchError, OSError) as exc:
                log(f"  {title}: {server.label} run {i + 1}: {exc}")
                continue
            log(f"  {title}: {server.label} run {i + 1}: {out[-1]['ops_per_sec']:,.0f} ops/s")
    if not s.redis_benchmark:
        return ours_res, rb_res
    for _ in range(s.runs):
        for (server, _, rb), base, out in zip(sides, ours_res, rb_res, strict=True):
            if rb is None or not server.ok or not base:
                continue
            server.flush()
            # Size each redis-benchmark run to about the same duration as ours.
            rate = _median([r["ops_per_sec"] for r in base]) or 10_000.0
            got = rb(max(2_000, int(rate * s.duration)))
            if got is not None:
                out.append(got)
                log(f"  {title}: redis-benchmark -> {server.label}: {got:,.0f} ops/s")
    return ours_res, rb_res


def fill(row: Row, t: BenchServer, r: BenchServer, t_res: list[dict[str, Any]],
         r_res: list[dict[str, Any]], t_rb: list[float], r_rb: list[float]) -> Row:
    row.trisque = _summ(t_res) if t.ok else f"n/a: {t.failure}"
    row.redis = _summ(r_res) if r.ok else f"n/a: {r.failure}"
    row.trisque_rb = _median(t_rb)
    row.redis_rb = _median(r_rb)
    row.detail = {"trisque_runs": [_brief(x) for x in t_res], "reference_runs": [_brief(x) for x in r_res],
                  "redis_benchmark": {"trisque": t_rb, "reference": r_rb}}
    return row


def throughput_case(key: str, title: str, trisque: BenchServer, redis: BenchServer, s: Settings,
                    t_run: Callable[[int], dict[str, Any]], r_run: Callable[[int], dict[str, Any]],
                    t_rb: Callable[[int], float | None] | None,
                    r_rb: Callable[[int], float | None] | None) -> Row:
    """Interleave trisque and redis runs; the row holds the medians."""
    (t_res, r_res), (t_rbr, r_rbr) = interleave([(trisque, t_run, t_rb), (redis, r_run, r_rb)], s,
                                                title)
    return fill(Row(key, title), trisque, redis, t_res, r_res, t_rbr, r_rbr)


def _summ(results: Sequence[dict[str, Any]]) -> float | str:
    if not results:
        return "n/a: every run failed"
    return float(statistics.median(r["ops_per_sec"] for r in results))


def _brief(r: dict[str, Any]) -> dict[str, Any]:
    lat = r["latency_ms"]
    return {"ops_per_sec": r["ops_per_sec"], "ops": r["ops"], "elapsed_s": r["elapsed_s"],
            "p50_ms": lat["p50"], "p99_ms": lat["p99"], "p999_ms": lat["p999"], "max_ms": lat["max"]}


# ---------------------------------------------------------------------------------------------
# The cases


def warm_up(trisque: BenchServer, redis: BenchServer, s: Settings) -> None:
    """A short unmeasured run on each server: the first seconds of a fresh Python process
    (imports, allocator and dict growth) should not land in the first measured run."""
    quick = Settings(runs=1, duration=min(1.0, s.duration), procs=s.procs)
    for server, workload in ((trisque, "produce"), (redis, "lpush")):
        if server.ok:
            try:
                ours(server, workload, quick, queue="warmup", jobs=50_000)
            except (BenchError, OSError) as exc:
                log(f"  warm-up on {server.label}: {exc}")
            server.flush()


def produce_case(key: str, title: str, trisque: BenchServer, redis: BenchServer, s: Settings,
                 pipeline: int) -> Row:
    addjob = ["ADDJOB", "rbq", "x" * BODY, "0"]
    lpush = ["LPUSH", "rbq", "x" * BODY]
    return throughput_case(
        key, title, trisque, redis, s,
        lambda i: ours(trisque, "produce", s, pipeline=pipeline, queue=f"bq{i}"),
        lambda i: ours(redis, "lpush", s, pipeline=pipeline, queue=f"bq{i}"),
        lambda n: redis_benchmark(trisque, addjob, n, pipeline=pipeline),
        lambda n: redis_benchmark(redis, lpush, n, pipeline=pipeline),
    )


def consume_case(trisque: BenchServer, redis: BenchServer, s: Settings) -> Row:
    def rb(server: BenchServer, args: list[str], is_redis: bool) -> Callable[[int], float | None]:
        def run(n: int) -> float | None:
            n = min(n, s.preload)
            trio.run(preload, [("127.0.0.1", server.port)], ["rbq"], n, BODY, is_redis, None)
            return redis_benchmark(server, args, n)
        return run

    # GETJOB NOHANG alone is compared with RPOP alone: no acknowledgement in this row.
    return throughput_case(
        "c", "(c) GETJOB NOHANG vs RPOP, 50 conn", trisque, redis, s,
        lambda i: ours(trisque, "consume", s, queue=f"cq{i}", jobs=s.preload),
        lambda i: ours(redis, "rpop", s, queue=f"cq{i}", jobs=s.preload),
        rb(trisque, ["GETJOB", "NOHANG", "FROM", "rbq"], False),
        rb(redis, ["RPOP", "rbq"], True),
    )


def memory_case(s: Settings) -> Row:
    row = Row("d", f"(d) RSS per queued {BODY}-byte job at {MEMORY_JOBS:,} jobs", unit="B/job")
    detail: dict[str, Any] = {}
    for kind, attr in (("trisque", "trisque"), ("redis", "redis")):
        with BenchServer(kind, f"{kind} (memory)") as server:
            if not server.ok:
                setattr(row, attr, f"n/a: {server.failure}")
                continue
            time.sleep(0.3)
            before = server.rss()
            try:
                loaded = trio.run(preload, [("127.0.0.1", server.port)], ["memq"], MEMORY_JOBS, BODY,
                                  kind == "redis", None)
            except (BenchError, OSError) as exc:
                setattr(row, attr, f"n/a: {exc}")
                continue
            time.sleep(0.3)
            after = server.rss()
            per_job = (after - before) / max(1, loaded)
            setattr(row, attr, per_job)
            detail[kind] = {"rss_before": before, "rss_after": after, "jobs": loaded,
                            "bytes_per_job": round(per_job, 1)}
            log(f"  memory: {kind}: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB "
                f"for {loaded} jobs = {per_job:.0f} B/job")
    row.detail = detail
    return row


def durability_case(trisque: BenchServer, s: Settings) -> tuple[Row, Row]:
    """ADDJOB with appendfsync always vs without the log, and vs redis LPUSH with always."""
    aof = BenchServer("trisque", "trisque aof-always", appendonly="yes", appendfsync="always")
    raof = BenchServer("redis", "redis aof-always", appendonly="yes", appendfsync="always")
    title = "(e) aof always"
    try:
        aof.start()
        if aof.ok:
            state = aof.config("appendonly")
            if state != "yes":
                aof.failure = f"server reports appendonly={state!r} after --appendonly yes"
        raof.start()
        addjob = ["ADDJOB", "rbq", "x" * BODY, "0"]
        (a_res, n_res, r_res), (a_rb, n_rb, r_rb) = interleave([
            (aof, lambda i: ours(aof, "produce", s, queue=f"aq{i}"),
             lambda n: redis_benchmark(aof, addjob, n)),
            (trisque, lambda i: ours(trisque, "produce", s, queue=f"nq{i}"),
             lambda n: redis_benchmark(trisque, addjob, n)),
            (raof, lambda i: ours(raof, "lpush", s, queue=f"aq{i}"),
             lambda n: redis_benchmark(raof, ["LPUSH", "rbq", "x" * BODY], n)),
        ], s, title)
    finally:
        aof.stop()
        raof.stop()
    vs_noaof = fill(Row("e_vs_noaof", "(e1) ADDJOB aof always vs no aof, 50 conn"),
                    aof, trisque, a_res, n_res, a_rb, n_rb)
    vs_redis = fill(Row("e_vs_redis", "(e2) ADDJOB aof always vs LPUSH aof always"),
                    aof, raof, a_res, r_res, a_rb, r_rb)
    return vs_noaof, vs_redis


# ---------------------------------------------------------------------------------------------
# Output


def _fmt(v: float | str | None, unit: str, notes: list[str] | None = None) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        if notes is None:
            return v
        if v not in notes:
            notes.append(v)
        return f"n/a [{notes.index(v) + 1}]"
    return f"{v:,.0f}" if unit == "ops/s" else f"{v:,.0f} B"


def _ratio_text(ratio: float | None) -> str:
    return f"{ratio:.3f}x" if ratio is not None else "-"


def _verdict(key: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    op, bound = TARGETS[key]
    ok = value >= bound if op == ">=" else value <= bound
    return "ok" if ok else "MISSED"


def _lat(row: Row, side: str) -> str:
    runs = (row.detail or {}).get(side) or []
    if not runs:
        return "-"
    p50 = statistics.median(r["p50_ms"] for r in runs)
    p99 = statistics.median(r["p99_ms"] for r in runs)
    return f"{p50:.2f}/{p99:.2f}"


def render(rows: Sequence[Row], s: Settings) -> str:
    w = 46
    notes: list[str] = []
    out = [
        f"trisque vs reference on this machine, median of {s.runs} run(s) of ~{s.duration:g} s "
        f"each, interleaved; {BODY}-byte bodies, 50 connections",
        f"primary load generator: trisque-benchmark (Python/trio, {s.procs} client processes); "
        "'redis-benchmark' lines: the C generator driving both servers",
        "",
        f"{'case':<{w}} {'trisque':>10} {'reference':>10} {'ratio':>7}  {'target':>8}  {'verdict':<7}"
        f"  latency p50/p99 ms (trisque | ref)",
        "-" * (w + 86),
    ]
    for row in rows:
        if row.key == "d":
            value = row.trisque if isinstance(row.trisque, float) else None
            out.append(f"{row.title:<{w}} {_fmt(row.trisque, row.unit, notes):>10} "
                       f"{_fmt(row.redis, row.unit, notes):>10} {'':>7}  "
                       f"{'<= 600 B':>8}  {_verdict('d', value):<7}")
            continue
        op, bound = TARGETS[row.key]
        ratio = row.ratio()
        out.append(f"{row.title:<{w}} {_fmt(row.trisque, row.unit, notes):>10} "
                   f"{_fmt(row.redis, row.unit, notes):>10} {_ratio_text(ratio):>7}  "
                   f"{op + format(bound, '.2f') + 'x':>8}  {_verdict(row.key, ratio):<7}  "
                   f"{_lat(row, 'trisque_runs')} | {_lat(row, 'reference_runs')}")
        if row.trisque_rb is not None or row.redis_rb is not None:
            out.append(f"{'   redis-benchmark driving both':<{w}} {_fmt(row.trisque_rb, 'ops/s'):>10} "
                       f"{_fmt(row.redis_rb, 'ops/s'):>10} {_ratio_text(row.rb_ratio()):>7}  "
                       f"{'':>8}  {_verdict(row.key, row.rb_ratio()):<7}")
    out += [
        "",
        "reference column: redis-server (LPUSH/RPOP; (e2) with appendfsync always), except (e1) where",
        "it is trisque without the append log. (d): RSS growth of the server process / jobs loaded.",
    ]
    out += [f"[{i + 1}] {note}" for i, note in enumerate(notes)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_table", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one short run per case (~1 minute)")
    p.add_argument("--runs", type=int, help="runs per case (default 5, quick 1)")
    p.add_argument("--duration", type=float, help="seconds per run (default 2, quick 1)")
    p.add_argument("--procs", type=int, default=2, help="client processes (default 2)")
    p.add_argument("--no-redis-benchmark", action="store_true", help="skip the C generator lines")
    p.add_argument("--only", help="comma-separated cases to run, e.g. a,b,d")
    p.add_argument("--out", default=str(REPO / "bench-results" / "latest.json"))
    opts = p.parse_args(argv)
    s = Settings(runs=opts.runs or (1 if opts.quick else 5),
                 duration=opts.duration or (1.0 if opts.quick else 2.0),
                 preload=30_000 if opts.quick else 60_000, procs=opts.procs,
                 redis_benchmark=not opts.no_redis_benchmark)
    only = set((opts.only or "a,b,c,d,e,f,h").split(","))
    started = time.monotonic()
    rows: list[Row] = []
    with BenchServer("trisque", "trisque") as trisque, BenchServer("redis", "redis") as redis:
        for server in (trisque, redis):
            log(f"{server.label}: " + (f"port {server.port}" if server.ok else f"n/a: {server.failure}"))
        warm_up(trisque, redis, s)
        if "a" in only:
            rows.append(produce_case("a", "(a) ADDJOB vs LPUSH, 50 conn, no pipeline", trisque, redis,
                                     s, 1))
        if "b" in only:
            rows.append(produce_case("b", "(b) ADDJOB vs LPUSH, 50 conn, pipeline 16", trisque, redis,
                                     s, 16))
        if "c" in only:
            rows.append(consume_case(trisque, redis, s))
        if "e" in only:
            rows.extend(durability_case(trisque, s))
    if "d" in only:
        rows.append(memory_case(s))
    rows.sort(key=lambda r: r.key)
    table = render(rows, s)
    print(table)
    elapsed = time.monotonic() - started
    print(f"\n(took {elapsed:.0f} s)")
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpus": _cpus()},
        "settings": s.__dict__,
        "elapsed_s": round(elapsed, 1),
        "rows": [{**r.__dict__, "ratio": r.ratio(), "redis_benchmark_ratio": r.rb_ratio(),
                  "target": TARGETS.get(r.key)} for r in rows],
        "table": table,
    }, indent=2, default=str))
    print(f"results written to {out}")
    if "h" in only:
        http_case(s)
    if "f" in only:
        spark_case(opts.quick)
    return 0


def http_case(s: Settings) -> None:
    """(h): the HTTP API next to RESP, 16 clients each (cli/bench_http.py)."""
    from cli import bench_http

    res = bench_http.run(runs=min(s.runs, 3), duration=s.duration, procs=s.procs,
                         preload_jobs=s.preload)
    print("\n" + bench_http.render(res), flush=True)
    out = REPO / "bench-results" / "http.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))


def spark_case(quick: bool) -> None:
    """(f): pipeline.bench in a process of its own (it starts its node and a JVM)."""
    import importlib.util

    print("\n(f) Spark data source (python -m pipeline.bench)", flush=True)
    if importlib.util.find_spec("pyspark") is None or shutil.which("java") is None:
        print("n/a: the spark extra or Java 17 is not installed", flush=True)
        return
    argv = [sys.executable, "-m", "pipeline.bench"]
    if quick:
        argv += ["--jobs", "200000", "--runs", "1", "--stream-jobs", "50000"]
    out = REPO / "bench-results" / "spark.json"
    done = subprocess.run(argv + ["--json", str(out)], cwd=REPO, timeout=3600)
    if done.returncode:
        print(f"n/a: pipeline.bench exited with {done.returncode}", flush=True)


def _cpus() -> int | None:
    import os

    return os.cpu_count()


if __name__ == "__main__":
    sys.exit(main())
