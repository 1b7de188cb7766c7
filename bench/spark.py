"""``python -m bench.spark [--jobs N] [--runs R]``: the data source's speed against the node's own.

On one fresh node (append log off, the node's default), in one run, each case ``--runs`` times
interleaved (the order rotates from run to run) and the medians reported, because the machine
is shared and noisy:

* ``trisque-benchmark`` pipelined ADDJOB, the issue's reference: one client process, 50
  connections, 100 commands per write, 16-byte bodies, the same bytes for every command;
* ``trisque-benchmark`` pipelined ADDJOB shaped like the data source: 2 connections, 1,000
  commands per write (like with like: two write tasks, ``batchsize`` 1000);
* the bulk load of N 16-byte jobs through ``df.write.format("trisque")``: local[2], a cached
  DataFrame of 2 partitions, so two write tasks, each one connection; timed around ``save()``,
  so it includes Spark's planning, the JVM reading the cache, the Arrow transfer to the
  Python workers and the encoding. The session's first Python data source write starts the
  Python workers (about 4 s here, once per session): a 10-row write does that first, untimed,
  and its time is printed.

Then, once, the stream consumption rate at maxJobsPerBatch 10,000 (AvailableNow into a no-op
sink, jobs acked on commit) over ``--stream-jobs`` jobs loaded through the data source. The
queue is flushed (DEBUG FLUSHALL) between cases. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from client.blocking import Client
from tests.support.server import free_port

TARGET = 0.8


def log(msg: str) -> None:
    print(f"[bench.spark {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        one, five, fifteen = os.getloadavg()
        return f"load average: {one:.2f}, {five:.2f}, {fifteen:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.spark", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1_000_000, help="jobs per run (default 1,000,000)")
    p.add_argument("--runs", type=int, default=3, help="interleaved runs per case (default 3)")
    p.add_argument("--stream-jobs", type=int, default=200_000,
                   help="jobs consumed by the stream case (default 200,000; 0 skips it)")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Spark's Python workers must import this checkout's pipeline/, client/ and protocol/.
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [here] + [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x])

    from pyspark.sql import SparkSession

    import pipeline

    load_before = uptime()
    log(f"start: {load_before}")
    server, port, server_dir = _start_node()
    try:
        node = f"127.0.0.1:{port}"
        spark = (SparkSession.builder.master("local[2]").appName("trisque-bench")
                 .config("spark.ui.enabled", "false")
                 .config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.driver.host", "127.0.0.1")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        pipeline.register(spark)
        # 16-byte bodies, like trisque-benchmark's default.
        df = spark.range(args.jobs, numPartitions=2).selectExpr(
            "concat('job-', lpad(cast(id as string), 12, '0')) as body").cache()
        df.count()
        # The session's first Python data source job starts Spark's Python workers (seconds,
        # once per session; they are reused after): done here, untimed, and reported.
        t0 = time.perf_counter()
        spark.range(10).selectExpr("cast(id as string) as body").write.format("trisque") \
            .option("nodes", node).option("queue", "warmup").mode("append").save()
        warmup_s = time.perf_counter() - t0
        log(f"warm-up write of 10 rows (starts the Python workers): {warmup_s:.1f} s")
        _flush(node)

        def ref(clients: int, pipe: int) -> float:
            out = subprocess.run(
                [sys.executable, "-m", "cli.bench", "produce", "-p", str(port), "-c", str(clients),
                 "-P", str(pipe), "-n", str(args.jobs), "--json", "--quiet"],
                check=True, capture_output=True, text=True, timeout=900).stdout
            return float(json.loads(out)["ops_per_sec"])

        def data_source() -> float:
            with _Progress(node, "bench", args.jobs):
                t0 = time.perf_counter()
                df.write.format("trisque").option("nodes", node).option("queue", "bench") \
                    .mode("append").save()
                elapsed = time.perf_counter() - t0
            with Client([node]) as c:
                got = c.qlen("bench")
            if got != args.jobs:
                raise RuntimeError(f"data source loaded {got} jobs, expected {args.jobs}")
            return got / elapsed

        cases: dict[str, Any] = {
            "addjob_50x100": lambda: ref(50, 100),
            "addjob_2x1000": lambda: ref(2, 1000),
            "data_source": data_source,
        }
        results: dict[str, list[float]] = {k: [] for k in cases}
        names = list(cases)
        for run in range(args.runs):
            order = names[run % len(names):] + names[:run % len(names)]
            for name in order:
                log(f"run {run + 1}/{args.runs}: {name}, {args.jobs:,} jobs ...")
                rate = cases[name]()
                results[name].append(rate)
                log(f"run {run + 1}/{args.runs}: {name} {rate:,.0f} jobs/s")
                _flush(node)

        stream_rate = None
        if args.stream_jobs:
            log(f"stream consume: loading {args.stream_jobs:,} jobs ...")
            spark.range(args.stream_jobs, numPartitions=2).selectExpr(
                "concat('job-', lpad(cast(id as string), 12, '0')) as body") \
                .write.format("trisque").option("nodes", node).option("queue", "bench") \
                .mode("append").save()
            with tempfile.TemporaryDirectory() as cp:
                t0 = time.perf_counter()
                q = (spark.readStream.format("trisque").option("nodes", node)
                     .option("queue", "bench").option("maxJobsPerBatch", "10000").load()
                     .writeStream.format("noop").option("checkpointLocation", cp)
                     .trigger(availableNow=True).start())
                q.awaitTermination(900)
                stream_rate = args.stream_jobs / (time.perf_counter() - t0)
            with Client([node]) as c:
                left = c.qlen("bench")
            if left:
                raise RuntimeError(f"stream left {left} jobs queued")
        spark.stop()
    finally:
        server.terminate()
        server.wait(60)
        shutil.rmtree(server_dir, ignore_errors=True)
    load_after = uptime()

    med = {k: statistics.median(v) for k, v in results.items()}
    ds = med["data_source"]
    lines = [
        f"jobs per run: {args.jobs:,}; runs: {args.runs}, interleaved, medians (all runs in jobs/s)",
        f"load before: {load_before}",
        f"load after:  {load_after}",
        f"trisque-benchmark ADDJOB, 1 process, 50 conn x pipeline 100: {med['addjob_50x100']:10,.0f} "
        f"jobs/s  {_runs(results['addjob_50x100'])}",
        f"trisque-benchmark ADDJOB, 1 process,  2 conn x pipeline 1000: {med['addjob_2x1000']:10,.0f} "
        f"jobs/s  {_runs(results['addjob_2x1000'])}",
        f"data source bulk load, local[2], 2 tasks x 1 conn, batch 1000: {ds:10,.0f} "
        f"jobs/s  {_runs(results['data_source'])}",
        f"  ratio to 50 conn x 100 (the issue's target >= {TARGET}x): "
        f"{ds / med['addjob_50x100']:.2f}x"
        f"{'' if ds / med['addjob_50x100'] >= TARGET else '  (TARGET MISSED)'}",
        f"  ratio to  2 conn x 1000 (like with like):            {ds / med['addjob_2x1000']:.2f}x",
        f"  (not timed: the session's first data source write, 10 rows, {warmup_s:.1f} s: it "
        f"starts Spark's Python workers)",
    ]
    if stream_rate is not None:
        lines.append(f"stream consume, maxJobsPerBatch 10,000, {args.stream_jobs:,} jobs: "
                     f"{stream_rate:10,.0f} jobs/s")
    print("\n".join(lines), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"jobs": args.jobs, "runs": results, "medians": med,
                       "stream_jobs_per_s": stream_rate, "warmup_s": warmup_s, "load_before": load_before,
                       "load_after": load_after}, f, indent=2)
    return 0


def _runs(values: list[float]) -> str:
    return "(" + ", ".join(f"{v:,.0f}" for v in values) + ")"


def _flush(node: str) -> None:
    with Client([node], socket_timeout=300) as c:
        c.execute("DEBUG", "FLUSHALL")


class _Progress:
    """Prints QLEN of the queue being loaded every 5 s (a 1,000,000-job load is long)."""

    def __init__(self, node: str, queue: str, total: int) -> None:
        self.node, self.queue, self.total = node, queue, total
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Progress:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    def _run(self) -> None:
        with Client([self.node]) as c:
            while not self.done.wait(5.0):
                log(f"  loaded {c.qlen(self.queue):,} / {self.total:,}")


def _start_node() -> tuple[subprocess.Popen[bytes], int, str]:
    """A fresh trisque-server on a free loopback port, its data in a temporary directory."""
    port = free_port()  # its bus port, port + 10000, must be free (and valid) too
    directory = tempfile.mkdtemp(prefix="trisque-pipeline-bench-")
    proc = subprocess.Popen([sys.executable, "-m", "cli.server", "--port", str(port),
                             "--bind", "127.0.0.1", "--dir", directory],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with Client([f"127.0.0.1:{port}"]) as c:
                c.ping()
            return proc, port, directory
        except OSError:
            time.sleep(0.1)
    proc.kill()
    shutil.rmtree(directory, ignore_errors=True)
    raise RuntimeError(f"trisque-server on 127.0.0.1:{port} did not start")


if __name__ == "__main__":
    sys.exit(main())
