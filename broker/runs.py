"""Run records: what script workers (``trisque worker``) report about the jobs they run.

Theory of operation
-------------------
A *run* is one execution of one job by one worker process: it starts when the worker has taken
the job and spawned its script, collects the script's status lines and the tail of its output
while it runs, and ends in a final state with an exit code and a reason. The worker reports all
of it with ``JOBRUN START|STATUS|APPEND|END`` (``protocol.commands.JobRun``); users and the
dashboard read it with ``JOBRUN GET|OUTPUT|LIST`` or, in process, through ``RunTable.running``,
``recent`` and ``get``.

Identity: ``START`` returns a run token, ``<first 8 hex of the node ID>-<counter>``, and the
writes name the token, not the job: two runs of one job (a job redelivered after RETRY while
its first run still goes on) never write into each other's record, and a token from another
node (a worker that failed over) is unknown here, so the worker learns it must start the run
again on its new node. ``get(job_id)`` is the newest run of that job.

States: ``running`` until ``END`` sets one of ``RUN_STATES`` (the worker's verdict), or until
the node gives up on it: a running run not written for ``LEASE_MS`` becomes ``lost`` (the
worker died or lost this node; a live worker writes at least every few seconds, an empty
``APPEND`` when the script is silent). A run that ended is never written again.

Output: the worker sends chunks with their absolute offset (``APPEND token offset bytes``); a
chunk overlapping what is known is trimmed (retries and replays are harmless), one past the end
leaves a gap (the worker skipped output it could not forward fast enough). Each run keeps only
the last ``OUTPUT_TAIL_BYTES``; offsets stay absolute, so a streaming reader sees a jump when it
fell behind (``read_output``).

Bounds: at most ``MAX_RUNNING`` runs running, ``MAX_FINISHED`` finished ones (the oldest
finished is dropped), ``MAX_STATUS_LINES`` status lines per run (the newest kept, the others
counted), ``MAX_LINE_BYTES`` per status line and reason, and ``MAX_OUTPUT_BYTES`` of output
tails in all: past it the tails of finished runs go first, oldest first, then those of running
ones. Everything here is in memory: records are observations of processes, not job state; the
worker's log file is the durable copy of the output, and the job's own fate (acked, nacked,
re-added) is in the append log as always. A restart forgets the runs.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

from protocol import errors
from protocol.commands import RUN_LINE_MAX, JobRun
from protocol.resp import OK, Error

LEASE_MS: Final = 30_000
MAX_RUNNING: Final = 1000
MAX_FINISHED: Final = 1000
MAX_STATUS_LINES: Final = 100
MAX_LINE_BYTES: Final = RUN_LINE_MAX  # checked by the parser (protocol/commands.py)
OUTPUT_TAIL_BYTES: Final = 256 * 1024
MAX_OUTPUT_BYTES: Final = 64 * 1024 * 1024

RUNNING: Final = "running"
LOST: Final = "lost"

NORUN: Final = Error("NORUN No such run running on this node (unknown, ended, lost or evicted)")
TOO_MANY: Final = Error(f"ERR Too many runs running on this node (at most {MAX_RUNNING})")


@dataclass(eq=False)
class Run:
    """One execution of one job; see the module docstring. Times are Unix ms."""

    job_id: bytes
    queue: bytes
    worker: str
    pid: int
    started_ms: int
    attempt: int
    token: bytes = b""
    ended_ms: int = 0
    state: str = RUNNING
    exit_code: int | None = None
    reason: str = ""
    status: list[tuple[int, str]] = field(default_factory=list)
    status_dropped: int = 0
    seen_ms: int = 0  # the last write: the lease runs from here
    output_size: int = 0  # bytes of output so far, kept or not (absolute offset of the end)
    _tail: bytearray = field(default_factory=bytearray, repr=False)

    @property
    def output_start(self) -> int:
        """The absolute offset of the first output byte still kept."""
        return self.output_size - len(self._tail)

    @property
    def last_status(self) -> str:
        return self.status[-1][1] if self.status else ""

    def read_output(self, offset: int) -> tuple[bytes, int]:
        """The kept output from ``offset`` (or from the first byte kept, if that is later) and
        the offset to read from next. A reader compares ``next - len(data)`` with the offset
        it asked for to learn it skipped bytes that were dropped."""
        start = max(offset, self.output_start)
        if start >= self.output_size:
            return b"", self.output_size
        return bytes(self._tail[start - self.output_start:]), self.output_size

    def append_output(self, offset: int, chunk: bytes) -> int:
        """Add ``chunk`` found at absolute ``offset``; returns the bytes the tail grew by
        (negative when it shrank: a gap cleared it)."""
        before = len(self._tail)
        if offset > self.output_size:
            self._tail.clear()  # a gap: the bytes in between were never forwarded
            self.output_size = offset
        skip = self.output_size - offset
        if skip >= len(chunk):
            return 0
        new = chunk[skip:]
        self._tail += new
        self.output_size += len(new)
        excess = len(self._tail) - OUTPUT_TAIL_BYTES
        if excess > 0:
            del self._tail[:excess]
        return len(self._tail) - before

    def drop_output(self) -> int:
        freed = len(self._tail)
        self._tail = bytearray()
        return freed

    def add_status(self, now_ms: int, line: str) -> None:
        self.status.append((now_ms, line))
        if len(self.status) > MAX_STATUS_LINES:
            del self.status[0]
            self.status_dropped += 1

    def finish(self, now_ms: int, state: str, exit_code: int | None, reason: str) -> None:
        self.state = state
        self.ended_ms = now_ms
        self.exit_code = exit_code
        self.reason = reason

    def reply(self, *, full: bool) -> list[Any]:
        """The RESP shape: field/value pairs, as SHOW and QSTAT. ``full`` adds the status
        lines; otherwise only the last one (LIST)."""
        out: list[Any] = [
            b"id", self.job_id,
            b"run", self.token,
            b"queue", self.queue,
            b"state", self.state.encode(),
            b"worker", self.worker.encode(),
            b"pid", self.pid,
            b"attempt", self.attempt,
            b"started-ms", self.started_ms,
            b"ended-ms", self.ended_ms,
            b"exit-code", self.exit_code,
            b"reason", self.reason.encode(),
            b"output-size", self.output_size,
            b"output-start", self.output_start,
        ]
        if full:
            out += [b"status-dropped", self.status_dropped,
                    b"status", [[ms, line.encode()] for ms, line in self.status]]
        else:
            out += [b"last-status", self.last_status.encode()]
        return out


class RunTable:
    """Every run this node knows, running and recently finished (``broker.runs``)."""

    def __init__(self, node_id: str) -> None:
        self.prefix = node_id[:8].encode()
        self._counter = 0
        # Both in start order, oldest first; a finished run moves from one to the other.
        self._running: OrderedDict[bytes, Run] = OrderedDict()
        self._finished: OrderedDict[bytes, Run] = OrderedDict()
        self._by_job: dict[bytes, Run] = {}  # the newest run of each job still kept
        self.output_bytes = 0  # the sum of the kept tails
        self.started = 0  # runs ever started here (INFO)
        self.lost = 0

    # -- reads (the dashboard's interface) -------------------------------------------------

    def running(self) -> list[Run]:
        """The running runs, newest first."""
        return list(reversed(self._running.values()))

    def recent(self, limit: int) -> list[Run]:
        """Running and finished runs, newest started first, at most ``limit``."""
        runs = [*self._running.values(), *self._finished.values()]
        runs.sort(key=lambda r: (r.started_ms, r.token), reverse=True)
        return runs[:max(limit, 0)]

    def get(self, job_id: bytes) -> Run | None:
        """The newest run of ``job_id`` kept here."""
        return self._by_job.get(job_id)

    def by_token(self, token: bytes) -> Run | None:
        return self._running.get(token) or self._finished.get(token)

    # -- writes ----------------------------------------------------------------------------

    def start(self, job_id: bytes, queue: bytes, worker: str, pid: int, attempt: int,
              now_ms: int) -> Run | Error:
        if len(self._running) >= MAX_RUNNING:
            return TOO_MANY
        self._counter += 1
        token = self.prefix + b"-%d" % self._counter
        run = Run(job_id, queue, worker, pid, now_ms, attempt, token=token, seen_ms=now_ms)
        self._running[token] = run
        self._by_job[job_id] = run
        self.started += 1
        return run

    def _live(self, token: bytes, now_ms: int) -> Run | None:
        run = self._running.get(token)
        if run is not None:
            run.seen_ms = now_ms
        return run

    def status(self, token: bytes, line: str, now_ms: int) -> bool:
        run = self._live(token, now_ms)
        if run is None:
            return False
        run.add_status(now_ms, line)
        return True

    def append(self, token: bytes, offset: int, chunk: bytes, now_ms: int) -> int | None:
        """The run's output size after the chunk, or None for an unknown token."""
        run = self._live(token, now_ms)
        if run is None:
            return None
        self.output_bytes += run.append_output(offset, chunk)
        if self.output_bytes > MAX_OUTPUT_BYTES:
            self._shed_output(keep=run)
        return run.output_size

    def end(self, token: bytes, state: str, exit_code: int | None, reason: str,
            now_ms: int) -> bool:
        run = self._running.pop(token, None)
        if run is None:
            return False
        run.finish(now_ms, state, exit_code, reason)
        self._retire(run)
        return True

    def expire(self, now_ms: int) -> None:
        """Runs whose worker stopped writing for ``LEASE_MS`` become ``lost``."""
        stale = [r for r in self._running.values() if now_ms - r.seen_ms >= LEASE_MS]
        for run in stale:
            del self._running[run.token]
            run.finish(now_ms, LOST, None,
                       f"the worker sent nothing for {LEASE_MS // 1000} s (it died, or lost "
                       "its connection to this node)")
            self.lost += 1
            self._retire(run)

    def _retire(self, run: Run) -> None:
        self._finished[run.token] = run
        while len(self._finished) > MAX_FINISHED:
            _, old = self._finished.popitem(last=False)
            self.output_bytes -= old.drop_output()
            if self._by_job.get(old.job_id) is old:
                del self._by_job[old.job_id]

    def _shed_output(self, keep: Run) -> None:
        """Drop whole tails, finished runs' first, oldest first, until under the budget.
        ``keep`` (the run being written) goes last: its newest bytes are what a reader is
        following."""
        for run in [*self._finished.values(), *self._running.values()]:
            if self.output_bytes <= MAX_OUTPUT_BYTES:
                return
            if run is not keep:
                self.output_bytes -= run.drop_output()
        if self.output_bytes > MAX_OUTPUT_BYTES:
            self.output_bytes -= keep.drop_output()

    # -- the command -----------------------------------------------------------------------

    def command(self, cmd: JobRun, now_ms: int) -> Any:
        """``JOBRUN``: see ``protocol.commands.JobRun`` for the forms and docs/worker.md."""
        sub = cmd.sub
        if sub == "START":
            started = self.start(cmd.job_id, cmd.queue, cmd.text, cmd.pid, cmd.attempt, now_ms)
            return started if isinstance(started, Error) else started.token
        if sub == "STATUS":
            return OK if self.status(cmd.token, cmd.text, now_ms) else NORUN
        if sub == "APPEND":
            size = self.append(cmd.token, cmd.offset, cmd.chunk, now_ms)
            return NORUN if size is None else size
        if sub == "END":
            ended = self.end(cmd.token, cmd.state, cmd.exit_code, cmd.text, now_ms)
            return OK if ended else NORUN
        if sub == "GET":
            run = self.get(cmd.job_id)
            return None if run is None else run.reply(full=True)
        if sub == "OUTPUT":
            run = self.get(cmd.job_id)
            if run is None:
                return None
            data, nxt = run.read_output(cmd.offset)
            return [nxt - len(data), nxt, data]
        if sub == "LIST":
            runs = self.running()[:cmd.limit] if cmd.running_only else self.recent(cmd.limit)
            return [r.reply(full=False) for r in runs]
        return errors.SYNTAX  # the parser admits no other subcommand
