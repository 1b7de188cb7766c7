"""A deduplicating queue's first ADDJOB after a start indexes the jobs whose body the log
holds by their reference's length and CRC-32, reading no body, and reads back only a
candidate with the same length and CRC-32, to compare it (broker/policy_table.py)."""

from __future__ import annotations

from typing import Any

from broker.job import BodyRef, Job, JobState
from broker.policy_table import PolicyTable
from protocol.checksum import crc32

NODE = "a" * 40


class _Broker:
    """What ``PolicyTable._find_local`` reads of the broker; counts the bodies read."""

    def __init__(self, bodies: dict[bytes, bytes]) -> None:
        self.node_id = NODE
        self.jobs: dict[bytes, Job] = {}
        self.store: dict[int, bytes] = {}
        self.reads = 0
        for n, (job_id, body) in enumerate(bodies.items()):
            job = Job(job_id, b"q", b"", repl=1, ttl=3600, retry=300, delay=0,
                      ctime=1_000_000, delivered=(NODE,), state=JobState.QUEUED)
            job.ref = BodyRef(1, n * 4096, len(body), crc32(body))
            self.store[n * 4096] = body
            self.jobs[job_id] = job

    def read_body(self, ref: BodyRef) -> bytes | None:
        self.reads += 1
        return self.store.get(ref.offset)


def _id(i: int) -> bytes:
    return b"D-" + NODE[:8].encode() + b"-%030d-05a1" % i


def test_indexing_reads_nothing_and_a_hit_reads_its_candidate_once() -> None:
    bodies = {_id(i): b"body %d " % i * 100 for i in range(1000)}
    b: Any = _Broker(bodies)
    table = PolicyTable()
    assert table._find_local(b, b"q", b"no such body") is None
    assert b.reads == 0  # 1,000 jobs indexed, none read
    assert table._find_local(b, b"q", bodies[_id(7)]) == _id(7)
    assert b.reads == 1
    assert table._find_local(b, b"q", bodies[_id(7)]) == _id(7)  # now by its digest
    assert b.reads == 1


def test_a_body_with_the_same_length_and_crc_is_compared_not_trusted() -> None:
    body = b"x" * 64
    b: Any = _Broker({_id(1): body})
    b.store[0] = b"y" * 64  # what the log holds differs, though the reference says the same
    table = PolicyTable()
    assert table._find_local(b, b"q", body) is None
    assert b.reads == 1
