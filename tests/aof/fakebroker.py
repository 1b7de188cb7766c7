"""A stand-in for ``broker.core.Broker`` with only what the append log touches.

Jobs are ``[id, queue, body, queued, nacks]`` lists (opaque records, like ``Job.to_record()``);
each change emits a ``LogRecord(kind, data, undo)`` into ``outbox``, as the core does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from broker.effects import LogRecord


class FakeBroker:
    def __init__(self) -> None:
        self.outbox: list[LogRecord] = []
        self.jobs: dict[bytes, list[Any]] = {}
        self.loaded_with: bool | None = None
        self.undone: list[tuple[Any, ...]] = []
        self.info_sources: dict[str, Any] = {}

    # commands -----------------------------------------------------------------------------
    def addjob(self, job_id: bytes, queue: bytes = b"q", body: bytes = b"x") -> None:
        rec = [job_id, queue, body, True, 0]
        self.jobs[job_id] = rec
        self.outbox.append(LogRecord("job", list(rec), None))

    def nack(self, job_id: bytes) -> None:
        before = list(self.jobs[job_id])
        self.jobs[job_id][4] += 1
        self.outbox.append(LogRecord("job", list(self.jobs[job_id]), before))

    def ackjob(self, job_id: bytes) -> None:
        before = self.jobs.pop(job_id)
        self.outbox.append(LogRecord("ack", job_id, before))

    # the contract -------------------------------------------------------------------------
    def take_effects(self) -> list[LogRecord]:
        effects, self.outbox = self.outbox, []
        return effects

    def undo_entry(self, entry: tuple[Any, ...], now_ms: int) -> None:
        self.undone.append(entry)
        kind, data, before = entry
        job_id = data[0] if kind == "job" else data
        if before is None:
            self.jobs.pop(job_id, None)
        else:
            self.jobs[job_id] = list(before)

    def validate_record(self, kind: str, data: Any) -> str | None:
        return None  # the fake's records are opaque lists

    def load_record(self, record: tuple[Any, ...], now_ms: int) -> None:
        kind, data = record[0], record[1]
        if kind == "job":
            self.jobs[data[0]] = list(data)
        else:
            self.jobs.pop(data, None)

    def finish_load(self, now_ms: int, enqueue_jobs_once: bool) -> None:
        self.loaded_with = enqueue_jobs_once
        if not enqueue_jobs_once:  # as Disque: loaded jobs wait for their retry time
            for rec in self.jobs.values():
                rec[3] = False

    def snapshot(self) -> Iterator[tuple[str, list[Any]]]:
        for job_id in list(self.jobs):  # a copy: the table changes between slices
            rec = self.jobs.get(job_id)
            if rec is not None:
                yield ("job", list(rec))


class Config:
    def __init__(self, directory: str, **kw: Any) -> None:
        self.dir = directory
        self.appendonly = True
        self.appendfilename = "appendonly.aof"
        self.appendfsync = "always"
        self.aof_load_truncated = True
        self.aof_enqueue_jobs_once = False
        self.auto_aof_rewrite_percentage = 100
        self.auto_aof_rewrite_min_size = 64 * 1024 * 1024
        self.aof_rewrite_incremental_fsync = True
        for k, v in kw.items():
            setattr(self, k, v)
