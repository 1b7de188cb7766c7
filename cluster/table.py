"""The node table of the membership core: entries, flags, and the effects that change them.

Theory of operation
-------------------
``Table`` holds one entry (``Node``) per known node, myself included, keyed by node ID, plus
the blacklist of forgotten IDs and the bus message counters. Every change to the table goes
through a method here that also appends the effects the change implies (``Connect`` for a
new address, ``Disconnect`` for an entry that goes away or is renamed, ``SaveNodes`` when
what ``nodes.conf`` holds changes), so the runtime's view of links never drifts from the
table. ``cluster.membership.Membership`` adds the events (frames, links, ticks) and
``cluster.commands`` the CLUSTER subcommands; the flags and rules are described in
``cluster/membership.py``.
"""

from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass, field
from typing import Final

from broker.config import Config
from cluster.effects import (
    Answer,
    Connect,
    Disconnect,
    EffectQueue,
    LinkId,
    LogLine,
    NewNodeId,
    SaveNodes,
    Send,
)
from cluster.messages import BUS_PORT_OFFSET, Fail, Gossip, Meet, Ping, Pong
from cluster.nodes_file import SavedNode, SavedNodes, render
from cluster.wire import MessageType

FAIL_REPORT_VALIDITY_MULT = 2
BLACKLIST_TTL_MS = 60_000
#: Flags a node publishes about itself in its PING/PONG/MEET.
PUBLISHED_FLAGS = frozenset({"leaving"})
#: Flags that live only in this node's memory (never gossiped nor saved).
_PRIVATE_FLAGS = frozenset({"meet", "myself"})


_UNREACHABLE: Final = frozenset({"myself", "handshake", "leaving", "pfail", "fail", "noaddr"})


@dataclass(slots=True, eq=False)
class Node:
    node_id: str
    ip: str
    port: int
    flags: set[str]
    ctime: int
    ping_sent: int = 0  # when the PING now unanswered was sent; 0: none
    pong_received: int = 0
    # The last heartbeat it sent us, on any link: a node that speaks is alive even while
    # our own PING waits (its inbound link came up before our outbound one).
    heard: int = 0
    link: LinkId | None = None  # the outbound link, while it is up
    link_since: int = 0
    # The last link answered a PING, then died: the node now listening there (if any) is
    # a new process, so the next link's first PING starts the pfail clock afresh.
    fresh_ping_on_next_link: bool = False
    fail_reports: dict[str, int] = field(default_factory=dict)  # reporter ID -> last time

    def failing(self) -> bool:
        return bool(self.flags & {"pfail", "fail"})


def hello_priority(node: Node, is_myself: bool) -> int:
    """HELLO's priority, Disque's values (lower is better for a client): 100 for a node that
    failed or is leaving, 10 for one suspected (pfail), 5 for one this node has no link to,
    1 otherwise."""
    if node.flags & {"fail", "leaving"}:
        return 100
    if "pfail" in node.flags:
        return 10
    if node.link is None and not is_myself:
        return 5
    return 1


def dialable(ip: str, port: int) -> str | None:
    """``ip`` in its normal form (as inet_ntop gives it) if ``ip:port`` may be dialled, else
    None: Disque's checks before any handshake. An IP literal only, so a name in a peer's
    gossip is never resolved, and a port whose bus port (port + 10000) exists."""
    if not 0 < port <= 65535 - BUS_PORT_OFFSET:
        return None
    try:
        return str(ipaddress.ip_address(ip))
    except ValueError:
        return None


def random_node_id(rng: random.Random) -> str:
    return f"{rng.getrandbits(160):040x}"


