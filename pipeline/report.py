"""``trisque-pipeline report --log DIR [--out DIR]``: what the queues did, from the append log.

Per queue: jobs in (distinct IDs with a job record), jobs acked (an ``ack`` record or a last
state of ``acked``), jobs deleted, NACKs and additional deliveries (from each job's last
record), jobs delivered at least once and their wait from creation to first delivery (p50 and
p99 in ms, exact, interpolated: ``dtime - ctime``, where ``dtime`` is the earliest of the job's
last record's ``dtime`` and its ``dlv`` records' times; null when no job of the queue has a
delivery time, e.g. a log written before deliveries were logged), and jobs created per minute
(by ``ctime``). A ``dlv`` record of a job with no job record in the file is ignored. With ``--out`` the per-queue table is written as Parquet.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def build_report(spark: Any, log: str) -> tuple[Any, Any]:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    import pipeline

    pipeline.register(spark)
    events = spark.read.format("trisque-log").option("path", log).load()
    jobs = events.where("event = 'job'")
    last = (jobs.withColumn("n", F.row_number().over(
        Window.partitionBy("file", "id").orderBy(F.col("seq").desc()))).where("n = 1"))
    acks = events.where("event = 'ack'").select("file", "id").distinct() \
        .withColumn("ack_record", F.lit(True))
    dels = events.where("event = 'del'").select("file", "id").distinct() \
        .withColumn("del_record", F.lit(True))
    dlvs = events.where("event = 'dlv'").groupBy("file", "id") \
        .agg(F.min("dtime").alias("dlv_time"))
    per_job = (last.join(acks, ["file", "id"], "left").join(dels, ["file", "id"], "left")
               .join(dlvs, ["file", "id"], "left")
               # least() skips nulls: the record's dtime, a dlv's time, or the earlier of both
               .withColumn("first_dtime", F.least("dtime", "dlv_time"))
               .withColumn("wait_ms",
                           (F.unix_micros("first_dtime") - F.unix_micros("ctime")) / 1000))
    per_queue = per_job.groupBy("queue").agg(
        F.count("*").alias("jobs_in"),
        F.sum(F.when(F.col("ack_record") | (F.col("state") == "acked"), 1).otherwise(0))
        .alias("jobs_acked"),
        F.sum(F.when(F.col("del_record"), 1).otherwise(0)).alias("jobs_deleted"),
        F.sum("nacks").alias("nacks"),
        F.sum(F.greatest(F.col("deliveries") - 1, F.lit(0))).alias("additional_deliveries"),
        F.count("wait_ms").alias("jobs_delivered"),
        F.percentile("wait_ms", 0.5).alias("wait_p50_ms"),
        F.percentile("wait_ms", 0.99).alias("wait_p99_ms"),
    ).orderBy("queue")
    per_minute = (last.groupBy("queue", F.date_trunc("minute", "ctime").alias("minute"))
                  .agg(F.count("*").alias("jobs_created")).orderBy("queue", "minute"))
    return per_queue, per_minute


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trisque-pipeline")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="per-queue report of an append log, with Spark")
    rep.add_argument("--log", required=True, help="append-log file or directory of *.aof")
    rep.add_argument("--out", help="write the per-queue table as Parquet here")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.appName("trisque-report")
             .config("spark.ui.enabled", "false").getOrCreate())
    try:
        per_queue, per_minute = build_report(spark, args.log)
        rows = per_queue.collect()
        print(f"{'queue':<24} {'in':>10} {'acked':>10} {'deleted':>8} {'nacks':>8} "
              f"{'redeliv':>8} {'delivered':>10} {'wait p50 ms':>12} {'wait p99 ms':>12}")
        for r in rows:
            print(f"{r.queue:<24} {r.jobs_in:>10} {r.jobs_acked:>10} {r.jobs_deleted:>8} "
                  f"{r.nacks:>8} {r.additional_deliveries:>8} {r.jobs_delivered:>10} "
                  f"{_ms(r.wait_p50_ms):>12} {_ms(r.wait_p99_ms):>12}")
        print("(wait: from creation to first delivery; n/a: no delivery time in the log)")
        print("\njobs created per minute")
        for r in per_minute.collect():
            print(f"{r.queue:<24} {r.minute:%Y-%m-%d %H:%M} {r.jobs_created:>10}")
        if args.out:
            per_queue.write.mode("overwrite").parquet(args.out)
            print(f"\nper-queue table written to {args.out}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
