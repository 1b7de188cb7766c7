"""Writing DataFrames into queues: the Arrow batch writer and its streaming flavour.

Each write task opens one client on a node chosen from HELLO (by partition id, so tasks spread
over the cluster), turns each Arrow record batch into ADDJOB commands and sends them
``batchsize`` at a time in one pipelined round trip. A job refused by the node (an error reply)
is retried once on another node when the cluster has one; otherwise it fails the task.

Rows with a null body or a body over ``maxBodyBytes`` are counted in the commit message and not
sent (``onBadRow=count``, the default) or fail the task (``onBadRow=fail``). The driver's commit
logs the totals. Writes are not transactional: the jobs a task added before it failed stay in
their queues, and a retried task adds its rows again (see docs/spark.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from pipeline.options import WriteOptions
from protocol import client_commands as cmd
from protocol.client import Client, ResponseError

log = logging.getLogger("pipeline.writer")


@dataclass
class WriteCounts(WriterCommitMessage):
    added: int = 0
    null_bodies: int = 0
    oversized: int = 0
    retried: int = 0
    node: str = ""


class BadRowError(ValueError):
    pass


def _column(batch: Any, name: str) -> list[Any] | None:
    idx = batch.schema.get_field_index(name)
    return None if idx < 0 else batch.column(idx).to_pylist()


def write_batches(opts: WriteOptions, batches: Iterator[Any], client: Client) -> WriteCounts:
    counts = WriteCounts(node=f"{client.address[0]}:{client.address[1]}" if client.address else "")
    pending: list[Any] = []

    def flush() -> None:
        if not pending:
            return
        replies = client.run_many(pending, raise_on_error=False)
        failed = [call for call, reply in zip(pending, replies, strict=True) if isinstance(reply, Exception)]
        counts.added += len(pending) - len(failed)
        pending.clear()
        if failed:
            _retry_elsewhere(opts, failed, replies, counts)

    for batch in batches:
        bodies = _column(batch, "body")
        if bodies is None:
            raise BadRowError("the DataFrame written to trisque needs a 'body' column")
        queues, delays, retries, ttls, repls = (
            _column(batch, c) for c in ("queue", "delay", "retry", "ttl", "replicate"))
        for i, body in enumerate(bodies):
            if body is None:
                counts.null_bodies += 1
                if opts.on_bad_row == "fail":
                    raise BadRowError("row with a null body (onBadRow=fail)")
                continue
            if isinstance(body, str):
                body = body.encode()
            if len(body) > opts.max_body_bytes:
                counts.oversized += 1
                if opts.on_bad_row == "fail":
                    raise BadRowError(f"row with a body of {len(body)} bytes, over "
                                      f"maxBodyBytes={opts.max_body_bytes} (onBadRow=fail)")
                continue
            queue = (queues[i] if queues else None) or opts.queue
            if not queue:
                raise BadRowError("row without a queue: give a 'queue' column or option 'queue'")
            pending.append(cmd.add_job(
                queue, body,
                replicate=_pick(repls, i, opts.replicate), delay=_pick(delays, i, opts.delay),
                retry=_pick(retries, i, opts.retry), ttl=_pick(ttls, i, opts.ttl),
                async_=opts.async_, timeout_ms=opts.timeout_ms))
            if len(pending) >= opts.batchsize:
                flush()
    flush()
    return counts


def _pick(column: list[Any] | None, i: int, default: int | None) -> int | None:
    value = column[i] if column else None
    return default if value is None else int(value)


def _retry_elsewhere(opts: WriteOptions, failed: list[Any], replies: list[Any],
                     counts: WriteCounts) -> None:
    from pipeline.connect import cluster_nodes, open_client

    first_error = next(r for r in replies if isinstance(r, Exception))
    others = [n for n in cluster_nodes(opts.common) if n != counts.node]
    if not others:
        raise ResponseError(f"ADDJOB refused by {counts.node}: {first_error}")
    client = open_client(opts.common, others)
    try:
        client.run_many(failed, raise_on_error=True)
    finally:
        client.close()
    counts.added += len(failed)
    counts.retried += len(failed)


def _task_id() -> int:
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return ctx.partitionId() if ctx else 0
    except Exception:  # noqa: BLE001 - outside a task (direct use): node 0
        return 0


def _run_task(opts: WriteOptions, iterator: Iterator[Any]) -> WriteCounts:
    from pipeline.connect import client_for_task

    client = client_for_task(opts.common, _task_id())
    try:
        return write_batches(opts, iterator, client)
    finally:
        client.close()


def _log_totals(kind: str, messages: list[WriterCommitMessage | None]) -> WriteCounts:
    total = WriteCounts()
    for m in messages:
        if isinstance(m, WriteCounts):
            total.added += m.added
            total.null_bodies += m.null_bodies
            total.oversized += m.oversized
            total.retried += m.retried
    log.warning("trisque %s committed: %d jobs added, %d null bodies and %d oversized bodies "
                "skipped, %d retried on another node", kind, total.added, total.null_bodies,
                total.oversized, total.retried)
    return total


class TrisqueArrowWriter(DataSourceArrowWriter):
    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts
        self.totals: WriteCounts | None = None

    def write(self, iterator: Iterator[Any]) -> WriteCounts:
        return _run_task(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.totals = _log_totals("write", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        total = _log_totals("write (aborted)", messages)
        log.error("trisque write aborted; %d jobs from successful tasks stay queued", total.added)


class TrisqueStreamWriter(DataSourceStreamArrowWriter):
    """Each micro-batch's rows become jobs; a replayed batch adds them again (at-least-once)."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> WriteCounts:
        return _run_task(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        _log_totals(f"stream batch {batchId}", messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        _log_totals(f"stream batch {batchId} (aborted)", messages)
