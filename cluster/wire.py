"""The cluster bus codec: frames in, typed messages out, and back (sans-IO).

Theory of operation
-------------------
Every bus frame is a fixed 56-byte header followed by a msgpack body and, when a
``cluster-secret`` is configured, a 32-byte HMAC-SHA256 trailer over header+body:

    magic   4 bytes  b"TQCB"
    version 1 byte   WIRE_VERSION
    flags   1 byte   bit 0: an HMAC trailer follows the body
    type    2 bytes  big-endian message type number (see MessageType)
    sender  40 bytes the sender's node ID, lowercase hex ASCII
    length  4 bytes  big-endian body length (not counting the MAC)
    ... the msgpack body (a map), then the MAC if flagged.

``FrameDecoder`` is incremental: ``feed(bytes)`` and then ``next()`` returns a
``Frame`` or ``None`` ("not yet": the input is short). Every way a frame can be
wrong raises its own subclass of ``WireError`` so the transport can log why it
dropped a link. The trio transport (later, in node/) only moves bytes.
"""

from __future__ import annotations

import enum
import struct
from typing import Any, NamedTuple

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.hmac import HMAC

MAGIC = b"TQCB"
WIRE_VERSION = 1
HEADER = struct.Struct(">4sBBH40sI")
HEADER_SIZE = HEADER.size
MAC_SIZE = 32
FLAG_MAC = 0x01
#: Largest body accepted; larger frames are refused before buffering them.
MAX_BODY = 16 * 1024 * 1024


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
    QPOLICY = 40  # queue policies (cluster/policy_sync.py); numbers are never reused
    TIMER = 41  # periodic timers (cluster/periodic_sync.py)


_HEX_DIGITS = b"0123456789abcdef"
# Number -> MessageType without the Enum's own lookup (about 1 us per frame).
_TYPES = {int(t): t for t in MessageType}


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


def received_body(frame: Frame) -> object:
    """``frame.body`` as it came, for a parser that checks it is a map before reading it: the
    decoder refuses any other body, but a harness or a test may hand a core any frame. Read
    through the tuple because mypyc-compiled code checks the field ``body`` against its
    declared type when it reads it, and would raise TypeError before the parser could refuse
    the frame as malformed."""
    fields: tuple[object, ...] = frame
    return fields[2]


def _mac(secret: bytes, data: bytes) -> bytes:
    h = HMAC(secret, hashes.SHA256())
    h.update(data)
    return h.finalize()


def encode(frame: Frame, secret: bytes | None = None) -> bytes:
    return encode_message(frame.type, frame.sender, frame.body, secret)


# One packer for the process: building a Packer per frame cost about 1 us. Its buffer is
# reset by every packb (autoreset), and nothing here awaits between packing and returning.
_packer = msgpack.Packer(use_bin_type=True)


def encode_message(mtype: MessageType, sender: str, body: dict[str, Any],
                   secret: bytes | None = None) -> bytes:
    """``encode`` without building a ``Frame`` (the bus's send path)."""
    if len(sender) != 40:
        raise ValueError("sender must be a 40-hex node ID")
    packed: bytes = _packer.pack(body)
    if len(packed) > MAX_BODY:
        raise Oversized(f"body of {len(packed)} bytes exceeds {MAX_BODY}")
    flags = FLAG_MAC if secret is not None else 0
    data = HEADER.pack(MAGIC, WIRE_VERSION, flags, mtype, sender.encode(), len(packed)) + packed
    return data + _mac(secret, data) if secret is not None else data


class FrameDecoder:
    def __init__(self, secret: bytes | None = None) -> None:
        self._buf = bytearray()
        self._secret = secret
        # Sender fields already checked (a link carries one or a few): bytes -> str.
        self._senders: dict[bytes, str] = {}

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next(self) -> Frame | None:
        buf = self._buf
        # A wrong prefix is refused as soon as it is seen, not after a full header.
        if buf[:4] != MAGIC[: min(4, len(buf))]:
            raise BadMagic(repr(bytes(buf[:4])))
        if len(buf) < HEADER_SIZE:
            return None
        magic, version, flags, mtype, sender, length = HEADER.unpack_from(buf)
        if version != WIRE_VERSION:
            raise BadVersion(f"version {version}, expected {WIRE_VERSION}")
        kind = _TYPES.get(mtype)
        if kind is None:
            raise UnknownType(f"message type {mtype}")
        if length > MAX_BODY:
            raise Oversized(f"body of {length} bytes exceeds {MAX_BODY}")
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
        has_mac = bool(flags & FLAG_MAC)
        total = HEADER_SIZE + length + (MAC_SIZE if has_mac else 0)
        if len(buf) < total:
            return None
        end = HEADER_SIZE + length
        if self._secret is not None:
            if not has_mac:
                raise BadMac("frame has no MAC but a cluster secret is set")
            h = HMAC(self._secret, hashes.SHA256())
            h.update(bytes(buf[:end]))
            try:
                h.verify(bytes(buf[end:total]))
            except InvalidSignature:
                raise BadMac("wrong MAC") from None
        elif has_mac:
            raise BadMac("frame carries a MAC but no cluster secret is set")
        packed = buf[HEADER_SIZE:end]
        del buf[:total]
        try:
            body = msgpack.unpackb(packed, raw=False, strict_map_key=True)
        except Exception as exc:  # msgpack raises several unrelated types
            raise MalformedBody(f"body is not msgpack: {exc}") from None
        if not isinstance(body, dict):
            raise MalformedBody("body is not a map")
        return Frame(kind, sender_id, body)

    def truncated_at_eof(self) -> None:
        """Call when the link closes: leftover bytes mean a truncated frame."""
        if self._buf:
            raise Truncated(f"{len(self._buf)} bytes of an unfinished frame")
