"""The trio side of the append log: group commit, everysec fsync, online rewrite, startup load.

Theory of operation
-------------------
Commands change the broker in memory first; the broker emits one ``LogRecord`` per durable
change (``broker/effects.py``). Right after each command (and each timer run) the server hands
them to ``submit(records)``, which encodes them into the *open batch* and returns the batch's
ticket; before it sends a reply whose command logged, it awaits ``wait_durable(ticket)``.
Records are submitted before the next checkpoint, so none is ever pending in the broker while
this module runs (a rewrite's snapshot, a failure's undo and a shutdown rely on that).

What runs per command or per round and never waits (``route``, ``submit``, the tickets, the
round's inline ``commit_now``) is in ``node/log_core.py``, compiled with the core: ``LogCore`` is
this class's base, and this module adds the writer task, the threads, the rewrite and trio's
events.

The group commit has two writers, and only one batch is ever being written, so batches reach
the file in ticket order:

* **The reactor's round** (``commit_now``, node/reactor.py). Client commands run in rounds;
  while one runs (``round_open``) their records only fill the open batch, and the round ends
  by writing it in the loop - one write, and under ``appendfsync always`` one fdatasync -
  before the round's replies go out, as Disque's ``beforeSleep`` does. No thread hand-off,
  no task to wake. It declines (and leaves the batch to the writer task) while the writer has
  a batch in flight, while a rewrite or CONFIG SET appendonly holds the file, and under
  ``always`` once an fdatasync took longer than ``INLINE_FSYNC_MAX_USEC``: nothing else runs
  during an inline fdatasync, so on a slow disk the thread, which lets the loop go on, wins.
* **The writer task** (``run``), woken by records submitted outside a round (timers, the bus,
  the HTTP API) or by a declined commit: it takes the open batch, opens a new one, and writes
  the taken batch (under ``always`` with its fdatasync in a worker thread, while the loop
  keeps executing commands whose records fill the next batch).

* ``always``   - a batch is done when it is written and fdatasync returned.
* ``everysec`` - done when written (``write(2)`` in the loop, as Redis does); a timer fdatasyncs
  in a thread once a second if anything was written since the last one.
* ``no``       - done when written; the OS flushes when it wants.

Advisory records (``broker.aof.ADVISORY_KINDS``: ``dlv``, a job's first delivery) ride in the
batches like the others, but ``submit`` returns ticket 0 for a command that made only advisory
records (its reply waits for nothing), a batch of nothing but advisory records is written
without an fdatasync of its own (the next batch's covers it), and a failure never undoes one.

Write failures (ENOSPC, EIO...): the failed batch and the open batch behind it are undone, newest
entry first (``broker.undo_entry``), so memory again matches the log, and every waiter of those
batches gets ``PersistenceError``. The file is cut back to its last good size, the fault is
logged once per episode, and the next batch simply tries again: when the disk recovers the node
recovers without intervention. Reads and commands that log nothing are never blocked.

Contract for the server (``wait_durable``; the reactor instead reads ``done_ticket`` and
``failure(ticket)`` right after its ``commit_now``)::

    ticket = p.submit(records)         # no await between execute() and submit()
    try:
        await p.wait_durable(ticket)
    except PersistenceError as exc:
        # the batch was undone: the replies of the commands whose records were in it
        # must become f"ERR {exc}".

Code that runs broker methods which may log without a client waiting (the ticker's ``tick``)
submits too, without waiting; those records ride with the next batch.

Rewrite (``bgrewrite`` and automatic): the snapshot is pulled from ``broker.snapshot()`` in
slices between checkpoints and written to a temporary file in a thread. Every batch written to
the old log from the start of the rewrite is also kept in a rewrite buffer and appended to the
new file (replay keeps the last state per job, so snapshot + later changes in order is exact).
At the end the writer is paused (only the group commit waits, for a small write, an fsync, a
rename and a directory fsync), the new file replaces the old one and the writer continues on it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import Any, Protocol

import trio

from broker import aof
from broker.effects import LogRecord
from broker.job import REC_BODY, REC_ID, BodyRef
from node import log_core, logfile, memory_use
from node.bodies import BodyError, BodyFiles
from node.log_core import Batch, BodyNote, LogCore, LogSettings
from protocol.checksum import crc32

REWRITE_SLICE = 200  # jobs taken from the snapshot between two checkpoints (well under 1 ms)
REWRITE_BUFFER_CHUNK = 1 << 20  # rewrite buffer bytes moved to the new file per thread call
# aof-rewrite-incremental-fsync: sync the new file every so often, so the final fsync (which the
# group commit waits behind) has little left to flush and the disk sees no burst. On ext4 a
# client's fdatasync can also wait for the rewrite's dirty pages (ordered journal), so the
# smaller this is, the less a rewrite adds to their latency: measured with 16 clients on
# `always` during a 67 MB rewrite, p99 went from 4.7-6.4 ms without a rewrite to 15.8 ms with
# 4 MB and 10 ms with 1 MB; 512 KB gained nothing more.
REWRITE_FSYNC_EVERY = 1024 * 1024


# The reactor fdatasyncs at the end of its round, in the event loop, as Disque does: that costs
# less CPU per ADDJOB than handing the batch to the writer's worker thread (docs/benchmarks.md),
# and while every client waits for the log there is nothing else to run. But nothing else runs
# meanwhile, so once an fdatasync took longer than this (a disk stalled, or busy with a rewrite)
# batches go to the writer's thread and the loop keeps serving; the thread's own fdatasyncs
# bring it back inline when the disk is fast again. The same 10 ms as a round's own bound
# (node/reactor_core.MAX_ROUND_S): at 1 ms a disk shared with other work (fdatasyncs of 1-3
# ms) kept the batches in the thread, at 0.72x Disque's rate against 1.12x inline.
INLINE_FSYNC_MAX_USEC = 10_000

_ADVISORY = aof.ADVISORY_KINDS


class PersistenceError(Exception):
    """A write or fsync failed; ``str(exc)`` is the text after ``ERR``."""

    def __init__(self, message: str, entries: list[Any] | None = None) -> None:
        super().__init__(message)
        self.entries = entries or []


class StartupError(Exception):
    """The log cannot be loaded; the text names the file and the offset."""


def _os_error_text(exc: OSError) -> str:
    text = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc))
    return f"Errors writing to the AOF file: {text}"


class LogBroker(Protocol):
    """What the append log needs of the broker core (broker.core.Broker; the tests' fake)."""

    info_sources: dict[str, Callable[[], list[tuple[str, Any]]]]
    log_wanted: bool  # set by the log: whether the broker's hot paths build their records

    def validate_record(self, kind: str, data: Any) -> str | None: ...

    def load_record(self, record: tuple[Any, ...], now_ms: int) -> None: ...

    def finish_load(self, now_ms: int, enqueue_jobs_once: bool) -> None: ...

    def snapshot(self) -> Iterator[tuple[str, Any]]: ...

    def undo_entry(self, entry: Any, now_ms: int) -> None: ...

    def undo_unencodable(self, entry: Any, now_ms: int) -> None: ...

    def take_effects(self) -> list[Any]: ...

    def body_stored(self, job: Any, ref: BodyRef) -> None: ...

    log_size: Callable[[], int]
    read_body: Callable[[BodyRef], bytes | None]

    @property
    def jobs(self) -> dict[bytes, Any]: ...


class Persistence(LogCore):
    """The append log: ``LogCore`` (node/log_core.py, compiled) holds the open batch, the
    tickets and the per-command ``route``/``submit``; this class writes, waits and rewrites."""

    def __init__(self, config: LogSettings, broker: LogBroker,
                 logger: logging.Logger | None = None, *,
                 open_file: Callable[[str], aof.LogFile] = logfile.OsLogFile,
                 clock: Callable[[], float] = time.time,
                 rewrite_step: Callable[[str], None] = lambda name: None) -> None:
        super().__init__(config, INLINE_FSYNC_MAX_USEC)
        self.broker: LogBroker = broker
        self.log = logger or logging.getLogger("trisque.aof")
        self.enabled = bool(config.appendonly)
        if self.policy not in ("always", "everysec", "no"):
            raise ValueError(f"invalid appendfsync {self.policy!r}")
        self.dir = str(config.dir)
        self.path = os.path.join(self.dir, config.appendfilename)
        self.load_truncated = bool(config.aof_load_truncated)
        self.enqueue_jobs_once = bool(config.aof_enqueue_jobs_once)
        self._open_file = open_file
        self._clock = clock
        self._rewrite_step = rewrite_step

        # The file, the batch buffers and the statistics the commit keeps are LogCore's.
        self._wakeup = trio.Event()
        self._write_lock = trio.Lock()  # held by the writer per batch and by the rewrite switch
        self._sync_lock = trio.Lock()  # the everysec fsync thread must not see its fd closed
        self._nursery: trio.Nursery | None = None

        # Rewrite state (its buffer: LogCore.rewrite_buf)
        self._rewrite_cancel = False
        self._rewrite_started = 0.0
        self.last_rewrite_time = -1
        self.last_bgrewrite_ok = True
        self.rewrites = 0
        self.loading = False
        self.bodies: BodyFiles = BodyFiles(self.log)  # bodies the log holds (body-memory-max)
        broker.info_sources.setdefault("persistence", self.info)
        broker.log_size = self.log_size  # maxdisk

    # Read at each use: CONFIG SET changes them at run time.
    @property
    def policy(self) -> str:
        return str(self.config.appendfsync)

    # -----------------------------------------------------------------------------------------
    # Start

    def load(self, now_ms: int) -> None:
        """Replay the log (if on, or if a controlled shutdown asked for it), then open it for
        appending. Raises ``StartupError`` when the log is unreadable."""
        if os.path.isdir(self.dir):
            for name in logfile.remove_stale_temps(self.dir):
                self.log.warning("Removed %s, left by a rewrite that did not finish", name)
        exists = os.path.exists(self.path)
        flagged = exists and self._header_flag_set()
        version = aof.FORMAT_VERSION
        if self.enabled:
            self.body_max = int(getattr(self.config, "body_memory_max", 0) or 0)
        if self.body_max:
            self.pack = aof.new_packer(self.bodies.for_record)
            self.body_of = self.bodies.for_record
            self.broker.read_body = self._read_for_broker
            if exists:
                self.bodies.gen = self.bodies.open(self.path)
        if self.enabled or self.enqueue_jobs_once or flagged:
            if exists:
                header = self._replay(now_ms, flagged).header
                version = header.version if header is not None else version
            else:
                self.broker.finish_load(now_ms, False)
        # Records made by finish_load (jobs that expired while the node was down).
        records = [e for e in self.broker.take_effects() if type(e) is LogRecord]
        if not self.enabled:
            return
        if version < aof.FORMAT_VERSION:
            # A file holds frames of one version, and the writer appends version-2 frames: an
            # older log is rewritten first (as BGREWRITEAOF would; it already holds the
            # records above).
            logfile.write_snapshot(self.path, list(self.broker.snapshot()),
                                   **self._snapshot_encoding())
            records = []
            self.log.info("Append only file rewritten from format version %d to %d",
                          version, aof.FORMAT_VERSION)
        if not os.path.exists(self.path):
            logfile.create_log(self.path)
        self.writer = aof.LogWriter(self._open_file(self.path))
        if self.body_max and (not self.bodies.gen or version < aof.FORMAT_VERSION):
            # A new log, or the version-1 one rewritten above (references into the old file
            # stay valid: its descriptor keeps the inode).
            self.bodies.gen = self.bodies.open(self.path)
        self._follow_policy()
        self.base_size = self.synced_size = self.writer.good_size
        if records:
            self.writer.write(aof.encode_records(records))
            self.writer.sync()

    def _body_loaded(self, record: tuple[Any, ...], frame: int) -> None:
        """Replay applied ``record`` from the frame at ``frame``: a body past body-memory-max
        stays in the file, the job keeps a reference to it."""
        if record[0] != "job":
            return
        payload = record[1]
        body = payload[REC_BODY]
        if type(body) is not bytes:
            return  # a split record's body, left in the file (the job holds its BodyRef)
        size = len(body)
        if size <= self.body_max:
            return
        job = self.broker.jobs.get(payload[REC_ID])
        if job is None or job.on_disk or len(job.body) != size:
            return
        at = frame + aof.FRAME_HEADER_SIZE + log_core.body_offset(payload, size)
        self.broker.body_stored(job, BodyRef(self.bodies.gen, at, size, crc32(body)))

    def unencodable(self, records: Sequence[Any]) -> None:
        now_ms = int(self._clock() * 1000)
        for entry in reversed(records):
            if entry[0] not in _ADVISORY:
                self.broker.undo_unencodable(entry, now_ms)

    def _move_bodies(self, gen: int, notes: list[BodyNote], base: int) -> None:
        """Point the references at the copies a rewrite made in the file of generation
        ``gen``, at ``base`` + each note's offset (bodies never change: any copy will do)."""
        jobs = self.broker.jobs
        for job_id, _body, at, size, crc in notes:
            job = jobs.get(job_id)
            if job is not None and job.on_disk:
                job.ref = BodyRef(gen, base + at, size, crc)

    def _read_for_broker(self, ref: BodyRef) -> bytes | None:
        """``Broker.read_body``: the bytes at ``ref`` for a queue policy (deduplication's
        index, REDRIVE), or None, logged and counted as a reply's unreadable body is."""
        try:
            return self.bodies.read(ref)
        except BodyError as exc:
            self.bodies.failed(ref, exc)
            return None

    def _keep_body(self, offset: int, length: int, crc: int) -> BodyRef:
        """Replay: a split record's body stays in the log; its job holds this."""
        return BodyRef(self.bodies.gen, offset, length, crc)

    def _snapshot_encoding(self) -> dict[str, Any]:
        """How a snapshot written outside the loop encodes: bodies read back, records split
        as the writer does (``logfile.write_snapshot``)."""
        if not self.body_max:
            return {}
        return {"pack": aof.new_packer(self.bodies.for_record), "body_max": self.body_max,
                "body_of": self.bodies.for_record}

    def log_size(self) -> int:
        """The log's size with the records not yet written (``maxdisk``); 0 with the log off."""
        writer = self.writer
        if writer is None or not self.enabled:
            return 0
        return writer.good_size + len(self.open_batch.data)

    def _header_flag_set(self) -> bool:
        try:
            with open(self.path, "rb") as f:
                header = aof.decode_header(f.read(aof.HEADER_SIZE), self.path)
        except aof.LogError:
            return False  # _replay reports it if the log is to be loaded at all
        return header is not None and header.enqueue_once

    def _replay(self, now_ms: int, flagged: bool) -> aof.ReadEnd:
        self.loading = True
        t0 = time.perf_counter()
        try:
            end = logfile.load_into(self.path, self.broker, now_ms,
                                    load_truncated=self.load_truncated, warn=self.log.warning,
                                    stored=self._body_loaded if self.body_max else None,
                                    keep=self._keep_body if self.body_max else None)
        except aof.LogError as exc:
            raise StartupError(str(exc)) from exc
        except OSError as exc:
            raise StartupError(f"Cannot read the append only file {self.path}: {exc}") from exc
        finally:
            self.loading = False
        enqueue = self.enqueue_jobs_once or flagged
        self.broker.finish_load(now_ms, enqueue)
        if flagged and end.header is not None:
            logfile.clear_flags(self.path, end.header.version)  # exact queues once only
        self.log.info(
            "DB loaded from append only file: %.3f seconds (%d jobs, %d acks, %d deletes%s)",
            time.perf_counter() - t0, end.counts["job"], end.counts["ack"], end.counts["del"],
            ", queues restored" if enqueue else "",
        )
        return end

    @property
    def enabled(self) -> bool:
        """The log is on: records are written."""
        return self.log_on

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self.log_on = on
        # While the log is off the broker does not build the records of its hot paths
        # (ADDJOB's job record, a delivery's dlv) that submit() would drop: measured 0.7 us of
        # the node's 9.8 per unpipelined GETJOB NOHANG and 10.9 per ADDJOB. Switching on
        # snapshots the broker first, so nothing done while off is missing from the log.
        self.broker.log_wanted = on

    # -----------------------------------------------------------------------------------------
    # Group commit

    # submit, route, failure, done_ticket, take_open_batch: LogCore (node/log_core.py)

    def wake_writer(self) -> None:
        self._wakeup.set()

    # commit_now, the reactor's inline group commit: LogCore (node/log_core.py); its hooks:

    def file_held(self) -> bool:
        return self._write_lock.locked()

    def write_failed(self, batch: Batch, exc: OSError) -> None:
        self._fail(batch, exc)

    def write_recovered(self) -> None:
        self.log.warning("AOF write error looks solved, trisque can write again.")
        self.write_error = None

    def start_auto_rewrite(self) -> None:
        if self._nursery is None:
            return
        size = self.writer.good_size if self.writer else 0
        base = max(self.base_size, 1)
        self.log.info("Starting automatic rewriting of AOF on %d%% growth",
                      (size - base) * 100 // base)
        self._nursery.start_soon(self._rewrite)
        self.rewrite_buf = bytearray()

    async def wait_durable(self, ticket: int) -> None:
        if ticket == 0:
            return
        if ticket <= self.done_ticket:
            error = self.failed.get(ticket)
            if error is not None:
                raise PersistenceError(error)
            return
        in_flight = self.in_flight
        if in_flight is not None and in_flight.ticket == ticket:
            batch = in_flight
        elif self.open_batch.ticket == ticket:
            batch = self.open_batch
        else:  # pragma: no cover - tickets come from submit()
            raise ValueError(f"unknown ticket {ticket}")
        done = self.done_events.get(ticket)
        if done is None:
            done = self.done_events[ticket] = trio.Event()
        await done.wait()
        if batch.error is not None:
            raise PersistenceError(batch.error, batch.entries)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._everysec)  # idle unless the log is on under everysec
            task_status.started()
            while True:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                async with self._write_lock:
                    if self.open_batch.entries and self.writer is not None:
                        await self._write_batch()
                await trio.sleep(0)  # let the clients of the finished batch run first

    async def _write_batch(self) -> None:
        assert self.writer is not None
        batch = self.in_flight = self.take_open_batch()
        data = batch.data
        try:
            if log_core.needs_sync(self, batch):
                await trio.to_thread.run_sync(log_core.write_and_sync, self, self.writer, data)
                self.fsync_latency.observe(self.last_fsync_usec / 1e6)
            else:
                self.writer.write(data)
        except OSError as exc:
            self._fail(batch, exc)
        else:
            log_core.written(self, batch, data)
        finally:
            self.in_flight = None

    def _fail(self, batch: Batch, exc: OSError) -> None:
        """Undo the failed batch and everything submitted after it, newest first."""
        error = _os_error_text(exc)
        if self.write_error is None:
            self.log.warning("%s (replies are errors until writes succeed again; further "
                             "failures of this episode are not logged)", error)
        self.write_error = error
        later = self.take_open_batch()  # submitted after the failed batch: undone too
        self._undo_newest_first(later, batch)
        self._rewrite_cancel = True  # the snapshot may hold state that was just undone
        self._finish(batch, error)
        if later.entries:
            self._finish(later, error)

    def _undo_newest_first(self, *batches: Batch) -> None:
        """Undo the records of ``batches`` (given newest first), newest record first, so
        memory again matches what the log holds."""
        now_ms = int(self._clock() * 1000)
        for batch in batches:
            for entry in reversed(batch.entries):
                if entry[0] not in _ADVISORY:  # a delivery that was not logged still happened
                    self.broker.undo_entry(entry, now_ms)

    def _finish(self, batch: Batch, error: str | None) -> None:
        log_core.finish(self, batch, error)

    async def _everysec(self) -> None:
        while True:
            await trio.sleep(1)
            if self.policy == "everysec":
                await self._sync_now()

    async def _sync_now(self) -> None:
        try:
            async with self._sync_lock:
                # Read under the lock: a rewrite's switch (which holds it) closes the file
                # the log was in before.
                writer = self.writer
                if writer is None or writer.good_size == self.synced_size:
                    return
                target = writer.good_size
                t0 = time.perf_counter()
                await trio.to_thread.run_sync(writer.sync)
        except OSError as exc:
            # The replies were sent already (that is what everysec means); report and retry.
            if self.write_error is None:
                self.log.warning("Error fsyncing the AOF file: %s", exc.strerror or exc)
            self.write_error = _os_error_text(exc)
            return
        log_core.fsynced(self, t0)
        self.fsync_latency.observe(self.last_fsync_usec / 1e6)
        self.synced_size = max(self.synced_size, target)

    # -----------------------------------------------------------------------------------------
    # Rewrite

    async def bgrewrite(self) -> str:
        """Start a rewrite; the Redis status text, or ``PersistenceError`` with the reason."""
        return self.start_rewrite()

    def start_rewrite(self) -> str:
        """``bgrewrite`` without an await (BGREWRITEAOF from the reactor's turn)."""
        if self.rewrite_buf is not None:
            raise PersistenceError("Background append only file rewriting already in progress")
        if self._nursery is None:
            raise PersistenceError("the append only file writer is not running")
        self._nursery.start_soon(self._rewrite)
        self.rewrite_buf = bytearray()  # mark in progress before anyone can ask again
        return "Background append only file rewriting started"

    async def _rewrite(self) -> None:
        self._rewrite_started = time.monotonic()
        self._rewrite_cancel = False
        self.rewrite_buf = bytearray()
        self.rewrite_streamed = 0
        self.rewrite_bodies = []
        moved: list[BodyNote] = []  # bodies in the snapshot, by offset in the new file
        new_gen = 0
        # What is in memory now is in the snapshot; batches written from now on also go to the
        # buffer (records are never pending in the broker: see the module docstring).
        rw: logfile.Rewrite | None = None
        new_file: aof.LogFile | None = None
        ok = False
        try:
            rw = await trio.to_thread.run_sync(logfile.Rewrite, self.path, 0, self._rewrite_step)
            snapshot = self.broker.snapshot()
            incremental = bool(self.config.aof_rewrite_incremental_fsync)
            synced_at = 0
            while True:
                # Encoded as they come: each record is freed at once, so a rewrite of a big
                # table does not promote garbage into the old GC generation (whose collection
                # would stall the loop for as long as a full pass over every job takes).
                if self.body_max:
                    out = bytearray()
                    notes: list[BodyNote] = []
                    log_core.append_noting_bodies(out, list(islice(snapshot, REWRITE_SLICE)),
                                                  self.pack, self.body_max, notes,
                                                  self.body_of)
                    moved.extend((i, b, rw.size + at, n, c) for i, b, at, n, c in notes)
                    data = bytes(out)
                else:
                    data = aof.encode_records(islice(snapshot, REWRITE_SLICE))
                if not data:
                    break
                await trio.to_thread.run_sync(rw.write, data)
                self._check_rewrite_cancel()
                if incremental and rw.size - synced_at >= REWRITE_FSYNC_EVERY:
                    await trio.to_thread.run_sync(rw.sync)
                    synced_at = rw.size
            snapshot_end = rw.size  # the rewrite buffer follows the snapshot
            while len(self.rewrite_buf) > REWRITE_BUFFER_CHUNK:
                await self._drain_rewrite_buffer(rw)
            await trio.to_thread.run_sync(rw.sync)  # the bulk fsync, clients still served
            # The switch: only the group commit (and the everysec fsync) wait for it.
            async with self._write_lock, self._sync_lock:
                self._check_rewrite_cancel()
                await self._drain_rewrite_buffer(rw)
                if self.enabled:  # opened before the rename: the fd follows the inode
                    new_file = await trio.to_thread.run_sync(self._open_file, rw.temp)
                    if self.body_max:
                        new_gen = self.bodies.open(rw.temp)
                try:
                    await trio.to_thread.run_sync(rw.commit)
                finally:
                    if rw.renamed and new_file is not None:
                        # The new file is the log now, even if a later step failed: writing
                        # on to the old, unlinked one would lose every record.
                        old, self.writer = self.writer, aof.LogWriter(new_file)
                        self._follow_policy()
                        new_file = None
                        if old is not None:
                            old.close()
                        self.base_size = self.synced_size = self.writer.good_size
                        if new_gen:
                            # In the same loop turn as the switch: no reply is built between.
                            self._move_bodies(new_gen, moved, 0)
                            self._move_bodies(new_gen, self.rewrite_bodies, snapshot_end)
                            old_gen, self.bodies.gen, new_gen = self.bodies.gen, new_gen, 0
                            self.bodies.close(old_gen)
                self.rewrite_buf = None
            ok = True
            self.rewrites += 1
            self.log.info("Background AOF rewrite finished successfully (%d bytes)", rw.size)
        except (OSError, RuntimeError, _RewriteCancelled) as exc:
            # RuntimeError: the job table changed under an unsafe snapshot iterator.
            self.log.warning("Background AOF rewrite failed: %s", exc)
        finally:
            self.rewrite_bodies = []
            if new_gen:
                self.bodies.close(new_gen)  # the switch did not happen: references stay
            if not ok:
                if new_file is not None:
                    new_file.close()
                if rw is not None:
                    rw.abort()
            self.last_bgrewrite_ok = ok
            self.last_rewrite_time = int(time.monotonic() - self._rewrite_started)
            self.rewrite_buf = None
            memory_use.release_free_heap()

    async def _drain_rewrite_buffer(self, rw: logfile.Rewrite) -> None:
        assert self.rewrite_buf is not None
        data = bytes(self.rewrite_buf)
        self.rewrite_buf.clear()
        if data:
            await trio.to_thread.run_sync(rw.write, data)

    def _check_rewrite_cancel(self) -> None:
        if self._rewrite_cancel:
            raise _RewriteCancelled("a write to the log failed during the rewrite")

    # -----------------------------------------------------------------------------------------
    # CONFIG SET appendonly

    def _follow_policy(self) -> None:
        """The file zero-fills ahead of its writes under ``always`` only (read when a fill is
        due: CONFIG SET changes it): only there does an fdatasync wait for each batch
        (node/logfile.py); elsewhere the fills would cost CPU and disk for nothing."""
        if self.writer is not None and hasattr(self.writer.file, "preallocate"):
            self.writer.file.preallocate = lambda: self.config.appendfsync == "always"

    async def config_changed(self, name: str) -> str | None:
        """Called by the server after a successful CONFIG SET; the error text if the change
        could not be carried out (then it is undone). ``appendfsync`` and the rewrite settings
        are read at each use; ``appendonly`` switches the log on (a full snapshot becomes the
        new log, as Redis starts with a rewrite) or off (flush, fsync, close).

        Switching on is all-or-nothing: whatever fails (the disk, or a bug while taking the
        snapshot), the log stays off, ``appendonly`` reads ``no`` again, and the changes made
        meanwhile, which waited for the log, are undone and answered with the error."""
        if name != "appendonly" or bool(self.config.appendonly) == self.enabled:
            return None
        error: str | None = None
        async with self._write_lock, self._sync_lock:
            if self.config.appendonly:
                # From now on changes are logged and wait in the open batch; the writer starts
                # on them once the snapshot (which they follow) is in place.
                self.enabled = True
                try:
                    records = list(self.broker.snapshot())  # consistent: one loop turn
                    await trio.to_thread.run_sync(lambda: logfile.write_snapshot(
                        self.path, records, **self._snapshot_encoding()))
                    f = await trio.to_thread.run_sync(self._open_file, self.path)
                except Exception as exc:  # noqa: BLE001 - any failure leaves the log off
                    error = _os_error_text(exc) if isinstance(exc, OSError) else repr(exc)
                    self._abandon_enable(error)
                    if isinstance(exc, OSError):
                        self.log.warning("Could not switch the append log on: %s", exc)
                    else:
                        self.log.exception("Could not switch the append log on")
                    return f"Could not switch the append log on: {error}"
                self.writer = aof.LogWriter(f)
                self._follow_policy()
                self.base_size = self.synced_size = self.writer.good_size
                if self.body_max:
                    # A new file: new references name it (older ones keep the old inode open).
                    self.bodies.gen = self.bodies.open(self.path)
                self._wakeup.set()
            else:
                if self.writer is not None:
                    if self.open_batch.entries:
                        await self._write_batch()
                    try:
                        await trio.to_thread.run_sync(self.writer.sync)
                    except OSError as exc:
                        self.log.warning("fsync while switching the append log off: %s", exc)
                    self.writer.close()
                    self.writer = None
                self.enabled = False
        self.log.info("Append log switched %s", "on" if self.enabled else "off")
        return error

    def _abandon_enable(self, error: str) -> None:
        """Undo a failed switch-on: log off, ``appendonly no``, and the changes that waited for
        the log undone and answered with ``error``."""
        self.enabled = False
        self.config.appendonly = False
        waiting = self.take_open_batch()
        self._undo_newest_first(waiting)
        self._finish(waiting, error)

    # -----------------------------------------------------------------------------------------
    # INFO and shutdown

    def info(self) -> list[tuple[str, object]]:
        in_progress = self.rewrite_buf is not None
        size = self.writer.good_size if self.writer else 0
        # The file is longer than the log by its zero-filled tail (node/logfile.py).
        file_size = getattr(self.writer.file, "file_size", None) if self.writer else None
        return [
            ("loading", int(self.loading)),
            ("aof_enabled", int(self.enabled)),
            ("aof_state", "on" if self.enabled else "off"),
            ("aof_rewrite_in_progress", int(in_progress)),
            ("aof_rewrite_scheduled", 0),
            ("aof_last_rewrite_time_sec", self.last_rewrite_time),
            ("aof_current_rewrite_time_sec",
             int(time.monotonic() - self._rewrite_started) if in_progress else -1),
            ("aof_last_bgrewrite_status", "ok" if self.last_bgrewrite_ok else "err"),
            ("aof_last_write_status", "ok" if self.write_error is None else "err"),
            ("aof_fsync_count", self.fsync_count),
            ("aof_last_fsync_latency_usec", self.last_fsync_usec),
            ("aof_current_size", size),
            ("aof_base_size", self.base_size),
            ("aof_preallocated_size", file_size() - size if file_size is not None else 0),
            ("body_memory_max", self.body_max),
            ("jobs_bodies_on_disk", getattr(self.broker, "disk_bodies", 0)),
            ("log_bytes", size),
            ("log_live_bytes", getattr(self.broker, "disk_body_bytes", 0)),
            ("bodies_unreadable", self.bodies.failures),
        ]

    async def shutdown(self, rewrite: bool) -> None:
        """Write what is pending and fsync; with ``rewrite`` replace the log by a snapshot that
        restores the queues exactly at the next start (SHUTDOWN REWRITE-AOF)."""
        self._rewrite_cancel = True
        async with self._write_lock, self._sync_lock:
            if self.writer is not None and self.open_batch.entries:
                await self._write_batch()
            if self.writer is not None:
                try:
                    await trio.to_thread.run_sync(self.writer.sync)
                    self.fsync_count += 1
                except OSError as exc:
                    self.log.warning("fsync at shutdown failed: %s", exc)
            if rewrite:
                records = list(self.broker.snapshot())  # consistent: taken in one loop turn
                await trio.to_thread.run_sync(
                    lambda: logfile.write_snapshot(self.path, records, aof.FLAG_ENQUEUE_ONCE,
                                                   **self._snapshot_encoding()))
                self.log.info("Append only file rewritten for a restart with the same queues "
                              "(%d jobs)", len(records))
            if self.writer is not None:
                self.writer.close()
                self.writer = None


class _RewriteCancelled(Exception):
    pass


__all__ = ["Persistence", "PersistenceError", "StartupError"]
