"""Writing DataFrames into queues: the Arrow batch writer and its streaming flavour.

Each write task opens one client on a node chosen from HELLO (by partition id, so tasks spread
over the cluster) and streams ADDJOBs on one connection: each Arrow record batch becomes one
column of complete commands (``pipeline.encode``, no Python object per row), sent ``batchsize``
commands ahead of the replies, which are counted as they arrive (every ADDJOB reply is one line)
while the next commands are written. A job refused by the node (an error reply) is retried once
on another node when the cluster has one; otherwise it fails the task. Batches whose rows need
different argument lists (a per-row option column with nulls and no default) go row by row.

Rows with a null body or a body over ``maxBodyBytes`` are counted in the commit message and not
sent (``onBadRow=count``, the default) or fail the task (``onBadRow=fail``). The driver's commit
logs the totals. Writes are not transactional: the jobs a task added before it failed stay in
their queues, and a retried task adds its rows again (see docs/spark.md).
"""

from __future__ import annotations

import logging
import select
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from client import commands as cmd
from client.blocking import Client, ResponseError
from pipeline.encode import BadRowError, Encoded, encode_batch, filter_bad_rows
from pipeline.options import WriteOptions

log = logging.getLogger("pipeline.writer")


@dataclass
class WriteCounts(WriterCommitMessage):
    added: int = 0
    null_bodies: int = 0
    oversized: int = 0
    retried: int = 0
    node: str = ""


class _LineCounter:
    """Counts the replies of pipelined ADDJOBs without parsing them one by one: every ADDJOB
    reply is one line (``+<id>`` or ``-<error>``), so ``bytes.count`` in C does it. Error lines
    are rare; their command indexes (counting from 0 in send order) and texts are kept."""

    def __init__(self) -> None:
        self.received = 0
        self.errors: list[tuple[int, str]] = []
        self._carry = b""

    def feed(self, data: bytes) -> None:
        buf = self._carry + data if self._carry else data
        end = buf.rfind(b"\r\n")
        if end < 0:
            self._carry = buf
            return
        complete, self._carry = buf[: end + 2], buf[end + 2:]
        if complete[:1] == b"-" or b"\n-" in complete:
            for i, line in enumerate(complete.split(b"\r\n")[:-1]):
                if line[:1] == b"-":
                    self.errors.append((self.received + i, line[1:].decode("utf-8", "replace")))
                elif line[:1] != b"+":
                    raise ResponseError(f"unexpected reply to ADDJOB: {line[:60]!r}")
        self.received += complete.count(b"\r\n")


def _stream_commands(conn: Any, encoded: Iterator[Encoded], window: int,
                     timeout: float) -> tuple[_LineCounter, list[Encoded]]:
    """Send every command of ``encoded`` on ``conn`` while reading the replies: at most
    ``window`` commands are sent ahead of the replies read, and the socket is read whenever it
    cannot take more (so neither side can block the other however big the window)."""
    sock = conn.sock
    sock.settimeout(0)
    counter = _LineCounter()
    sent = 0
    done: list[Encoded] = []

    def wait(for_write: bool) -> None:
        readable, writable, _ = select.select([sock], [sock] if for_write else [], [], timeout)
        if not readable and not writable:
            raise TimeoutError(f"no reply from the node within {timeout} s")
        if readable:
            data = sock.recv(1 << 18)
            if not data:
                raise ConnectionResetError("connection closed by the node")
            counter.feed(data)

    for enc in encoded:
        done.append(enc)
        for start in range(0, len(enc), window):
            stop = min(start + window, len(enc))
            payload = enc.payload(start, stop)
            while payload:
                try:
                    n = sock.send(payload)
                    payload = payload[n:]
                except BlockingIOError:
                    wait(for_write=True)
            sent += stop - start
            while sent - counter.received > window:
                wait(for_write=False)
    while counter.received < sent:
        wait(for_write=False)
    return counter, done


