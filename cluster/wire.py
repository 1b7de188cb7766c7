"""The cluster bus codec: frames in, typed messages out, and back (sans-IO).

Theory of operation
-------------------
Every bus frame is a fixed 52-byte header followed by a msgpack body and, when a
``cluster-secret`` is configured, a 32-byte HMAC-SHA256 trailer over header+body:

    magic   4 bytes  b"TQCB"
    version 1 byte   WIRE_VERSION
    flags   1 byte   bit 0: an HMAC trailer follows the body
    type    2 bytes  big-endian message type number (see MessageType)
    sender  40 bytes the sender's node ID, lowercase hex ASCII
    length  4 bytes  big-endian body length (not counting the MAC)
    ... the msgpack body (a map), then the MAC if flagged.

A BATCH frame carries several messages of one type (``BATCHABLE``: REPLJOB, GOTJOB) to one
node, its body ``{"type": <number>, "bodies": [<body>, ...]}``: the bus joins what a round
sends to one node (``batch_body``) and the receiver splits it back (``unbatch``, strict: any
other shape is ``MalformedBody``), so the cores only ever see the single messages.

``FrameDecoder`` is incremental: ``feed(bytes)`` and then ``next()`` returns a
``Frame`` or ``None`` ("not yet": the input is short). Every way a frame can be
wrong raises its own subclass of ``WireError`` so the transport can log why it
dropped a link. The trio transport (node/bus.py) only moves bytes.

Size. A body may be as large as the largest job a node accepts (the
``job-max-body-len`` directive) plus ``FRAME_OVERHEAD`` for the rest of its record,
and never less than ``MAX_BODY`` (``max_body_for``): both ends apply the same rule, the
sender before encoding and the receiver from the header, before buffering anything.
Messages that carry many records (YOURJOBS, the tables) are cut by the cores into
frames of about ``BATCH_BYTES``, so only one big job makes a big frame.

A big frame is made and read without copying its body more than msgpack does.
``encode_parts`` first replaces every ``bytes`` of at least ``BIG_VALUE`` bytes in the
body of a message that carries jobs (``CARRY_JOBS``; a job's body, a few levels of maps
and lists deep) by a 16-byte token, packs what is left (small; should a small value
equal a token, the body is packed whole instead), then splits the packed bytes at each
token's encoding, putting back a msgpack bin32 header and the value itself as a buffer
of its own. The bytes on the wire are exactly what packing the body whole gives
(msgpack encodes every bytes of 64 KiB or more as bin32), so the receiver decodes it as
any frame, through views of its buffer. A big frame's MAC can be left to the writer,
which computes it a slice at a time as it writes (``defer_mac``, ``mac_state``), and
the decoder adds a frame's bytes to its MAC as they arrive: the MAC of 40 MB at once
would hold the loop for 60-100 ms.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.hmac import HMAC

MAGIC: Final = b"TQCB"
#: 2: the batched job messages (SETACK_BATCH ...) and BATCH frames exist; a node of
#: version 1 would drop the link at the first one.
WIRE_VERSION: Final = 2
HEADER: Final = struct.Struct(">4sBBH40sI")
HEADER_SIZE: Final = HEADER.size
MAC_SIZE: Final = 32
FLAG_MAC: Final = 0x01
#: The least a node accepts as a body (and all it accepts from a message that carries no
#: job); larger frames are refused before buffering them.
MAX_BODY: Final = 16 * 1024 * 1024
#: Room in a frame for what a job's record holds besides its body: the queue name (at most
#: 64 KiB), up to 10,000 holders' node IDs, the numbers.
FRAME_OVERHEAD: Final = 1024 * 1024
#: What a core packs into one frame of many records (YOURJOBS, the tables) before starting
#: the next one: many frames of a few MiB rather than one too large to send.
BATCH_BYTES: Final = 4 * 1024 * 1024
#: Bodies at least this large are handed to the transport as a buffer of their own, not
#: copied behind their header.
_JOIN_BELOW: Final = 64 * 1024
#: A ``bytes`` value at least this large inside a body is never copied into the packed body
#: (its msgpack header is always bin32, 5 bytes).
BIG_VALUE: Final = 64 * 1024
_LIFT_DEPTH: Final = 3  # body map -> list of records -> record fields
# Tokens stand for the big values while the rest of a body is packed. A small value of the
# body equal to one would make its place ambiguous: then the body is packed whole.
_TOKEN_PREFIX: Final = b"\x00TQCB:value:"
_BIN32: Final = struct.Struct(">BI")


def max_body_for(job_max_body_len: int) -> int:
    """The largest body of a frame on a node whose ``job-max-body-len`` is this."""
    return max(MAX_BODY, job_max_body_len + FRAME_OVERHEAD)


class MessageType(enum.IntEnum):
    PING = 1
    PONG = 2
    MEET = 3
    FAIL = 4
    REPLJOB = 10
    GOTJOB = 11
    ENQUEUE = 12
    WILLQUEUE = 13
    QUEUED = 14
    SETACK = 15
    GOTACK = 16
    DELJOB = 17
    WORKING = 18
    NACK = 19
    PAUSE = 20
    NEEDJOBS = 21
    YOURJOBS = 22
    # Several job messages of one type to one node in one frame (cluster/job_messages.py).
    SETACK_BATCH = 30
    GOTACK_BATCH = 31
    DELJOB_BATCH = 32
    WILLQUEUE_BATCH = 33
    QUEUED_BATCH = 34
    QPOLICY = 40  # queue policies (cluster/policy_sync.py); numbers are never reused
    TIMER = 41  # periodic timers (cluster/periodic_sync.py)
    USERS = 42  # ACL users (cluster/user_sync.py)
    WAITFOR = 50  # job outcomes (cluster/results.py)
    RESULT = 51
    DEDUP = 52  # the shared deduplication index (cluster/dedup_sync.py)
    BATCH = 60  # several messages of one type in one frame (``batch_body``, ``unbatch``)


#: The messages that carry job bodies: only theirs are searched for big values (the others
#: are packed as they are, at no extra cost).
CARRY_JOBS: Final = frozenset({MessageType.REPLJOB, MessageType.YOURJOBS})

#: The messages the bus may join into one BATCH frame: small, and many to one node in a round
#: (a REPLJOB is joined only when its job's values are small: see ``node/bus_core.py``).
BATCHABLE: Final = frozenset({MessageType.REPLJOB, MessageType.GOTJOB})
#: The most messages one BATCH frame carries.
BATCH_MAX: Final = 256

_HEX_DIGITS: Final = b"0123456789abcdef"
# Number -> MessageType without the Enum's own lookup (about 1 us per frame).
_TYPES: Final = {int(t): t for t in MessageType}
# The same as a tuple indexed by the number (None where no type has it): the decoder's
# lookup, without hashing.
_KINDS: Final[tuple[MessageType | None, ...]] = tuple(
    _TYPES.get(number) for number in range(max(_TYPES) + 1))
_KINDS_SIZE: Final = len(_KINDS)
# The decoder reads the header's magic as one word, and calls the bound method directly.
_MAGIC_WORD: Final = int.from_bytes(MAGIC, "big")
_unpack_header: Final = struct.Struct(">IBBH40sI").unpack_from


class WireError(Exception):
    """A frame that cannot be accepted; the link should be dropped."""


class BadMagic(WireError):
    pass


class BadVersion(WireError):
    pass


class UnknownType(WireError):
    pass


class Oversized(WireError):
    pass


class Truncated(WireError):
    pass


class MalformedBody(WireError):
    pass


class BadMac(WireError):
    pass


class Frame(NamedTuple):
    """One decoded frame (a tuple: cheaper to build than a frozen dataclass, as immutable)."""

    type: MessageType
    sender: str
    body: dict[str, Any]


def new_frame(kind: MessageType, sender: str, body: dict[str, Any]) -> Frame:
    """``Frame(kind, sender, body)`` without the named tuple's interpreted ``__new__``: one
    per frame received."""
    return _new_tuple(_FRAME, (kind, sender, body))


# Bound once: compiled, ``tuple.__new__`` is looked up on the type and ``Frame`` in the
# module's dict at every call.
_new_tuple: Final = tuple.__new__
_FRAME: Final = Frame


def received_body(frame: Frame) -> object:
    """``frame.body`` as it came, for a parser that checks it is a map before reading it: the
    decoder refuses any other body, but a harness or a test may hand a core any frame. Read
    through the tuple because mypyc-compiled code checks the field ``body`` against its
    declared type when it reads it, and would raise TypeError before the parser could refuse
    the frame as malformed."""
    fields: tuple[object, ...] = frame
    return fields[2]


def batch_body(mtype: MessageType, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """The body of a BATCH frame carrying ``bodies``, each a ``mtype`` message's body."""
    return {"type": int(mtype), "bodies": bodies}


