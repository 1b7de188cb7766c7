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
* Several nodes (``nodes`` naming more than one): the reader claims from *every node it is
  given*, round-robin, one ``GETJOB NOHANG`` per node per pass (there is no federation: a node
  only hands out the jobs queued on it). Each claimed job's entry in the offset carries the
  node that delivered it (``[id, queue, body_b64, node]``); ACKJOB, WORKING and the restart
  checks go to that node, or, when it cannot be reached, to any other node given (ACKJOB on
  any node reaches every copy of a replicated job). A node that cannot be reached is skipped
  with a warning naming it and tried again every ``_RETRY_DOWN_S`` seconds; the query carries
  on with the others, and fails (naming every address) only when no node it was given can be
  reached. See docs/spark.md, "On a cluster", for why this keeps at-least-once.
* Claimed, uncommitted jobs are kept alive by a background thread that sends WORKING every
  ``keepaliveMs``, so RETRY can be shorter than a batch; the thread lives in the driver-side
  reader. ``stop()`` is not reliably called, so nothing depends on it, and uncommitted claims
  are never NACKed (their RETRY brings them back if this query dies).
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from client import commands as cmd
from client.blocking import Client, TrisqueConnectionError
from pipeline.connect import open_client
from pipeline.options import StreamOptions

log = logging.getLogger("pipeline.stream")

