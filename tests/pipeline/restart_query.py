"""Run by test_stream.py in a process of its own: a NEW Spark application (its own driver
process, JVM and SparkSession, nothing shared with the test's session but the checkpoint
directory and the node) restarts a trisque stream query from a checkpoint.

``python tests/pipeline/restart_query.py NODES QUEUE PER_BATCH CHECKPOINT OUT RUNS``: runs the
AvailableNow query RUNS times in that session (the same foreachBatch Parquet sink as the
test's) and prints, as the last line of stdout, a JSON list per run of the batches it saw, each
the sorted job IDs.
"""

from __future__ import annotations

import json
import os
import sys


def main(nodes: str, queue: str, per_batch: str, checkpoint: str, out: str, runs: str) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import pipeline

    spark = (SparkSession.builder.master("local[2]").appName("trisque-restart")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    pipeline.register(spark)
    seen: list[list[list[str]]] = []
    try:
        for _ in range(int(runs)):
            batches: list[list[str]] = []
            seen.append(batches)

            def sink(df, batch_id, batches=batches):  # noqa: ANN001
                batches.append(sorted(r.id for r in df.collect()))
                df.write.mode("append").parquet(out)

            query = (spark.readStream.format("trisque").option("nodes", nodes)
                     .option("queue", queue).option("maxJobsPerBatch", per_batch).load()
                     .writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
                     .trigger(availableNow=True).start())
            if not query.awaitTermination(240):
                query.stop()
                raise SystemExit("the restarted query did not finish within 240 s")
            if query.exception() is not None:
                raise SystemExit(f"the restarted query failed: {query.exception()}")
    finally:
        spark.stop()
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