def unbatch(frame: Frame) -> list[Frame]:
    """The messages of a BATCH frame, each as a frame of its own from the same sender, in
    order; ``MalformedBody`` unless it carries 1..``BATCH_MAX`` maps of one ``BATCHABLE``
    type (each message's own fields are checked by its core's parser, as for any frame)."""
    kind, bodies = batch_of(frame)
    sender = frame.sender
    return [new_frame(kind, sender, item) for item in bodies]


def batch_of(frame: Frame) -> tuple[MessageType, list[dict[str, Any]]]:
    """A BATCH frame's message type and bodies, checked as ``unbatch`` says, with no frame
    made per message (the bus hands a batch of GOTJOBs to the job core whole)."""
    body = received_body(frame)
    if not isinstance(body, dict):
        raise MalformedBody("body is not a map")
    number = body.get("type")
    kind = _TYPES.get(number) if type(number) is int else None
    if kind is None or kind not in BATCHABLE:
        raise MalformedBody("field 'type' must be a message type that may be batched")
    bodies = body.get("bodies")
    if not isinstance(bodies, list) or not 0 < len(bodies) <= BATCH_MAX:
        raise MalformedBody(f"field 'bodies' must be a list of 1..{BATCH_MAX} maps")
    for item in bodies:
        if not isinstance(item, dict):
            raise MalformedBody("field 'bodies' must be a list of maps")
    return kind, bodies


