"""Per-job log files: capped, rotated, and only so many kept.

Theory of operation
-------------------
Each run writes its script's stdout and stderr to ``<log-dir>/<job-id>.<attempt>.log`` (the
job ID with ``/`` percent-encoded: Disque IDs carry base64). When the file reaches
``max_bytes`` it is renamed to ``... .log.1``, replacing an older part, and a new file starts:
a job never holds more than two parts, ``2 * max_bytes`` on disk, however much it writes. The
directory keeps the ``keep`` newest job logs (by modification time, the ones found at start
included); opening one more deletes the oldest and its older part. Writes are plain ``write``
calls to the page cache, done in the worker's event loop: they do not wait for the disk.
"""

from __future__ import annotations

import os
from collections import deque
from pathlib import Path
from urllib.parse import quote

_SUFFIX = ".log"


def file_name(job_id: str, attempt: int) -> str:
    return f"{quote(job_id, safe='+-=')}.{attempt}{_SUFFIX}"


class JobLog:
    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self._size = os.fstat(self._fd).st_size
        self.rotations = 0

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            room = self.max_bytes - self._size
            if room <= 0:
                self._rotate()
                continue
            n = os.write(self._fd, view[:room])
            self._size += n
            view = view[n:]

    def _rotate(self) -> None:
        os.close(self._fd)
        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                           0o644)
        self._size = 0
        self.rotations += 1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class LogDir:
    def __init__(self, directory: Path, max_bytes: int, keep: int) -> None:
        self.dir = directory
        self.max_bytes = max_bytes
        self.keep = keep
        directory.mkdir(parents=True, exist_ok=True)
        found = [p for p in directory.iterdir() if p.name.endswith(_SUFFIX)]
        found.sort(key=lambda p: p.stat().st_mtime)
        self._files: deque[Path] = deque(found)
        self._prune()

    def open(self, job_id: str, attempt: int) -> JobLog:
        path = self.dir / file_name(job_id, attempt)
        if path in self._files:
            self._files.remove(path)  # written again (a second run): now the newest
        self._files.append(path)
        self._prune()
        return JobLog(path, self.max_bytes)

    def _prune(self) -> None:
        while len(self._files) > self.keep:
            old = self._files.popleft()
            for p in (old, old.with_name(old.name + ".1")):
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass
