"""``python -m pipeline.bench [--jobs N]``: the data source's speed against the node's own.

On one fresh node, in one run: the pipelined ADDJOB rate ``trisque-benchmark`` measures
(produce, 50 clients, pipeline 100, 16-byte bodies), the bulk load rate of N small jobs through
``df.write.format("trisque")`` (local[2], two write tasks), and the stream consumption rate at
maxJobsPerBatch 10,000 (AvailableNow into a no-op sink, jobs acked on commit).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from protocol.client import Client


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pipeline.bench")
    p.add_argument("--jobs", type=int, default=1_000_000)
    args = p.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from pyspark.sql import SparkSession

    import pipeline

    server, port = _start_node()
    try:
        node = f"127.0.0.1:{port}"
        out = subprocess.run(
            [sys.executable, "-m", "cli.bench", "produce", "-p", str(port), "-c", "50",
             "-P", "100", "-n", str(args.jobs), "--json", "--quiet"],
            check=True, capture_output=True, text=True).stdout
        addjob_rate = float(json.loads(out)["ops_per_sec"])
        with Client([node]) as c:
            c.execute("DEBUG", "FLUSHALL")

        spark = (SparkSession.builder.master("local[2]").appName("trisque-bench")
                 .config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        pipeline.register(spark)
        df = spark.range(args.jobs, numPartitions=2).selectExpr(
            "concat('job-body-', cast(id as string)) as body").cache()
        df.count()
        t0 = time.perf_counter()
        df.write.format("trisque").option("nodes", node).option("queue", "bench") \
            .mode("append").save()
        load_rate = args.jobs / (time.perf_counter() - t0)

        with tempfile.TemporaryDirectory() as cp:
            t0 = time.perf_counter()
            q = (spark.readStream.format("trisque").option("nodes", node).option("queue", "bench")
                 .option("maxJobsPerBatch", "10000").load().writeStream.format("noop")
                 .option("checkpointLocation", cp).trigger(availableNow=True).start())
            q.awaitTermination()
            stream_rate = args.jobs / (time.perf_counter() - t0)
        spark.stop()
        load = os.getloadavg()
        print(f"jobs: {args.jobs}  load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        print(f"trisque-benchmark pipelined ADDJOB: {addjob_rate:12,.0f} jobs/s")
        print(f"data source bulk load:              {load_rate:12,.0f} jobs/s "
              f"({load_rate / addjob_rate:.2f}x, target >= 0.8x)")
        print(f"stream consume, 10,000 per batch:   {stream_rate:12,.0f} jobs/s")
    finally:
        server.terminate()
        server.wait(30)
    return 0


def _start_node() -> tuple[subprocess.Popen[bytes], int]:
    """A fresh trisque-server on a free loopback port, its data in a temporary directory.
    (pipeline may not import cli, so this is not cli.bench_servers.)"""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    directory = tempfile.mkdtemp(prefix="trisque-pipeline-bench-")
    proc = subprocess.Popen([sys.executable, "-m", "cli.server", "--port", str(port),
                             "--bind", "127.0.0.1", "--dir", directory],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with Client([f"127.0.0.1:{port}"]) as c:
                c.ping()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"trisque-server on 127.0.0.1:{port} did not start")


if __name__ == "__main__":
    sys.exit(main())
