"""What the cluster core asks the node's runtime to do, and what the runtime tells it.

Theory of operation
-------------------
The cluster core (``cluster/membership.py``, and the job state machines of later issues) is
sans-IO like the broker: it never opens a socket, reads a clock or writes a file. The runtime
(``node/bus.py`` in production, ``cluster/sim.py`` in tests) calls it with events and the
time, and takes effects from its ``outbox`` after every call, in order.

Links. Every link is bidirectional and the transport numbers each one with a ``LinkId`` (an
int, never reused within a process). A node keeps one *outbound* link to every node of its
table that has an address (handshake entries included), opened when the core asks for it with
``Connect`` and kept up by the transport (reconnecting every 100 ms) until ``Disconnect``. It
also accepts *inbound* links from anyone. Frames arriving on either kind of link go to the core with
the link's ID; an answer to a frame (PONG to PING or MEET) goes back on the link it came from
(``Answer``), which is what lets a node answer a sender it does not know yet, as Redis and
Disque do. Messages a node starts itself go on its outbound link to that node (``Send``): if
that link is not up the transport drops the message and counts it, and the core's own timers
(PING every so often, failure detection) take care of the loss.

Events into the core (method names on the core):
    receive(frame, link, peer_ip, local_ip, outbound_to, now_ms)
        a decoded ``cluster.wire.Frame`` arrived; ``outbound_to`` is the table ID the link
        was opened for (None on an inbound link); ``local_ip`` is this end's address of the
        link (how a node learns its own IP, as Redis does).
    link_up(node_id, link, now_ms) / link_down(node_id, link, now_ms)
        an outbound link opened or closed (closed includes "connect failed").
    tick(now_ms)
        called at least every 100 ms.

Effects out of the core (this module): each one is an immutable value (a frozen dataclass, a
named tuple for ``Answer``, a compiled class with final fields for ``Send``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from mypy_extensions import mypyc_attr

from cluster.wire import MessageType

LinkId = int


@dataclass(frozen=True, slots=True)
class Connect:
    """Open (and keep open) an outbound link to ``ip``:``bus_port`` for table entry
    ``node_id`` (possibly a handshake entry's temporary ID). Idempotent."""

    node_id: str
    ip: str
    bus_port: int


@dataclass(frozen=True, slots=True)
class Disconnect:
    """Close the outbound link of ``node_id`` and stop reconnecting it."""

    node_id: str


class Send:
    """Send a message on the outbound link of ``node_id`` (dropped if it is not up). The most
    frequent effect (two REPLJOBs per replicated ADDJOB on the origin, a GOTJOB on each
    replica): a compiled class, built by a direct call (a named tuple's ``__new__`` is
    interpreted, and ``tuple.__new__`` called from compiled code costs about 1 us more)."""

    __slots__ = ("node_id", "type", "body")

    def __init__(self, node_id: str, type: MessageType, body: dict[str, Any]) -> None:
        self.node_id: Final = node_id
        self.type: Final = type
        self.body: Final = body

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Send) and self.node_id == other.node_id
                and self.type is other.type and self.body == other.body)

    def __repr__(self) -> str:
        return f"Send({self.node_id!r}, {self.type!r}, {self.body!r})"


class Answer(NamedTuple):
    """Send a message back on the link a frame came from (dropped if it has closed)."""

    link: LinkId
    type: MessageType
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CloseLink:
    """Close one link (a peer that lied about its identity, or sent a frame that makes no
    sense). An outbound link so closed is reconnected only if its node is still wanted."""

    link: LinkId


@dataclass(frozen=True, slots=True)
class SaveNodes:
    """The node table changed: write ``content`` to ``cluster-config-file`` atomically
    (temp file, fsync, rename, fsync of the directory). Only the newest one matters."""

    content: str


@dataclass(frozen=True, slots=True)
class NewNodeId:
    """This node's ID changed (CLUSTER RESET HARD): the broker must mint job IDs from it."""

    node_id: str


@dataclass(frozen=True, slots=True)
class LogLine:
    """Something worth a line in the node's log. ``key`` groups lines for rate limiting
    (the runtime writes at most one line per key every few seconds); level is one of
    ``"debug"``, ``"notice"``, ``"warning"``."""

    level: str
    text: str
    key: str = ""


ClusterEffect = Connect | Disconnect | Send | Answer | CloseLink | SaveNodes | NewNodeId | LogLine


@mypyc_attr(allow_interpreted_subclasses=True)  # the tests' fake cores
class EffectQueue:
    """The effects a core queued since the runtime last took them: the base class of every
    core the bus flushes. Concrete, so that the bus's look at each core's ``outbox`` after
    every flush is a compiled read rather than a Python attribute lookup."""

    def __init__(self) -> None:
        self.outbox: list[ClusterEffect] = []

    def take_effects(self) -> list[ClusterEffect]:
        effects, self.outbox = self.outbox, []
        return effects
