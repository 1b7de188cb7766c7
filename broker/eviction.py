"""Freeing memory past 95 % of maxmemory: Disque's freeMemoryIfNeeded, sans-IO.

Under ``maxmemory-policy acks`` (the default) a command that may grow memory (ADDJOB, ENQUEUE,
NACK) first frees jobs nobody needs any more: acknowledged jobs (a cluster keeps them for its
ack GC) and at-most-once jobs (RETRY 0) already delivered, which would otherwise stay until
their TTL. Disque samples random jobs and gives up after 11 in a row it cannot free or after
1-2 ms; here a cursor walks the job scan list instead (a random key is not O(1) in a dict) and
gives up after the same run of misses, so each call costs a bounded number of looks. Under
``noeviction`` nothing is freed. The command is refused with -OOM when the count stays above
95 %.
"""

from __future__ import annotations

from typing import Final, Protocol

from broker.core_api import BrokerCore
from broker.effects import LogRecord
from broker.job import FLAG_DELIVERED, Job, JobState

# Disque's DISQUE_NOT_FREED_MAX_LEN: consecutive jobs that cannot be freed before giving up.
MAX_MISSES: Final = 10
# Jobs looked at per call at most, freed or not (Disque bounds the loop by time instead).
MAX_LOOKS: Final = 1000

# Scan list slots read per refill of the walk's batch.
_BATCH: Final = 64


class Walk:
    """Where the walk over the jobs is: a scan cursor and the live jobs read ahead."""

    def __init__(self) -> None:
        self.cursor = 0
        self.batch: list[Job] = []

    def next_job(self, b: BrokerCore) -> Job | None:
        """The next job still registered, wrapping around; None when there is none."""
        jobs = b.jobs
        empty_reads = 0
        while jobs:
            while self.batch:
                job = self.batch.pop()
                if jobs.get(job.id) is job:
                    return job
            self.cursor, found = b.job_scan.scan(self.cursor, _BATCH, b.job_alive)
            self.batch = found[::-1]
            empty_reads = 0 if found else empty_reads + 1
            if empty_reads > 2 and not self.cursor:
                return None  # a whole pass found nothing (cannot happen while jobs exist)
        return None


class EvictingBroker(BrokerCore, Protocol):
    """The broker core with its walk over the jobs (``Broker.eviction``)."""

    eviction: Walk


def freeable(job: Job) -> bool:
    return job.state is JobState.ACKED or (job.retry == 0 and bool(job.flags & FLAG_DELIVERED))


def free_memory(b: EvictingBroker, adding: int) -> bool:
    """Free jobs until the count with ``adding`` more bytes is at most 95 % of maxmemory.
    True when it is (the command may go on), False to refuse it with -OOM."""
    target = b.config.maxmemory // 100 * 95
    if b.used_memory + adding <= target:
        return True
    if b.config.maxmemory_policy != "acks":
        return False
    misses = looks = 0
    while b.used_memory + adding > target:
        job = b.eviction.next_job(b)
        if job is None:
            return False  # no job at all
        looks += 1
        if freeable(job):
            misses = 0
            if job.state is JobState.ACKED:
                b.unregister(job)  # its ack is in the log already
            else:
                prev = job.to_record()
                b.unregister(job)
                b.outbox.append(LogRecord("del", job.id, prev))
        else:
            misses += 1
        if misses > MAX_MISSES or looks >= MAX_LOOKS:
            return False
    return True
