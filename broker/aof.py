"""The append log: its format, a streaming reader, the loader, the writer and the rewrite switch.

Theory of operation
-------------------
A log is one file: a 16-byte header, then frames, one per record, then (version 2) zero
bytes up to the end of the file.

    header  = MAGIC (8 bytes) | version u16 | flags u16 | crc32(first 12 bytes) u32
    frame   = ~length u32 | length u32 | crc32(payload) u32 | payload (msgpack, `length` bytes)
    (both u32 are big-endian; the record's offset is the frame's, its payload 12 bytes on)
    tail    = zero bytes (the writer zero-fills the file ahead of its writes)

A frame starts with the complement of its length, whose first byte is never zero (0xFF minus
the length's top byte; a frame would need 4080 MiB to reach 0). So the first byte at a frame
boundary tells a record (however little of it reached the disk) from the zero-filled tail: a
zero byte there, and zeros to the end of the file, is the end of the log (its *logical end*;
``ReadEnd.tail`` counts the zeros). Frames never move inside a file: a record's offset is
stable until a rewrite writes a new file.

Version 1 (still read) had ``length | ~length`` and no tail: there a frame's first bytes are
zero for any record under 16 MiB, so zeros after the last frame are a torn tail as below. A
file holds frames of its header's version only: a node that loaded a version-1 log rewrites it
(as BGREWRITEAOF does) before appending.

Version 3 adds the *split* job record, so that a replay need not read the bodies: the frame
is as above, but the body slot of its job record holds ``[length, crc32(body)]`` and the body's
``length`` bytes follow the frame, outside its checksum. The frame's checksum covers the
metadata, the body's own CRC-32 (the one a ``BodyRef`` keeps) covers the body, and the next
frame starts after the body. A reader that keeps the body where it is seeks past it; a body cut
by the end of the file is a torn tail; a body whose CRC does not match is damage at its
record's frame (checked where the body is read: by a reader that reads bodies, in the log's
last ``VERIFY_TAIL`` bytes at every replay, and by node/bodies.py when the job is served).
The writer splits a record whose body is longer than ``body-memory-max``; other records are
byte for byte as in version 2.

A payload is ``[kind, data]``: ``["job", job_record]`` (the full state of a job, the last one per
ID wins at replay), ``["ack", job_id]``, ``["del", job_id]``, ``["flushall", None]`` (DEBUG
FLUSHALL: forget everything before) or ``["dlv", [job_id, dtime_ms]]`` (a job's first delivery).
Integers are big-endian.

``dlv`` is *advisory* (``ADVISORY_KINDS``): it feeds statistics (the pipeline report's wait), not
the jobs' state. No reply waits for it, a failed write of it undoes nothing, replay applies it
only to a known job without a delivery time, and a rewrite never emits it (the job record
carries ``dtime``).

The length is stored twice (as itself and as its complement) so that a flipped bit in a length
field is caught as corruption instead of being taken for a frame that runs past the end of the
file, which would look like a torn tail and make us drop every record after it.

How the end of a log is classified (``ReadEnd``):

* ``clean``   - the last frame ends exactly at the end of the file, or (version 2) only zeros
  follow it.
* ``torn``    - the damage is confined to the tail: a frame (or its header) runs past the end of
  the file, or a bad frame is followed only by zero bytes or by nothing (what a crash leaves when
  the file size reached the disk before the data did). Truncating at ``offset`` loses only the
  records whose write was never acknowledged.
* ``corrupt`` - a bad frame is followed by other bytes: good records may lie behind the damage,
  so nothing may be truncated automatically.

Flags: ``FLAG_ENQUEUE_ONCE`` marks a log written by ``SHUTDOWN REWRITE-AOF``; the loader then
restores the queues exactly (Disque's ``aof-enqueue-jobs-once``). The flag is cleared in place
(``clear_flags``) once the log has been loaded, so it applies to one start only.

The writer (``LogWriter``, on any ``LogFile``) owns the end of the file. It remembers
``good_size``, the size after the last write that succeeded; a failed or short write is cut
back to it, so a later successful write never lands behind garbage. A failed fdatasync is
treated the same way (after such a failure Linux may have dropped the dirty pages, so the batch
is not trusted: it is cut off and reported).

This module does no I/O of its own: ``read_records`` reads from a stream it is handed, and
opening, replaying, truncating files and the atomic rewrite switch are in ``node/logfile.py``;
``node/persistence.py`` decides when to write and fsync and runs the slow calls in threads.
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Final, Protocol

import msgpack

from broker.job import REC_BODY, REC_ID
from protocol.checksum import crc32

MAGIC: Final = b"TRISQLOG"
# 2: the file may end in a zero-filled tail (its writer preallocates). 3: a job record's body
# may follow its frame (a split record, see the module docstring). Older logs are read too;
# the node rewrites them as version 3 before it appends.
FORMAT_VERSION: Final = 3
FLAG_ENQUEUE_ONCE: Final = 0x0001

_HEADER = struct.Struct(">8sHHI")
HEADER_SIZE: Final = _HEADER.size  # 16
_FRAME = struct.Struct(">III")
FRAME_HEADER_SIZE: Final = _FRAME.size  # 12
_MASK: Final = 0xFFFFFFFF

# qpolicy: broker/policy_table.py; timer: broker/periodic.py
KINDS: Final = ("job", "ack", "del", "flushall", "dlv", "qpolicy", "timer", "result")
# Records that describe, not decide: see the module docstring. The runtime neither waits for
# them nor undoes them (node/persistence.py).
ADVISORY_KINDS: Final[frozenset[str]] = frozenset({"dlv"})

# How much of the file the reader holds at once: big enough that the per-read cost is lost in
# the noise, small enough that a multi-gigabyte log does not need as much memory. Not Final:
# compiled with mypyc, a Final is inlined where it is used, and a test sets a small chunk to
# make records span reads.
READ_CHUNK = 8 * 1024 * 1024
# The bodies of split records in this many bytes at the end of the log are read and checked
# at replay even when the replay keeps only references: a crash can leave the last records'
# metadata on disk without their bodies (written after the last fdatasync). Not Final: tests
# set it.
VERIFY_TAIL = 16 * 1024 * 1024

Record = tuple[Any, ...]


class LogError(Exception):
    """A log cannot be used as it is. ``str(exc)`` names the file and, if any, the offset."""


class LogCorrupt(LogError):
    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(
            f"Bad file format reading the append only file {path}: {reason} at offset {offset}; "
            f"records after it would be lost by truncating, so the start is refused. "
            f"Inspect it with `trisque check-log {path}`."
        )
        self.path, self.offset, self.reason = path, offset, reason


class LogTruncated(LogError):
    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(
            f"Unexpected end of the append only file {path} at offset {offset} ({reason}). "
            f"Set aof-load-truncated yes to load it up to there, or run "
            f"`trisque check-log --fix {path}`."
        )
        self.path, self.offset, self.reason = path, offset, reason


class LogVersionError(LogError):
    pass


# ---------------------------------------------------------------------------------------------
# Format


def encode_header(flags: int = 0, version: int = FORMAT_VERSION) -> bytes:
    head = _HEADER.pack(MAGIC, version, flags, 0)[:12]
    return head + struct.pack(">I", crc32(head))


def encode_frame(kind: str, data: Any, version: int = FORMAT_VERSION) -> bytes:
    """One frame (``version`` 1 only for tests of old logs)."""
    payload: bytes = msgpack.packb((kind, data), use_bin_type=True)
    n = len(payload)
    if version == 1:
        return _FRAME.pack(n, n ^ _MASK, crc32(payload)) + payload
    return _FRAME.pack(n ^ _MASK, n, crc32(payload)) + payload


# Bound once (Final: a C static when compiled): records are encoded for every command that
# changes a job, and each name looked up per call was a dictionary lookup and a bound method.
_PACK_FRAME: Final = _FRAME.pack
_CRC32: Final = crc32
_PACKER: Final = msgpack.Packer
# Packers ready for use. A Packer keeps a buffer between calls and a rewrite or a snapshot
# encodes in a worker thread while the event loop encodes new records, so each call takes one
# for itself (list.pop and append are atomic) and a new one when none is free; making one per
# call was a tenth of the cost of encoding a record. The event loop's group commit brings its
# own (``new_packer``): it needs no lock and skips the pool's pop and append.
_FREE_PACKERS: Final[list[Any]] = []
_MAX_FREE_PACKERS: Final = 4

Pack = Callable[[Any], bytes]


def new_packer(default: Callable[[Any], Any] | None = None) -> Pack:
    """The ``pack`` of a Packer for one thread's own use with ``append_records``; ``default``
    gives what to pack for a value msgpack does not know (a body the log holds: its
    ``BodyRef`` is read back, node/bodies.py)."""
    pack: Pack = _PACKER(use_bin_type=True, default=default).pack
    return pack


def encode_records(records: Iterable[Record], pack: Pack | None = None, body_max: int = 0,
                   body_of: Callable[[Any], bytes] | None = None) -> bytes:
    """Frames for records shaped like the broker's: ``(kind, data, ...)``; extra items (the undo
    state of a ``LogRecord``) are not written. ``pack``: a packer of the caller's own;
    ``body_max``, ``body_of``: as ``append_records``."""
    if pack is not None:
        out = bytearray()
        append_records(out, records, pack, body_max, body_of)
        return bytes(out)
    try:
        packer = _FREE_PACKERS.pop()
    except IndexError:
        packer = _PACKER(use_bin_type=True)
    buf = bytearray()
    append_records(buf, records, packer.pack, body_max, body_of)
    # Only after a success: a Packer whose pack raised is not put back.
    if len(_FREE_PACKERS) < _MAX_FREE_PACKERS:
        _FREE_PACKERS.append(packer)
    return bytes(buf)


# (job ID, body bytes or reference, offset of the body in the buffer, length, CRC-32)
BodyNote = tuple[bytes, Any, int, int, int]


def append_records(buf: bytearray, records: Iterable[Record], pack: Pack, body_max: int = 0,
                   body_of: Callable[[Any], bytes] | None = None,
                   notes: list[BodyNote] | None = None) -> None:
    """``encode_records`` appended to ``buf`` (the open batch of node/persistence.py), with
    ``pack`` (``new_packer()``), without a separate result to copy. With ``body_max``, a job
    record whose body is longer (or is a reference, whose bytes ``body_of`` reads back) is
    split: its body follows its frame, and ``notes`` gets where. All or nothing: if a record
    cannot be encoded, ``buf`` (and ``notes``) are cut back to their size before the call and
    the error raised."""
    start = len(buf)
    first_note = len(notes) if notes is not None else 0
    try:
        for rec in records:
            data = rec[1]
            if body_max and rec[0] == "job":
                body = data[REC_BODY]
                if type(body) is not bytes or len(body) > body_max:
                    _append_split(buf, data, body, pack, body_of, notes)
                    continue
            payload = pack((rec[0], data))
            n = len(payload)
            buf += _PACK_FRAME(n ^ _MASK, n, _CRC32(payload))
            buf += payload
    except BaseException:
        del buf[start:]
        if notes is not None:
            del notes[first_note:]
        raise


def _append_split(buf: bytearray, data: list[Any], body: Any, pack: Pack,
                  body_of: Callable[[Any], bytes] | None, notes: list[BodyNote] | None) -> None:
    """A split job record: its frame, whose body slot holds ``[length, crc32]``, then the
    body's bytes."""
    if type(body) is bytes:
        raw: bytes = body
        crc = _CRC32(raw)
    else:  # a reference (broker.job.BodyRef): read back and checked by ``body_of``
        if body_of is None:
            raise TypeError("a body the log holds needs body_of to be written again")
        raw = body_of(body)
        crc = body.crc
    size = len(raw)
    meta = list(data)
    meta[REC_BODY] = [size, crc]
    payload = pack(("job", meta))
    n = len(payload)
    buf += _PACK_FRAME(n ^ _MASK, n, _CRC32(payload))
    buf += payload
    if notes is not None:
        notes.append((data[REC_ID], body, len(buf), size, crc))
    buf += raw


