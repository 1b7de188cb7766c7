"""Messages that carry many records, cut into frames by count and by bytes (sans-IO).

A bus frame has a size limit (``cluster.wire.max_body_for``), and one frame of a hundred
1 MB jobs is far past what a link should carry in one piece. Every core that packs records
into one message (YOURJOBS, the replicated tables) cuts them with ``cut``: consecutive
batches, in order, of at most ``max_count`` records and about ``BATCH_BYTES``. A batch is
closed before the record that would take it past the byte budget, so only a record larger
than the budget by itself makes a larger frame, alone (a big job: the frame limit allows for
it). The sizes are estimates of the msgpack encoding, from the record's large fields.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from broker.job import REC_BODY, REC_CONFIRMED, REC_DELIVERED, REC_ID, REC_QUEUE
from cluster.wire import BATCH_BYTES

#: What a job record holds besides its body, queue name and holders (numbers, flags, msgpack
#: headers), rounded up.
_JOB_FIXED_BYTES: Final = 128
_NODE_ID_BYTES: Final = 42  # a 40-hex ID and its msgpack header


def cut(records: list[Any], size_of: Callable[[Any], int], max_count: int,
        max_bytes: int = BATCH_BYTES) -> list[list[Any]]:
    """``records`` in order, in batches of at most ``max_count`` and about ``max_bytes``."""
    batches: list[list[Any]] = []
    batch: list[Any] = []
    size = 0
    for rec in records:
        rec_size = size_of(rec)
        if batch and (len(batch) >= max_count or size + rec_size > max_bytes):
            batches.append(batch)
            batch, size = [], 0
        batch.append(rec)
        size += rec_size
    if batch:
        batches.append(batch)
    return batches


def job_record_size(record: list[Any]) -> int:
    """About how many bytes ``broker.job.Job.to_record()``'s output takes in a frame."""
    return (_JOB_FIXED_BYTES + len(record[REC_ID]) + len(record[REC_QUEUE])
            + len(record[REC_BODY])
            + _NODE_ID_BYTES * (len(record[REC_DELIVERED]) + len(record[REC_CONFIRMED])))
