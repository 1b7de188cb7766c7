"""Keeps a node's run record (``JOBRUN``, broker/runs.py) in step with one run.

Theory of operation
-------------------
``RunReport`` holds what the node should know of the run in a mirror of the node's record (a
``broker.runs.Run``, so the same bounds apply: the newest status lines, the tail of the output
with the absolute count of bytes written) and sends it:
``START`` once the script runs, ``STATUS`` per line, ``APPEND`` from ``flush`` (called every
``FLUSH_S`` by the runner: at most one chunk of the newest output per call, so a script writing
gigabytes costs the node a bounded tail, and an empty ``APPEND`` as heartbeat when the script is
silent for ``HEARTBEAT_S``), and ``END``.

The record lives on the node the client talks to. When that node answers ``NORUN`` (it
restarted, the record was lost for silence, or the client failed over to another node, which
does not know the token), the report starts the run again there and replays what it holds: the
status lines and the output tail at its absolute offset. So the record follows the worker from
node to node, minus what the bounds dropped. A report never fails its run: errors are logged
(once per ``LOG_EVERY_S`` per run) and the next write tries again.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import trio

from broker.runs import MAX_LINE_BYTES, Run
from client.aio import AsyncClient
from client.core import ResponseError, TrisqueError

FLUSH_S: Final = 0.25
HEARTBEAT_S: Final = 5.0  # well within broker.runs.LEASE_MS
LOG_EVERY_S: Final = 30.0
END_ATTEMPTS: Final = 3

log = logging.getLogger("trisque.worker")


class RunReport:
    def __init__(self, client: AsyncClient, job_id: str, queue: str, attempt: int,
                 worker: str) -> None:
        self.client = client
        self.job_id = job_id
        self.queue = queue
        self.attempt = attempt
        self.worker = worker
        self.pid = 0
        self.token: bytes | None = None
        # What the node's record should hold (its times are the node's: unused here).
        self.mirror = Run(job_id.encode(), queue.encode(), worker, 0, 0, attempt)
        self.sent = 0  # the node's record has the output up to here
        self._last_write = 0.0
        self._last_error_log = -LOG_EVERY_S
        self._lock = trio.Lock()  # one write at a time: START before the rest, in order

    # -- what the runner tells it ----------------------------------------------------------

    @property
    def total(self) -> int:
        """Output bytes written by the script, kept or not."""
        return self.mirror.output_size

    def add_output(self, data: bytes) -> None:
        self.mirror.append_output(self.mirror.output_size, data)

    async def start(self, pid: int) -> None:
        self.pid = pid
        async with self._lock:
            await self._ensure()

    async def status_line(self, line: str) -> None:
        line = clip(line)
        self.mirror.add_status(0, line)
        async with self._lock:
            if self.token is not None:
                if await self._send("STATUS", line) is not _NORUN:
                    return
                self.token = None
            await self._ensure()  # its replay sends the line

    async def flush(self) -> None:
        async with self._lock:
            for _ in (0, 1):
                if self.token is None and not await self._ensure():
                    return
                if self.total > self.sent:
                    chunk, end = self.mirror.read_output(self.sent)
                    reply = await self._send("APPEND", end - len(chunk), chunk)
                    if reply is not None and reply is not _NORUN:
                        self.sent = end
                elif trio.current_time() - self._last_write >= HEARTBEAT_S:
                    reply = await self._send("APPEND", self.sent, b"")
                else:
                    return
                if reply is not _NORUN:
                    return
                self.token = None

    async def keep_flushing(self) -> None:
        while True:
            await trio.sleep(FLUSH_S)
            await self.flush()

    async def end(self, state: str, exit_code: int | None, reason: str) -> bool:
        """The final flush and END; True when the node recorded it."""
        code: int | str = "none" if exit_code is None else exit_code
        for attempt in range(END_ATTEMPTS):
            await self.flush()
            async with self._lock:
                if self.token is not None:
                    reply = await self._send("END", state, code, clip(reason))
                    if reply is _NORUN:
                        self.token = None
                        continue
                    if reply is not None:
                        return True
            await trio.sleep(0.5 * (attempt + 1))
        return False

    # -- the node ----------------------------------------------------------------------------

    async def _ensure(self) -> bool:
        """START the run on the current node and replay what it should hold."""
        try:
            token = await self.client.execute("JOBRUN", "START", self.job_id, self.queue,
                                              self.attempt, self.worker, self.pid)
        except TrisqueError as exc:
            self._complain(exc)
            return False
        self.token = bytes(token)
        self._last_write = trio.current_time()
        for _, line in list(self.mirror.status):
            if await self._send("STATUS", line) is None:
                return False
        self.sent = self.mirror.output_start  # the new record has no output yet
        return True

    async def _send(self, sub: str, *args: Any) -> Any:
        assert self.token is not None
        try:
            reply = await self.client.execute("JOBRUN", sub, self.token, *args)
        except ResponseError as exc:
            if exc.code == "NORUN":
                return _NORUN
            self._complain(exc)
            return None
        except TrisqueError as exc:
            self._complain(exc)
            return None
        self._last_write = trio.current_time()
        return reply

    def _complain(self, exc: Exception) -> None:
        now = trio.current_time()
        if now - self._last_error_log >= LOG_EVERY_S:
            self._last_error_log = now
            log.warning("job %s: cannot update its run record on the node: %s", self.job_id,
                        exc)


def clip(text: str) -> str:
    """One line of at most the node's limit of bytes (invalid bytes decoded as U+FFFD take
    three bytes each, so a line the script kept within the limit may not be)."""
    text = text.replace("\r", " ").replace("\n", " ")
    data = text.encode()
    return text if len(data) <= MAX_LINE_BYTES else data[:MAX_LINE_BYTES].decode("utf-8", "ignore")


class _NoRun:
    pass


_NORUN: Final = _NoRun()