@dataclass
class Header:
    version: int
    flags: int

    @property
    def enqueue_once(self) -> bool:
        return bool(self.flags & FLAG_ENQUEUE_ONCE)


def decode_header(data: bytes, path: str) -> Header | None:
    """The header, or None if ``data`` is a strict prefix of a header (a torn creation)."""
    if len(data) < HEADER_SIZE:
        if encode_header()[: min(len(data), 8)] == data[:8]:
            return None
        raise LogError(f"{path} is not a trisque append log (bad magic)")
    magic, version, flags, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise LogError(f"{path} is not a trisque append log (bad magic)")
    if crc32(data[:12]) != crc:
        raise LogCorrupt(path, 0, "header checksum mismatch")
    if version > FORMAT_VERSION:
        raise LogVersionError(
            f"{path} was written with append log format version {version}, but this trisque "
            f"reads versions up to {FORMAT_VERSION}: upgrade trisque to load it"
        )
    return Header(version, flags)


# ---------------------------------------------------------------------------------------------
# Reading


@dataclass
class ReadEnd:
    state: str = "clean"  # clean | torn | corrupt
    offset: int = 0  # end of the last whole record (where a torn tail is cut)
    reason: str = ""
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    header: Header | None = None
    tail: int = 0  # zero bytes after ``offset`` of a clean version-2 log (its preallocation)
    frame: int = 0  # while reading: the offset of the frame of the record last yielded

    @property
    def records(self) -> int:
        return sum(self.counts.values())


