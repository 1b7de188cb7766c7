"""Disque job IDs: ``D-`` + 8 hex (node) + 24 base64 (random) + 4 hex (TTL minutes).

The 24 base64 characters encode the high 144 bits of ``SHA1(seed || counter)``: unique without
coordination. The last 4 hex digits carry the TTL in minutes with the low bit set for
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


class IdGenerator:
    """Makes IDs from a random seed (injected, so tests are repeatable) and a counter."""

    __slots__ = ("_prefix", "_seeded", "_counter", "_suffixes")

    def __init__(self, node_id: str, seed: bytes) -> None:
        self._prefix = b"D-" + node_id[:8].encode() + b"-"
        # SHA1 state after the seed, copied for each ID: the seed is hashed once, not per ID.
        self._seeded = hashlib.sha1(seed)
        self._counter = 0
        self._suffixes: dict[tuple[int, bool], bytes] = {}

    def next_id(self, ttl_seconds: int, retry: int) -> bytes:
        self._counter += 1
        h = self._seeded.copy()
        h.update(_COUNTER.pack(self._counter))
        key = (ttl_seconds, retry > 0)
        suffix = self._suffixes.get(key)
        if suffix is None:
            suffix = b"-%04x" % ttl_field(ttl_seconds, retry)
            if len(self._suffixes) < 1024:
                self._suffixes[key] = suffix
        return self._prefix + binascii.b2a_base64(h.digest()[:18], newline=False) + suffix