class Table(EffectQueue):
    """The node table and what changes it; ``Membership`` adds the events."""

    def __init__(self, config: Config, myself_id: str, rng: random.Random, now_ms: int,
                 saved: SavedNodes | None = None) -> None:
        self.config = config
        self.rng = rng
        self.outbox = []
        self.myself = Node(myself_id, "", 0, {"myself"}, now_ms)
        self.nodes: dict[str, Node] = {myself_id: self.myself}
        self.blacklist: dict[str, int] = {}  # node ID -> time it may be learnt again
        self.messages_sent = 0
        self.messages_received = 0
        if saved is not None:
            self._load(saved, now_ms)
        for node in self.nodes.values():
            if node is not self.myself and self.has_address(node):
                self._connect(node)
        self.save()  # a new node's ID is on disk at once

    def _load(self, saved: SavedNodes, now_ms: int) -> None:
        for s in saved.nodes:
            if s.node_id == saved.myself_id:
                self.myself.ip = s.ip
                self.myself.flags |= s.flags & PUBLISHED_FLAGS
                continue
            if s.node_id == self.myself.node_id:
                continue
            node = Node(s.node_id, s.ip, s.port, set(s.flags - {"myself", "handshake"}), now_ms)
            # As Disque: the file's times only say "there was one"; a restart counts from now.
            node.ping_sent = now_ms if s.ping_sent else 0
            node.pong_received = now_ms if s.pong_received else 0
            self.nodes[node.node_id] = node

    # ------------------------------------------------------------------------------------
    # Reading the table

    @property
    def myself_id(self) -> str:
        return self.myself.node_id

    @property
    def leaving(self) -> bool:
        return "leaving" in self.myself.flags

    def node_timeout(self) -> int:
        return int(self.config.cluster_node_timeout)

    def size(self) -> int:
        """Disque's cluster size: every entry not in handshake, myself and failed ones too."""
        return sum(1 for n in self.nodes.values() if "handshake" not in n.flags)

    def reachable_nodes(self) -> int:
        # Disque's list, plus noaddr: a node with no address cannot be reached (Disque
        # counts it, so replication would pick a node it cannot talk to).
        return sum(1 for n in self.nodes.values() if n.flags.isdisjoint(_UNREACHABLE))

    def hello_nodes(self) -> list[list[bytes]]:
        rows = []
        for n in self.ordered():
            if n.flags & {"handshake", "noaddr"}:
                continue  # no node a client could use: a temporary ID, or no address
            priority = hello_priority(n, n is self.myself)
            rows.append([n.node_id.encode(), n.ip.encode(), str(self.port_of(n)).encode(),
                         str(priority).encode()])
        return rows

    def ordered(self) -> list[Node]:
        """Myself first, then the others in the order they were learnt."""
        return [self.myself, *(n for n in self.nodes.values() if n is not self.myself)]

    def port_of(self, node: Node) -> int:
        return self.config.client_port if node is self.myself else node.port

    def saved_nodes(self) -> list[SavedNode]:
        """The table as CLUSTER NODES and nodes.conf show it."""
        return [SavedNode(n.node_id, n.ip, self.port_of(n), frozenset(n.flags - {"meet"}),
                          n.ping_sent, n.pong_received, n.link is not None or n is self.myself)
                for n in self.ordered()]

    def has_address(self, node: Node) -> bool:
        return bool(node.ip) and node.port > 0 and "noaddr" not in node.flags

    def blacklisted(self, node_id: str, now_ms: int) -> bool:
        until = self.blacklist.get(node_id)
        if until is not None and until < now_ms:
            del self.blacklist[node_id]
            return False
        return until is not None

    # ------------------------------------------------------------------------------------
    # Effects

    def save(self) -> None:
        self.outbox.append(SaveNodes(render(self.saved_nodes())))

    def log(self, level: str, text: str, key: str = "") -> None:
        self.outbox.append(LogLine(level, text, key))

    def _connect(self, node: Node) -> None:
        self.outbox.append(Connect(node.node_id, node.ip, node.port + BUS_PORT_OFFSET))

    def _heartbeat(self, kind: type[Ping | Pong | Meet], to: str | None) -> Ping | Pong | Meet:
        return kind(self.config.client_port, frozenset(self.myself.flags & PUBLISHED_FLAGS),
                    self._gossip(to))

    def send_ping(self, node: Node, kind: type[Ping | Meet], now_ms: int) -> None:
        if node.ping_sent == 0:
            node.ping_sent = now_ms  # an older unanswered PING keeps its time
        msg = self._heartbeat(kind, node.node_id)
        self.outbox.append(Send(node.node_id, msg.TYPE, msg.to_body()))
        self.messages_sent += 1

    def answer_pong(self, link: LinkId, to: str | None) -> None:
        msg = self._heartbeat(Pong, to)
        self.outbox.append(Answer(link, MessageType.PONG, msg.to_body()))
        self.messages_sent += 1

    def _gossip(self, to: str | None) -> tuple[Gossip, ...]:
        """A few other nodes, failing ones first: 1/10 of the table, at least 3 (Disque's
        rule, enough for failure reports to reach every node within their validity).
        Unlike Disque, nodes without a link are gossiped too: a link here exists only while
        connected, and a dead node is exactly the one whose reports must travel."""
        candidates = [n for n in self.nodes.values() if n is not self.myself
                      and n.node_id != to and not n.flags & {"handshake", "noaddr"}]
        wanted = min(max(3, len(self.nodes) // 10), len(candidates))
        failing = [n for n in candidates if n.failing()]
        self.rng.shuffle(failing)
        rest = [n for n in candidates if not n.failing()]
        picked = (failing + self.rng.sample(rest, min(len(rest), wanted)))[:wanted]
        return tuple(Gossip(n.node_id, n.ip, n.port, frozenset(n.flags - _PRIVATE_FLAGS),
                            n.ping_sent, n.pong_received) for n in picked)

    # ------------------------------------------------------------------------------------
    # Table changes

    def start_handshake(self, ip: str, port: int, now_ms: int, *, meet: bool) -> bool:
        """Add a handshake entry for ip:port; False if one is already under way or the
        address cannot be dialled (``dialable``: gossip and MEETs come from peers)."""
        normal = dialable(ip, port)
        if normal is None:
            return False
        ip = normal
        if any("handshake" in n.flags and n.ip == ip and n.port == port
               for n in self.nodes.values()):
            return False
        node = Node(random_node_id(self.rng), ip, port,
                    {"handshake", "meet"} if meet else {"handshake"}, now_ms)
        self.nodes[node.node_id] = node
        self._connect(node)
        return True

    def delete(self, node: Node) -> None:
        del self.nodes[node.node_id]
        for other in self.nodes.values():
            other.fail_reports.pop(node.node_id, None)
        self.outbox.append(Disconnect(node.node_id))

    def rename(self, node: Node, new_id: str) -> None:
        self.outbox.append(Disconnect(node.node_id))
        del self.nodes[node.node_id]
        node.node_id = new_id
        node.link = None  # the transport closes the old link; Connect brings a new one
        self.nodes[new_id] = node
        self._connect(node)

    def set_address(self, node: Node, ip: str, port: int) -> None:
        self.outbox.append(Disconnect(node.node_id))
        node.ip, node.port, node.link = ip, port, None
        node.flags.discard("noaddr")
        self._connect(node)

    def drop_address(self, node: Node) -> None:
        self.outbox.append(Disconnect(node.node_id))
        node.ip, node.port, node.link = "", 0, None
        node.flags.add("noaddr")
        node.flags -= {"pfail", "fail"}  # nothing to ping; its state is unknown, not failed

    def forget(self, node: Node, now_ms: int) -> None:
        self.blacklist[node.node_id] = now_ms + BLACKLIST_TTL_MS
        self.delete(node)
        self.save()

    def reset(self, hard: bool) -> None:
        for node in [n for n in self.nodes.values() if n is not self.myself]:
            self.delete(node)
        if hard:
            del self.nodes[self.myself.node_id]
            self.myself.node_id = random_node_id(self.rng)
            self.nodes[self.myself.node_id] = self.myself
            self.outbox.append(NewNodeId(self.myself.node_id))
        self.save()

    def set_leaving(self, leaving: bool, now_ms: int) -> None:
        if leaving == self.leaving:
            return
        if leaving:
            self.myself.flags.add("leaving")
        else:
            self.myself.flags.discard("leaving")
        self.save()
        # Tell every connected node now rather than at its next PING: HELLO elsewhere is how
        # clients learn to move away from a leaving node.
        for node in list(self.nodes.values()):
            if node.link is not None and "handshake" not in node.flags:
                self.send_ping(node, Ping, now_ms)

    # ------------------------------------------------------------------------------------
    # Failure detection

    def mark_failing_if_needed(self, node: Node, now_ms: int) -> None:
        if "pfail" not in node.flags or "fail" in node.flags:
            return
        validity = self.node_timeout() * FAIL_REPORT_VALIDITY_MULT
        for reporter, when in list(node.fail_reports.items()):
            if now_ms - when > validity:
                del node.fail_reports[reporter]
        votes = len(node.fail_reports) + 1  # and myself, who sees it pfail
        if votes < self.size() // 2 + 1:
            return
        self.log("notice", f"Marking node {node.node_id} as failing (quorum reached: "
                 f"{votes} of {self.size()})", key=f"fail:{node.node_id}")
        self.set_fail(node)
        body = Fail(node.node_id).to_body()
        for other in self.nodes.values():
            if other is not self.myself and other is not node and "handshake" not in other.flags:
                self.outbox.append(Send(other.node_id, Fail.TYPE, body))
                self.messages_sent += 1

    def set_fail(self, node: Node) -> None:
        node.flags.discard("pfail")
        node.flags.add("fail")
        self.save()
