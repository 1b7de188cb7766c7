"""Disque job IDs: ``D-`` + 8 hex (node) + 24 base64 (random) + 4 hex (TTL minutes).

The 24 base64 characters are 144 pseudo-random bits (SHAKE-128 of a seed and a counter, see
``IdGenerator``): unique without coordination. The last 4 hex digits carry the TTL in minutes with the low bit set for
at-least-once jobs (RETRY > 0) and clear for at-most-once jobs, so a node that does not hold a
job can still tell whether an ACK for it needs to be remembered, and when to forget it.
"""

from __future__ import annotations

import binascii
import hashlib
import struct
from typing import Final

ID_LEN: Final = 40
_COUNTER: Final = struct.Struct("<Q")


def is_valid(job_id: bytes) -> bool:
    """Disque's check: 40 bytes with ``D-`` and the two dashes in place. Nothing more, so an
    ID from another implementation with a different alphabet is still accepted."""
    return (
        len(job_id) == ID_LEN
        and job_id[0] == 0x44
        and job_id[1] == 0x2D
        and job_id[10] == 0x2D
        and job_id[35] == 0x2D
    )


def ttl_field(ttl_seconds: int, retry: int) -> int:
    """The 16-bit TTL-in-minutes field with the delivery-guarantee bit."""
    minutes = min(ttl_seconds // 60, 0xFFFF) if ttl_seconds >= 0 else 1
    return minutes | 1 if retry else minutes & ~1


def ttl_minutes(job_id: bytes) -> int:
    try:
        return int(job_id[-4:], 16)
    except ValueError:
        return 0


def is_at_most_once(job_id: bytes) -> bool:
    return ttl_minutes(job_id) & 1 == 0


def keyed_id(node_id: str, key: bytes, ttl_seconds: int, retry: int) -> bytes:
    """The ID every node computes alike for ``key`` (a periodic timer's name and due time):
    the 24 characters come from ``SHA1(key)`` instead of a node's seed and counter, so two
    nodes that add the job for the same key add one job ID, not two."""
    digest = hashlib.sha1(b"trisque-keyed-id:" + key).digest()[:18]
    return (b"D-" + node_id[:8].encode() + b"-" + binascii.b2a_base64(digest, newline=False)
            + b"-%04x" % ttl_field(ttl_seconds, retry))


# How many IDs one hash gives (see IdGenerator): 18 bytes each.
IDS_PER_BLOCK: Final = 32
_RANDOM_BYTES: Final = 18  # 144 bits: 24 base64 characters, no padding


class IdGenerator:
    """Makes IDs from a random seed (injected, so tests are repeatable) and a counter.

    SHAKE-128 in counter mode, as Disque uses SHA1 in counter mode, but one hash gives the
    random part of ``IDS_PER_BLOCK`` IDs: the digest of (seed, block counter), 18 bytes per ID,
    is turned into base64 in one call, and each ID takes the next 24 characters of it. A
    hash, a base64 call and their buffers per ID were about 0.8 us of every ADDJOB
    (compiled); per block they cost a thirty-second of that."""

    __slots__ = ("_prefix", "_seeded", "_counter", "_text", "_next", "_suffix_key",
                 "_suffix")

    def __init__(self, node_id: str, seed: bytes) -> None:
        self._prefix = b"D-" + node_id[:8].encode() + b"-"
        # The hash state after the seed, copied for each block: the seed is hashed once.
        self._seeded = hashlib.shake_128(seed)
        self._counter = 0
        self._text = b""  # the block's base64: 24 characters per ID
        self._next = IDS_PER_BLOCK  # the next unused ID of the block
        self._suffix_key = -1  # the TTL field of the last ID made, and its text
        self._suffix = b""

    def next_id(self, ttl_seconds: int, retry: int) -> bytes:
        if self._next == IDS_PER_BLOCK:
            self._counter += 1
            h = self._seeded.copy()
            h.update(_COUNTER.pack(self._counter))
            self._text = binascii.b2a_base64(h.digest(_RANDOM_BYTES * IDS_PER_BLOCK),
                                              newline=False)
            self._next = 0
        at = self._next * 24
        self._next += 1
        field = ttl_field(ttl_seconds, retry)
        if field != self._suffix_key:
            self._suffix_key = field
            self._suffix = b"-%04x" % field
        return self._prefix + self._text[at : at + 24] + self._suffix
