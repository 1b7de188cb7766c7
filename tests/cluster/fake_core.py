"""A tiny cluster core that follows ``cluster/effects.py``'s contract, to test the trio bus
without the real membership core: MEET/PING/PONG with the sender's bus port and the nodes it
knows (gossip), a handshake entry renamed on the first PONG, SaveNodes on every change.
It records every event so tests can check what the transport reported."""

from __future__ import annotations

import os
from typing import Any

from cluster.effects import (
    Answer,
    Connect,
    Disconnect,
    EffectQueue,
    LinkId,
    SaveNodes,
    Send,
)
from cluster.wire import Frame, MessageType


class FakeCore(EffectQueue):
    def __init__(self, node_id: str, bus_port: int, ping_every_ms: int = 100) -> None:
        self.node_id = node_id
        self.bus_port = bus_port
        self.outbox = []
        self.nodes: dict[str, tuple[str, int]] = {}  # id -> (ip, bus port), handshakes too
        self.handshakes: set[str] = set()
        self.up: dict[str, LinkId] = {}
        self.received: list[tuple[Frame, LinkId, str, str, str | None]] = []
        self.events: list[tuple[str, str, LinkId]] = []
        self.ticks = 0
        self.ping_every_ms = ping_every_ms
        self._last_ping = 0

    # -- commands ---------------------------------------------------------------------

    def meet(self, ip: str, bus_port: int) -> None:
        temp = os.urandom(20).hex()
        self.handshakes.add(temp)
        self._add(temp, ip, bus_port)

    def forget(self, node_id: str) -> None:
        self.nodes.pop(node_id, None)
        self.up.pop(node_id, None)
        self.outbox.append(Disconnect(node_id))

    def known(self) -> set[str]:
        return set(self.nodes) - self.handshakes

    def _add(self, node_id: str, ip: str, bus_port: int) -> None:
        if node_id == self.node_id or node_id in self.nodes:
            return
        self.nodes[node_id] = (ip, bus_port)
        self.outbox.append(Connect(node_id, ip, bus_port))
        self.outbox.append(SaveNodes(self._render()))

    def _render(self) -> str:
        lines = [f"{self.node_id} myself"] + [f"{n} {ip}:{p}" for n, (ip, p) in
                                              sorted(self.nodes.items())]
        return "\n".join(lines) + "\n"

    def _body(self) -> dict[str, Any]:
        return {"port": self.bus_port,
                "nodes": [[n, ip, p] for n, (ip, p) in self.nodes.items()
                          if n not in self.handshakes]}

    # -- events -------------------------------------------------------------------------

    def link_up(self, node_id: str, link: LinkId, now_ms: int) -> None:
        self.events.append(("up", node_id, link))
        self.up[node_id] = link
        kind = MessageType.MEET if node_id in self.handshakes else MessageType.PING
        self.outbox.append(Send(node_id, kind, self._body()))

    def link_down(self, node_id: str, link: LinkId, now_ms: int) -> None:
        self.events.append(("down", node_id, link))
        if self.up.get(node_id) == link:
            del self.up[node_id]

    def receive(self, frame: Frame, link: LinkId, peer_ip: str, local_ip: str,
                outbound_to: str | None, now_ms: int) -> None:
        self.received.append((frame, link, peer_ip, local_ip, outbound_to))
        if frame.type in (MessageType.MEET, MessageType.PING):
            if frame.type is MessageType.MEET:
                self._add(frame.sender, peer_ip, int(frame.body["port"]))
            self.outbox.append(Answer(link, MessageType.PONG, self._body()))
        elif frame.type is MessageType.PONG and outbound_to in self.handshakes:
            self.handshakes.discard(outbound_to)
            ip, port = self.nodes.pop(outbound_to)
            self.up.pop(outbound_to, None)
            self.outbox.append(Disconnect(outbound_to))
            self._add(frame.sender, ip, port)
        if frame.sender in self.nodes and frame.sender not in self.handshakes:
            for node_id, ip, port in frame.body.get("nodes", []):
                self._add(node_id, ip, port)

    def tick(self, now_ms: int) -> None:
        self.ticks += 1
        if now_ms - self._last_ping >= self.ping_every_ms:
            self._last_ping = now_ms
            for node_id in self.up:
                if node_id not in self.handshakes:
                    self.outbox.append(Send(node_id, MessageType.PING, self._body()))