# A node that could not be reached is tried again after this long (not at every batch: a node
# that hangs rather than refuses would cost a socket timeout per batch).
_RETRY_DOWN_S = 5.0
_NET_ERRORS = (TrisqueConnectionError, OSError)



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
        self._clients: dict[str, Client] = {}
        self._down: dict[str, tuple[float, str]] = {}  # node -> (when it failed, why)
        self._lock = threading.Lock()
        self._alive: dict[str, None] = {}        # claimed, not yet acked: kept alive
        self._bodies: dict[str, tuple[bytes, int, int]] = {}
        self._node_of: dict[str, str] = {}       # claimed job -> the node that delivered it
        self._acked: set[str] = set()
        self._keepalive: threading.Thread | None = None
        self._available_now_left: int | None = None
        self._next_node = 0

    # A pickled copy (for read()) carries only the options; the connections, the thread and the
    # claims stay with the driver-side reader.
    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.opts = state["opts"]
        self._init_driver_state()

    # -- nodes ---------------------------------------------------------------------------

    def _node_client(self, node: str) -> Client:
        """The client of one node given; raises (and marks the node down) if unreachable."""
        with self._lock:
            client = self._clients.get(node)
        if client is not None:
            return client
        try:
            client = open_client(self.opts.common, [node])
        except _NET_ERRORS as exc:
            self._mark_down(node, exc)
            raise
        with self._lock:
            self._down.pop(node, None)
            self._clients[node] = client
        return client

    def _mark_down(self, node: str, exc: BaseException) -> None:
        with self._lock:
            client = self._clients.pop(node, None)
            first = node not in self._down
            self._down[node] = (time.monotonic(), str(exc))
        if client is not None:
            client.close()
        if first:
            log.warning("trisque node %s unreachable, carrying on with the other nodes given "
                        "(tried again every %.0f s): %s", node, _RETRY_DOWN_S, exc)

    def _live_nodes(self) -> list[str]:
        """The nodes given, but those marked down less than _RETRY_DOWN_S ago; fails naming
        every node when none is left."""
        now = time.monotonic()
        with self._lock:
            live = [n for n in self.opts.common.nodes
                    if n not in self._down or now - self._down[n][0] >= _RETRY_DOWN_S]
            if not live:
                raise TrisqueConnectionError("cannot reach any trisque node given: " + ", ".join(
                    f"{n} ({self._down[n][1]})" for n in self.opts.common.nodes))
        return live

    def _run_on(self, node: str | None, calls: list[Any]) -> tuple[str, list[Any]]:
        """Run ``calls`` (errors returned, not raised) on ``node``, or, when it cannot be
        reached, on the first other node given that can: (the node used, the replies)."""
        order = self.opts.common.nodes
        if node in order:
            order = [node] + [n for n in order if n != node]
        elif node is not None:
            order = [node, *order]
        tried = []
        for n in order:
            try:
                return n, self._node_client(n).run_many(calls, raise_on_error=False)
            except _NET_ERRORS as exc:
                self._mark_down(n, exc)
                tried.append(f"{n} ({exc})")
        raise TrisqueConnectionError("cannot reach any trisque node given: " + ", ".join(tried))

    def client(self) -> Client:
        """A client of the first node given that can be reached (single-node uses)."""
        return self._node_client(self._live_nodes()[0])

    # -- offsets -------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802
        return {"seq": 0, "jobs": []}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.opts.max_jobs_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        left = 0
        for node in self._live_nodes():
            try:
                client = self._node_client(node)
                left += sum(client.qlen(q) for q in self.opts.queues)
            except _NET_ERRORS as exc:
                self._mark_down(node, exc)
        self._available_now_left = left
        log.info("AvailableNow: consuming the %d jobs queued now", self._available_now_left)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        self._ack_jobs(start["jobs"])
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
            [j.id, j.queue, base64.b64encode(j.body).decode() if keep_bodies else None,
             self._node_of[j.id]]
            for j in jobs]}

    def _claim(self, want: int) -> list[Any]:
        """Up to ``want`` jobs, GETJOB NOHANG round-robin over the live nodes given (the pass
        starts one node further each batch, so no node is always drained first)."""
        claimed: list[Any] = []
        nodes = self._live_nodes()
        start = self._next_node % len(nodes)
        self._next_node += 1
        nodes = nodes[start:] + nodes[:start]
        empty: set[str] = set()
        while len(claimed) < want and len(empty) < len(nodes):
            for node in nodes:
                if node in empty or len(claimed) >= want:
                    continue
                try:
                    got = self._node_client(node).get_job(
                        *self.opts.queues, count=min(self.opts.getjob_count, want - len(claimed)),
                        nohang=True, with_counters=True)
                except _NET_ERRORS as exc:
                    # Jobs a lost reply had claimed come back after their RETRY (at-least-once).
                    self._mark_down(node, exc)
                    got = []
                if not got:
                    empty.add(node)
                with self._lock:
                    for j in got:
                        self._alive[j.id] = None
                        self._bodies[j.id] = (j.body, j.nacks or 0, j.additional_deliveries or 0)
                        self._node_of[j.id] = node
                claimed.extend(got)
        if len(empty) == len(nodes) and all(n in self._down for n in nodes):
            self._live_nodes()  # every node is down now: fail naming them
        if claimed:
            self._start_keepalive()
        return claimed

    # -- planning and reading ------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        rows = []
        replayed = [job for job in end["jobs"] if job[0] not in self._bodies]
        if replayed:
            self._reclaim(replayed)
        for job in end["jobs"]:
            job_id, queue = job[0], job[1]
            body, nacks, extra = self._bodies[job_id]
            rows.append((job_id, queue, "active", None, None, None, nacks, extra, body))
        n = max(1, min(self.opts.partitions, len(rows)))
        return [JobsPartition(rows[i::n]) for i in range(n)]

    def _reclaim(self, jobs: list[list[Any]]) -> None:
        """Replay after a restart: take the jobs back with WORKING and recover their bodies,
        on the node that delivered each (or another node given, which has a copy when the job
        is replicated)."""
        for node, group in _by_node(jobs).items():
            for job in group:
                job_id, _queue, body_b64 = job[0], job[1], job[2]
                info, used, why = None, None, ""
                for candidate in ([node] if node else []) + [
                        n for n in self.opts.common.nodes if n != node]:
                    try:
                        working, shown = self._node_client(candidate).run_many(
                            [cmd.working(job_id), cmd.show(job_id)], raise_on_error=False)
                    except _NET_ERRORS as exc:
                        self._mark_down(candidate, exc)
                        why += f" {candidate}: {exc};"
                        continue
                    if isinstance(working, Exception) or shown is None:
                        why += f" {candidate}: WORKING {working};"
                        continue
                    info, used = shown, candidate
                    break
                if info is None or used is None:
                    raise JobVanishedError(
                        f"job {job_id} of the batch being replayed is on no node given that "
                        f"can be reached ({why.strip()}): acknowledged, deleted, expired, or "
                        f"its only copies are on nodes that are down")
                body = base64.b64decode(body_b64) if body_b64 is not None else info.body
                with self._lock:
                    self._alive[job_id] = None
                    self._bodies[job_id] = (body, info.nacks, info.additional_deliveries)
                    self._node_of[job_id] = used
        log.warning("replaying %d jobs of an uncommitted batch", len(jobs))
        self._start_keepalive()

    def read(self, partition: JobsPartition) -> Iterator[tuple[Any, ...]]:  # type: ignore[override]
        yield from partition.jobs

    # -- acknowledging -------------------------------------------------------------------

    def commit(self, end: dict[str, Any]) -> None:
        self._ack_jobs(end["jobs"])

    def _ack_jobs(self, jobs: list[list[Any]]) -> None:
        with self._lock:
            todo = [j for j in jobs if j[0] not in self._acked]
            earlier = [j for j in todo if j[0] not in self._alive]
        if earlier:
            # Claimed by an earlier run of the query (the first start after a restart): that
            # run may have acked them already (its last latestOffset does, in AvailableNow).
            gone = self._already_acked(earlier)
            todo = [j for j in todo if j[0] not in gone]
        for node, group in _by_node(todo, self._node_of).items():
            ids = [j[0] for j in group]
            for k in range(0, len(ids), 1000):
                # On the node that delivered them, else any node given (ACKJOB reaches every
                # copy; a job whose only copy is on an unreachable node comes back after its
                # RETRY if that node does: a duplicate, never a loss).
                _used, (reply,) = self._run_on(node, [cmd.ack_job(*ids[k:k + 1000])])
                if isinstance(reply, Exception):
                    raise reply
        with self._lock:
            for j in todo:
                self._acked.add(j[0])
                self._alive.pop(j[0], None)
                self._bodies.pop(j[0], None)
                self._node_of.pop(j[0], None)

    def _already_acked(self, jobs: list[list[Any]]) -> set[str]:
        """The IDs among ``jobs`` that are acked or gone: one pipelined SHOW per ID on its
        node, once per restart (only a batch claimed by an earlier reader is checked)."""
        gone: set[str] = set()
        for node, group in _by_node(jobs).items():
            _used, replies = self._run_on(node, [cmd.show(j[0]) for j in group])
            gone |= {j[0] for j, info in zip(group, replies, strict=True)
                     if info is None or (not isinstance(info, Exception) and info.state == "acked")}
        return gone

    def stop(self) -> None:
        # Not reliably called by Spark; only closes the connections when it is.
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    # -- keep-alive ----------------------------------------------------------------------

    def _start_keepalive(self) -> None:
        if self._keepalive is None or not self._keepalive.is_alive():
            self._keepalive = threading.Thread(target=self._keep_alive_loop,
                                               name="trisque-keepalive", daemon=True)
            self._keepalive.start()

    def _keep_alive_loop(self) -> None:
        while True:
            with self._lock:
                alive = [[i, None, None, self._node_of.get(i)] for i in self._alive]
            for node, group in _by_node(alive).items():
                try:
                    self._run_on(node, [cmd.working(j[0]) for j in group])
                except Exception as exc:  # noqa: BLE001 - keep trying; log why
                    log.warning("keep-alive WORKING failed: %s", exc)
            threading.Event().wait(self.opts.keepalive_s)


def _by_node(jobs: list[list[Any]], node_of: dict[str, str] | None = None
             ) -> dict[str | None, list[list[Any]]]:
    """Offset entries grouped by the node that delivered them: the entry's 4th field (absent
    in offsets written before several nodes were supported: None, the first node given), or
    what this reader recorded when it claimed the job."""
    groups: dict[str | None, list[list[Any]]] = {}
    for job in jobs:
        node = job[3] if len(job) > 3 else None
        if node is None and node_of is not None:
            node = node_of.get(job[0])
        groups.setdefault(node, []).append(job)
    return groups