def _mac(secret: bytes, data: bytes) -> bytes:
    h = HMAC(secret, hashes.SHA256())
    h.update(data)
    return h.finalize()


def encode(frame: Frame, secret: bytes | None = None) -> bytes:
    return encode_message(frame.type, frame.sender, frame.body, secret)


# One packer for the process: building a Packer per frame cost about 1 us. Its buffer is
# reset by every packb (autoreset), and nothing here awaits between packing and returning.
_packer = msgpack.Packer(use_bin_type=True)


def pack_unknown_with(default: Callable[[Any], Any]) -> None:
    """Pack a value msgpack does not know as ``default(value)`` (the node: a body its append
    log holds is read back into the REPLJOB or YOURJOBS that carries it)."""
    global _packer
    _packer = msgpack.Packer(use_bin_type=True, default=default)


def encode_message(mtype: MessageType, sender: str, body: dict[str, Any],
                   secret: bytes | None = None, max_body: int = MAX_BODY) -> bytes:
    """``encode`` without building a ``Frame`` (one buffer; see ``encode_parts``)."""
    parts = encode_parts(mtype, sender, body, secret, max_body)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def encode_parts(mtype: MessageType, sender: str, body: dict[str, Any],
                 secret: bytes | None = None, max_body: int = MAX_BODY,
                 defer_mac: bool = False, small: bool = False) -> list[bytes]:
    """The frame as buffers to write in order: one for a small body (the bus's send path);
    for a large one, the header, then the packed body cut around its big values, each value a
    buffer of its own (never copied), then the MAC, unless ``defer_mac``: then the caller
    computes it (``mac_state``) as it writes the buffers, a slice at a time, and writes it
    after them (a frame of one buffer, small, always comes with its MAC). ``small``: the
    caller knows the body holds no big value (its search skipped: packed whole, the bytes are
    the same). ``Oversized`` if the body is over ``max_body``."""
    if len(sender) != 40:
        raise ValueError("sender must be a 40-hex node ID")
    big: list[bytes] = []
    packed: bytes = _packer.pack(_lift(body, _LIFT_DEPTH, big)
                                 if not small and mtype in CARRY_JOBS else body)
    if big and any(packed.count(_marker(i)) != 1 for i in range(len(big))):
        big = []
        packed = _packer.pack(body)
    flags = FLAG_MAC if secret is not None else 0
    if not big:
        if len(packed) > max_body:
            raise Oversized(f"body of {len(packed)} bytes exceeds {max_body}")
        header = HEADER.pack(MAGIC, WIRE_VERSION, flags, mtype, sender.encode(), len(packed))
        if len(packed) < _JOIN_BELOW:
            data = header + packed
            return [data + _mac(secret, data) if secret is not None else data]
        parts = [header, packed]
    else:
        parts = [b""]
        pos = 0
        for i, value in enumerate(big):
            mark = packed.index(_marker(i), pos)
            parts += [packed[pos:mark], _BIN32.pack(0xC6, len(value)), value]
            pos = mark + 18
        parts.append(packed[pos:])
        length = sum(len(p) for p in parts)
        if length > max_body:
            raise Oversized(f"body of {length} bytes exceeds {max_body}")
        parts[0] = HEADER.pack(MAGIC, WIRE_VERSION, flags, mtype, sender.encode(), length)
    if secret is not None and not defer_mac:
        h = HMAC(secret, hashes.SHA256())
        for part in parts:
            h.update(part)
        parts.append(h.finalize())
    return parts


