"""The job messages' bodies (cluster/job_messages.py): every message survives the codec, and
every malformed field is refused with MalformedBody."""

from __future__ import annotations

from typing import Any

import pytest

from broker.job import Job
from cluster.job_messages import (
    BATCH_OF,
    MAX_BATCH,
    Batch,
    Enqueue,
    GotAck,
    JobRef,
    NeedJobs,
    PauseQueue,
    Queued,
    ReplJob,
    SetAck,
    YourJobs,
    batch_item,
    parse,
    parse_federation,
)
from cluster.wire import Frame, FrameDecoder, MalformedBody, MessageType, encode

ID = b"D-aaaaaaaa-000000000000000000000000-05a1"
NODE = "a" * 40


def _record() -> list[object]:
    job = Job(ID, b"q", b"body", repl=3, ttl=100, retry=10, delay=0, ctime=5 * 10**15,
              delivered=(NODE, "b" * 40))
    return job.to_record()


def _through_the_wire(kind: MessageType, body: dict[str, object]) -> Frame:
    dec = FrameDecoder(None)
    dec.feed(encode(Frame(kind, NODE, body), None))
    frame = dec.next()
    assert frame is not None
    return frame


@pytest.mark.parametrize("msg", [
    ReplJob(_record(), True), JobRef(MessageType.GOTJOB, ID), Enqueue(ID, 7),
    JobRef(MessageType.WILLQUEUE, ID), Queued(ID, True, False), SetAck(ID, 3),
    GotAck(ID, True), JobRef(MessageType.DELJOB, ID), JobRef(MessageType.WORKING, ID),
    PauseQueue(b"q", 3),
], ids=lambda m: m.type.name)
def test_every_job_message_round_trips(msg: object) -> None:
    frame = _through_the_wire(msg.type, msg.body())  # type: ignore[attr-defined]
    assert parse(frame) == msg


BAD = [
    (MessageType.GOTJOB, {}), (MessageType.GOTJOB, {"id": "D-not-bytes"}),
    (MessageType.GOTJOB, {"id": b"D-short"}), (MessageType.DELJOB, {"id": 5}),
    (MessageType.ENQUEUE, {"id": ID}), (MessageType.ENQUEUE, {"id": ID, "delay": -1}),
    (MessageType.ENQUEUE, {"id": ID, "delay": True}),
    (MessageType.QUEUED, {"id": ID, "nack": 1}),
    (MessageType.SETACK, {"id": ID, "mayhave": "3"}), (MessageType.SETACK, {"id": ID}),
    (MessageType.GOTACK, {"id": ID, "known": "yes"}),
    (MessageType.PAUSE, {"queue": "q", "flags": 1}), (MessageType.PAUSE, {"queue": b"q"}),
    (MessageType.PAUSE, {"queue": b"q", "flags": 4}), (MessageType.PAUSE, {"queue": b"", "flags": 1}),
    (MessageType.REPLJOB, {}), (MessageType.REPLJOB, {"job": [1, 2]}),
    (MessageType.REPLJOB, {"job": _record(), "noreply": "no"}),
    (MessageType.NACK, {"id": ID}), (MessageType.PING, {"id": ID}),
]


@pytest.mark.parametrize(("kind", "body"), BAD)
def test_malformed_bodies_are_refused(kind: MessageType, body: dict[str, object]) -> None:
    with pytest.raises(MalformedBody):
        parse(Frame(kind, NODE, body))


@pytest.mark.parametrize("change", [
    (3, "acked"), (3, "queued"), (12, []), (12, ["not-a-node"]), (0, b"D-bad"), (4, 0),
], ids=str)
def test_a_repljob_record_that_is_not_an_active_copy_is_refused(change: tuple[int, object]) -> None:
    record = _record()
    record[change[0]] = change[1]
    with pytest.raises(MalformedBody):
        parse(Frame(MessageType.REPLJOB, NODE, {"job": record}))


def test_holders_are_checked_however_many_were_seen_before() -> None:
    # More well-formed node IDs than the parser remembers, then a bad one among them.
    nodes = [f"{i:040x}" for i in range(40)]
    for i in range(0, 40, 2):
        record = _record()
        record[12] = nodes[i:i + 3]
        parse(Frame(MessageType.REPLJOB, NODE, {"job": record}))
    for bad in ("A" * 40, "a" * 39, "g" + "a" * 39, " " + "a" * 39, "a" * 41):
        record = _record()
        record[12] = [nodes[0], nodes[39], bad]
        with pytest.raises(MalformedBody):
            parse(Frame(MessageType.REPLJOB, NODE, {"job": record}))


