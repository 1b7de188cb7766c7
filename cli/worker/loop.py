"""The worker's main loop: take jobs while slots are free, run each, stop gracefully.

Theory of operation
-------------------
``Worker.serve`` holds ``concurrency`` slots (a semaphore). While it is not stopping it waits
for a free slot, takes every free slot at once and asks for that many jobs with one ``GETJOB
TIMEOUT 1000 COUNT n WITHCOUNTERS FROM queues...``; each job gets a ``JobRunner`` task that
gives its slot back when done. So at most ``concurrency`` scripts run, and the loop never
holds a job it has no slot for. A failed job to be retried (``--retries``) waits for its
backoff after its slot was given back, kept from its RETRY by WORKING, and is then NACKed: a
failing job never keeps a slot, nor the other jobs of its queue, waiting. GETJOB goes through the cluster-aware client
(``client.aio``): when its node fails the client moves to another one, and errors
while no node answers are retried with a backoff up to ``MAX_BACKOFF_S``, logged once per
``LOG_EVERY_S``.

Stopping (SIGTERM, SIGINT): the loop stops asking for jobs. A GETJOB in flight is let finish
for at most ``STOP_GETJOB_S`` more (a healthy one answers within its 1 s TIMEOUT; jobs it
brings are NACKed at once so another worker gets them) and is then cancelled, whatever it
waits on: a connect to a node that does not answer, a HELLO or a reply on a half-open
connection (the client's own limits are 2 and 5 s). A backoff sleep between failed GETJOBs is
cancelled at once. So a worker with no running job exits about a second after the signal,
however long its nodes have been gone. A GETJOB cut off this way may have been served by the
node (its reply not read): such jobs come back after their RETRY. The running
jobs have ``grace`` seconds to finish; then the worker stops each (SIGTERM, SIGKILL after
``kill_after``) and NACKs it. A second signal skips the rest of the grace period. Jobs waiting
for a retry are NACKed at once, once no GETJOB is in flight (it could take one back).
"""

from __future__ import annotations

import logging
import os
import signal

import trio

from cli.worker.joblog import LogDir
from cli.worker.leftovers import RunningScripts, sweep
from cli.worker.runner import RESULT_MAX, JobRunner
from cli.worker.settings import Settings
from client.aio import AsyncClient
from client.commands import Job
from client.core import TrisqueError

GETJOB_TIMEOUT_MS = 1000
MAX_BACKOFF_S = 5.0
LOG_EVERY_S = 30.0
STOP_GETJOB_S = 0.75  # how long a GETJOB in flight may still take once the worker stops

log = logging.getLogger("trisque.worker")


