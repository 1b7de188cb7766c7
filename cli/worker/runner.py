"""One job, from GETJOB's reply to its ACK, NACK or re-add: the script's whole life.

Theory of operation
-------------------
``JobRunner.run`` prepares the job's environment (the body in a file of a private temporary
directory, and in ``TRISQUE_BODY`` when it is text of at most 64 KB), spawns the command
(``cli.worker.process``), and supervises it with six tasks in one nursery:

* the output pump: stdout and stderr into the job's log file (``cli.worker.joblog``) and into
  the run report's tail (``cli.worker.report``), read as fast as the script writes;
* the status reader: fd 3's lines (``cli.worker.status``) into the run record; ``dup``
  answered on fd 4; the first ``done``/``err``/``resend`` kept as the final word; a protocol
  violation stops the script;
* the result reader: what the script writes to fd 4 (a socket, so the same descriptor carries
  ``dup``'s answers the other way), up to the node's ``result-max-size``; past it the rest is
  read and dropped (a script blocked on a full socket would never end) and the run fails;
* WORKING at once (the retry period runs from queueing, not from delivery) and then every
  third of the job's RETRY, so the job is not queued again while its script runs;
* the report's flusher (output chunks and heartbeats to the node's run record);
* the guard: on the time limit, a violation or the worker's shutdown, SIGTERM to the process
  group, SIGKILL ``kill_after`` seconds later.

When the script's process exits, whatever it left in its group is killed (a job's processes
end with the job), the pipes are drained, and ``status.decide`` gives the verdict, which is
carried out: ACKJOB, or RESOLVE with the job's result (fd 4's bytes; without any, with
``--result output``, its output); for a failure (RQ's ``err``) ``QPOLICY PARK``, which moves the job out
of its queue with why (``broker/parking.py``), unless ``--retries`` allows another run: then
``retry_after`` is set and the worker NACKs the job after that backoff without holding a slot
(``Worker._retry_later``); NACK at once when the worker's shutdown stopped the script; or for
``resend N``: ADDJOB of a copy with DELAY N (same body, RETRY, the remaining TTL plus N) and
then ACKJOB of the original. Disque cannot delay a job that exists (NACK queues it at once), so
the copy has a new ID; the run record of the original says which. If the worker dies between
the two steps the job exists twice, once delayed: at-least-once, never lost. Network errors on
these calls are retried for ``SETTLE_S`` seconds; after that the job's own RETRY brings it
back. Last, the run record is closed with the state, the exit status and the reason.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import trio

from cli.worker import status
from cli.worker.joblog import JobLog, LogDir
from cli.worker.leftovers import RunningScripts
from cli.worker.process import ScriptProcess, spawn, spawn_error_text
from cli.worker.report import RunReport
from cli.worker.settings import Settings
from client.aio import AsyncClient
from client.commands import Job, JobInfo
from client.core import ResponseError, TrisqueError

BODY_ENV_MAX: Final = 64 * 1024
DRAIN_S: Final = 2.0  # after the script's exit, how long its pipes may stay open
SETTLE_S: Final = 15.0  # how long ACK/NACK/ADDJOB are retried through node failures
ADDJOB_TIMEOUT_MS: Final = 5000
ANSWER_TIMEOUT_S: Final = 5.0
EARLY_CLOSE_S: Final = 0.2
READ_CHUNK: Final = 256 * 1024
MAX_NOTE: Final = 4000  # QPOLICY PARK's reason (the node takes up to 4096 bytes)
RESULT_MAX: Final = 1024 * 1024  # the node's default result-max-size (Worker asks the node)

log = logging.getLogger("trisque.worker")
T = TypeVar("T")


def job_environment(base: dict[str, str], job: Job, attempt: int, body_file: Path,
                    node: str, worker: str, log_file: Path) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith("TRISQUE_")}
    env.update({
        "TRISQUE_JOB_ID": job.id,
        "TRISQUE_QUEUE": job.queue,
        "TRISQUE_BODY_FILE": str(body_file),
        "TRISQUE_ATTEMPT": str(attempt),
        "TRISQUE_NACKS": str(job.nacks or 0),
        "TRISQUE_ADDITIONAL_DELIVERIES": str(job.additional_deliveries or 0),
        "TRISQUE_NODE": node,
        "TRISQUE_WORKER": worker,
        "TRISQUE_LOG_FILE": str(log_file),
        "TRISQUE_WRITE": "3",
        "TRISQUE_READ": "4",
    })
    if len(job.body) <= BODY_ENV_MAX and b"\0" not in job.body:
        try:
            env["TRISQUE_BODY"] = job.body.decode("utf-8")
        except UnicodeDecodeError:
            pass  # not text: the file only
    return env


class JobRunner:
    def __init__(self, settings: Settings, client: AsyncClient, logs: LogDir, job: Job,
                 scripts: RunningScripts | None = None, result_max: int = RESULT_MAX) -> None:
        self.settings = settings
        self.scripts = scripts  # where the script's process group is recorded while it runs
        self.client = client
        self.logs = logs
        self.job = job
        self.attempt = 1 + (job.nacks or 0) + (job.additional_deliveries or 0)
        self.outcome = status.Outcome()
        self.report = RunReport(self.client, job.id, job.queue, self.attempt,
                                self.settings.name)
        self._stop = trio.Event()  # set: the guard stops the script
        self._notes: list[str] = []
        self._status_closed_at: float | None = None
        self._exited = False  # the script's own process exited
        self._last_error = ""  # the last failed node call, for the reason
        self.state = ""
        self.log_path = ""
        self.info: JobInfo | None = None  # SHOW's answer, when the node gave one
        self.result_max = result_max  # the node's result-max-size
        self._written = bytearray()  # what the script wrote to fd 4, up to result_max
        self._written_total = 0  # every byte it wrote there, kept or not
        self._output = bytearray()  # the first result_max bytes of its output (--result output)
        self.result: bytes | None = None  # RESOLVE's result instead of ACKJOB, when set
        # Set when a failed run is to be retried: seconds to wait before the NACK, which the
        # worker does without holding a slot (Worker._retry_later).
        self.retry_after: float | None = None

    # -- the worker's handle ---------------------------------------------------------------

    def stop(self, why: str) -> None:
        """Stop the script (worker shutdown); the job is NACKed. Nothing to stop once it
        exited (the run is only draining its pipes and settling the job)."""
        if not self._stop.is_set() and not self._exited:
            self.outcome.stopped = why
            self._stop.set()

    # -- the run -----------------------------------------------------------------------------

    async def run(self) -> None:
        job = self.job
        info = self.info = await self._call(self.client.show(job.id), quiet=True)
        workdir: Path | None = None
        joblog: JobLog | None = None
        try:
            # Files first: a full disk or a vanished log directory fails this job with the
            # reason, like a command that cannot be executed, and the worker goes on.
            workdir = Path(tempfile.mkdtemp(prefix="trisque-job-"))
            body_file = workdir / "body"
            body_file.write_bytes(job.body)
            joblog = self.logs.open(job.id, self.attempt)
            self.log_path = str(joblog.path)
            node = self.client.address
            env = job_environment(dict(os.environ), job, self.attempt, body_file,
                                  f"{node[0]}:{node[1]}" if node else "", self.settings.name,
                                  joblog.path)
        except OSError as exc:
            self.outcome.spawn_error = f"cannot prepare the job's files: {exc}"
        try:
            if joblog is not None and not self.outcome.spawn_error:
                await self._spawn_and_supervise(env, joblog, info)
            else:
                await self.report.start(0)
        finally:
            if joblog is not None:
                joblog.close()
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
        self.outcome.notes = tuple(self._notes)
        verdict = status.decide(self.outcome)
        if workdir is not None and verdict.action == status.ACK:
            verdict = self._take_result(verdict)
        reason = await self._carry_out(verdict, info)
        self.state = verdict.state
        await self.report.end(verdict.state, self.outcome.exit_code, reason)
        level = logging.INFO if verdict.state == "done" else logging.WARNING
        log.log(level, "job %s: %s (%s)", job.id, verdict.state, reason)

    async def _spawn_and_supervise(self, env: dict[str, str], joblog: JobLog,
                                   info: JobInfo | None) -> None:
        try:
            proc = await spawn(self.settings.command, env)
        except OSError as exc:
            self.outcome.spawn_error = "cannot execute the command: " + spawn_error_text(exc)
            await self.report.start(0)
            return
        log.info("job %s (queue %s, attempt %d): started pid %d", self.job.id, self.job.queue,
                 self.attempt, proc.pid)
        if self.scripts is not None:
            self.scripts.record(proc.pid, self.job.id, self.attempt)
        try:
            await self.report.start(proc.pid)
            await self._supervise(proc, joblog, info)
        finally:
            if self.scripts is not None:
                self.scripts.forget(proc.pid)
            await proc.aclose()
        if joblog.rotations:
            self._notes.append(f"log rotated {joblog.rotations} time(s) at "
                               f"{self.settings.log_max_bytes} bytes")

    async def _supervise(self, proc: ScriptProcess, joblog: JobLog,
                         info: JobInfo | None) -> None:
        out_done, status_done, result_done = trio.Event(), trio.Event(), trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump_output, proc, joblog, out_done)
            nursery.start_soon(self._read_status, proc, status_done)
            nursery.start_soon(self._read_result, proc, result_done)
            nursery.start_soon(self._keep_working, info)
            nursery.start_soon(self.report.keep_flushing)
            nursery.start_soon(self._guard, proc)
            self.outcome.exit_code = await proc.wait()
            self._exited = True
            closed = self._status_closed_at
            # The kernel closes an exiting process's files just before it can be reaped: only
            # a clear gap means the script closed fd 3 itself and went on.
            if (closed is not None and self.outcome.final is None
                    and trio.current_time() - closed > EARLY_CLOSE_S):
                self._notes.append("it closed its status pipe (fd 3) and went on running")
            # Whatever is left of its group dies with it (after the guard's signals, stragglers
            # of the group it was stopping are no news).
            if proc.signal_group(signal.SIGKILL) and not self.outcome.signalled:
                self._notes.append("processes it left in its group were killed")
            with trio.move_on_after(DRAIN_S) as drain:
                await out_done.wait()
                await status_done.wait()
                await result_done.wait()
            if drain.cancelled_caught:
                self._notes.append("a process that left its group kept its output open; the "
                                   "rest of the output was not read")
            nursery.cancel_scope.cancel()

    async def _guard(self, proc: ScriptProcess) -> None:
        limit = self.settings.time_limit_for(self.job.queue)
        with trio.move_on_after(limit if limit else float("inf")):
            await self._stop.wait()
        if self._exited:
            return  # the limit came while its pipes were drained: it ended on its own
        if not self._stop.is_set():
            self.outcome.timed_out_after = limit
        log.warning("job %s: stopping pid %d (%s): SIGTERM to its process group", self.job.id,
                    proc.pid, "time limit" if self.outcome.timed_out_after else
                    self.outcome.violation or self.outcome.stopped)
        self.outcome.signalled = True
        proc.signal_group(signal.SIGTERM)
        await trio.sleep(self.settings.kill_after)
        if proc.signal_group(signal.SIGKILL):
            log.warning("job %s: SIGKILL to process group %d after %g s", self.job.id,
                        proc.pid, self.settings.kill_after)

    async def _pump_output(self, proc: ScriptProcess, joblog: JobLog, done: trio.Event) -> None:
        logging_to_file = True
        try:
            while data := await proc.out.receive_some(READ_CHUNK):
                if logging_to_file:
                    try:
                        joblog.write(data)
                    except OSError as exc:  # a full disk, say: the node still gets the tail
                        logging_to_file = False
                        self._notes.append(f"log file not written after "
                                           f"{self.report.total} bytes: {exc}")
                self.report.add_output(data)
                if self.settings.result_from_output and len(self._output) <= self.result_max:
                    self._output += data[:self.result_max + 1 - len(self._output)]
        finally:
            done.set()

    async def _read_result(self, proc: ScriptProcess, done: trio.Event) -> None:
        """fd 4's bytes as they come: the first ``result_max`` kept, the rest counted."""
        limit = self.result_max
        try:
            while data := await proc.answers.receive_some(READ_CHUNK):
                self._written_total += len(data)
                if len(self._written) < limit:
                    self._written += data[:limit - len(self._written)]
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # closed by the drain's end: what was read counts
        finally:
            done.set()

    def _take_result(self, verdict: status.Verdict) -> status.Verdict:
        """The job's result, if it has one: fd 4's bytes, else (--result output) its output.
        One past ``result-max-size`` cannot be kept whole, and a cut result is a wrong one:
        the run fails instead (retried or parked with why), and the worker logs it."""
        limit = self.result_max
        if self._written_total > limit:
            text = (f"its result on fd 4 was {self._written_total} bytes, over the node's "
                    f"result-max-size of {limit}")
        elif self._written_total:
            self.result = bytes(self._written)
            return verdict
        elif not self.settings.result_from_output:
            return verdict
        elif len(self._output) > limit:
            text = f"its output (the result, --result output) is over result-max-size ({limit})"
        else:
            self.result = bytes(self._output)
            return verdict
        log.error("job %s: %s: not resolved", self.job.id, text)
        return status.Verdict("failed", status.FAIL, f"{verdict.reason}; but {text}")

    async def _read_status(self, proc: ScriptProcess, done: trio.Event) -> None:
        reader = status.StatusReader()
        try:
            while data := await proc.status.receive_some(4096):
                for item in reader.feed(data):
                    await self._on_status(item, proc)
            for item in reader.end():
                await self._on_status(item, proc)
            self._status_closed_at = trio.current_time()
        finally:
            done.set()

    async def _on_status(self, item: status.Line | status.Violation,
                         proc: ScriptProcess) -> None:
        if isinstance(item, status.Violation):
            if not self.outcome.violation:
                self.outcome.violation = item.reason
                self._stop.set()
            return
        if self.outcome.violation:
            return  # the script is being stopped: nothing it says counts any more
        await self.report.status_line(item.raw)
        if item.verb in status.FINAL_VERBS and self.outcome.final is None:
            self.outcome.final = item
        elif item.verb == "dup":
            await self._dup(item, proc)

    async def _dup(self, line: status.Line, proc: ScriptProcess) -> None:
        queue = line.queue.decode("utf-8", "surrogateescape")
        try:
            new_id = await self.client.add_job(queue, self.job.body, delay=line.seconds or None,
                                               timeout_ms=ADDJOB_TIMEOUT_MS)
            answer = f"ok {new_id}"
        except TrisqueError as exc:
            answer = "fail " + " ".join(str(exc).split())
        await self.report.status_line("answer " + answer)
        try:
            with trio.fail_after(ANSWER_TIMEOUT_S):
                await proc.answers.send_all(answer.encode() + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, OSError):
            self._notes.append("it did not read the answer to dup on fd 4 (closed or full)")

    async def _keep_working(self, info: JobInfo | None) -> None:
        if info is not None and info.retry == 0:
            return  # at most once: never queued again, nothing to postpone
        while True:
            try:
                retry = await self.client.working(self.job.id)
            except ResponseError as exc:
                # TOOLATE (half the TTL is gone) or NOJOB: the job may be delivered again
                # while this run goes on; say so once in the record.
                await self.report.status_line(f"worker: WORKING refused: {exc}")
                return
            except TrisqueError as exc:
                log.warning("job %s: WORKING failed: %s", self.job.id, exc)
                retry = info.retry if info else 3
            if retry <= 0:
                return
            await trio.sleep(max(retry / 3, 0.5))

    # -- the verdict -------------------------------------------------------------------------

    async def _carry_out(self, verdict: status.Verdict, info: JobInfo | None) -> str:
        job_id = self.job.id
        # The count replied does not matter (a NACK that dead-letters the job counts 0): the
        # command was carried out unless it raised.
        if verdict.action == status.ACK:
            result = self.result
            if result is None:
                done = await self._settle(lambda: self.client.ack_job(job_id))
            else:
                done = await self._settle(lambda: self.client.resolve(job_id, result))
            if done is not None:
                return verdict.reason
            return (verdict.reason + f"; {'ACKJOB' if result is None else 'RESOLVE'} failed "
                    f"({self._last_error}): the job comes back after its RETRY")
        if verdict.action == status.FAIL:
            return await self._fail(verdict)
        if verdict.action == status.NACK:
            if await self._settle(lambda: self.client.nack(job_id)) is not None:
                return verdict.reason
            return (verdict.reason + f"; NACK failed ({self._last_error}): the job comes back "
                    "after its RETRY")
        return await self._resend(verdict, info)

    async def _fail(self, verdict: status.Verdict) -> str:
        """Retry (``--retries``: the worker NACKs the job after a backoff) or park the job out
        of its queue (QPOLICY PARK: its dead-letter queue, or <queue>.err), with why."""
        retries = self.settings.retries_for(self.job.queue)
        if self.attempt <= retries:
            self.retry_after = self.settings.backoff_after(self.attempt)
            return (verdict.reason + f"; run again in {self.retry_after:g} s (retry "
                    f"{self.attempt} of {retries})")
        reason = verdict.reason
        if self.attempt > 1:
            reason = f"run {self.attempt} times; the last: " + reason
        code = self.outcome.exit_code
        reply = await self._settle(lambda: self.client.execute(
            "QPOLICY", "PARK", self.job.id, "none" if code is None else code, self.log_path,
            reason[:MAX_NOTE]))
        if not isinstance(reply, list):
            return (reason + f"; QPOLICY PARK failed ({self._last_error}): the job comes "
                    "back after its RETRY")
        queue, parked = (x.decode("utf-8", "replace") for x in reply)
        return reason + f"; parked in {queue} as {parked}"

    async def keep_working(self) -> None:
        """WORKING while the job waits for its retry, so it is not queued again meanwhile."""
        await self._keep_working(self.info)

    async def nack(self) -> None:
        if await self._settle(lambda: self.client.nack(self.job.id)) is None:
            log.warning("job %s: NACK failed (%s): it comes back after its RETRY", self.job.id,
                        self._last_error)

    async def _resend(self, verdict: status.Verdict, info: JobInfo | None) -> str:
        if info is None:
            info = await self._call(self.client.show(self.job.id))
        if info is None:
            return (verdict.reason + "; cannot resend: the job is not known to the node "
                    f"({self._last_error}); it comes back after its RETRY")
        delay = verdict.seconds

        async def add() -> str:
            return await self.client.add_job(
                self.job.queue, self.job.body, delay=delay or None, retry=info.retry,
                ttl=max(info.ttl, 1) + delay, replicate=1 if info.retry == 0 else None,
                timeout_ms=ADDJOB_TIMEOUT_MS)

        new_id = await self._settle(add)
        if new_id is None:
            return (verdict.reason + f"; ADDJOB of the copy failed ({self._last_error}): the "
                    "job comes back after its RETRY")
        if new_id == self.job.id:
            # The queue deduplicates bodies (QPOLICY DEDUP): the original is the duplicate
            # found. Acknowledge it first, then add the copy again.
            await self._settle(lambda: self.client.ack_job(self.job.id))
            new_id = await self._settle(add)
            if new_id is None:
                return verdict.reason + f"; the copy could not be added ({self._last_error})"
            return verdict.reason + f"; re-added as {new_id}"
        acked = await self._settle(lambda: self.client.ack_job(self.job.id))
        text = verdict.reason + f"; re-added as {new_id}"
        if acked is None:
            return text + f"; ACKJOB of the original failed ({self._last_error})"
        return text

    async def _settle(self, call: Callable[[], Awaitable[T]]) -> T | None:
        """Retry through node failures (the client moves to another node) for SETTLE_S."""
        with trio.move_on_after(SETTLE_S):
            delay = 0.2
            while True:
                try:
                    return await call()
                except ResponseError as exc:
                    self._last_error = str(exc)
                    return None
                except TrisqueError as exc:
                    self._last_error = str(exc)
                    log.warning("job %s: %s; trying again", self.job.id, exc)
                await trio.sleep(delay)
                delay = min(delay * 2, 2.0)
        return None

    async def _call(self, awaitable: Awaitable[Any], quiet: bool = False) -> Any:
        try:
            return await awaitable
        except TrisqueError as exc:
            self._last_error = str(exc)
            if not quiet:
                log.warning("job %s: %s", self.job.id, exc)
            return None
