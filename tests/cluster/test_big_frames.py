"""Big jobs in the sans-IO cluster code: frames that carry big values without copying them,
batches cut by bytes, and a big REPLJOB not re-sent while its first copy may be on the way."""

from __future__ import annotations

import msgpack
import pytest

from cluster import wire
from cluster.batches import cut, job_record_size
from cluster.sim import Faults
from cluster.wire import MessageType as M
from tests.cluster.jobsim import JobCluster

MB = 1024 * 1024
SENDER = "ab" * 20


@pytest.mark.parametrize("secret", [None, b"s3cret"])
def test_a_frame_with_big_values_is_the_plain_encoding_and_decodes_back(
        secret: bytes | None) -> None:
    big, other = b"a" * (3 * MB), b"b" * wire.BIG_VALUE
    record = [b"D-id", b"q", big, "active", [other, b"small"]]
    body = {"job": record, "jobs": [[b"c" * (wire.BIG_VALUE - 1)], [big]], "noreply": False}
    parts = wire.encode_parts(M.REPLJOB, SENDER, body, secret, 8 * MB)
    assert any(p is big for p in parts) and any(p is other for p in parts)  # never copied
    assert record[2] is big and record[4][0] is other  # the caller's body is left as it was
    data = b"".join(parts)
    packed = msgpack.packb(body, use_bin_type=True)
    assert data[wire.HEADER_SIZE:wire.HEADER_SIZE + len(packed)] == packed
    assert len(data) == wire.HEADER_SIZE + len(packed) + (wire.MAC_SIZE if secret else 0)
    decoder = wire.FrameDecoder(secret, 8 * MB)
    for k in range(0, len(data), MB):  # as reads arrive
        decoder.feed(data[k:k + MB])
        if k + MB < len(data):
            assert decoder.next() is None and decoder.missing() == len(data) - k - MB
    frame = decoder.next()
    assert frame is not None and frame.body == body and decoder.missing() == 0


def test_a_small_value_that_looks_like_a_token_still_encodes_exactly() -> None:
    """The encoder marks big values with tokens while packing the rest: a body holding a
    token's own bytes must not make it cut in the wrong place."""
    big = b"a" * wire.BIG_VALUE
    token = wire._token(0)  # what stands for the first big value while packing
    for body in ({"a": token, "x": big}, {"x": big, "a": token}):
        data = b"".join(wire.encode_parts(M.REPLJOB, SENDER, body, None, 8 * MB))
        assert data[wire.HEADER_SIZE:] == msgpack.packb(body, use_bin_type=True)


def test_a_body_past_the_limit_is_refused_by_sender_and_receiver() -> None:
    body = {"job": [b"x" * (2 * MB)]}
    with pytest.raises(wire.Oversized):
        wire.encode_parts(M.REPLJOB, SENDER, body, None, 2 * MB)
    data = b"".join(wire.encode_parts(M.REPLJOB, SENDER, body, None, 3 * MB))
    whole = wire.encode_message(M.QPOLICY, SENDER, body, None, 3 * MB)  # packed as it is
    assert whole[wire.HEADER_SIZE:] == data[wire.HEADER_SIZE:]
    decoder = wire.FrameDecoder(None, 2 * MB)
    decoder.feed(data[:wire.HEADER_SIZE])  # refused from the header, before the body
    with pytest.raises(wire.Oversized):
        decoder.next()
    assert wire.max_body_for(128 * MB) == 129 * MB
    assert wire.max_body_for(1 * MB) == wire.MAX_BODY


def test_cut_keeps_order_within_count_and_bytes_and_sends_a_big_record_alone() -> None:
    sizes = [1, 1, 3, 1, 9, 1, 1, 1, 1]
    batches = cut(sizes, lambda r: r, max_count=3, max_bytes=4)
    assert batches == [[1, 1], [3, 1], [9], [1, 1, 1], [1]]
    assert cut([], lambda r: r, 3) == []


def test_yourjobs_of_1mb_jobs_go_in_frames_of_a_few_mib_and_all_arrive() -> None:
    c = JobCluster(2, federation=True)
    for k in range(20):
        c.addjob(0, "q", f"{k:02}" + "x" * (MB - 2), "0", "REPLICATE", "1")
    client = c.client()
    c.cmd(1, "GETJOB", "TIMEOUT", "5000", "COUNT", "20", "FROM", "q", client=client)
    got: list[bytes] = []
    for _ in range(50):
        c.run_for(100)
        jobs = c.cmd(1, "GETJOB", "NOHANG", "COUNT", "20", "FROM", "q")
        if isinstance(jobs, list):
            got += [job[2] for job in jobs]
        if len(got) + len(c.reply_to(1, client) or []) >= 20:
            break
    got += [job[2] for job in (c.reply_to(1, client) or [])]
    assert sorted(b[:2] for b in got) == [f"{k:02}".encode() for k in range(20)]
    frames = [body["jobs"] for at, s, d, t, body in c.sends if t is M.YOURJOBS]
    assert len(frames) > 1
    for records in frames:
        assert sum(job_record_size(r) for r in records) <= wire.BATCH_BYTES


def test_a_big_repljob_is_resent_only_once_its_copy_had_time_to_arrive() -> None:
    c = JobCluster(3)
    c.sim.faults[(2, 0)] = Faults(drop=1.0)  # node2's GOTJOB never arrives: the ADDJOB waits
    client = c.client()
    c.cmd(0, "ADDJOB", "q", "x" * (2 * MB), "1000", "REPLICATE", "3", client=client)
    assert c.run_until(lambda: c.reply_to(0, client) is not None, 1200)
    to_2 = [at for at, s, d in c.sent(M.REPLJOB, None, src=0) if d == c.node_id(2)]
    # 2 MiB at 10 MB/s: about every 210 ms, not every 50 ms (20 copies of 2 MiB in 1 s).
    assert 4 <= len(to_2) <= 6, to_2
    assert all(b - a >= 2 * MB // 10_000 for a, b in zip(to_2, to_2[1:], strict=False))


def test_a_big_frame_signed_later_slice_by_slice_is_the_same_frame() -> None:
    """What the bus's writer does with a big frame when a cluster secret is set: the MAC
    computed over the buffers as they are written, then appended, and the receiver checking
    it as the bytes arrive."""
    body = {"job": [b"D-id", b"q", b"z" * (3 * MB + 5)]}
    parts = wire.encode_parts(M.REPLJOB, SENDER, body, b"k", 8 * MB, defer_mac=True)
    mac = wire.mac_state(b"k")
    for part in parts:
        for k in range(0, len(part), MB):
            mac.update(memoryview(part)[k:k + MB])
    data = b"".join(parts) + mac.finalize()
    assert data == wire.encode_message(M.REPLJOB, SENDER, body, b"k", 8 * MB)
    small = wire.encode_parts(M.GOTJOB, SENDER, {"id": b"x"}, b"k", defer_mac=True)
    assert small == [wire.encode_message(M.GOTJOB, SENDER, {"id": b"x"}, b"k")]
    decoder = wire.FrameDecoder(b"k", 8 * MB)
    for k in range(0, len(data), 100_000):
        decoder.feed(data[k:k + 100_000])
        frame = decoder.next()
    assert frame is not None and frame.body == body
    decoder.feed(data[:-1] + bytes([data[-1] ^ 1]))  # one bit of the MAC flipped
    with pytest.raises(wire.BadMac):
        while decoder.next() is None:
            pass


def test_a_big_job_asks_one_more_node_only_once_its_copies_had_time_to_arrive() -> None:
    c = JobCluster(5)
    for k in range(1, 5):  # no GOTJOB ever arrives: the ADDJOB waits for its whole timeout
        c.sim.faults[(k, 0)] = Faults(drop=1.0)
    client = c.client()
    c.cmd(0, "ADDJOB", "q", "x" * (2 * MB), "300", "REPLICATE", "3", client=client)
    c.run_for(150)
    asked = {d for at, s, d in c.sent(M.REPLJOB, None, src=0)}
    # Two nodes for REPLICATE 3; a small job would have had two more asked by now (50 ms).
    assert len(asked) == 2, asked
    c.run_for(100)
    assert len({d for at, s, d in c.sent(M.REPLJOB, None, src=0)}) == 3
