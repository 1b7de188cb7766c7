"""The membership core: who is in the cluster, who is down (sans-IO, after Disque's cluster.c).

Theory of operation
-------------------
``Membership`` owns the node table of one node (``cluster.table.Table``). The runtime drives
it with the events of ``cluster/effects.py`` (``receive``, ``link_up``, ``link_down``,
``tick``), ``meet`` and the ``broker.cluster_view.ClusterView`` methods, and takes effects
from ``outbox`` after each call. It reads ``config.cluster_node_timeout`` and
``config.client_port`` each time it needs them, so CONFIG SET takes effect at once.

Flags of an entry (any combination):
    myself      this node (its IP is learnt from the ``local_ip`` of links, as Redis does;
                its port is config.client_port: port, or tls-port on a TLS-only node).
    handshake   met (CLUSTER MEET, a MEET received, or gossip) but its real ID is not known:
                the entry has a random temporary ID. The first frame on its outbound link
                reveals the ID: the entry is renamed (Disconnect temp, Connect real), or
                dropped if that ID is already known. A handshake not completed within
                max(node_timeout, 1000) ms is dropped, so a MEET to a port with nothing
                behind it leaves no trace.
    meet        while in handshake, say MEET (not PING) on the outbound link, so that the
                peer adds us although it does not know us.
    pfail       my own view: a PING has gone unanswered for more than node_timeout (a node
                we cannot connect to counts as pinged since its link went down). A PING
                still pending when a link that had answered dies is void on the next
                link, whose own first PING starts the clock: a new process listens there.
    fail        agreed: pfail here, and failure reports (pfail/fail in gossip) from other
                nodes, each valid node_timeout * FAIL_REPORT_VALIDITY_MULT, plus myself,
                reach size // 2 + 1, where size counts every entry not in handshake, failed
                ones and myself included (Disque's ``cluster->size``). A minority partition
                therefore never gathers a majority of the whole cluster. The node then
                broadcasts FAIL; a FAIL received sets the flag. pfail and fail clear as soon
                as the node answers a PING again (Disque clears FAIL whenever it is reachable).
    leaving     published by the node itself in every PING/PONG/MEET (CLUSTER LEAVING).
    noaddr      no usable address: the old one now answers with another node's ID.

Trust. Only a MEET adds an unknown sender (as a handshake entry at the link's peer IP and the
body's port); a PING from an unknown node gets a PONG and nothing more. Gossip is believed
only from known senders. A forgotten node is blacklisted for 60 s so gossip does not bring it
back, and its frames are dropped. A PING/MEET claiming a known, healthy node's ID with another
port is dropped and its link closed; the same port from another IP is a multi-homed node
connecting out of another interface and changes nothing; a known node that is failing or
unconnected is taken to have moved (Disque updates the address). Every refusal is a ``LogLine``
with a ``key`` for the runtime's rate limit; a malformed body never raises out of ``receive``.

Schedule (``tick``, at least every 100 ms): every second PING the node with the oldest PONG
among five random ones; PING anyone whose last PONG is older than node_timeout / 2; a PING
unanswered for node_timeout makes the node pfail.
"""

from __future__ import annotations

import random
from typing import Any

from broker.config import Config
from cluster import commands
from cluster.effects import CloseLink, LinkId
from cluster.messages import MEMBERSHIP_TYPES, Fail, Heartbeat, Meet, Ping, Pong, parse
from cluster.nodes_file import SavedNodes
from cluster.table import PUBLISHED_FLAGS, Node, Table
from cluster.wire import Frame, MalformedBody

HANDSHAKE_MIN_MS = 1000
RANDOM_PING_EVERY_MS = 1000