def _zeros_to_end(f: BinaryIO, start: int) -> int:
    """How many bytes follow ``start`` if they are all zero, else -1."""
    f.seek(start)
    n = 0
    while chunk := f.read(READ_CHUNK):
        if chunk.count(0) != len(chunk):
            return -1
        n += len(chunk)
    return n


def _rest_is_zero(f: BinaryIO, start: int) -> bool:
    return _zeros_to_end(f, start) >= 0


def _zero_tail(f: BinaryIO, end: ReadEnd, offset: int) -> bool:
    """At a frame boundary of a version-2 log whose next byte is zero: if only zeros follow,
    the log ends here (clean, with the zeros as its tail)."""
    header = end.header
    if header is None or header.version < 2:
        return False
    zeros = _zeros_to_end(f, offset)
    if zeros < 0:
        return False
    end.state, end.offset, end.reason, end.tail = "clean", offset, "", zeros
    return True


Validator = Callable[[str, Any], "str | None"]
# Called for the body of a split record that replay leaves in the file: (its offset, length,
# CRC-32) -> what the record's body slot holds instead (node/persistence.py: a BodyRef).
BodyKeeper = Callable[[int, int, int], Any]


def read_records(f: BinaryIO, path: str, end: ReadEnd | None = None,
                 validate: Validator | None = None,
                 keep: BodyKeeper | None = None) -> Iterator[Record]:
    """Yield ``(kind, data)`` for every whole record of the log open as ``f`` (named ``path``
    in errors); fill ``end`` with how the file ends. The caller opens the file
    (``node/logfile.py``): this module does no I/O of its own.

    The body of a split record (version 3) is read and its CRC-32 checked, unless ``keep`` is
    given: then it is skipped (a seek, no read) and the record's body slot holds what
    ``keep(offset, length, crc)`` returns; only the bodies in the last ``VERIFY_TAIL`` bytes
    are still read and checked (a crash's torn tail).

    ``validate(kind, data)`` (the record format's owner, ``broker.job.validate_record``) says
    why a decodable record is still not one a node could have written; such a record is
    damage at its offset, like a checksum mismatch, so replay never applies it.

    Raises ``LogError``/``LogVersionError`` for a file that is not a log we can read (bad
    magic, newer version, damaged header); damage after the header is reported in ``end``.
    """
    end = end if end is not None else ReadEnd()
    head = f.read(HEADER_SIZE)
    header = decode_header(head, path)
    if header is None:
        end.state, end.offset, end.reason = "torn", 0, "incomplete header"
        return
    end.header = header
    unpackb, unpack_frame = msgpack.unpackb, _FRAME.unpack_from
    complement_first = header.version >= 2  # the frame layout (module docstring)
    split = header.version >= 3
    file_size = f.seek(0, 2)
    f.seek(HEADER_SIZE)
    verify_from = file_size - VERIFY_TAIL
    counts = end.counts
    buf = b""
    pos = 0  # next frame in buf
    base = HEADER_SIZE  # file offset of buf[0]
    eof = False
    while True:
        # Refill when less than one frame header remains, or the frame at pos is partial.
        if not eof and len(buf) - pos < FRAME_HEADER_SIZE:
            chunk = f.read(READ_CHUNK)
            base += pos
            buf = buf[pos:] + chunk
            pos = 0
            eof = not chunk
            continue
        if len(buf) - pos < FRAME_HEADER_SIZE:
            if pos == len(buf):
                end.state, end.offset = "clean", base + pos
                return
            if buf[pos] == 0 and _zero_tail(f, end, base + pos):
                return
            end.state, end.offset, end.reason = "torn", base + pos, "incomplete frame header"
            return
        if complement_first:
            check, n, crc = unpack_frame(buf, pos)
        else:
            n, check, crc = unpack_frame(buf, pos)
        start = pos + FRAME_HEADER_SIZE
        if n ^ check != _MASK:
            if complement_first and buf[pos] == 0 and _zero_tail(f, end, base + pos):
                return
            _classify(f, end, base + pos, None, "bad frame length")
            return
        if start + n > len(buf):
            if not eof:
                chunk = f.read(max(READ_CHUNK, start + n - len(buf)))
                base += pos
                buf = buf[pos:] + chunk
                pos = 0
                eof = not chunk
                continue
            end.state, end.offset = "torn", base + pos
            end.reason = f"frame of {n} bytes cut by the end of the file"
            return
        payload = buf[start : start + n]
        reason = ""
        after = start + n  # where the next frame starts in buf (past a split record's body)
        if crc32(payload) != crc:
            reason = "checksum mismatch"
        else:
            try:
                kind, data = unpackb(payload, raw=False, use_list=True)
            except Exception as exc:  # noqa: BLE001 - any decoding failure is damage
                reason = f"undecodable record ({exc.__class__.__name__})"
            else:
                if not isinstance(kind, str) or kind not in counts:
                    reason = f"unknown record kind {kind!r:.60}"
                elif (split and kind == "job" and type(data) is list and len(data) > REC_BODY
                        and type(data[REC_BODY]) is list):
                    spec = data[REC_BODY]
                    at = base + after  # the body's offset in the file
                    if validate is not None:  # the record's shape first, the body aside
                        data[REC_BODY] = b""
                        reason = validate(kind, data) or ""
                        data[REC_BODY] = spec
                    if reason:
                        pass
                    elif (len(spec) != 2 or type(spec[0]) is not int or type(spec[1]) is not int
                            or spec[0] < 0):
                        reason = "bad body reference"
                    elif at + spec[0] > file_size:
                        end.state, end.offset = "torn", base + pos
                        end.reason = f"body of {spec[0]} bytes cut by the end of the file"
                        return
                    else:
                        size, body_crc = spec
                        if keep is None or at + size > verify_from:
                            if after + size <= len(buf):
                                body = buf[after : after + size]
                            else:
                                f.seek(at)
                                body = f.read(size)
                                f.seek(base + len(buf))
                            if crc32(body) != body_crc:
                                reason = "body checksum mismatch"
                            data[REC_BODY] = body if keep is None else keep(at, size, body_crc)
                        else:
                            data[REC_BODY] = keep(at, size, body_crc)
                        after += size
                if not reason and validate is not None:
                    reason = validate(kind, data) or ""
        if reason:
            _classify(f, end, base + pos, base + after, reason)
            return
        counts[kind] += 1
        end.frame = base + pos
        yield kind, data
        if after <= len(buf):
            pos = after
        else:
            # The body runs past what is in memory: skip it with a seek, not a read.
            base += after
            f.seek(base)
            buf, pos, eof = b"", 0, False