def mac_state(secret: bytes) -> HMAC:
    """A frame's MAC to compute piece by piece (``update``, then ``finalize``)."""
    return HMAC(secret, hashes.SHA256())


def _token(i: int) -> bytes:
    return _TOKEN_PREFIX + i.to_bytes(4, "big")


def _marker(i: int) -> bytes:
    """How msgpack packs ``_token(i)`` (bin8 of 16 bytes)."""
    return b"\xc4\x10" + _token(i)


def _lift(value: Any, depth: int, big: list[bytes]) -> Any:
    """``value`` with each ``bytes`` of at least ``BIG_VALUE`` bytes in it (``depth`` levels
    of lists and maps deep) replaced by the next token, in packing order, the bytes appended
    to ``big``. The lists and maps on the way are copied, never changed: a core may send the
    same record to several nodes. Called for every frame: the common item (a number, a short
    string) costs one type test, no call."""
    t = type(value)
    if t is bytes:
        if len(value) < BIG_VALUE:
            return value
        big.append(value)
        return _token(len(big) - 1)
    if t is list:
        out: list[Any] | None = None
        for i, item in enumerate(value):
            kind = type(item)
            if kind is bytes:
                if len(item) < BIG_VALUE:
                    continue
            elif depth <= 1 or (kind is not list and kind is not dict):
                continue
            new = _lift(item, depth - 1, big)
            if new is not item:
                if out is None:
                    out = list(value)
                out[i] = new
        return value if out is None else out
    if t is dict:
        copied: dict[Any, Any] | None = None
        for key, item in value.items():
            kind = type(item)
            if kind is bytes:
                if len(item) < BIG_VALUE:
                    continue
            elif depth <= 1 or (kind is not list and kind is not dict):
                continue
            new = _lift(item, depth - 1, big)
            if new is not item:
                if copied is None:
                    copied = dict(value)
                copied[key] = new
        return value if copied is None else copied
    return value


_unpackb: Final = msgpack.unpackb


def _unpack(packed: memoryview | bytearray) -> tuple[Any, str]:
    """The msgpack value of ``packed`` and "", or None and why it is not msgpack."""
    try:
        # msgpack's defaults (1.0 on): str as str, map keys only str or bytes. Passed as
        # keywords they cost a parse per frame.
        return _unpackb(packed), ""
    except Exception as exc:  # msgpack raises several unrelated types
        return None, f"body is not msgpack: {exc}"