def write_batches(opts: WriteOptions, batches: Iterator[Any], client: Client) -> WriteCounts:
    counts = WriteCounts(node=f"{client.address[0]}:{client.address[1]}" if client.address else "")
    row_by_row: list[Any] = []

    def encoded() -> Iterator[Encoded]:
        for batch in batches:
            enc = encode_batch(batch, opts)
            if enc is None:
                row_by_row.append(batch)
                continue
            counts.null_bodies += enc.null_bodies
            counts.oversized += enc.oversized
            yield enc

    wait = opts.common.timeout_s + opts.timeout_ms / 1000
    with client.connection() as conn:
        counter, sent = _stream_commands(conn, encoded(), opts.batchsize, wait)
    counts.added += counter.received - len(counter.errors)
    if counter.errors:
        failed_rows = _rows_by_index(sent, [i for i, _ in counter.errors])
        failed = [c for b in failed_rows for c in _calls(opts, b, counts)]
        _retry_elsewhere(opts, failed, counter.errors[0][1], counts)
    for batch in row_by_row:
        _write_row_by_row(opts, batch, client, counts)
    return counts


def _rows_by_index(sent: list[Encoded], indexes: list[int]) -> list[Any]:
    """The rows (one-row record batches) behind the given command indexes."""
    rows, base, it = [], 0, iter(sorted(indexes))
    target = next(it, None)
    for enc in sent:
        while target is not None and target < base + len(enc):
            rows.append(enc.rows.slice(target - base, 1))
            target = next(it, None)
        base += len(enc)
    return rows


def _write_row_by_row(opts: WriteOptions, batch: Any, client: Client, counts: WriteCounts) -> None:
    """Rows whose argument lists differ (see pipeline.encode): one ``Call`` each."""
    batch, nulls, oversized = filter_bad_rows(batch, opts)
    counts.null_bodies += nulls
    counts.oversized += oversized
    calls = _calls(opts, batch, counts)
    for start in range(0, len(calls), opts.batchsize):
        chunk = calls[start:start + opts.batchsize]
        replies = client.run_many(chunk, raise_on_error=False)
        failed = [c for c, r in zip(chunk, replies, strict=True) if isinstance(r, Exception)]
        counts.added += len(chunk) - len(failed)
        if failed:
            first = next(r for r in replies if isinstance(r, Exception))
            _retry_elsewhere(opts, failed, str(first), counts)


def _calls(opts: WriteOptions, batch: Any, counts: WriteCounts) -> list[Any]:
    """One ADDJOB ``Call`` per row of a batch already cleared of bad rows."""
    def column(name: str) -> list[Any] | None:
        idx = batch.schema.get_field_index(name)
        return None if idx < 0 else batch.column(idx).to_pylist()

    bodies = column("body") or []
    queues, delays, retries, ttls, repls = (
        column(c) for c in ("queue", "delay", "retry", "ttl", "replicate"))
    calls = []
    for i, body in enumerate(bodies):
        queue = (queues[i] if queues else None) or opts.queue
        if not queue:
            raise BadRowError("row without a queue: give a 'queue' column or option 'queue'")
        calls.append(cmd.add_job(
            queue, body,
            replicate=_pick(repls, i, opts.replicate), delay=_pick(delays, i, opts.delay),
            retry=_pick(retries, i, opts.retry), ttl=_pick(ttls, i, opts.ttl),
            async_=opts.async_, timeout_ms=opts.timeout_ms))
    return calls


def _pick(column: list[Any] | None, i: int, default: int | None) -> int | None:
    value = column[i] if column else None
    return default if value is None else int(value)


def _retry_elsewhere(opts: WriteOptions, failed: list[Any], first_error: str,
                     counts: WriteCounts) -> None:
    from pipeline.connect import open_client, writable_nodes

    others = [n for n in writable_nodes(opts.common) if n != counts.node]
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
