"""The streaming read: jobs claimed with GETJOB, acknowledged once Spark committed their batch.

Theory of operation (pyspark 4.3 facts this relies on are listed in docs/spark.md):

* The driver-side reader claims up to the batch's limit with ``GETJOB NOHANG`` in
  ``latestOffset``. The claimed jobs go *into the offset*: ``{"seq": n, "jobs": [[id, queue,
  body_b64 | null], ...]}`` (bodies up to ``bodiesInOffsetBytes`` in total; past that only IDs,
  and the bodies are fetched with SHOW on replay). ``read(partition)`` runs on a pickled copy of
  the reader in another process, so partitions carry the jobs themselves.
* Nothing claimed: ``latestOffset`` returns ``start`` itself (Spark compares offsets as JSON
  strings; a new object would make it run empty batches forever).
* Acknowledging: ``commit(end)`` ACKs the batch's IDs, but Spark calls it one batch late, so
  ``latestOffset(start)`` also ACKs the IDs in ``start`` (when Spark plans the next batch, the
  one ending at ``start`` is in its commit log). A set of acked IDs keeps any ID from being
  ACKed twice by one reader; IDs a reader did not claim itself (a batch of an earlier run of
  the query, seen after a restart) are first checked with SHOW and ACKed only if they are
  still there, so no ID is ACKed twice across restarts either.
* Restart from a checkpoint: Spark calls ``partitions(start, end)`` on a fresh reader for the
  uncommitted batch. Its jobs are re-claimed with WORKING (which also proves they still exist:
  a vanished job fails the query loudly, naming it).
* Claimed, uncommitted jobs are kept alive by a background thread that sends WORKING every
  ``keepaliveMs``, so RETRY can be shorter than a batch; the thread lives in the driver-side
  reader. ``stop()`` is not reliably called, so nothing depends on it, and uncommitted claims
  are never NACKed (their RETRY brings them back if this query dies).
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pipeline.connect import open_client
from pipeline.options import StreamOptions
from protocol import client_commands as cmd
from protocol.client import Client

log = logging.getLogger("pipeline.stream")



class JobVanishedError(RuntimeError):
    pass


class JobsPartition(InputPartition):
    def __init__(self, jobs: list[tuple[Any, ...]]) -> None:
        super().__init__(len(jobs))
        self.jobs = jobs


class TrisqueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: StreamOptions) -> None:
        self.opts = opts
        self._init_driver_state()

    def _init_driver_state(self) -> None:
        self._client: Client | None = None
        self._lock = threading.Lock()
        self._alive: dict[str, None] = {}        # claimed, not yet acked: kept alive
        self._bodies: dict[str, tuple[bytes, int, int]] = {}
        self._acked: set[str] = set()
        self._keepalive: threading.Thread | None = None
        self._available_now_left: int | None = None

    # A pickled copy (for read()) carries only the options; the connections, the thread and the
    # claims stay with the driver-side reader.
    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.opts = state["opts"]
        self._init_driver_state()

    def client(self) -> Client:
        if self._client is None:
            self._client = open_client(self.opts.common)
        return self._client

    # -- offsets -------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802
        return {"seq": 0, "jobs": []}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.opts.max_jobs_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        client = self.client()
        self._available_now_left = sum(client.qlen(q) for q in self.opts.queues)
        log.info("AvailableNow: consuming the %d jobs queued now", self._available_now_left)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        self._ack_ids([job[0] for job in start["jobs"]])
        want = limit.max_rows if isinstance(limit, ReadMaxRows) else self.opts.max_jobs_per_batch
        if isinstance(limit, ReadAllAvailable):
            want = 1 << 30
        if self._available_now_left is not None:
            want = min(want, self._available_now_left)
        jobs = self._claim(want)
        if not jobs:
            return start
        if self._available_now_left is not None:
            self._available_now_left -= len(jobs)
        total = sum(len(j.body) for j in jobs)
        keep_bodies = total <= self.opts.bodies_in_offset_bytes
        return {"seq": int(start["seq"]) + 1, "jobs": [
            [j.id, j.queue, base64.b64encode(j.body).decode() if keep_bodies else None]
            for j in jobs]}

    def _claim(self, want: int) -> list[Any]:
        client, claimed = self.client(), []
        while len(claimed) < want:
            got = client.get_job(*self.opts.queues, count=min(self.opts.getjob_count,
                                                               want - len(claimed)),
                                 nohang=True, with_counters=True)
            if not got:
                break
            claimed.extend(got)
        with self._lock:
            for j in claimed:
                self._alive[j.id] = None
                self._bodies[j.id] = (j.body, j.nacks or 0, j.additional_deliveries or 0)
        if claimed:
            self._start_keepalive()
        return claimed

    # -- planning and reading ------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        rows = []
        replayed = [job for job in end["jobs"] if job[0] not in self._bodies]
        if replayed:
            self._reclaim(replayed)
        for job_id, queue, _body in end["jobs"]:
            body, nacks, extra = self._bodies[job_id]
            rows.append((job_id, queue, "active", None, None, None, nacks, extra, body))
        n = max(1, min(self.opts.partitions, len(rows)))
        return [JobsPartition(rows[i::n]) for i in range(n)]

    def _reclaim(self, jobs: list[list[Any]]) -> None:
        """Replay after a restart: take the jobs back with WORKING and recover their bodies."""
        client = self.client()
        replies = client.run_many([cmd.working(job[0]) for job in jobs], raise_on_error=False)
        for job, reply in zip(jobs, replies, strict=True):
            if isinstance(reply, Exception):
                raise JobVanishedError(
                    f"job {job[0]} of the batch being replayed is gone from trisque "
                    f"(WORKING: {reply}); it was acknowledged, deleted or expired")
        log.warning("replaying %d jobs of an uncommitted batch", len(jobs))
        for job_id, _queue, body_b64 in jobs:
            info = client.show(job_id)
            if info is None:
                raise JobVanishedError(f"job {job_id} of the batch being replayed is gone")
            body = base64.b64decode(body_b64) if body_b64 is not None else info.body
            with self._lock:
                self._alive[job_id] = None
                self._bodies[job_id] = (body, info.nacks, info.additional_deliveries)
        self._start_keepalive()

    def read(self, partition: JobsPartition) -> Iterator[tuple[Any, ...]]:  # type: ignore[override]
        yield from partition.jobs

    # -- acknowledging -------------------------------------------------------------------

    def commit(self, end: dict[str, Any]) -> None:
        self._ack_ids([job[0] for job in end["jobs"]])

    def _ack_ids(self, ids: list[str]) -> None:
        with self._lock:
            todo = [i for i in ids if i not in self._acked]
            earlier = [i for i in todo if i not in self._alive]
        if earlier:
            # Claimed by an earlier run of the query (the first start after a restart): that
            # run may have acked them already (its last latestOffset does, in AvailableNow).
            gone = self._already_acked(earlier)
            todo = [i for i in todo if i not in gone]
        for k in range(0, len(todo), 1000):
            self.client().ack_job(*todo[k:k + 1000])
        with self._lock:
            for i in todo:
                self._acked.add(i)
                self._alive.pop(i, None)
                self._bodies.pop(i, None)

    def _already_acked(self, ids: list[str]) -> set[str]:
        """The IDs among ``ids`` that are acked or gone: one pipelined SHOW per ID, once
        per restart (only a batch claimed by an earlier reader is checked)."""
        replies = self.client().run_many([cmd.show(i) for i in ids], raise_on_error=False)
        return {i for i, info in zip(ids, replies, strict=True)
                if info is None or (not isinstance(info, Exception) and info.state == "acked")}

    def stop(self) -> None:
        # Not reliably called by Spark; only closes the connection when it is.
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- keep-alive ----------------------------------------------------------------------

    def _start_keepalive(self) -> None:
        if self._keepalive is None or not self._keepalive.is_alive():
            self._keepalive = threading.Thread(target=self._keep_alive_loop,
                                               name="trisque-keepalive", daemon=True)
            self._keepalive.start()

    def _keep_alive_loop(self) -> None:
        client = open_client(self.opts.common)
        try:
            while True:
                with self._lock:
                    ids = list(self._alive)
                if ids:
                    try:
                        client.run_many([cmd.working(i) for i in ids], raise_on_error=False)
                    except Exception as exc:  # noqa: BLE001 - keep trying; log why
                        log.warning("keep-alive WORKING failed: %s", exc)
                threading.Event().wait(self.opts.keepalive_s)
        finally:
            client.close()
