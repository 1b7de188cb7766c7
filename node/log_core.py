"""The append log's per-command path, without trio: compiled with mypyc as part of the core.

Theory of operation
-------------------
``node/persistence.py`` explains the group commit. This module holds the part of it that runs
for every command that logs, and the bookkeeping its readers consult per reply:

* ``route`` (``Server.route`` is this object's bound ``route``): a command's effects sorted
  into log records, handed to ``submit``, and replies for other clients, handed back;
* ``submit``: the records encoded straight into the *open batch*'s buffer with the loop's own
  msgpack packer, kept for the undo, and the batch's ticket returned (0: nothing to wait for);
* the tickets: ``done_ticket`` (every batch up to it finished), ``failure(ticket)``,
  ``last_ticket`` (the newest batch a reply waits for), and ``take_open_batch``.

``LogCore`` is the compiled base of the interpreted ``Persistence``, which adds everything that
waits or writes (the writer task, the fdatasync thread, the rewrite, trio's events). Compiled
code calls a method of an object of an interpreted subclass through Python, so the hot code is
in module functions (``route``, ``submit``, ``commit_now``, ``take_open_batch``, ``finish``)
that read the declared attributes directly; the methods only forward to them for the
interpreted callers. The one call out of this module on the hot path is ``wake_writer`` (the
interpreted ``Persistence`` sets trio's event), and only for records made outside a reactor
round: a round commits its own batch at its end (``Persistence.commit_now``).

A batch holds no ``trio.Event``: ``Persistence`` makes one only for a ticket someone awaits
(``wait_durable``), so the common case (the reactor's round, which reads ``done_ticket`` right
after its commit) builds none.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

from mypy_extensions import mypyc_attr

from broker import aof
from broker.effects import Effect, LogRecord, Reply
from broker.job import REC_ID, REC_QUEUE, BodyRef, Job
from broker.stats import LATENCY_BUCKETS, Histogram

_ADVISORY: Final = aof.ADVISORY_KINDS
# Failures remembered for ``failure(ticket)``: a reply asks right after its batch finished.
MAX_FAILURES_KEPT: Final = 256
# /metrics' group-commit batch sizes: records and bytes per write.
BATCH_RECORD_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
BATCH_BYTE_BUCKETS: Final = (256, 1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20)


class LogSettings(Protocol):
    """The directives the append log reads (broker.config.Config has them all)."""

    appendonly: bool
    appendfsync: str
    dir: str
    appendfilename: str
    aof_load_truncated: bool
    aof_enqueue_jobs_once: bool
    aof_rewrite_incremental_fsync: bool
    auto_aof_rewrite_percentage: int
    auto_aof_rewrite_min_size: int


# (job ID, body bytes or BodyRef, offset, length, CRC-32 of the body)
BodyNote = tuple[bytes, Any, int, int, int]


def body_offset(payload: list[Any], size: int) -> int:
    """Where the body of the job record ``payload`` (``size`` bytes long) starts in the frame's
    msgpack payload ``["job", record]`` packed with ``use_bin_type``: after the outer array
    (1 byte), "job" (4), the record's array header, its ID and queue, and the body's own
    header. tests/aof/test_bodies_on_disk.py holds it to what msgpack writes."""
    job_id: bytes = payload[REC_ID]
    queue: bytes = payload[REC_QUEUE]
    n = len(payload)
    at = 5 + (1 if n < 16 else 3)
    at += _bin_header(len(job_id)) + len(job_id) + _bin_header(len(queue)) + len(queue)
    return at + _bin_header(size)


def _bin_header(n: int) -> int:
    return 2 if n < 256 else 3 if n < 65536 else 5


def append_noting_bodies(buf: bytearray, records: Sequence[Any], pack: aof.Pack, body_max: int,
                         notes: list[BodyNote],
                         body_of: Callable[[Any], bytes] | None = None) -> None:
    """``aof.append_records`` splitting each job record whose body is longer than
    ``body_max`` (or is a reference, read back by ``body_of``), noting in ``notes`` where
    each such body lands in ``buf``. All or nothing, as ``append_records``."""
    aof.append_records(buf, records, pack, body_max, body_of, notes)


class Batch:
    """Records waiting to be written together: the frames in ``data``, the ``LogRecord``s in
    ``entries`` (for the undo of a failed write)."""

    def __init__(self, ticket: int) -> None:
        self.ticket = ticket
        self.entries: list[Any] = []
        self.data = bytearray()
        self.error: str | None = None
        # Bodies past body-memory-max in ``data``: (job ID, body or BodyRef, its offset in
        # ``data``, length, CRC-32), for the references set once the batch is written.
        self.bodies: list[BodyNote] = []


@mypyc_attr(allow_interpreted_subclasses=True)
class LogCore:
    """The open batch and the tickets (``node.persistence.Persistence`` is the whole log)."""

    def __init__(self, config: LogSettings, inline_fsync_max_usec: int) -> None:
        self.config = config
        self.log_on = False  # records are kept and written (Persistence.enabled)
        # True while a reactor round runs: the round commits at its end (``commit_now``), so
        # its records do not wake the writer task.
        self.round_open = False
        self.next_ticket = 1
        self.open_batch = Batch(self.next_ticket)
        self.in_flight: Batch | None = None  # being written by the writer task
        self.done_ticket = 0  # every ticket up to this one is finished
        self.last_ticket = 0  # the newest batch submitted with a record a reply waits for
        self.failed: dict[int, str] = {}  # recent failed tickets -> error (bounded)
        self.pack = aof.new_packer()  # the event loop's own: no pool, no lock
        # Set by a ticket's waiter (``Persistence.wait_durable``: trio events, typed Any here
        # where trio is not imported); set and dropped when the batch finishes.
        self.done_events: dict[int, Any] = {}

        # The file and what the inline commit keeps of it (Persistence: see there).
        self.writer: aof.LogWriter | None = None
        self.synced_size = 0
        self.base_size = 0  # the log's size after the last rewrite (automatic rewrites)
        self.write_error: str | None = None  # set during a failure episode
        # Every batch written since a rewrite started, for the new file (None: no rewrite).
        self.rewrite_buf: bytearray | None = None
        self.inline_fsync_max_usec = inline_fsync_max_usec
        # Statistics for INFO
        self.fsync_count = 0
        self.last_fsync_usec = 0
        # ... and for /metrics (node/metrics.py): every fdatasync's latency, and each batch's
        # records and bytes (the group commit's batch size).
        self.fsync_latency = Histogram(LATENCY_BUCKETS)
        self.batch_records = Histogram(BATCH_RECORD_BUCKETS)
        self.batch_bytes = Histogram(BATCH_BYTE_BUCKETS)
        self.inline_commits = 0  # batches written by commit_now (the rest: the writer task)
        # body-memory-max while bodies may go to the log (0: every body stays in memory).
        self.body_max = 0
        # Reads back a body the log holds, for a record that carries it again (node/bodies.py).
        self.body_of: Callable[[Any], bytes] | None = None
        # While a rewrite runs: the bytes appended to ``rewrite_buf`` since it started, and
        # where the bodies in them are (offsets in that stream), for the new references.
        self.rewrite_streamed = 0
        self.rewrite_bodies: list[BodyNote] = []
        # Set by Persistence: the broker (its ``jobs`` and ``body_stored``, for the
        # references) and the read descriptors (``node.bodies.BodyFiles``: the current file's
        # generation); typed Any, as the log sees the broker through a Protocol.
        self.broker: Any = None
        self.bodies: Any = None

    # -- after a write ------------------------------------------------------------------------

    def bodies_written(self, batch: Batch, offset: int) -> None:
        """``batch``, holding bodies past body-memory-max, was written at ``offset``: the jobs
        keep references instead of their bodies (compiled: once per body an ADDJOB adds)."""
        broker = self.broker
        jobs: dict[bytes, Job] = broker.jobs
        stored = broker.body_stored
        gen: int = self.bodies.gen
        for job_id, _body, at, size, crc in batch.bodies:
            job = jobs.get(job_id)
            # A job's body never changes, so any record of it carries the same bytes.
            if job is not None and not job.on_disk and len(job.body) == size:
                stored(job, BodyRef(gen, offset + at, size, crc))

    # -- hooks the interpreted subclass provides (each runs at most once per batch) -----------

    def wake_writer(self) -> None:
        """Records wait outside a round: wake the writer task."""

    def file_held(self) -> bool:
        """A batch in the writer task, a rewrite's switch or CONFIG SET appendonly holds the
        file: the inline commit leaves the batch to the writer task."""
        return False

    def write_failed(self, batch: Batch, exc: OSError) -> None:
        """Undo ``batch`` (and what followed it) and finish it with the error."""

    def write_recovered(self) -> None:
        """A write succeeded after a failure episode: say so."""

    def start_auto_rewrite(self) -> None:
        """The log grew past auto-aof-rewrite-percentage: start a rewrite."""

    def unencodable(self, records: Sequence[Any]) -> None:
        """A command's ``records`` could not be encoded (a body the log holds could not be
        read back into one): undo them, so memory matches the log."""

    # -- for the interpreted callers ------------------------------------------------------------

    def commit_now(self) -> bool:
        return commit_now(self)

    def route(self, effects: list[Effect], replies: list[Reply]) -> int:
        return route(self, effects, replies)

    def submit(self, records: Sequence[Any]) -> int:
        return submit(self, records)

    def sync_due(self) -> bool:
        """The open batch will be fdatasynced when committed: ``always``, and it holds a record
        a reply waits for."""
        return self.last_ticket == self.open_batch.ticket and self.config.appendfsync == "always"

    def failure(self, ticket: int) -> str | None:
        """The error of a finished batch whose write failed, None if it succeeded (asked right
        after it finished: only the last ``MAX_FAILURES_KEPT`` failures are kept)."""
        return self.failed.get(ticket)

    def take_open_batch(self) -> Batch:
        return take_open_batch(self)


def waiting_ticket(core: LogCore) -> int:
    """The newest log batch a reply may wait for and that is not durable yet (0 when the log
    is idle or off)."""
    return core.last_ticket if core.last_ticket > core.done_ticket else 0


def route(core: LogCore, effects: list[Effect], replies: list[Reply]) -> int:
    """The one place the broker's effects go where they belong: log records to the open batch
    (dropped while the log is off), replies to other clients into ``replies`` for the caller
    to dispatch. The log ticket to wait for, or 0."""
    if len(effects) == 1 and type(effects[0]) is LogRecord:
        return submit(core, effects)  # an ADDJOB's or a GETJOB's one record: the common case
    records: list[Any] = []
    for effect in effects:
        if type(effect) is LogRecord:
            records.append(effect)
        elif type(effect) is Reply:
            replies.append(effect)
    return submit(core, records)


def submit(core: LogCore, records: Sequence[Any]) -> int:
    """Add ``records`` (``LogRecord``s) to the open batch; the ticket to wait for, 0 when there
    is nothing to wait for (no records, only advisory ones, or the log is off: they are
    dropped). Raises what msgpack raises for a record it cannot encode, adding nothing."""
    if not records or not core.log_on:
        return 0
    batch = core.open_batch
    if core.body_max:
        try:
            append_noting_bodies(batch.data, records, core.pack, core.body_max, batch.bodies,
                                 core.body_of)
        except OSError:  # node/bodies.BodyError: a damaged body, nothing was added
            core.unencodable(records)
            raise
    else:
        aof.append_records(batch.data, records, core.pack)
    batch.entries.extend(records)
    # Never written here, per command: the reactor's round (commit_now) or the writer task
    # joins the records of every connection served meanwhile into one write(2). Writing per
    # command was measured at about half the ADDJOB throughput (12-13k vs 22-23k ops/s, 50
    # conns).
    if not core.round_open:
        core.wake_writer()
    if all_advisory(records):
        return 0  # a GETJOB's dlv: its reply does not wait for the disk
    core.last_ticket = batch.ticket
    return batch.ticket


def take_open_batch(core: LogCore) -> Batch:
    """The open batch, replaced by a new empty one."""
    core.next_ticket += 1
    taken = core.open_batch
    core.open_batch = Batch(core.next_ticket)
    return taken


def commit_now(core: LogCore) -> bool:
    """Write the open batch in the calling task, without waiting for anyone: one write, and
    under ``always`` one fdatasync (the reactor's group commit at the end of each round, as
    Disque's beforeSleep). False, leaving it to the writer task, when a batch is in flight
    there or a rewrite or CONFIG SET appendonly holds the file, or under ``always`` once an
    fdatasync took longer than ``inline_fsync_max_usec``; True when there was nothing to write
    or it was written (or failed and was undone)."""
    batch = core.open_batch
    if not batch.entries:
        return True
    sync = needs_sync(core, batch)
    writer = core.writer
    if (writer is None or core.in_flight is not None or core.file_held()
            or (sync and core.last_fsync_usec > core.inline_fsync_max_usec)):
        core.wake_writer()
        return False
    take_open_batch(core)
    # The taken batch's buffer is written as it is: nothing appends to it any more.
    data = batch.data
    core.inline_commits += 1
    try:
        if sync:
            write_and_sync(core, writer, data)
            core.fsync_latency.observe(core.last_fsync_usec / 1e6)
        else:
            writer.write(data)
    except OSError as exc:
        core.write_failed(batch, exc)
    else:
        written(core, batch, data)
    return True


def needs_sync(core: LogCore, batch: Batch) -> bool:
    """Under ``always`` a batch is fdatasynced unless it holds only advisory records (read at
    each use: CONFIG SET changes the policy at run time)."""
    return core.config.appendfsync == "always" and not all_advisory(batch.entries)


def write_and_sync(core: LogCore, writer: aof.LogWriter, data: bytearray) -> None:
    """One write and one fdatasync for a whole batch (in the writer's worker thread, or
    inline in ``commit_now``)."""
    before = writer.good_size
    writer.write(data)
    t0 = time.perf_counter()
    writer.sync(unsynced_from=before)
    fsynced(core, t0)
    core.synced_size = writer.good_size


def fsynced(core: LogCore, t0: float) -> None:
    core.last_fsync_usec = int((time.perf_counter() - t0) * 1e6)
    core.fsync_count += 1


def written(core: LogCore, batch: Batch, data: bytearray) -> None:
    """``batch`` reached the file (and the disk, if it had to)."""
    if core.write_error is not None:
        core.write_recovered()
    rewrite_buf = core.rewrite_buf
    if batch.bodies:
        writer = core.writer
        if writer is not None:
            core.bodies_written(batch, writer.good_size - len(data))
        if rewrite_buf is not None:
            streamed = core.rewrite_streamed
            for job_id, body, at, size, crc in batch.bodies:
                core.rewrite_bodies.append((job_id, body, streamed + at, size, crc))
    if rewrite_buf is not None:
        rewrite_buf.extend(data)
        core.rewrite_streamed += len(data)
    core.batch_records.observe(len(batch.entries))
    core.batch_bytes.observe(len(data))
    finish(core, batch, None)
    if auto_rewrite_due(core):
        core.start_auto_rewrite()


def auto_rewrite_due(core: LogCore) -> bool:
    """The log grew by auto-aof-rewrite-percentage since the last rewrite (and is at least
    auto-aof-rewrite-min-size), and no rewrite runs."""
    pct = core.config.auto_aof_rewrite_percentage
    if core.rewrite_buf is not None or pct <= 0:
        return False
    writer = core.writer
    size = writer.good_size if writer is not None else 0
    base = max(core.base_size, 1)
    return size >= core.config.auto_aof_rewrite_min_size and (size - base) * 100 // base >= pct


def all_advisory(entries: Sequence[Any]) -> bool:
    """Advisory records only (dlv): no reply waits for them, so ``submit`` gives no ticket and,
    under ``always``, a batch of them is written without its own fdatasync (the next batch's
    fdatasync covers it)."""
    for entry in entries:
        if entry[0] not in _ADVISORY:
            return False
    return True


def finish(core: LogCore, batch: Batch, error: str | None) -> None:
    """``batch`` is written (``error`` None) or failed and undone: its ticket is done, and
    its waiters, if any, are woken."""
    batch.error = error
    if batch.ticket > core.done_ticket:
        core.done_ticket = batch.ticket
    if error is not None:
        failed = core.failed
        failed[batch.ticket] = error
        if len(failed) > MAX_FAILURES_KEPT:
            del failed[min(failed)]
    if core.done_events:
        done = core.done_events.pop(batch.ticket, None)
        if done is not None:
            done.set()
