"""The shared deduplication index on its own (broker/dedup.py): the TTL sweep pops only what
is due, skips what was replaced or dropped, and its heap never outgrows the index."""

from __future__ import annotations

from broker.dedup import SharedIndex

NODE = "n" * 40
NOW = 1_000_000


def _digest(i: int) -> bytes:
    return i.to_bytes(20, "big")


def test_the_sweep_drops_what_is_due_and_nothing_else() -> None:
    index = SharedIndex()
    for i in range(10):
        index.added(b"q", _digest(i), b"job-%d" % i, NOW + 1000 * (i + 1), NODE, NOW)
    index.expire(NOW + 500)
    assert len(index.entries) == 10 and len(index.expiry) == 10
    index.expire(NOW + 3000)
    assert sorted(index.entries) == [(b"q", _digest(i)) for i in range(3, 10)]
    assert sorted(index.by_job) == [b"job-%d" % i for i in range(3, 10)]


def test_an_entry_replaced_is_swept_once_by_its_newest_version() -> None:
    index = SharedIndex()
    index.added(b"q", _digest(1), b"job-1", NOW + 1000, NODE, NOW)
    index.ended(b"job-1", NODE, NOW + 10)  # the tombstone: same TTL, a second heap item
    # A newer job of the same body, due later: the old items must not drop it.
    index.added(b"q", _digest(1), b"job-2", NOW + 5000, NODE, NOW + 20)
    index.expire(NOW + 1000)
    assert index.entries[(b"q", _digest(1))][2] == b"job-2"
    assert index.by_job == {b"job-2": (b"q", _digest(1))}
    index.expire(NOW + 5000)
    assert index.entries == {} and index.by_job == {} and index.expiry == []


def test_the_heap_never_outgrows_the_index_under_churn() -> None:
    """Jobs added, ended and their tombstones dropped long before their TTL: the heap's
    items for them would stay until the TTL; it is rebuilt from the index instead."""
    index = SharedIndex()
    for i in range(20_000):
        now = NOW + i
        index.added(b"q", _digest(i), b"job-%d" % i, now + 86_400_000, NODE, now)
        index.ended(b"job-%d" % i, NODE, now)
        index.drop_tombstones(now - 100)
        assert len(index.expiry) <= 2 * len(index.entries) + 1025
    assert len(index.entries) <= 101
