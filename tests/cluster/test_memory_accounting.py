"""A replicated job's copies count what they hold (broker/memory.py's CLUSTER_JOB_BYTES): the
three nodes' used_memory grows as tracemalloc sees their objects grow, within 10 %."""

from __future__ import annotations

import gc
import tracemalloc

from tests.cluster.jobsim import JobCluster


def _forget_harness_records(c: JobCluster) -> None:
    """The harness keeps every message and log record for its assertions: not node memory."""
    c.trace.clear()
    c.sends.clear()
    c.blocked_replies.clear()
    for records in c.logs.values():
        records.clear()
    for i in range(3):
        c.jn(i).received.clear()


def test_replicated_copies_count_their_cluster_state() -> None:
    c = JobCluster(3)
    c.addjob(0, "q", "first", "500")  # queues and links exist before measuring
    c.run_for(1000)
    for i in range(3):
        c.broker(i).log_wanted = False
    _forget_harness_records(c)
    gc.collect()
    counted0 = sum(c.broker(i).used_memory for i in range(3))
    jobs = 1000
    tracemalloc.start()
    try:
        traced0 = tracemalloc.get_traced_memory()[0]
        for _ in range(jobs):
            c.addjob(0, "q", "b" * 200, "0", "REPLICATE", "3", "ASYNC")
        c.run_for(2000)
        _forget_harness_records(c)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - traced0
    finally:
        tracemalloc.stop()
    assert all(len(c.broker(i).jobs) == jobs + 1 for i in range(3))
    counted = sum(c.broker(i).used_memory for i in range(3)) - counted0
    assert abs(traced - counted) <= counted // 10, (traced / jobs / 3, counted / jobs / 3)