def test_the_records_of_one_holder_share_its_string() -> None:
    first, second = _record(), _record()
    first[12] = ["".join(["c"] * 40)]
    second[12] = ["".join(["c"] * 40)]  # equal, another object
    assert first[12][0] is not second[12][0]
    a = parse(Frame(MessageType.REPLJOB, NODE, {"job": first}))
    b = parse(Frame(MessageType.REPLJOB, NODE, {"job": second}))
    assert isinstance(a, ReplJob) and isinstance(b, ReplJob)
    assert a.record[12] == b.record[12] == ["c" * 40]
    assert a.record[12][0] is b.record[12][0]


def test_a_body_that_is_not_a_map_is_refused() -> None:
    with pytest.raises(MalformedBody):
        parse(Frame(MessageType.GOTJOB, NODE, [ID]))  # type: ignore[arg-type]


@pytest.mark.parametrize("msg", [
    NeedJobs(b"q", 1), NeedJobs(b"x" * 100, 100), YourJobs([_record()]),
    YourJobs([_record()] * 100),
])
def test_federation_messages_survive_the_codec(msg: NeedJobs | YourJobs) -> None:
    assert parse_federation(_through_the_wire(msg.type, msg.body())) == msg


def test_federation_parse_refuses_job_messages_and_vice_versa() -> None:
    with pytest.raises(MalformedBody):
        parse_federation(_through_the_wire(MessageType.GOTJOB, {"id": ID}))
    with pytest.raises(MalformedBody):
        parse(_through_the_wire(MessageType.NEEDJOBS, {"queue": b"q", "count": 1}))


ID2 = b"D-bbbbbbbb-000000000000000000000000-05a1"


@pytest.mark.parametrize("msgs", [
    [SetAck(ID, 3), SetAck(ID2, 0)], [GotAck(ID, True), GotAck(ID2, False)],
    [JobRef(MessageType.DELJOB, ID), JobRef(MessageType.DELJOB, ID2)],
    [JobRef(MessageType.WILLQUEUE, ID)] * 3, [Queued(ID, True, False), Queued(ID2, False, True)],
], ids=lambda m: m[0].type.name)
def test_a_batch_carries_each_message_it_was_made_of(msgs: list[Any]) -> None:
    kind = BATCH_OF[msgs[0].type]
    batch = Batch(kind, [batch_item(m) for m in msgs])
    parsed = parse(_through_the_wire(kind, batch.body()))
    assert parsed == batch and parsed.messages() == msgs  # type: ignore[union-attr]


BAD_BATCHES = [
    (MessageType.DELJOB_BATCH, {}), (MessageType.DELJOB_BATCH, {"items": [ID]}),  # one: single
    (MessageType.DELJOB_BATCH, {"items": [ID] * (MAX_BATCH + 1)}),
    (MessageType.DELJOB_BATCH, {"items": [ID, b"D-short"]}),
    (MessageType.WILLQUEUE_BATCH, {"items": [ID, [ID]]}),
    (MessageType.SETACK_BATCH, {"items": [[ID, 3], [ID2]]}),
    (MessageType.SETACK_BATCH, {"items": [[ID, 3], [ID2, True]]}),
    (MessageType.SETACK_BATCH, {"items": [[ID, 3], [ID2, -1]]}),
    (MessageType.SETACK_BATCH, {"items": [[ID, 3], ID2]}),
    (MessageType.GOTACK_BATCH, {"items": [[ID, True], [ID2, 1]]}),
    (MessageType.GOTACK_BATCH, {"items": [[ID, True], [5, True]]}),
    (MessageType.QUEUED_BATCH, {"items": [[ID, True, False], [ID2, False]]}),
    (MessageType.QUEUED_BATCH, {"items": [[ID, True, False], [ID2, False, "no"]]}),
    (MessageType.QUEUED_BATCH, {"items": "not a list"}),
]


@pytest.mark.parametrize(("kind", "body"), BAD_BATCHES)
def test_malformed_batches_are_refused(kind: MessageType, body: dict[str, object]) -> None:
    with pytest.raises(MalformedBody):
        parse(Frame(kind, NODE, body))
