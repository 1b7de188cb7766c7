"""used_memory counts what the node holds (broker/memory.py): its constants must stay true.

tracemalloc sees every object the core allocates, compiled or not; if a job or a queue grows
(a new field, a copy kept), these fail and the constant must be measured again
(``python -m bench.job_memory``).
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable

from broker.memory import QUEUE_BYTES
from tests.broker.harness import Node


def _traced_growth(action: Callable[[Node], None]) -> tuple[int, int]:
    """(bytes traced, used_memory growth) over ``action()``, the harness's node passed in."""
    n = Node()
    n.b.log_wanted = False  # the harness keeps the log records it is given: not the node's
    n.add("q", "first")  # the queue and the interned values exist before measuring
    gc.collect()
    used0 = n.b.used_memory
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        action(n)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return traced, n.b.used_memory - used0


def test_jobs_count_their_body_and_the_documented_overhead() -> None:
    jobs, body = 5000, 300

    def add(n: Node) -> None:
        for i in range(jobs):
            n.add("q", f"{i:05d}" + "b" * (body - 5))

    traced, counted = _traced_growth(add)
    overhead = Node().b.job_overhead
    assert counted == jobs * (body + overhead)  # exact: the count is incremental
    assert abs(traced - counted) <= counted // 10, (traced / jobs, counted / jobs)


def test_delivered_and_acknowledged_jobs() -> None:
    n = Node()
    ids = [n.add("q", "x" * 100) for _ in range(100)]
    full = n.b.used_memory
    n("GETJOB", "COUNT", 100, "FROM", "q")
    assert n.b.used_memory == full  # active jobs still held
    for job_id in ids:
        n("ACKJOB", job_id)
    assert n.b.used_memory == QUEUE_BYTES  # only the queue is left


def test_queues_count_the_documented_bytes() -> None:
    queues = 3000

    def create(n: Node) -> None:
        for i in range(queues):
            n("GETJOB", "NOHANG", "FROM", f"queue-{i:06d}")

    traced, counted = _traced_growth(create)
    assert counted == queues * QUEUE_BYTES
    assert abs(traced - counted) <= counted // 10, traced / queues
