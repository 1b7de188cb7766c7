"""The vectorised ADDJOB encoder and the streaming sender, against the row-by-row reference."""

from __future__ import annotations

import pyarrow as pa
import pytest

from client import commands as cmd
from client.blocking import Client, ResponseError
from pipeline.encode import encode_batch
from pipeline.options import write_options
from pipeline.writer import write_batches

pytestmark = [pytest.mark.spark, pytest.mark.timeout(120)]


def test_batch_payload_is_the_addjob_calls_bytes() -> None:
    opts = write_options({"nodes": "127.0.0.1:1", "queue": "dflt", "retry": "5", "delay": "7",
                          "ttl": "3600", "async": "true", "timeout": "250"})
    batch = pa.RecordBatch.from_pydict({
        "body": ["a", "bb", None, "ccc", "é" * 3],
        "queue": ["x", "", None, "y", None],
        "delay": [1, None, 2, 3, None],
        "replicate": [1, 1, 1, 1, 1],
    })
    enc = encode_batch(batch, opts)
    assert enc is not None and enc.null_bodies == 1 and len(enc) == 4
    rows = [("x", "a", 1), ("dflt", "bb", 7), ("y", "ccc", 3), ("dflt", "é" * 3, 7)]
    calls = [cmd.add_job(q, b, replicate=1, delay=d, retry=5, ttl=3600, async_=True,
                         timeout_ms=250).payload for q, b, d in rows]
    assert bytes(enc.payload(0, 4)) == b"".join(calls)
    assert bytes(enc.payload(1, 3)) == b"".join(calls[1:3])


def test_rows_needing_different_arguments_are_left_to_the_row_path() -> None:
    opts = write_options({"nodes": "127.0.0.1:1", "queue": "q"})  # no default delay
    batch = pa.RecordBatch.from_pydict({"body": ["a", "b"], "delay": [5, None]})
    assert encode_batch(batch, opts) is None


def test_streamed_write_and_row_path_reach_the_node(node, nodes_opt) -> None:
    opts = write_options({"nodes": nodes_opt, "queue": "q", "batchsize": "300"})
    batches = [pa.RecordBatch.from_pydict({"body": [f"b{i}" for i in range(k, k + 1000)]})
               for k in range(0, 5000, 1000)]
    batches.append(pa.RecordBatch.from_pydict({"body": ["late"], "delay": [None],
                                               "queue": ["r"]}))
    with Client([nodes_opt]) as c:
        counts = write_batches(opts, iter(batches), c)
        assert counts.added == 5001
        assert (c.qlen("q"), c.qlen("r")) == (5000, 1)
        first = c.get_job("q", count=3)
        assert [j.body for j in first] == [b"b0", b"b1", b"b2"]


def test_a_refused_write_with_no_other_node_fails_naming_the_node(node, nodes_opt) -> None:
    with Client([nodes_opt]) as c:
        c.pause("p", "in")
        batch = pa.RecordBatch.from_pydict({"body": ["x", "y"]})
        with pytest.raises(ResponseError, match=f"ADDJOB refused by {nodes_opt}: PAUSED"):
            write_batches(write_options({"nodes": nodes_opt, "queue": "p"}), iter([batch]), c)
