"""Bodies the append log holds instead of memory (``body-memory-max``, docs/persistence.md).

A job whose body is in the log keeps a ``broker.job.BodyRef``: the log file's generation, the
body's offset, length and CRC-32. ``BodyFiles`` keeps a read descriptor per generation (the
log's current file, and an older one until a rewrite has moved every reference out of it) and
reads a body with ``pread``, checking its CRC: the page cache does the caching. The node's
encoders call it: the RESP encoder for replies (``for_reply``: a damaged body becomes an error
in its place) and the msgpack packers of the log and the bus (``for_record``: a damaged body
raises, so no record carries a wrong body).

Bodies added together lie together in the file and are mostly taken in that order (a GETJOB
COUNT n, a round of GETJOBs): a read that follows closely on the one before reads ``WINDOW``
bytes at once and the next bodies are cut from them, one ``pread`` for many. The window is a
cache of the file, checked like any read: a body whose CRC does not match in it is read again
on its own before it is called damaged.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Final

from mypy_extensions import mypyc_attr

from broker.job import BodyRef
from cluster import wire
from protocol.checksum import crc32
from protocol.resp import Error, register_lazy


@mypyc_attr(native_class=False)  # compiled, a native class cannot derive from OSError
class BodyError(OSError):
    """A body the log should hold cannot be read back as it was written."""


# Generations are unique in the process (tests run several nodes in one), so one resolver
# registered with the RESP encoder serves them all.
_FILES: Final[dict[int, tuple[int, BodyFiles]]] = {}  # generation -> (descriptor, owner)
_last_gen = 0

#: Bytes read at once when a body follows closely on the last one read (``_read``). 64 KiB:
#: about 60 bodies of 1 KB for one system call; a lone body is still read on its own.
WINDOW: Final = 64 << 10
#: How far past the end of the last body read the next may start and still count as
#: following it (the records between bodies: their headers, acknowledgements, deliveries).
NEAR: Final = 16 << 10


class _Window:
    """The last window read: its generation, where it starts, its bytes, and where the last
    body read ended (in that generation)."""

    gen = 0
    start = 0
    data = b""
    end = -1  # the end of the last body read, -1: none


_window: Final = _Window()


def _read(fd: int, ref: BodyRef) -> bytes:
    """The bytes at ``ref`` (unchecked), from the window when they lie in it."""
    w = _window
    offset = ref.offset
    length = ref.length
    if ref.gen == w.gen:
        at = offset - w.start
        if at >= 0 and at + length <= len(w.data):
            w.end = offset + length
            return w.data[at:at + length]
        if length < WINDOW and 0 <= offset - w.end < NEAR:
            data = os.pread(fd, WINDOW, offset)
            w.start, w.data, w.end = offset, data, offset + length
            return data[:length]
    else:
        w.gen, w.data = ref.gen, b""
    w.end = offset + length
    return os.pread(fd, length, offset)


def _for_reply(ref: BodyRef) -> Any:
    entry = _FILES.get(ref.gen)
    if entry is not None:
        # The common case inline: one lookup, no method calls.
        try:
            data = _read(entry[0], ref)
        except OSError:
            data = b""
        if len(data) == ref.length and crc32(data) == ref.crc:
            return data
        return entry[1].for_reply(ref)
    return Error(f"ERR body unreadable from the append log: its file (generation "
                 f"{ref.gen}) is closed")


def _for_record(value: Any) -> Any:
    if type(value) is not BodyRef:
        raise TypeError(f"cannot serialize {type(value).__name__!r} object")
    entry = _FILES.get(value.gen)
    if entry is None:
        raise BodyError(f"body unreadable from the append log: its file (generation "
                        f"{value.gen}) is closed")
    return entry[1].for_record(value)


def _for_bus(value: Any) -> Any:
    """``_for_record`` for the bus, whose send path drops (and logs) a message it cannot
    encode on ValueError: a frame that would carry a damaged body is not sent."""
    try:
        return _for_record(value)
    except BodyError as exc:
        raise ValueError(str(exc)) from exc


register_lazy(BodyRef, _for_reply)
wire.pack_unknown_with(_for_bus)  # REPLJOB and YOURJOBS carry the bytes


class BodyFiles:
    """Read descriptors of one node's log files, by generation."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or logging.getLogger("trisque.aof")
        self.gens: list[int] = []  # open, oldest first
        self.gen = 0  # the current file's generation (0: none open)
        self.failures = 0  # bodies that could not be read back (INFO)

    def open(self, path: str) -> int:
        """Open ``path`` (the log, or a rewrite's new file before its rename: the descriptor
        follows the inode) as the next generation, and return it (not yet current)."""
        global _last_gen
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        _last_gen += 1
        _FILES[_last_gen] = (fd, self)
        self.gens.append(_last_gen)
        return _last_gen

    def close(self, gen: int) -> None:
        entry = _FILES.pop(gen, None)
        if entry is not None:
            os.close(entry[0])
            self.gens.remove(gen)
        if _window.gen == gen:
            _window.gen, _window.data, _window.end = 0, b"", -1

    def close_all(self) -> None:
        for gen in list(self.gens):
            self.close(gen)
        self.gen = 0

    def read(self, ref: BodyRef) -> bytes:
        """The body at ``ref``, or ``BodyError`` saying why it cannot be trusted."""
        entry = _FILES.get(ref.gen)
        fd = entry[0] if entry is not None else None
        if fd is None:
            raise BodyError(f"its log file (generation {ref.gen}) is closed")
        try:
            data = _read(fd, ref)
            if len(data) == ref.length and crc32(data) == ref.crc:
                return data
            # Not as written, maybe only in the window (a failed write's bytes, since
            # overwritten): the file itself decides.
            data = os.pread(fd, ref.length, ref.offset)
        except OSError as exc:
            raise BodyError(f"read error: {exc.strerror or exc}") from exc
        if len(data) != ref.length:
            raise BodyError(f"short read ({len(data)} of {ref.length} bytes at {ref.offset})")
        if crc32(data) != ref.crc:
            raise BodyError(f"checksum mismatch ({ref.length} bytes at offset {ref.offset})")
        return data

    def failed(self, ref: BodyRef, exc: BodyError) -> str:
        """Count and log (the first 100, then every 10,000th) a body that cannot be read
        back; the text that says why."""
        self.failures += 1
        text = f"body unreadable from the append log: {exc}"
        if self.failures <= 100 or self.failures % 10_000 == 0:
            self.log.warning("A job %s (generation %d)", text, ref.gen)
        return text

    def for_reply(self, ref: Any) -> Any:
        """What a reply carries in place of the body: the bytes, or an error for this job."""
        try:
            return self.read(ref)
        except BodyError as exc:
            return Error(f"ERR {self.failed(ref, exc)}")

    def for_record(self, value: Any) -> Any:
        """msgpack's ``default``: the bytes of a ``BodyRef``; raises ``BodyError`` (and
        nothing is packed) for a body that cannot be read back."""
        if type(value) is not BodyRef:
            raise TypeError(f"cannot serialize {type(value).__name__!r} object")
        try:
            return self.read(value)
        except BodyError as exc:
            raise BodyError(self.failed(value, exc)) from exc


def body_of(value: Any) -> bytes:
    """``value`` (a body from a broker reply or ``Job.content``) as bytes: a ``BodyRef`` is
    read back; ``BodyError`` if it cannot be (for the HTTP API and the dashboard, which build
    their answers from broker values themselves)."""
    if type(value) is not BodyRef:
        return bytes(value)
    entry = _FILES.get(value.gen)
    if entry is None:
        raise BodyError(f"body unreadable from the append log: its file (generation "
                        f"{value.gen}) is closed")
    return entry[1].read(value)
