"""The cluster config file (``nodes.conf``) on disk: read at start, written atomically.

Theory of operation
-------------------
``cluster/nodes_file.py`` owns the format (``parse``/``render``, pure); this module owns the
file. ``load`` reads it at start: a missing file is a new node (None), a file that cannot be
trusted stops the start with one line naming the file and the line (``NodesStoreError``):
starting with a new identity would silently make a new node out of an old one.

``write_atomic`` replaces the file as a crash-safe unit: write a temporary file beside it,
fsync it, rename it over the old one, fsync the directory (so the rename itself is durable).
A crash leaves the old table or the new one, never half of one.

``NodesFileWriter`` is what the cluster core's ``SaveNodes`` effects go to while the node
runs. Only the newest content matters, so ``submit`` just replaces the pending content and
wakes a task, which writes it in a worker thread (an fsync can take long; the event loop never
waits for it). Contents submitted while a write is under way are coalesced into one next
write. ``flush`` writes what is pending and waits for it (shutdown).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import trio

from cluster.nodes_file import NodesFileError, SavedNodes, parse

log = logging.getLogger("trisque")

RETRY_AFTER_ERROR_S = 1.0


class NodesStoreError(Exception):
    """The file exists but cannot be used: the node must not start."""


def load(path: str) -> SavedNodes | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise NodesStoreError(f"Can't read the cluster config file {path}: {exc.strerror}") from None
    try:
        return parse(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        reason = f"corrupt cluster config file: not UTF-8 text at byte {exc.start}"
    except NodesFileError as exc:
        reason = str(exc)
    raise NodesStoreError(f"Unrecoverable error: {path}: {reason}. Fix the file, or remove it "
                          "to start as a new node with a new ID")


def write_atomic(path: str, content: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class NodesFileWriter:
    def __init__(self, path: str) -> None:
        self.path = path
        self.pending: str | None = None
        self.written: str | None = None
        self.writes = 0
        self._wake = trio.Event()
        self._lock = trio.Lock()
        self._last_error = ""

    def submit(self, content: str) -> None:
        if content == self.written and self.pending is None:
            return  # the table's save points often repeat the same content
        self.pending = content
        self._wake.set()

    def write_now(self) -> None:
        """Write what is pending, blocking (at start, before the event loop serves anyone)."""
        if self.pending is not None:
            write_atomic(self.path, self.pending)
            self.written, self.pending = self.pending, None
            self.writes += 1

    async def flush(self) -> None:
        """Write what is pending and wait until it is on disk (errors are logged, then
        raised). ``pending`` stays set until its content is durable."""
        async with self._lock:
            content = self.pending
            if content is None:
                return
            try:
                await trio.to_thread.run_sync(write_atomic, self.path, content)
            except OSError as exc:
                error = exc.strerror or str(exc)
                if error != self._last_error:  # once per kind of failure, not every retry
                    self._last_error = error
                    log.warning("Can't save the cluster config file %s: %s", self.path, error)
                raise
            if self.pending is content:  # else a newer one came meanwhile: written next
                self.pending = None
            self.written = content
            self.writes += 1
            self._last_error = ""

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            try:
                await self.flush()
            except OSError:
                await trio.sleep(RETRY_AFTER_ERROR_S)
                self._wake.set()