class Membership(Table):
    #: The message types this core handles (a runtime with several cores routes by type).
    HANDLES = MEMBERSHIP_TYPES

    def __init__(self, config: Config, myself_id: str, rng: random.Random, now_ms: int,
                 saved: SavedNodes | None = None) -> None:
        super().__init__(config, myself_id, rng, now_ms, saved)
        self._next_random_ping = now_ms + RANDOM_PING_EVERY_MS

    def command(self, sub: bytes, args: tuple[bytes, ...], now_ms: int) -> Any:
        return commands.run(self, sub.lower(), args, now_ms)

    # ------------------------------------------------------------------------------------
    # Links

    def link_up(self, node_id: str, link: LinkId, now_ms: int) -> None:
        node = self.nodes.get(node_id)
        if node is None or node is self.myself:
            return  # a link for an entry renamed or deleted since; Disconnect was sent
        node.link, node.link_since = link, now_ms
        if node.fresh_ping_on_next_link:
            # The PING pending (or the clock started when the link died) was never answered
            # by whatever listens now; Disque keeps it, which fails a peer killed right after
            # its restart as soon as a PING from before its restart is node_timeout old.
            node.fresh_ping_on_next_link = False
            node.ping_sent = 0
        # The meet flag stays until the handshake completes: a MEET lost with its link is
        # said again on the next one, and a repeated MEET is harmless.
        self.send_ping(node, Meet if "meet" in node.flags else Ping, now_ms)

    def link_down(self, node_id: str, link: LinkId, now_ms: int) -> None:
        node = self.nodes.get(node_id)
        if node is None:
            return
        if node.link == link:
            node.link = None
            # Only a link that answered: a peer that accepts links and drops them unanswered
            # gets no fresh clock per link, so it is still flagged after one node_timeout.
            node.fresh_ping_on_next_link = node.pong_received >= node.link_since
        if node.link is None and node.ping_sent == 0:
            # Nothing can answer now: count from here so an unreachable node goes pfail.
            node.ping_sent = now_ms

    # ------------------------------------------------------------------------------------
    # Frames

    def receive(self, frame: Frame, link: LinkId, peer_ip: str, local_ip: str,
                outbound_to: str | None, now_ms: int) -> None:
        self.messages_received += 1  # every bus message, as Disque's stats count them
        if frame.type not in MEMBERSHIP_TYPES:
            return  # a job message: another core's business
        try:
            msg = parse(frame)
        except MalformedBody as exc:
            self.log("warning", f"Dropping a malformed {frame.type.name} from {frame.sender} "
                     f"at {peer_ip}: {exc}", key=f"malformed:{peer_ip}")
            self.outbox.append(CloseLink(link))
            return
        sender_id = frame.sender
        if sender_id not in self.nodes and self.blacklisted(sender_id, now_ms):
            self.log("notice", f"Dropping a {frame.type.name} from forgotten node {sender_id} "
                     f"at {peer_ip}", key=f"forgotten:{sender_id}")
            self.outbox.append(CloseLink(link))
            pending = self.nodes.get(outbound_to) if outbound_to is not None else None
            if pending is not None and "handshake" in pending.flags:
                self.delete(pending)  # a handshake that turned out to reach it
            return
        if isinstance(msg, Fail):
            self._on_fail(msg, sender_id, now_ms)
        else:
            self._on_heartbeat(msg, sender_id, link, peer_ip, local_ip, outbound_to, now_ms)

    def _on_fail(self, msg: Fail, sender_id: str, now_ms: int) -> None:
        sender = self.nodes.get(sender_id)
        failing = self.nodes.get(msg.node_id)
        if sender is None or "handshake" in sender.flags or failing is None:
            return
        if failing is not self.myself and "fail" not in failing.flags:
            self.log("notice", f"FAIL message received from {sender_id} about {msg.node_id}",
                     key=f"fail:{msg.node_id}")
            self.set_fail(failing)

    def _on_heartbeat(self, msg: Heartbeat, sender_id: str, link: LinkId, peer_ip: str,
                      local_ip: str, outbound_to: str | None, now_ms: int) -> None:
        asks_answer = isinstance(msg, Ping | Meet)
        if asks_answer and local_ip and local_ip != self.myself.ip and (
                isinstance(msg, Meet) or not self.myself.ip):
            # Peers reach us at the address they were given, so a MEET says what it is.
            self.myself.ip = local_ip
            self.log("notice", f"IP address for this node updated to {local_ip}")
            self.save()
        sender = self.nodes.get(sender_id)
        if sender is not None and "handshake" in sender.flags:
            sender = None  # a temporary ID is ours; nobody may speak as it
        if outbound_to is None and sender is not None and sender is not self.myself \
                and asks_answer and (sender.ip, sender.port) != (peer_ip, msg.port):
            healthy = not sender.failing() and sender.link is not None
            if healthy and sender.port != msg.port:
                self.log("warning", f"Dropping a {msg.TYPE.name} claiming the ID of "
                         f"{sender_id} ({sender.ip}:{sender.port}) from {peer_ip}:{msg.port}",
                         key=f"id-clash:{sender_id}")
                self.outbox.append(CloseLink(link))
                return
            if not healthy:
                self.log("warning", f"Address updated for node {sender_id}, now "
                         f"{peer_ip}:{msg.port}", key=f"moved:{sender_id}")
                self.set_address(sender, peer_ip, msg.port)
                self.save()
            # else: same port from another IP while our link to it works: a multi-homed
            # node connecting out of another interface, nothing to change.
        if asks_answer:
            if sender is None and isinstance(msg, Meet) and sender_id != self.myself_id:
                # Its real ID is only trusted once our own link to it says so.
                self.start_handshake(peer_ip, msg.port, now_ms, meet=False)
            self.answer_pong(link, sender_id)
        if sender is self.myself and outbound_to is None:
            return  # our own handshake reaching us, or an impostor: nothing to learn
        link_node = self.nodes.get(outbound_to) if outbound_to is not None else None
        if link_node is not None and link_node.link != link:
            link_node = None  # a frame still in flight on a link we have given up
        if link_node is not None:
            if "handshake" in link_node.flags:
                if not self._complete_handshake(link_node, sender_id,
                                                self.nodes.get(sender_id)):
                    return
                sender = link_node
            elif link_node.node_id != sender_id:
                self.log("warning", f"Node {link_node.node_id} at {link_node.ip}:"
                         f"{link_node.port} answers as {sender_id}: forgetting its address",
                         key=f"id-mismatch:{link_node.node_id}")
                self.drop_address(link_node)
                self.save()
                return
            if isinstance(msg, Pong):
                self._on_pong(link_node, now_ms)
        if sender is None or sender is self.myself:
            return
        sender.heard = now_ms
        published = msg.flags & PUBLISHED_FLAGS
        if sender.flags & PUBLISHED_FLAGS != published:
            sender.flags = (sender.flags - PUBLISHED_FLAGS) | published
            self.save()
        self._on_gossip(msg, sender, now_ms)

    def _complete_handshake(self, node: Node, sender_id: str, known: Node | None) -> bool:
        """The first frame from a handshake entry's address names it: True if the entry is
        now that node, False if it was dropped (already known, or myself)."""
        if sender_id == self.myself_id:
            self.log("notice", f"Handshake with {node.ip}:{node.port} reached this node itself",
                     key=f"self-meet:{node.ip}:{node.port}")
            self.delete(node)
            return False
        if known is not None and "handshake" in known.flags:
            self.delete(node)  # a peer speaking as one of our temporary IDs: not to be trusted
            return False
        if known is not None:
            if (known.ip, known.port) != (node.ip, node.port) and (
                    known.failing() or known.link is None):
                self.log("warning", f"Address updated for node {sender_id}, now "
                         f"{node.ip}:{node.port}", key=f"moved:{sender_id}")
                self.set_address(known, node.ip, node.port)
            self.delete(node)
            self.save()
            return False
        self.rename(node, sender_id)
        node.flags -= {"handshake", "meet"}
        self.log("notice", f"Handshake with node {sender_id} at {node.ip}:{node.port} completed")
        self.save()
        return True

    def _on_pong(self, node: Node, now_ms: int) -> None:
        node.pong_received = now_ms
        node.ping_sent = 0
        if node.failing():
            self.log("notice", f"Clear {'FAIL' if 'fail' in node.flags else 'PFAIL'} state for "
                     f"node {node.node_id}: it is reachable again", key=f"back:{node.node_id}")
            node.flags -= {"pfail", "fail"}
            self.save()

    def _on_gossip(self, msg: Heartbeat, sender: Node, now_ms: int) -> None:
        for g in msg.gossip:
            node = self.nodes.get(g.node_id)
            if node is None:
                # Unknown: meet it, unless it has no address or was forgotten on purpose.
                if g.ip and g.port and not g.flags & {"noaddr", "handshake"} \
                        and not self.blacklisted(g.node_id, now_ms):
                    self.start_handshake(g.ip, g.port, now_ms, meet=False)
                continue
            if node is self.myself or "handshake" in node.flags:
                continue
            if g.flags & {"pfail", "fail"}:
                node.fail_reports[sender.node_id] = now_ms
                self.mark_failing_if_needed(node, now_ms)
            else:
                node.fail_reports.pop(sender.node_id, None)
            if node.failing() and g.ip and (g.ip, g.port) != (node.ip, node.port):
                # It may have moved: a handshake at the new address tells (and updates it).
                self.start_handshake(g.ip, g.port, now_ms, meet=False)

    # ------------------------------------------------------------------------------------
    # Time

    def tick(self, now_ms: int) -> None:
        timeout = self.node_timeout()
        handshake_timeout = max(timeout, HANDSHAKE_MIN_MS)
        for node in list(self.nodes.values()):
            if node is self.myself or "noaddr" in node.flags:
                continue
            if "handshake" in node.flags:
                if now_ms - node.ctime > handshake_timeout:
                    self.log("notice", f"Handshake with {node.ip}:{node.port} timed out",
                             key=f"handshake-timeout:{node.ip}:{node.port}")
                    self.delete(node)
                continue
            self._check(node, now_ms, timeout)
        if now_ms >= self._next_random_ping:
            self._next_random_ping = now_ms + RANDOM_PING_EVERY_MS
            self._ping_random(now_ms)

    def _check(self, node: Node, now_ms: int, timeout: int) -> None:
        if node.link is None and node.ping_sent == 0:
            node.ping_sent = now_ms
        if (node.link is not None and node.ping_sent and now_ms - node.link_since > timeout
                and node.pong_received < node.ping_sent
                and now_ms - node.ping_sent > timeout // 2):
            # A PONG this late on a link this old: maybe the link, not the node, is stuck.
            # Close it; the transport reconnects (as Disque does).
            self.outbox.append(CloseLink(node.link))
            node.link = None
        if node.link is not None and node.ping_sent == 0 \
                and now_ms - node.pong_received > timeout // 2:
            self.send_ping(node, Ping, now_ms)
            return
        if node.ping_sent and now_ms - node.ping_sent > timeout \
                and now_ms - node.heard > timeout and not node.failing():
            node.flags.add("pfail")
            self.log("notice", f"Node {node.node_id} is possibly failing (no PONG and "
                     f"nothing heard from it in {timeout} ms)", key=f"pfail:{node.node_id}")
            self.save()
        if "pfail" in node.flags:
            self.mark_failing_if_needed(node, now_ms)

    def _ping_random(self, now_ms: int) -> None:
        others = [n for n in self.nodes.values() if n is not self.myself]
        best: Node | None = None
        for node in (self.rng.choice(others) for _ in range(5 if others else 0)):
            if node.link is None or node.ping_sent or "handshake" in node.flags:
                continue
            if best is None or node.pong_received < best.pong_received:
                best = node
        if best is not None:
            self.send_ping(best, Ping, now_ms)