def _classify(f: BinaryIO, end: ReadEnd, offset: int, frame_end: int | None, reason: str) -> None:
    """Damage at ``offset``: torn if nothing but zeros follows the bad frame (or its header),
    corrupt otherwise."""
    end.offset, end.reason = offset, reason
    # A frame header that is itself the damage (its length fields disagree) may be one torn
    # by a crash in the zero-filled tail: then zeros follow it.
    tail_from = frame_end if frame_end is not None else offset + FRAME_HEADER_SIZE
    end.state = "torn" if _rest_is_zero(f, tail_from) else "corrupt"


class Loadable(Protocol):
    def load_record(self, record: Record, now_ms: int) -> None: ...

    def validate_record(self, kind: str, data: Any) -> str | None: ...


class LogFile(Protocol):
    """What the writer needs from a file; tests inject objects that fail or record calls."""

    def write(self, data: bytes | memoryview, /) -> int: ...
    def sync(self) -> None: ...
    def truncate(self, size: int, /) -> None: ...
    def size(self) -> int: ...
    def close(self) -> None: ...


class LogWriter:
    """Appends encoded frames to a log and keeps its tail whole after failures."""

    def __init__(self, file: LogFile) -> None:
        self.file = file
        self.good_size = file.size()
        self._needs_cut = False

    def write(self, data: bytes | bytearray) -> None:
        """Write everything or raise ``OSError`` with the file cut back to ``good_size``."""
        if self._needs_cut:
            self.file.truncate(self.good_size)  # a previous cut failed: retry before appending
            self._needs_cut = False
        view = memoryview(data)
        try:
            while view:
                n = self.file.write(view)
                if not n:
                    # A zero-length write means no space.
                    raise OSError(errno.ENOSPC, "No space left on device")
                view = view[n:]
        except OSError:
            self._cut()
            raise
        self.good_size += len(data)

    def sync(self, unsynced_from: int | None = None) -> None:
        """fdatasync; on failure cut back to ``unsynced_from`` (what the caller still trusts)
        and raise."""
        try:
            self.file.sync()
        except OSError:
            if unsynced_from is not None:
                self.good_size = unsynced_from
                self._cut()
            raise

    def _cut(self) -> None:
        try:
            self.file.truncate(self.good_size)
        except OSError:
            self._needs_cut = True

    def close(self) -> None:
        self.file.close()
