"""An in-process cluster: N nodes' cluster cores wired through an in-memory bus, one fake clock.

Theory of operation
-------------------
``Sim`` plays the part ``node/bus.py`` plays in production, following the contract of
``cluster/effects.py`` to the letter, so whatever the cores do here they do over TCP too:

* Time is an int (``Sim.now``, ms) that only the harness advances: ``run_for(ms)`` and
  ``run_until(pred, max_ms)`` jump from event to event (a delivery, a connection attempt,
  the 100 ms tick of every core), so a minute of cluster life costs milliseconds.
* Links. ``Connect`` makes a node *want* an outbound link to an address; the harness opens it
  if a live node listens there (bus port = port + 10000) and no partition separates them,
  then calls ``link_up``; otherwise it calls ``link_down`` (connect failed) and tries again
  ``reconnect_ms`` (100) later, as the transport does. ``Disconnect`` closes it and stops
  wanting it (no ``link_down``: the core asked). ``CloseLink`` and a peer's death close a link
  and report ``link_down`` to the side that opened it, which then reconnects.
* Frames travel as bytes: ``cluster.wire.encode`` with the sender's secret, then the
  receiving end's ``FrameDecoder`` with the receiver's secret. A ``WireError`` (a wrong or
  missing MAC, garbage) closes the link as the transport does, and is recorded in the
  receiver's ``wire_errors``; such a frame never reaches a core.
* Faults between an ordered pair of nodes (``faults[(a, b)]``): drop, delay, jitter (which
  reorders frames) and duplicate, drawn from the harness's seeded ``rng``. ``partition``
  closes every link across groups and refuses new ones until ``heal``. ``kill`` stops a node
  (its links close); ``restart`` brings it back from the last ``SaveNodes`` it emitted, as a
  node restarted after kill -9 reads its nodes.conf.
* Routing by message type: every node runs ``cores`` (the membership core first); a frame
  goes to each core whose ``HANDLES`` contains its type, so the job cores of later issues
  plug in through ``core_factories`` without touching this module. A core needs ``HANDLES``,
  ``receive``, ``tick`` and ``take_effects``; ``link_up``/``link_down`` if it cares, and
  ``next_deadline()`` (ms or None) if it has timers finer than the tick: it is then also
  ticked at that instant, as the runtime ticks a core at its next deadline.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.config import Config
from cluster.effects import (
    Answer,
    CloseLink,
    ClusterEffect,
    Connect,
    Disconnect,
    LogLine,
    NewNodeId,
    SaveNodes,
    Send,
)
from cluster.membership import Membership
from cluster.messages import BUS_PORT_OFFSET
from cluster.nodes_file import parse
from cluster.wire import Frame, FrameDecoder, MessageType, WireError, encode

#: Most events processed at one instant before the harness assumes a livelock.
MAX_EVENTS_PER_INSTANT = 100_000
OUTSIDE = -1  # the "node" index of frames injected from outside the cluster


class Core(Protocol):
    HANDLES: frozenset[MessageType]

    def receive(self, frame: Frame, link: int, peer_ip: str, local_ip: str,
                outbound_to: str | None, now_ms: int) -> None: ...

    def tick(self, now_ms: int) -> None: ...

    def take_effects(self) -> list[ClusterEffect]: ...


@dataclass
class Faults:
    drop: float = 0.0  # probability a frame is lost
    delay_ms: int = 0  # added to every frame
    jitter_ms: int = 0  # a further random 0..jitter_ms: frames overtake each other
    duplicate: float = 0.0  # probability a frame arrives twice


@dataclass(eq=False)
class _Link:
    out_id: int  # the link's ID at the node that opened it
    in_id: int  # ... and at the node that accepted it
    src: int
    dst: int
    for_node: str  # the table entry the src opened it for
    src_decoder: FrameDecoder
    dst_decoder: FrameDecoder
    open: bool = True
    src_decoder_secret: bytes | None = None  # an injected link's outside secret


@dataclass(eq=False)
class SimNode:
    index: int
    ip: str
    config: Config
    secret: bytes | None
    rng: random.Random
    cores: list[Any] = field(default_factory=list)
    up: bool = True
    saved: str | None = None  # the content of its last SaveNodes: its nodes.conf
    logs: list[LogLine] = field(default_factory=list)
    wire_errors: list[str] = field(default_factory=list)
    new_ids: list[str] = field(default_factory=list)
    wanted: dict[str, tuple[str, int]] = field(default_factory=dict)
    next_attempt: dict[str, int] = field(default_factory=dict)
    out_links: dict[str, _Link] = field(default_factory=dict)
    dropped_sends: int = 0

    @property
    def membership(self) -> Membership:
        core: Membership = self.cores[0]
        return core

    @property
    def node_id(self) -> str:
        return self.membership.myself_id

    @property
    def port(self) -> int:
        return int(self.config.port)


class Sim:
    def __init__(self, seed: int = 0, *, start_ms: int = 1_795_315_000_000, tick_ms: int = 100,
                 reconnect_ms: int = 100,
                 core_factories: tuple[Callable[[SimNode, int], Any], ...] = ()) -> None:
        self.rng = random.Random(seed)
        self.now = start_ms
        self.tick_ms = tick_ms
        self.reconnect_ms = reconnect_ms
        self.core_factories = core_factories
        self.nodes: list[SimNode] = []
        self.faults: dict[tuple[int, int], Faults] = {}
        self.outside: list[tuple[int, Frame]] = []  # frames answered to injected links
        self._groups: dict[int, int] = {}
        self._links: dict[int, _Link] = {}
        self._next_link_id = 1
        self._queue: list[tuple[int, int, int, _Link, bool, bytes]] = []
        self._seq = 0
        self._next_tick = start_ms + tick_ms

    # ------------------------------------------------------------------------------------
    # Building the cluster

    def add_node(self, *, ip: str = "127.0.0.1", port: int | None = None,
                 secret: bytes | None = None, node_timeout: int = 2000,
                 saved: str | None = None) -> SimNode:
        config = Config()
        config.set("port", [str(port if port is not None else 7711 + len(self.nodes))])
        config.set("cluster-node-timeout", [str(node_timeout)])
        node = SimNode(len(self.nodes), ip, config, secret,
                       random.Random(self.rng.getrandbits(64)), saved=saved)
        self.nodes.append(node)
        self._start(node)
        return node

    def _start(self, node: SimNode) -> None:
        saved = parse(node.saved) if node.saved is not None else None
        myself_id = saved.myself_id if saved else f"{node.rng.getrandbits(160):040x}"
        node.cores = [Membership(node.config, myself_id, node.rng, self.now, saved)]
        node.cores += [factory(node, self.now) for factory in self.core_factories]
        node.up = True
        self._drain(node)

    def kill(self, i: int) -> None:
        node = self.nodes[i]
        node.up = False
        for link in list(self._links.values()):
            if link.src == i or link.dst == i:
                self._close(link, notify=link.dst == i)
        node.wanted.clear()
        node.next_attempt.clear()
        node.out_links.clear()

    def restart(self, i: int) -> None:
        node = self.nodes[i]
        if node.up:
            self.kill(i)
        self._start(node)

    def partition(self, *groups: set[int] | list[int]) -> None:
        """Nodes in different groups cannot talk; nodes in no group are in one more group."""
        self._groups = {i: g for g, members in enumerate(groups) for i in members}
        for link in list(self._links.values()):
            if link.open and not self._can_talk(link.src, link.dst):
                self._close(link, notify=True)

    def heal(self) -> None:
        self._groups = {}

    def _can_talk(self, a: int, b: int) -> bool:
        if a == OUTSIDE or b == OUTSIDE:
            return True
        return self._groups.get(a, -1) == self._groups.get(b, -1)

    # ------------------------------------------------------------------------------------
    # Driving it

    def command(self, i: int, sub: str, *args: str | bytes) -> Any:
        """``CLUSTER <sub> <args>`` on node ``i``, its effects carried out."""
        node = self.nodes[i]
        raw = tuple(a if isinstance(a, bytes) else a.encode() for a in args)
        reply = node.membership.command(sub.encode(), raw, self.now)
        self._drain(node)
        return reply

    def drain(self, i: int) -> None:
        """Carry out the effects node ``i``'s cores emitted outside an event (a test called
        a core directly, as a client command does)."""
        self._drain(self.nodes[i])

    def set_leaving(self, i: int, leaving: bool) -> None:
        self.nodes[i].membership.set_leaving(leaving, self.now)
        self._drain(self.nodes[i])

    def meet_all(self, chain: bool = True) -> None:
        """CLUSTER MEET node i+1 from node i (chain) or every node from node 0."""
        for i in range(1, len(self.nodes)):
            src = i - 1 if chain else 0
            self.command(src, "MEET", self.nodes[i].ip, str(self.nodes[i].port))

    def run_for(self, ms: int) -> None:
        self.run_until(lambda: False, ms)

    def run_until(self, pred: Callable[[], bool], max_ms: int) -> bool:
        """Advance until ``pred()`` holds (True) or ``max_ms`` have passed (False)."""
        deadline = self.now + max_ms
        while not pred():
            at = self._next_event()
            if at > deadline:
                self.now = deadline
                return pred()
            self.now = max(self.now, at)
            self._process_due()
        return True

    def inject(self, i: int, data: bytes | Frame, *, peer_ip: str = "10.9.9.9",
               secret: bytes | None = None) -> None:
        """Bytes (or a frame, encoded with ``secret``) arriving on a new inbound link of node
        ``i`` from outside the cluster; answers land in ``outside``."""
        if isinstance(data, Frame):
            data = encode(data, secret)
        node = self.nodes[i]
        link = self._new_link(OUTSIDE, i, "")
        link.src_decoder_secret = secret
        self._deliver(link, to_dst=True, data=data, peer_ip=peer_ip)
        self._drain(node)
        self._process_due()  # answers due now reach ``outside`` before this returns

    # ------------------------------------------------------------------------------------
    # Events

    def _next_event(self) -> int:
        at = self._next_tick
        if self._queue:
            at = min(at, self._queue[0][0])
        for node in self.nodes:
            for node_id, when in node.next_attempt.items():
                if node.up and node_id not in node.out_links:
                    at = min(at, when)
            if node.up:
                for core in node.cores:
                    due = self._core_deadline(core)
                    if due is not None:
                        at = min(at, due)
        return at

    @staticmethod
    def _core_deadline(core: Any) -> int | None:
        method = getattr(core, "next_deadline", None)
        return method() if method is not None else None

    def _deadline_due(self, node: SimNode) -> bool:
        for core in node.cores:
            due = self._core_deadline(core)
            if due is not None and due <= self.now:
                core.tick(self.now)
                self._drain(node)
                return True
        return False

    def _process_due(self) -> None:
        for _ in range(MAX_EVENTS_PER_INSTANT):
            if self._queue and self._queue[0][0] <= self.now:
                _, _, _, link, to_dst, data = heapq.heappop(self._queue)
                self._deliver(link, to_dst, data)
            elif any(self._connect_due(n) for n in self.nodes if n.up):
                pass
            elif any(self._deadline_due(n) for n in self.nodes if n.up):
                pass
            elif self._next_tick <= self.now:
                self._next_tick += self.tick_ms
                for node in self.nodes:
                    if node.up:
                        for core in node.cores:
                            core.tick(self.now)
                        self._drain(node)
            else:
                return
        raise RuntimeError(f"more than {MAX_EVENTS_PER_INSTANT} events at {self.now} ms")

    def _connect_due(self, node: SimNode) -> bool:
        for node_id, when in list(node.next_attempt.items()):
            if when > self.now or node_id in node.out_links:
                continue
            del node.next_attempt[node_id]
            ip, bus_port = node.wanted[node_id]
            target = next((t for t in self.nodes if t.up and t.ip == ip
                           and t.port + BUS_PORT_OFFSET == bus_port), None)
            if target is None or not self._can_talk(node.index, target.index):
                node.next_attempt[node_id] = self.now + self.reconnect_ms
                failed = self._next_link_id
                self._next_link_id += 1
                self._each_core(node, "link_down", node_id, failed, self.now)
            else:
                link = self._new_link(node.index, target.index, node_id)
                node.out_links[node_id] = link
                self._each_core(node, "link_up", node_id, link.out_id, self.now)
            return True
        return False

    def _each_core(self, node: SimNode, event: str, *args: Any) -> None:
        for core in node.cores:
            method = getattr(core, event, None)
            if method is not None:
                method(*args)
        self._drain(node)

    def _new_link(self, src: int, dst: int, for_node: str) -> _Link:
        src_secret = self.nodes[src].secret if src != OUTSIDE else None
        link = _Link(self._next_link_id, self._next_link_id + 1, src, dst, for_node,
                     FrameDecoder(src_secret), FrameDecoder(self.nodes[dst].secret))
        self._next_link_id += 2
        self._links[link.out_id] = self._links[link.in_id] = link
        return link

    def _close(self, link: _Link, notify: bool) -> None:
        if not link.open:
            return
        link.open = False
        self._links.pop(link.out_id, None)
        self._links.pop(link.in_id, None)
        if link.src == OUTSIDE:
            return
        src = self.nodes[link.src]
        if src.out_links.get(link.for_node) is link:
            del src.out_links[link.for_node]
            if link.for_node in src.wanted:
                src.next_attempt[link.for_node] = self.now + self.reconnect_ms
            if notify and src.up:
                self._each_core(src, "link_down", link.for_node, link.out_id, self.now)

    def _deliver(self, link: _Link, to_dst: bool, data: bytes, peer_ip: str = "") -> None:
        if not link.open:
            return
        receiver_index = link.dst if to_dst else link.src
        if receiver_index == OUTSIDE:
            decoded = FrameDecoder(link.src_decoder_secret)
            decoded.feed(data)
            try:
                frame = decoded.next()
            except WireError:
                return
            if frame is not None:
                self.outside.append((link.in_id, frame))
            return
        node = self.nodes[receiver_index]
        other = link.src if to_dst else link.dst
        decoder = link.dst_decoder if to_dst else link.src_decoder
        decoder.feed(data)
        while link.open:
            try:
                frame = decoder.next()
            except WireError as exc:
                node.wire_errors.append(f"{type(exc).__name__}: {exc}")
                self._close(link, notify=True)
                return
            if frame is None:
                return
            local = link.in_id if to_dst else link.out_id
            ip = peer_ip or (self.nodes[other].ip if other != OUTSIDE else "")
            for core in node.cores:
                if frame.type in core.HANDLES:
                    core.receive(frame, local, ip, node.ip, None if to_dst else link.for_node,
                                 self.now)
            self._drain(node)

    # ------------------------------------------------------------------------------------
    # Effects

    def _drain(self, node: SimNode) -> None:
        for core in node.cores:
            for effect in core.take_effects():
                self._carry_out(node, effect)

    def _carry_out(self, node: SimNode, effect: ClusterEffect) -> None:
        if isinstance(effect, Send):
            link = node.out_links.get(effect.node_id)
            if link is None or not link.open:
                node.dropped_sends += 1
            else:
                self._transmit(node, link, True, effect.type, effect.body)
        elif isinstance(effect, Answer):
            found = self._links.get(effect.link)
            if found is not None and found.open:
                self._transmit(node, found, effect.link == found.out_id, effect.type,
                               effect.body)
        elif isinstance(effect, Connect):
            node.wanted[effect.node_id] = (effect.ip, effect.bus_port)
            if effect.node_id not in node.out_links:
                node.next_attempt.setdefault(effect.node_id, self.now)
        elif isinstance(effect, Disconnect):
            node.wanted.pop(effect.node_id, None)
            node.next_attempt.pop(effect.node_id, None)
            link = node.out_links.get(effect.node_id)
            if link is not None:
                self._close(link, notify=False)
        elif isinstance(effect, CloseLink):
            found = self._links.get(effect.link)
            if found is not None:
                self._close(found, notify=True)
        elif isinstance(effect, SaveNodes):
            node.saved = effect.content
        elif isinstance(effect, NewNodeId):
            node.new_ids.append(effect.node_id)
        elif isinstance(effect, LogLine):
            node.logs.append(effect)

    def _transmit(self, node: SimNode, link: _Link, to_dst: bool, kind: MessageType,
                  body: dict[str, Any]) -> None:
        data = encode(Frame(kind, node.node_id, body), node.secret)
        receiver = link.dst if to_dst else link.src
        faults = self.faults.get((node.index, receiver))
        copies = 1
        delay = 0
        if faults is not None:
            if self.rng.random() < faults.drop:
                return
            if self.rng.random() < faults.duplicate:
                copies = 2
            delay = faults.delay_ms
        for _ in range(copies):
            jitter = self.rng.randint(0, faults.jitter_ms) if faults and faults.jitter_ms else 0
            self._seq += 1
            heapq.heappush(self._queue, (self.now + delay + jitter, self._seq, id(link), link,
                                         to_dst, data))
