"""The append log's file operations: reading a log from disk, replaying it, cutting a torn
tail, the writer's file, the rewrite's temporary file and atomic switch.

Theory of operation
-------------------
``broker/aof.py`` owns the format (header, frames, records, how a file ends) and reads records
from a stream it is given; everything that opens, truncates, syncs, renames or lists files is
here, in the runtime. A rewrite writes a new log next to the old one under a temporary name and
switches with write, fsync, rename, fsync of the directory: until the rename the old log is
whole, after it the new one is, and a crash at any point leaves one of them under the log's
name. Each function is synchronous; ``node/persistence.py`` runs the slow ones in threads.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from broker.aof import (
    HEADER_SIZE,
    BodyKeeper,
    Loadable,
    LogCorrupt,
    LogTruncated,
    Pack,
    ReadEnd,
    Record,
    Validator,
    encode_header,
    encode_records,
    read_records,
)


def read_log(path: str, end: ReadEnd | None = None, validate: Validator | None = None,
             keep: BodyKeeper | None = None) -> Iterator[Record]:
    """``broker.aof.read_records`` on the file at ``path``."""
    with open(path, "rb") as f:
        yield from read_records(f, path, end, validate, keep)


def scan(path: str, validate: Validator | None = None) -> ReadEnd:
    """Read a whole log without applying it (for ``check-log``)."""
    end = ReadEnd()
    for _ in read_log(path, end, validate):
        pass
    return end

def load_into(
    path: str, broker: Loadable, now_ms: int, *, load_truncated: bool = True,
    warn: Callable[[str], None] = lambda msg: None,
    stored: Callable[[Record, int], None] | None = None,
    keep: BodyKeeper | None = None,
) -> ReadEnd:
    """Replay ``path`` into ``broker``. Cuts a torn tail (if allowed) and warns; raises
    ``LogCorrupt`` for damage in the middle and ``LogTruncated`` for a torn tail when
    ``load_truncated`` is off. ``keep``: the bodies of split records stay in the file
    (``broker.aof.read_records``). The caller calls ``broker.finish_load`` afterwards."""
    end = ReadEnd()
    load = broker.load_record
    for rec in read_log(path, end, broker.validate_record, keep):
        load(rec, now_ms)
        if stored is not None:
            stored(rec, end.frame)  # a body past body-memory-max stays in the file
    if end.state == "corrupt":
        raise LogCorrupt(path, end.offset, end.reason)
    if end.tail:
        # The zero-filled tail a running writer keeps ahead of its writes (a crash left it):
        # cut, so the writer starts at the logical end; it zero-fills again as it goes.
        truncate(path, end.offset)
    if end.state == "torn":
        if not load_truncated:
            raise LogTruncated(path, end.offset, end.reason)
        size = os.path.getsize(path)
        warn(
            f"!!! Warning: the append only file {path} is truncated ({end.reason} at offset "
            f"{end.offset} of {size}); loaded {end.records} records and cut the "
            f"{size - end.offset} bytes after them"
        )
        truncate(path, end.offset)
    return end


def truncate(path: str, offset: int) -> None:
    """Cut the file at ``offset`` durably; an empty result gets a fresh header."""
    fd = os.open(path, os.O_WRONLY)
    try:
        if offset < HEADER_SIZE:
            os.ftruncate(fd, 0)
            _write_all(fd, encode_header())
        else:
            os.ftruncate(fd, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def clear_flags(path: str, version: int) -> None:
    """Rewrite the header without flags, keeping its format ``version``, in place and durably
    (the enqueue-once flag is used for one start only)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, encode_header(version=version), 0)
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# Writing

# The zero-filled region kept ahead of the writes: the first fill, and the most one fill adds
# (each fill doubles the last one up to this, so an idle log stays small and a busy one gets
# big steps). A fill starts when less than the last fill's size is left.
PREALLOCATE_MIN = 64 * 1024
PREALLOCATE_MAX = 8 * 1024 * 1024
_ZERO_PIECE = 256 * 1024  # zeros written (under the lock) and synced at a time by the filler
_ZEROS = memoryview(bytes(_ZERO_PIECE))


