"""Typed bodies of the membership messages: PING, PONG, MEET and FAIL.

Theory of operation
-------------------
``cluster.wire`` turns bytes into a ``Frame`` whose body is whatever msgpack map the peer
sent. This module is the only place that trusts nothing about that map: ``from_frame``
checks every field's type and range and raises ``cluster.wire.MalformedBody`` for anything
wrong, so the membership core only ever sees well-formed values and a hostile or buggy
peer cannot crash it. ``to_body`` is the inverse (a plain dict msgpack can encode).

PING, PONG and MEET share one shape (as in Redis and Disque, a PONG is a PING sent as an
answer and a MEET a PING that asks the receiver to add the sender):

    port    int        the sender's client port (its bus listens on port + BUS_PORT_OFFSET)
    flags   [str]      the sender's own published flags (``leaving`` today)
    gossip  [map]      a few nodes the sender knows, each:
                         id             40-hex node ID
                         ip             str ("" if unknown)
                         port           int, client port
                         flags          [str]  (pfail, fail, leaving, noaddr, handshake)
                         ping_sent      int ms, 0 = no ping in flight
                         pong_received  int ms, 0 = never

FAIL carries ``node``: the 40-hex ID of the node the sender marked failed.

Unknown flag names are ignored rather than refused: a newer node may publish flags an older
one does not know, and dropping its whole PING would look like a failure.

The message type numbers of the job messages (REPLJOB ...) are defined in ``cluster.wire``;
their bodies belong to the job cores of later issues.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Self

from cluster.wire import Frame, MalformedBody, MessageType

#: The cluster bus listens on the client port plus this (fixed, as in Disque).
BUS_PORT_OFFSET = 10000
#: Flags a node may publish about itself or gossip about others.
WIRE_FLAGS = frozenset({"pfail", "fail", "leaving", "noaddr", "handshake"})
#: Bounds that keep a hostile body from making the core allocate without limit.
MAX_GOSSIP = 1000
MAX_IP_LEN = 64

_HEX = frozenset("0123456789abcdef")
_HEX_DIGITS = "0123456789abcdef"


def is_node_id(value: object) -> bool:
    # Nothing left once every hex digit is stripped from both ends: all 40 are hex digits
    # (a set per call cost about 1 us; every REPLJOB checks each holder).
    return isinstance(value, str) and len(value) == 40 and not value.strip(_HEX_DIGITS)


def int_field(body: dict[str, Any], key: str, lo: int, hi: int) -> int:
    value = body.get(key)
    # bool is an int subclass: refuse it, a peer sending True for a port is broken.
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise MalformedBody(f"field {key!r} must be an integer in [{lo}, {hi}]")
    return value


def _flags(body: dict[str, Any], key: str) -> frozenset[str]:
    value = body.get(key)
    if not isinstance(value, list) or len(value) > 32 or not all(
            isinstance(f, str) for f in value):
        raise MalformedBody(f"field {key!r} must be a list of flag names")
    return frozenset(value) & WIRE_FLAGS


def _map(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedBody(f"{what} must be a map")
    return value


@dataclass(frozen=True, slots=True)
class Gossip:
    """What the sender knows about one other node."""

    node_id: str
    ip: str
    port: int
    flags: frozenset[str]
    ping_sent: int
    pong_received: int

    def to_body(self) -> dict[str, Any]:
        return {"id": self.node_id, "ip": self.ip, "port": self.port,
                "flags": sorted(self.flags), "ping_sent": self.ping_sent,
                "pong_received": self.pong_received}

    @classmethod
    def from_body(cls, value: object) -> Gossip:
        body = _map(value, "gossip entry")
        node_id = body.get("id")
        if not is_node_id(node_id):
            raise MalformedBody("gossip entry 'id' is not a 40-hex node ID")
        ip = body.get("ip")
        if not isinstance(ip, str) or len(ip) > MAX_IP_LEN:
            raise MalformedBody("gossip entry 'ip' must be a short string")
        assert isinstance(node_id, str)
        return cls(node_id, ip, int_field(body, "port", 0, 65535), _flags(body, "flags"),
                   int_field(body, "ping_sent", 0, 2**63 - 1),
                   int_field(body, "pong_received", 0, 2**63 - 1))


@dataclass(frozen=True, slots=True)
class _Heartbeat:
    TYPE: ClassVar[MessageType]

    port: int
    flags: frozenset[str]
    gossip: tuple[Gossip, ...] = ()

    def to_body(self) -> dict[str, Any]:
        return {"port": self.port, "flags": sorted(self.flags),
                "gossip": [g.to_body() for g in self.gossip]}

    @classmethod
    def from_frame(cls, frame: Frame) -> Self:
        _check_type(frame, cls.TYPE)
        return cls.from_body(frame.body)

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        gossip = body.get("gossip")
        if not isinstance(gossip, list) or len(gossip) > MAX_GOSSIP:
            raise MalformedBody(f"field 'gossip' must be a list of at most {MAX_GOSSIP}")
        return cls(int_field(body, "port", 1, 65535), _flags(body, "flags"),
                   tuple(Gossip.from_body(g) for g in gossip))


@dataclass(frozen=True, slots=True)
class Ping(_Heartbeat):
    """Sent on an outbound link: every so often, and first thing on a new link."""

    TYPE: ClassVar[MessageType] = MessageType.PING


@dataclass(frozen=True, slots=True)
class Pong(_Heartbeat):
    """The answer to PING and MEET, on the link they came from."""

    TYPE: ClassVar[MessageType] = MessageType.PONG


@dataclass(frozen=True, slots=True)
class Meet(_Heartbeat):
    """A PING that asks the receiver to add the sender (CLUSTER MEET's handshake)."""

    TYPE: ClassVar[MessageType] = MessageType.MEET


@dataclass(frozen=True, slots=True)
class Fail:
    """Broadcast by a node that reached the failure quorum about ``node_id``."""

    TYPE: ClassVar[MessageType] = MessageType.FAIL

    node_id: str

    def to_body(self) -> dict[str, Any]:
        return {"node": self.node_id}

    @classmethod
    def from_frame(cls, frame: Frame) -> Fail:
        _check_type(frame, cls.TYPE)
        node_id = frame.body.get("node")
        if not is_node_id(node_id):
            raise MalformedBody("field 'node' is not a 40-hex node ID")
        assert isinstance(node_id, str)
        return cls(node_id)


Heartbeat = Ping | Pong | Meet
Message = Ping | Pong | Meet | Fail

_PARSERS: dict[MessageType, Any] = {
    MessageType.PING: Ping.from_frame,
    MessageType.PONG: Pong.from_frame,
    MessageType.MEET: Meet.from_frame,
    MessageType.FAIL: Fail.from_frame,
}
#: The message types the membership core handles; the rest belong to other cores.
MEMBERSHIP_TYPES = frozenset(_PARSERS)


def _check_type(frame: Frame, expected: MessageType) -> None:
    if frame.type is not expected:
        raise MalformedBody(f"a {frame.type.name} frame is not a {expected.name} message")
    if not isinstance(frame.body, dict):
        raise MalformedBody("body is not a map")


def parse(frame: Frame) -> Message:
    """The typed message of a membership frame; MalformedBody if it is not one."""
    parser = _PARSERS.get(frame.type)
    if parser is None:
        raise MalformedBody(f"{frame.type.name} is not a membership message")
    result: Message = parser(frame)
    return result
