"""ADDJOB commands for a whole Arrow record batch at once, without a Python object per row.

Theory of operation
-------------------
A write task receives Arrow record batches (10,000 rows each by default). Building one
``Call`` per row cost about as much Python time as the node spends executing the ADDJOB, so
the bulk load could not keep up with a pipelined client. Here every argument of the command
becomes a column of RESP bulk strings (``$<len>\\r\\n<value>\\r\\n``) computed by
``pyarrow.compute`` in C, and the columns are joined row-wise into one ``large_binary`` column:
row *i* holds the full ADDJOB command of row *i*, and the column's data buffer is the pipelined
payload of the whole batch, ready to send (``payload(start, stop)`` slices it, no copy).

A row's argument list must be the same for every row of the batch for this to work: a per-row
option column (``delay``, ``retry``, ``ttl``, ``replicate``) with a null where the option has no
default would drop the argument for that row only. ``encode_batch`` returns None in that case
(and when a column cannot be cast to an integer), and the writer builds those rows one by one.

Null bodies and bodies over ``maxBodyBytes`` are counted and filtered out first (or raise
``BadRowError`` with ``onBadRow=fail``), as the row-by-row path does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.options import WriteOptions

_BIN = pa.large_binary()
_CRLF = pa.scalar(b"\r\n", _BIN)
_DOLLAR = pa.scalar(b"$", _BIN)
_EMPTY = pa.scalar(b"", _BIN)

# ADDJOB queue body timeout [REPLICATE n] [DELAY d] [RETRY r] [TTL t] [ASYNC]: the order
# client.commands.add_job uses.
_OPTION_COLUMNS = (("replicate", "REPLICATE"), ("delay", "DELAY"), ("retry", "RETRY"),
                   ("ttl", "TTL"))


class BadRowError(ValueError):
    pass


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


@dataclass
class Encoded:
    """The ADDJOB commands of the rows of one batch that are sent (bad rows filtered out)."""

    commands: Any  # pa.LargeBinaryArray, one full command per row
    rows: Any  # the filtered columns (pa.RecordBatch) the commands were built from
    null_bodies: int
    oversized: int

    def __len__(self) -> int:
        return len(self.commands)

    def payload(self, start: int, stop: int) -> memoryview:
        """The bytes of commands ``start`` to ``stop`` (exclusive), contiguous in the column."""
        arr = self.commands
        _, offsets_buf, data = arr.buffers()
        # The offsets buffer as int64 values; arr.offset counts a slice's first row.
        offsets = pa.Array.from_buffers(pa.int64(), len(arr) + 1, [None, offsets_buf],
                                        offset=arr.offset)
        lo, hi = offsets[start].as_py(), offsets[stop].as_py()
        return memoryview(data)[lo:hi]


def _column(batch: Any, name: str) -> Any | None:
    idx = batch.schema.get_field_index(name)
    return None if idx < 0 else batch.column(idx)


def _as_binary(col: Any) -> Any:
    if pa.types.is_large_binary(col.type):
        return col
    return pc.cast(col, _BIN)


def _bulk_column(values: Any) -> Any:
    """``$<len>\\r\\n<value>\\r\\n`` for every value of a large_binary column."""
    lengths = pc.cast(pc.cast(pc.binary_length(values), pa.string()), _BIN)
    return pc.binary_join_element_wise(_DOLLAR, lengths, _CRLF, values, _CRLF, _EMPTY)


def filter_bad_rows(batch: Any, opts: WriteOptions) -> tuple[Any, int, int]:
    """The batch without null or oversized bodies, and how many of each were dropped."""
    body = _column(batch, "body")
    if body is None:
        raise BadRowError("the DataFrame written to trisque needs a 'body' column")
    body = _as_binary(body)
    nulls = body.null_count
    if nulls and opts.on_bad_row == "fail":
        raise BadRowError("row with a null body (onBadRow=fail)")
    too_big = pc.greater(pc.binary_length(body), opts.max_body_bytes)
    oversized = pc.sum(too_big).as_py() or 0
    if oversized and opts.on_bad_row == "fail":
        biggest = pc.max(pc.binary_length(body)).as_py()
        raise BadRowError(f"row with a body of {biggest} bytes, over "
                          f"maxBodyBytes={opts.max_body_bytes} (onBadRow=fail)")
    if nulls or oversized:
        keep = pc.and_(pc.is_valid(body), pc.invert(pc.fill_null(too_big, False)))
        batch = batch.filter(keep)
    return batch, nulls, oversized


def encode_batch(batch: Any, opts: WriteOptions) -> Encoded | None:
    """The batch's ADDJOB commands as one column, or None when its rows need different
    argument lists (see the module docstring): the caller then encodes them row by row."""
    batch, nulls, oversized = filter_bad_rows(batch, opts)
    n = batch.num_rows
    parts: list[Any] = []
    argc = 4  # ADDJOB queue body timeout

    queue = _column(batch, "queue")
    if queue is not None:
        queue = _as_binary(queue)
        queue = pc.if_else(pc.equal(pc.binary_length(queue), 0), pa.scalar(None, _BIN), queue)  # '' -> default
        if opts.queue:
            queue = pc.fill_null(queue, pa.scalar(opts.queue.encode(), _BIN))
        if queue.null_count:
            raise BadRowError("row without a queue: give a 'queue' column or option 'queue'")
        queue_part: Any = _bulk_column(queue)
    elif opts.queue:
        queue_part = pa.scalar(_bulk(opts.queue.encode()), _BIN)
    elif n:
        raise BadRowError("row without a queue: give a 'queue' column or option 'queue'")
    else:
        queue_part = _EMPTY
    parts += [queue_part, _bulk_column(_as_binary(batch.column(batch.schema.get_field_index("body")))),
              pa.scalar(_bulk(b"%d" % opts.timeout_ms), _BIN)]

    for column_name, keyword in _OPTION_COLUMNS:
        default = getattr(opts, column_name)
        col = _column(batch, column_name)
        if col is not None and col.null_count < n:
            try:
                ints = pc.cast(col, pa.int64())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return None
            if default is not None:
                ints = pc.fill_null(ints, default)
            elif ints.null_count:
                return None  # the argument would be left out for some rows only
            text = pc.cast(pc.cast(ints, pa.string()), _BIN)
            parts += [pa.scalar(_bulk(keyword.encode()), _BIN), _bulk_column(text)]
            argc += 2
        elif default is not None:
            parts.append(pa.scalar(_bulk(keyword.encode()) + _bulk(b"%d" % default), _BIN))
            argc += 2
    if opts.async_:
        parts.append(pa.scalar(_bulk(b"ASYNC"), _BIN))
        argc += 1

    head = pa.scalar(b"*%d\r\n" % argc + _bulk(b"ADDJOB"), _BIN)
    if n == 0:
        commands = pa.array([], _BIN)
    else:
        commands = pc.binary_join_element_wise(head, *parts, _EMPTY)
        if not isinstance(commands, pa.Array):  # every part a scalar cannot happen (body)
            raise AssertionError("ADDJOB column without a per-row part")
    return Encoded(commands, batch, nulls, oversized)