class OsLogFile:
    """The log's file descriptor, written at its logical end (``end``) with a zero-filled,
    fdatasynced region kept ahead of it (up to ``allocated``).

    Why: fdatasync after an append must also journal the new size and block allocation; after
    a write into blocks already written it flushes only the data (measured 143 against 206 us
    on the development VM). ``sync`` is fdatasync (timestamps are not needed to read the log).

    A thread of its own (started per fill, when less than the last fill's size is left) extends
    the region by writing zeros past ``allocated`` and fdatasyncs them. The writer's writes
    below ``allocated`` take no lock: the filler only writes at or past it. A write that would
    cross it (the filler fell behind, or failed: ENOSPC) takes the lock and moves it, as a plain
    append would. ``close`` cuts the file back to its logical end; a crash leaves the zeros,
    which the reader takes for the end of the log (format version 2, broker/aof.py).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.end = os.lseek(self.fd, 0, os.SEEK_END)
        self.allocated = self.end  # the file's length: zeros from ``end`` to here
        self.fill_size = PREALLOCATE_MIN // 2  # doubled before each fill
        self.filling = False
        # Asked when a fill is due (Persistence: under appendfsync always only).
        self.preallocate: Callable[[], bool] = lambda: True
        self.fill_error: OSError | None = None  # the last fill's failure, retried later
        self._fill_retry_at = 0.0
        self._lock = threading.Lock()

    def write(self, data: bytes | memoryview, /) -> int:
        end = self.end
        if end + len(data) <= self.allocated:
            n = os.pwrite(self.fd, data, end)
        else:
            with self._lock:
                n = os.pwrite(self.fd, data, end)
                if end + n > self.allocated:
                    self.allocated = end + n
        self.end = end + n
        if self.allocated - self.end < self.fill_size and not self.filling and self.preallocate():
            self._start_fill()
        return n

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def truncate(self, size: int, /) -> None:
        with self._lock:
            os.ftruncate(self.fd, size)
            self.end = self.allocated = size

    def size(self) -> int:
        """The logical size: where the next write goes."""
        return self.end

    def file_size(self) -> int:
        """The file's length, its zero-filled tail included."""
        return self.allocated

    def close(self) -> None:
        with self._lock:
            if self.fd < 0:
                return
            try:
                os.ftruncate(self.fd, self.end)  # a clean stop leaves no tail
            except OSError:
                pass  # zeros past the end are read as the end anyway
            os.close(self.fd)
            self.fd = -1

    # -- the filler -------------------------------------------------------------------------

    def _start_fill(self) -> None:
        if self.fill_error is not None and time.monotonic() < self._fill_retry_at:
            return
        self.filling = True
        self.fill_size = min(self.fill_size * 2, PREALLOCATE_MAX)
        threading.Thread(target=self._fill, args=(self.fill_size,), daemon=True,
                         name="trisque-log-fill").start()

    def _fill(self, size: int) -> None:
        fd = -1
        try:
            with self._lock:
                if self.fd < 0:
                    return
                fd = os.dup(self.fd)  # never a number the closed log's fd was reused for
                target = self.allocated + size
            while True:
                with self._lock:
                    if self.fd < 0:
                        return
                    start = self.allocated
                    if start >= target:
                        break
                    n = os.pwrite(fd, _ZEROS[: min(_ZERO_PIECE, target - start)], start)
                    self.allocated = start + n
                # Each piece synced at once: the writer's fdatasync flushes every dirty page
                # of the file, so zeros left dirty would be written in its time.
                os.fdatasync(fd)
            self.fill_error = None
        except OSError as exc:
            # A full disk: the writes append as before (and fail on their own if they must);
            # a fill is tried again a little later.
            self.fill_error = exc
            self._fill_retry_at = time.monotonic() + FILL_RETRY_SEC
        finally:
            if fd >= 0:
                os.close(fd)
            self.filling = False


FILL_RETRY_SEC = 5.0


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]

def fsync_dir(directory: str) -> None:
    fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_log(path: str, flags: int = 0) -> None:
    """A new empty log, durable (header written and synced, directory entry synced)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        _write_all(fd, encode_header(flags))
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(os.path.dirname(path))


TEMP_PREFIX: Final = "temp-rewriteaof-"


class Rewrite:
    """A new log being written under a temporary name; ``commit`` switches it in atomically.

    ``step`` is called with the name of each step of the switch before it is taken; tests use
    it to stop (raise) at every point and check that what is left on disk loads.
    """

    def __init__(self, path: str, flags: int = 0,
                 step: Callable[[str], None] = lambda name: None) -> None:
        self.path = path
        self.step = step
        directory = os.path.dirname(path) or "."
        self.temp = os.path.join(directory, f"{TEMP_PREFIX}{os.getpid()}.aof")
        self.fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self.size = 0
        self.renamed = False  # from here on the new file is the log, whatever happens next
        try:
            self.write(encode_header(flags))
        except BaseException:
            self.abort()
            raise

    def write(self, data: bytes) -> None:
        self.step("write")
        _write_all(self.fd, data)
        self.size += len(data)

    def sync(self) -> None:
        self.step("fsync")
        os.fdatasync(self.fd)

    def commit(self) -> None:
        """fsync, rename over the log, fsync the directory. Afterwards the new log is in place
        and durable; a crash before the rename leaves the old log in place."""
        self.sync()
        self.step("rename")
        os.rename(self.temp, self.path)
        self.renamed = True
        self.step("fsync-dir")
        fsync_dir(os.path.dirname(self.path))
        self.step("done")
        os.close(self.fd)
        self.fd = -1

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.renamed:
            return
        try:
            os.unlink(self.temp)
        except FileNotFoundError:
            pass


def remove_stale_temps(directory: str) -> list[str]:
    """Temporary files of rewrites that a crash interrupted: never the log itself, so removed."""
    removed = []
    for name in os.listdir(directory or "."):
        if name.startswith(TEMP_PREFIX) and name.endswith(".aof"):
            os.unlink(os.path.join(directory, name))
            removed.append(name)
    return removed


def write_snapshot(path: str, records: Iterable[Record], flags: int = 0,
                   step: Callable[[str], None] = lambda name: None, *,
                   pack: Pack | None = None, body_max: int = 0,
                   body_of: Callable[[Any], bytes] | None = None) -> int:
    """A complete rewrite in one go (SHUTDOWN REWRITE-AOF, tests); returns the new size.
    ``pack``: a packer of the caller's own (one that reads back bodies the log holds);
    ``body_max``, ``body_of``: split records (``broker.aof.append_records``). References to
    bodies in the old file stay valid: their descriptor keeps its inode."""
    rw = Rewrite(path, flags, step)
    try:
        batch: list[Record] = []
        for rec in records:
            batch.append(rec)
            if len(batch) >= 4096:
                rw.write(encode_records(batch, pack, body_max, body_of))
                batch.clear()
        rw.write(encode_records(batch, pack, body_max, body_of))
        rw.commit()
    except BaseException:
        rw.abort()
        raise
    return rw.size