class FrameDecoder:
    def __init__(self, secret: bytes | None = None, max_body: int = MAX_BODY,
                 limit: Callable[[], int] | None = None) -> None:
        self._buf = bytearray()
        self._secret = secret
        # The largest body accepted (``max_body_for``); the transport may change it between
        # reads (CONFIG SET job-max-body-len). Or, with ``limit``, the least it accepts:
        # ``limit()`` says how much (never less than ``max_body``: ``max_body_for``), read
        # live only for a body above ``max_body``, not once per read.
        self.max_body = max_body
        self._limit = limit
        self._need = 0  # bytes of the frame being read, once its header is known
        # The MAC of the frame being read, over its first ``_hashed`` bytes: computed as
        # they arrive, so a big frame's MAC does not hold the loop once it is complete.
        self._hasher: HMAC | None = None
        self._hashed = 0
        # Sender fields already checked (a link carries one or a few): bytes -> str, and
        # the last one seen.
        self._senders: dict[bytes, str] = {}
        self._sender = b""
        self._sender_id = ""

    def feed(self, data: bytes) -> None:
        self._buf += data

    def missing(self) -> int:
        """Bytes still to come for the frame being read (0 when none is known): the transport
        reads that much at once rather than in small reads."""
        return max(self._need - len(self._buf), 0)

    def next(self) -> Frame | None:
        buf = self._buf
        have = len(buf)
        if have < HEADER_SIZE:
            # A wrong prefix is refused as soon as it is seen, not after a full header.
            if have and buf[:4] != MAGIC[: min(4, have)]:
                raise BadMagic(repr(bytes(buf[:4])))
            return None
        # Typed: compiled, the fields are then compared and added as machine integers.
        magic: int
        version: int
        flags: int
        mtype: int
        sender: bytes
        length: int
        magic, version, flags, mtype, sender, length = _unpack_header(buf)
        if magic != _MAGIC_WORD:
            raise BadMagic(repr(bytes(buf[:4])))
        if version != WIRE_VERSION:
            raise BadVersion(f"version {version}, expected {WIRE_VERSION}")
        kind = _KINDS[mtype] if mtype < _KINDS_SIZE else None
        if kind is None:
            raise UnknownType(f"message type {mtype}")
        if length > self.max_body:
            limit = self.max_body if self._limit is None else self._limit()
            if length > limit:
                raise Oversized(f"body of {length} bytes exceeds {limit}")
        if sender == self._sender:  # a link speaks for one node: no hash of the field
            sender_id = self._sender_id
        else:
            sender_id = self._check_sender(sender)
        has_mac = bool(flags & FLAG_MAC)
        end = HEADER_SIZE + length
        total = end + MAC_SIZE if has_mac else end
        if have < total:
            self._need = total
            if self._secret is not None and has_mac:
                self._hash_ahead(min(have, end))
            return None
        self._need = 0
        if self._secret is None and not has_mac and length < _JOIN_BELOW:
            # A small frame without a MAC (nearly every frame of a bus without a secret): its
            # body copied out costs less than the views below.
            try:
                body = _unpackb(buf[HEADER_SIZE:end])
                problem = ""
            except Exception as exc:  # msgpack raises several unrelated types
                body, problem = None, f"body is not msgpack: {exc}"
        else:
            # Views, not slices: a large frame's body is not copied before msgpack reads it.
            # The view is released before the buffer is cut (a bytearray with views cannot
            # resize).
            whole = memoryview(buf)
            try:
                if self._secret is not None:
                    if not has_mac:
                        raise BadMac("frame has no MAC but a cluster secret is set")
                    self._hash_ahead(end)
                    h = self._hasher
                    assert h is not None
                    self._hasher = None
                    try:
                        h.verify(bytes(whole[end:total]))
                    except InvalidSignature:
                        raise BadMac("wrong MAC") from None
                elif has_mac:
                    raise BadMac("frame carries a MAC but no cluster secret is set")
                view = whole[HEADER_SIZE:end]
                try:
                    body, problem = _unpack(view)
                finally:
                    view.release()
            finally:
                whole.release()
        del buf[:total]  # an authentic frame is consumed even if its body is refused
        if problem:
            raise MalformedBody(problem)
        if not isinstance(body, dict):
            raise MalformedBody("body is not a map")
        return new_frame(kind, sender_id, body)

    def _check_sender(self, sender: bytes) -> str:
        """The node ID of a header's sender field; MalformedBody unless it is 40 hex digits."""
        sender_id = self._senders.get(sender)
        if sender_id is None:
            # int(x, 16) would also accept spaces, "_" and "+": check the digits themselves
            # (what is left after deleting every hex digit must be nothing).
            if sender.translate(None, _HEX_DIGITS):
                raise MalformedBody("sender is not a 40-hex node ID")
            sender_id = sender.decode("ascii")
            if len(self._senders) >= 64:  # bounded: a link speaks for one node, or a few
                self._senders.clear()
            self._senders[sender] = sender_id
        self._sender = sender
        self._sender_id = sender_id
        return sender_id

    def _hash_ahead(self, upto: int) -> None:
        """Add the frame's bytes up to ``upto`` to its MAC."""
        if self._hasher is None:
            self._hasher = HMAC(self._secret or b"", hashes.SHA256())
            self._hashed = 0
        if upto > self._hashed:
            whole = memoryview(self._buf)
            piece = whole[self._hashed:upto]
            try:
                self._hasher.update(piece)
            finally:
                piece.release()
                whole.release()
            self._hashed = upto

    def truncated_at_eof(self) -> None:
        """Call when the link closes: leftover bytes mean a truncated frame."""
        if self._buf:
            raise Truncated(f"{len(self._buf)} bytes of an unfinished frame")
