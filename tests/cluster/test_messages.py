"""Typed membership messages: round trip through the wire codec, and refusal of bad bodies."""

from __future__ import annotations

from typing import Any

import pytest

from cluster import wire
from cluster.messages import Fail, Gossip, Meet, Ping, Pong, parse
from cluster.wire import Frame, FrameDecoder, MalformedBody, MessageType

NODE = "a" * 40


def through_the_wire(frame: Frame) -> Frame:
    decoder = FrameDecoder(b"k")
    decoder.feed(wire.encode(frame, b"k"))
    out = decoder.next()
    assert out is not None
    return out


@pytest.mark.parametrize("kind", [Ping, Pong, Meet])
def test_heartbeats_round_trip(kind: type[Ping | Pong | Meet]) -> None:
    gossip = (Gossip("b" * 40, "10.0.0.2", 7712, frozenset({"pfail"}), 5, 6),
              Gossip("c" * 40, "", 7713, frozenset(), 0, 0))
    msg = kind(7711, frozenset({"leaving"}), gossip)
    frame = through_the_wire(Frame(kind.TYPE, NODE, msg.to_body()))
    assert parse(frame) == msg
    assert kind.from_frame(frame) == msg


def test_fail_round_trips() -> None:
    frame = through_the_wire(Frame(MessageType.FAIL, NODE, Fail("b" * 40).to_body()))
    assert parse(frame) == Fail("b" * 40)


def test_unknown_flags_are_ignored_not_refused() -> None:
    body = {"port": 1, "flags": ["leaving", "from-the-future"], "gossip": []}
    assert parse(Frame(MessageType.PING, NODE, body)).flags == {"leaving"}  # type: ignore[union-attr]


GOOD_GOSSIP = {"id": "b" * 40, "ip": "1.2.3.4", "port": 1, "flags": [], "ping_sent": 0,
               "pong_received": 0}


@pytest.mark.parametrize("body", [
    {},
    {"port": 7711, "flags": []},
    {"port": 0, "flags": [], "gossip": []},
    {"port": 65536, "flags": [], "gossip": []},
    {"port": 1.5, "flags": [], "gossip": []},
    {"port": False, "flags": [], "gossip": []},
    {"port": 1, "flags": [1], "gossip": []},
    {"port": 1, "flags": ["x"] * 33, "gossip": []},
    {"port": 1, "flags": [], "gossip": [GOOD_GOSSIP] * 1001},
    {"port": 1, "flags": [], "gossip": [5]},
    {"port": 1, "flags": [], "gossip": [GOOD_GOSSIP | {"id": "B" * 40}]},
    {"port": 1, "flags": [], "gossip": [GOOD_GOSSIP | {"ip": 4}]},
    {"port": 1, "flags": [], "gossip": [GOOD_GOSSIP | {"ip": "1" * 65}]},
    {"port": 1, "flags": [], "gossip": [GOOD_GOSSIP | {"ping_sent": -1}]},
    {"port": 1, "flags": [], "gossip": [{k: v for k, v in GOOD_GOSSIP.items() if k != "port"}]},
])
def test_bad_heartbeat_bodies_raise_malformed_body(body: dict[str, Any]) -> None:
    with pytest.raises(MalformedBody):
        parse(Frame(MessageType.PING, NODE, body))


@pytest.mark.parametrize("body", [{}, {"node": "x"}, {"node": None}, {"node": "a" * 41}])
def test_bad_fail_bodies_raise_malformed_body(body: dict[str, Any]) -> None:
    with pytest.raises(MalformedBody):
        parse(Frame(MessageType.FAIL, NODE, body))


def test_a_job_message_is_not_a_membership_message() -> None:
    with pytest.raises(MalformedBody):
        parse(Frame(MessageType.REPLJOB, NODE, {}))
    with pytest.raises(MalformedBody):
        Ping.from_frame(Frame(MessageType.PONG, NODE, {"port": 1, "flags": [], "gossip": []}))
