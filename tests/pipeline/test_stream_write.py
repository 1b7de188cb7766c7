"""The stream writer (``df.writeStream.format("trisque")``, the Arrow flavour): every row of a
streaming DataFrame becomes a job with exactly its body, and a batch replayed after a failure
is written again (at-least-once, as docs/spark.md says)."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from client.blocking import Client

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def _files(directory, batches: list[list[tuple[str, str]]]) -> None:
    directory.mkdir()
    for n, rows in enumerate(batches):
        path = directory / f"part-{n}.json"
        with open(path, "w") as f:
            for body, queue in rows:
                f.write(json.dumps({"body": body, "queue": queue}) + "\n")
        # The file source takes the oldest file first (maxFilesPerTrigger 1): one batch each,
        # in this order.
        os.utime(path, (1_700_000_000 + 10 * n, 1_700_000_000 + 10 * n))


def _drain(c: Client, queue: str) -> list[bytes]:
    bodies: list[bytes] = []
    while jobs := c.get_job(queue, count=500, nohang=True):
        bodies.extend(j.body for j in jobs)
        c.ack_job(*[j.id for j in jobs])
    return bodies


def _query(spark, src, nodes_opt: str, cp: str):
    stream = (spark.readStream.schema("body string, queue string")
              .option("maxFilesPerTrigger", "1").json(str(src)))
    return (stream.writeStream.format("trisque").option("nodes", nodes_opt)
            .option("queue", "sw").option("checkpointLocation", cp)
            .trigger(availableNow=True).start())


def test_stream_writer_rows_arrive_as_written_and_a_replayed_batch_is_written_again(
        spark, nodes_opt, tmp_path) -> None:
    odd = ["é ü 漢字", "line\r\nbreak", "$3\r\nnot a command", "x" * 5000]
    batch0 = [(f"b0-{i}", None) for i in range(50)] + [(b, None) for b in odd]
    # Batch 1: 30 rows for "sw", then one for "held", whose input is paused: the node refuses
    # it, the task fails after the first 30 were added, and the query stops at batch 1.
    batch1 = [(f"b1-{i}", "sw") for i in range(30)] + [("b1-held", "held")]
    batch2 = [(f"b2-{i}", None) for i in range(40)]
    src = tmp_path / "src"
    _files(src, [batch0, batch1, batch2])
    cp = str(tmp_path / "cp")
    with Client([nodes_opt]) as c:
        c.pause("held", "in")
        query = _query(spark, src, nodes_opt, cp)
        with pytest.raises(Exception, match="ADDJOB refused .*PAUSED"):
            query.awaitTermination(240)
        first = Counter(_drain(c, "sw"))
        assert first == Counter(b.encode() for b, _ in batch0 + batch1[:30])

        c.pause("held", "none")
        query = _query(spark, src, nodes_opt, cp)  # restart from the checkpoint
        query.awaitTermination(240)
        assert query.exception() is None
        again = Counter(_drain(c, "sw"))
        held = _drain(c, "held")
    # Batch 1 was replayed whole: its 30 "sw" rows are written a second time (at-least-once:
    # a failed batch's rows that had been added stay); batch 0 was committed and is not.
    assert again == Counter(b.encode() for b, _ in batch1[:30] + batch2)
    assert held == [b"b1-held"]