class Worker:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.client = AsyncClient(settings.nodes, password=settings.password, tls=settings.tls)
        self.logs = LogDir(settings.log_dir, settings.log_max_bytes, settings.log_keep)
        self.scripts = RunningScripts(settings.log_dir)
        self.running: set[JobRunner] = set()
        self.stopping = False
        self.counts: dict[str, int] = {}
        self._slot_wait: trio.CancelScope | None = None
        self._getjob: trio.CancelScope | None = None  # the GETJOB in flight (with its connect)
        self._backoff: trio.CancelScope | None = None  # the sleep after a failed GETJOB
        self._waiting: set[trio.CancelScope] = set()  # failed jobs waiting for their retry
        self._grace_over = trio.Event()
        self._taking_ended = trio.Event()  # no GETJOB in flight any more
        self._node: tuple[str, int] | None = None  # the node GETJOB went to last
        self.result_max = RESULT_MAX  # that node's result-max-size (JobRunner's bound)

    # -- stopping ----------------------------------------------------------------------------

    def stop_taking(self) -> None:
        if not self.stopping:
            self.stopping = True
            log.info("stopping: no more jobs taken; %d running, %g s to finish",
                     len(self.running), self.settings.grace)
        if self._slot_wait is not None:
            self._slot_wait.cancel()
        if self._backoff is not None:
            self._backoff.cancel()
        for waiting in self._waiting:
            waiting.cancel()  # a job waiting for its retry goes back now
        if self._getjob is not None:
            self._getjob.deadline = min(self._getjob.deadline,
                                        trio.current_time() + STOP_GETJOB_S)

    def stop_running(self, why: str) -> None:
        self._grace_over.set()
        for runner in list(self.running):
            runner.stop(why)

    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if not self.stopping:
                    self.stop_taking()
                else:
                    log.warning("second %s: stopping the running jobs now",
                                signal.Signals(signum).name)
                    self.stop_running(f"the worker got a second {signal.Signals(signum).name}")

    async def _grace_timer(self) -> None:
        with trio.move_on_after(self.settings.grace):
            await self._grace_over.wait()
        if self.running:
            self.stop_running(f"the worker was stopped and its grace period of "
                              f"{self.settings.grace:g} s ran out")

    # -- serving -----------------------------------------------------------------------------

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        s = self.settings
        log.info("worker %s: queues %s, concurrency %d, nodes %s, logs in %s, command %s",
                 s.name, " ".join(s.queues), s.concurrency, ",".join(s.nodes), s.log_dir,
                 " ".join(s.command))
        killed = sweep(s.log_dir)
        if killed:
            log.warning("killed %d process(es) that a worker killed earlier left running",
                        killed)
        async with trio.open_nursery() as top:
            top.start_soon(self._watch_signals)
            task_status.started()
            async with trio.open_nursery() as jobs:
                await self._take_jobs(jobs)
                self._taking_ended.set()
                top.start_soon(self._grace_timer)
            top.cancel_scope.cancel()
        await self.client.aclose()
        done = ", ".join(f"{n} {state}" for state, n in sorted(self.counts.items()))
        log.info("worker %s stopped (%s)", s.name, done or "no jobs run")

    async def _take_jobs(self, jobs: trio.Nursery) -> None:
        slots = trio.Semaphore(self.settings.concurrency)
        backoff = 0.25
        last_complaint = -LOG_EVERY_S
        while not self.stopping:
            with trio.CancelScope() as self._slot_wait:
                await slots.acquire()
            self._slot_wait = None
            if self.stopping:
                break  # a slot taken or not, nothing was asked for with it
            taken = 1
            while slots.value > 0:
                slots.acquire_nowait()
                taken += 1
            got: list[Job] = []
            failure: TrisqueError | None = None
            with trio.CancelScope() as self._getjob:
                try:
                    got = await self.client.get_job(*self.settings.queues, count=taken,
                                                    timeout_ms=GETJOB_TIMEOUT_MS,
                                                    with_counters=True)
                except TrisqueError as exc:
                    failure = exc
            self._getjob = None
            if failure is not None or self.stopping and not got:
                for _ in range(taken):
                    slots.release()
                if self.stopping:
                    break
                assert failure is not None
                now = trio.current_time()
                if now - last_complaint >= LOG_EVERY_S:
                    last_complaint = now
                    log.warning("GETJOB failed: %s (trying again, also other nodes)", failure)
                with trio.CancelScope() as self._backoff:
                    await trio.sleep(backoff)
                self._backoff = None
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            backoff = 0.25
            if self.client.address != self._node:
                self._node = self.client.address
                if self._node is not None:
                    log.info("taking jobs from node %s:%d", *self._node)
                    await self._learn_result_max()
            for _ in range(taken - len(got)):
                slots.release()
            for job in got:
                if self.stopping:
                    jobs.start_soon(self._give_back, job, slots)
                else:
                    jobs.start_soon(self._run, job, slots)

    async def _learn_result_max(self) -> None:
        """The node's result-max-size: a result past it is refused, so the runner checks it
        first and says why. An older node, or one that does not answer: the default."""
        try:
            value = (await self.client.config_get("result-max-size")).get("result-max-size")
        except TrisqueError:
            return
        if value is not None and value.isdigit() and int(value) > 0:
            self.result_max = int(value)

    async def _run(self, job: Job, slots: trio.Semaphore) -> None:
        runner = JobRunner(self.settings, self.client, self.logs, job, self.scripts,
                           self.result_max)
        self.running.add(runner)
        try:
            await runner.run()
        except Exception:
            log.exception("job %s: the worker failed running it; it comes back after its "
                          "RETRY", job.id)
            runner.state = "worker-error"
        finally:
            self.running.discard(runner)
            self.counts[runner.state or "unknown"] = self.counts.get(runner.state, 0) + 1
            slots.release()
        if runner.retry_after is not None:
            await self._retry_later(runner, runner.retry_after)

    async def _retry_later(self, runner: JobRunner, delay: float) -> None:
        """The backoff of a failed job, without its slot: it stays delivered to this worker
        (WORKING) and is NACKed when the delay is over, so its delivery counters count the
        attempt and a worker that dies meanwhile leaves it to its RETRY."""
        with trio.CancelScope() as scope:
            self._waiting.add(scope)
            if self.stopping:
                scope.cancel()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(runner.keep_working)
                    await trio.sleep(delay)
                    nursery.cancel_scope.cancel()
            finally:
                self._waiting.discard(scope)
        if self.stopping:
            # A GETJOB still in flight would take the job back at once, and its NACK would
            # count one failure twice.
            await self._taking_ended.wait()
        await runner.nack()

    async def _give_back(self, job: Job, slots: trio.Semaphore) -> None:
        try:
            await self.client.nack(job.id)
            log.info("job %s: taken while stopping, NACKed", job.id)
        except TrisqueError as exc:
            log.warning("job %s: taken while stopping; NACK failed (%s): it comes back after "
                        "its RETRY", job.id, exc)
        finally:
            slots.release()


def close_inherited_fds() -> None:
    """Descriptors the worker inherited (from a shell, a supervisor) must not leak into every
    script: mark them close-on-exec."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass
