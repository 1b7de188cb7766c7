"""Bus codec: literal bytes, each error type, HMAC, and a bounded seeded fuzz."""

import random
import struct

import pytest

from cluster import wire
from cluster.wire import Frame, FrameDecoder, MessageType

NODE = "a" * 40


def test_literal_ping_bytes() -> None:
    data = wire.encode(Frame(MessageType.PING, NODE, {}))
    assert data == b"TQCB\x02\x00\x00\x01" + NODE.encode() + b"\x00\x00\x00\x01" + b"\x80"


def test_roundtrip_and_incremental() -> None:
    frame = Frame(MessageType.MEET, NODE, {"addr": "127.0.0.1", "port": 17711})
    data = wire.encode(frame) * 2
    dec = FrameDecoder()
    out = []
    for b in data:
        dec.feed(bytes([b]))
        got = dec.next()
        if got is not None:
            out.append(got)
    assert out == [frame, frame]
    dec.truncated_at_eof()


def _header(magic=b"TQCB", version=wire.WIRE_VERSION, flags=0, mtype=1, sender=b"a" * 40, length=1):
    return struct.pack(">4sBBH40sI", magic, version, flags, mtype, sender, length)


@pytest.mark.parametrize(
    "data, error",
    [
        (b"XXXX", wire.BadMagic),
        (b"TX", wire.BadMagic),
        (_header(sender=b" " * 39 + b"a") + b"\x80", wire.MalformedBody),
        (_header(sender=b"A" * 40) + b"\x80", wire.MalformedBody),
        (_header(version=9) + b"\x80", wire.BadVersion),
        (_header(mtype=999) + b"\x80", wire.UnknownType),
        (_header(length=wire.MAX_BODY + 1), wire.Oversized),
        (_header(length=1) + b"\xc1", wire.MalformedBody),
        (_header(length=1) + b"\x01", wire.MalformedBody),
        (_header(sender=b"z" * 40) + b"\x80", wire.MalformedBody),
    ],
)
def test_each_error_is_distinct(data: bytes, error: type) -> None:
    dec = FrameDecoder()
    dec.feed(data)
    with pytest.raises(error):
        dec.next()


def test_limit_is_read_only_for_a_body_above_the_floor() -> None:
    reads = []

    def limit() -> int:
        reads.append(1)
        return 2 * wire.MAX_BODY

    dec = FrameDecoder(None, wire.MAX_BODY, limit)
    dec.feed(wire.encode(Frame(MessageType.PING, NODE, {})))
    assert dec.next() == Frame(MessageType.PING, NODE, {}) and not reads
    dec.feed(_header(length=2 * wire.MAX_BODY))  # allowed by the limit: waits for the body
    assert dec.next() is None and reads
    over = FrameDecoder(None, wire.MAX_BODY, limit)
    over.feed(_header(length=2 * wire.MAX_BODY + 1))
    with pytest.raises(wire.Oversized, match=str(2 * wire.MAX_BODY)):
        over.next()


def test_each_sender_is_checked_whatever_came_before() -> None:
    dec = FrameDecoder()
    dec.feed(wire.encode(Frame(MessageType.PING, NODE, {})))
    assert dec.next() is not None
    dec.feed(wire.encode(Frame(MessageType.PING, "b" * 40, {})))
    assert dec.next() == Frame(MessageType.PING, "b" * 40, {})
    dec.feed(_header(sender=b"g" * 40) + b"\x80")
    with pytest.raises(wire.MalformedBody):
        dec.next()


def test_truncated_at_eof() -> None:
    dec = FrameDecoder()
    dec.feed(wire.encode(Frame(MessageType.PING, NODE, {}))[:-1])
    assert dec.next() is None
    with pytest.raises(wire.Truncated):
        dec.truncated_at_eof()


def test_hmac_accepts_right_secret_refuses_others() -> None:
    frame = Frame(MessageType.PING, NODE, {"x": 1})
    signed = wire.encode(frame, b"s1")
    ok = FrameDecoder(b"s1")
    ok.feed(signed)
    assert ok.next() == frame
    for dec, data in [
        (FrameDecoder(b"s2"), signed),
        (FrameDecoder(b"s1"), wire.encode(frame)),
        (FrameDecoder(), signed),
    ]:
        dec.feed(data)
        with pytest.raises(wire.BadMac):
            dec.next()


def test_fuzz_decoder_never_raises_untyped() -> None:
    rng = random.Random(8)
    valid = wire.encode(Frame(MessageType.PONG, NODE, {"g": [1, 2]}))
    for _ in range(100_000):
        if rng.random() < 0.5:
            data = bytearray(valid)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data[: rng.randint(0, len(data))])
        else:
            data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 80)))
        dec = FrameDecoder()
        dec.feed(data)
        try:
            while dec.next() is not None:
                pass
        except wire.WireError:
            pass


def test_batch_roundtrip_gives_the_single_messages_in_order() -> None:
    bodies = [{"id": b"a" * 8}, {"id": b"b" * 8}, {"id": b"c" * 8}]
    frame = Frame(MessageType.BATCH, NODE, wire.batch_body(MessageType.GOTJOB, bodies))
    dec = FrameDecoder()
    dec.feed(wire.encode(frame))
    got = dec.next()
    assert got is not None and got.type is MessageType.BATCH
    assert wire.unbatch(got) == [Frame(MessageType.GOTJOB, NODE, b) for b in bodies]


@pytest.mark.parametrize("body", [
    {"bodies": [{}]},  # no type
    {"type": int(MessageType.PING), "bodies": [{}]},  # a type that is never batched
    {"type": int(MessageType.BATCH), "bodies": [{}]},  # no batch in a batch
    {"type": 999, "bodies": [{}]},  # no such type
    {"type": True, "bodies": [{}]},  # a bool is not a type number
    {"type": int(MessageType.GOTJOB)},  # no bodies
    {"type": int(MessageType.GOTJOB), "bodies": []},  # empty
    {"type": int(MessageType.GOTJOB), "bodies": [{}] * (wire.BATCH_MAX + 1)},  # too many
    {"type": int(MessageType.GOTJOB), "bodies": [{}, 1]},  # not a map
    {"type": int(MessageType.GOTJOB), "bodies": {"id": 1}},  # not a list
])
def test_a_malformed_batch_is_refused(body: dict[str, object]) -> None:
    with pytest.raises(wire.MalformedBody):
        wire.unbatch(Frame(MessageType.BATCH, NODE, body))  # type: ignore[arg-type]
