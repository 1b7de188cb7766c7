"""A cluster of brokers on ``cluster.sim``: each node runs the membership core, a Broker and
the job core; its append log is kept across kill/restart, as a node with ``appendonly yes``
and ``appendfsync always`` would.

``JobCluster(n)`` meets the nodes and waits for the full mesh; ``cmd(i, *argv)`` runs a
client command on node ``i`` (its effects carried out at once) and returns the reply;
``replies(i)`` are the replies to blocked clients (``Reply`` effects) in order.
``JobCluster(n, federation=True)`` adds the federation core to every node: its
frames are routed to it, and it is ticked at its own ``next_deadline``.
"""

from __future__ import annotations

import random
from typing import Any

from broker.clients import BLOCKED, Client
from broker.config import Config
from broker.core import Broker
from broker.effects import LogRecord, Reply
from broker.job import Job
from cluster.effects import Send
from cluster.federation import FederationCore
from cluster.job_messages import BATCH_OF, FED_TYPES, JOB_TYPES
from cluster.jobs import JobCore
from cluster.results import RESULT_TYPES, ResultCore
from cluster.sim import Sim, SimNode
from cluster.wire import Frame, MessageType
from cluster.wiring import attach


def lone_broker(now_ms: int) -> tuple[Broker, Client]:
    """One broker outside any cluster, seeded, and an authenticated client of it."""
    b = Broker(Config(), "a" * 40, b"seed", now_ms=now_ms, rng=random.Random(0))
    c = Client(1)
    c.authenticated = True
    return b, c


class SimJobNode:
    """The job core and its broker as one sim core (the runtime's routing, in small)."""

    HANDLES = JOB_TYPES | FED_TYPES | RESULT_TYPES

    def __init__(self, cluster: JobCluster, node: SimNode, now_ms: int) -> None:
        self.cluster = cluster
        self.node = node
        seed = node.rng.getrandbits(64).to_bytes(8, "big")
        self.broker = Broker(node.config, node.node_id, seed, now_ms=now_ms, rng=node.rng)
        self.core = JobCore(self.broker, node.membership, node.rng)
        self.fed = FederationCore(self.broker, node.membership) if cluster.federation else None
        self.results = ResultCore(self.broker, node.membership, node.rng)
        attach(self.broker, membership=node.membership, jobs=self.core, federation=self.fed,
               results=self.results)
        log = cluster.logs.setdefault(node.index, [])
        if log:  # restarted: replay the append log (replication is set first)
            for rec in log:
                self.broker.load_record((rec.kind, rec.payload), now_ms)
            self.broker.finish_load(now_ms, False)
        self.received: list[tuple[MessageType, str, Any]] = []

    def receive(self, frame: Frame, link: int, peer_ip: str, local_ip: str,
                outbound_to: str | None, now_ms: int) -> None:
        self.received.append((frame.type, frame.sender, frame.body))
        self.cluster.trace.append((now_ms, frame.sender, self.node.node_id, frame.type,
                                   frame.body))
        if frame.type in JOB_TYPES:
            self.core.receive(frame, link, peer_ip, local_ip, outbound_to, now_ms)
        elif frame.type in RESULT_TYPES:
            self.results.receive(frame, link, peer_ip, local_ip, outbound_to, now_ms)
        elif self.fed is not None:
            self.fed.receive(frame, link, peer_ip, local_ip, outbound_to, now_ms)

    def tick(self, now_ms: int) -> None:
        self.broker.tick(now_ms)
        self.core.tick(now_ms)
        self.results.tick(now_ms)
        if self.fed is not None:
            self.fed.tick(now_ms)

    def next_deadline(self) -> int | None:
        return self.fed.next_deadline() if self.fed is not None else None

    def take_effects(self) -> list[Any]:
        # Broker effects first: the log records before the messages they allow (GOTJOB).
        for effect in self.broker.take_effects():
            if isinstance(effect, LogRecord):
                self.cluster.logs[self.node.index].append(effect)
            elif isinstance(effect, Reply):
                self.cluster.blocked_replies.setdefault(self.node.index, []).append(
                    (effect.client, effect.value))
        # The result core's first, as the node's bus: a RESULT leaves before its SETACKs.
        effects = self.results.take_effects() + self.core.take_effects()
        if self.fed is not None:
            effects += self.fed.take_effects()
        for e in effects:
            if isinstance(e, Send) and e.type is MessageType.GOTJOB:
                # The durability rule: a GOTJOB only for a job whose record is in the log.
                assert any(r.kind == "job" and r.payload[0] == e.body["id"]
                           for r in self.cluster.logs[self.node.index]), "GOTJOB before log"
            if isinstance(e, Send) and e.type is MessageType.YOURJOBS:
                # An at-most-once job leaves with its ``del`` already in the log.
                for rec in e.body["jobs"]:
                    assert rec[6] or any(r.kind == "del" and r.payload == rec[0]
                                         for r in self.cluster.logs[self.node.index]), \
                        "YOURJOBS before the del of its at-most-once job"
            if isinstance(e, Send):
                self.cluster.sends.append((self.cluster.sim.now, self.node.node_id, e.node_id,
                                           e.type, e.body))
        return effects


class JobCluster:
    def __init__(self, n: int = 3, seed: int = 1, tick_ms: int = 20,
                 node_timeout: int = 2000, federation: bool = False) -> None:
        self.federation = federation
        self.logs: dict[int, list[LogRecord]] = {}
        self.blocked_replies: dict[int, list[tuple[Client, Any]]] = {}
        self.trace: list[tuple[int, str, str, MessageType, Any]] = []  # delivered
        self.sends: list[tuple[int, str, str, MessageType, Any]] = []  # emitted
        self.sim = Sim(seed, tick_ms=tick_ms,
                       core_factories=(lambda node, now: SimJobNode(self, node, now),))
        for _ in range(n):
            self.sim.add_node(node_timeout=node_timeout)
        self.sim.meet_all()
        ok = self.sim.run_until(self.meshed, 20_000)
        assert ok, "the cluster did not form"
        self._client_ids = 0

    # -- reading ------------------------------------------------------------------------------

    def meshed(self) -> bool:
        n = len(self.sim.nodes)
        return all(node.membership.reachable_nodes() == n - 1
                   and all(x.link is not None for x in node.membership.nodes.values()
                           if x is not node.membership.myself)
                   for node in self.sim.nodes if node.up)

    def jn(self, i: int) -> SimJobNode:
        core: SimJobNode = self.sim.nodes[i].cores[1]
        return core

    def broker(self, i: int) -> Broker:
        return self.jn(i).broker

    def job(self, i: int, job_id: bytes) -> Job | None:
        return self.broker(i).jobs.get(job_id)

    def node_id(self, i: int) -> str:
        return self.sim.nodes[i].node_id

    def holders(self, job_id: bytes) -> list[int]:
        return [i for i, n in enumerate(self.sim.nodes)
                if n.up and job_id in self.broker(i).jobs]

    def queued_on(self, job_id: bytes) -> list[int]:
        return [i for i in self.holders(job_id)
                if self.broker(i).jobs[job_id].state.value == "queued"]

    def messages(self, kind: MessageType, job_id: bytes | None = None) -> list[tuple[str, str]]:
        """(sender, receiver) of every ``kind`` message delivered so far, about ``job_id``;
        a batched frame (``kind``'s ``*_BATCH`` type) counts once per message it carries."""
        out = []
        batch = BATCH_OF.get(kind)
        for _, src, dst, t, body in self.trace:
            if t is batch and batch is not None:
                for item in body["items"]:
                    if job_id is None or (item if isinstance(item, bytes) else item[0]) == job_id:
                        out.append((src, dst))
                continue
            if t is kind and (job_id is None or body.get("id") == job_id
                              or (isinstance(body.get("job"), list)
                                  and body["job"][0] == job_id)):
                out.append((src, dst))
        return out

    # -- acting -------------------------------------------------------------------------------

    def client(self) -> Client:
        self._client_ids += 1
        c = Client(self._client_ids)
        c.authenticated = True
        return c

    def cmd(self, i: int, *argv: str | bytes, client: Client | None = None) -> Any:
        raw = [a if isinstance(a, bytes) else a.encode() for a in argv]
        reply = self.broker(i).execute(raw, client or self.client(), self.sim.now)
        self.sim.drain(i)
        return reply

    def reply_to(self, i: int, client: Client) -> Any:
        for c, value in self.blocked_replies.get(i, []):
            if c is client:
                return value
        return None

    def run_for(self, ms: int) -> None:
        self.sim.run_for(ms)

    def run_until(self, pred: Any, max_ms: int) -> bool:
        return self.sim.run_until(pred, max_ms)

    def deliver(self, i: int, sender: int | str, kind: MessageType, body: Any) -> None:
        """Hand node ``i``'s job core one frame from ``sender`` (an index or a node ID), as
        if it had just arrived, and carry out what it emits."""
        sender_id = self.node_id(sender) if isinstance(sender, int) else sender
        self.jn(i).receive(Frame(kind, sender_id, body), 0, "127.0.0.1", "127.0.0.1", None,
                           self.sim.now)
        self.sim.drain(i)

    def sent(self, kind: MessageType, job_id: bytes | None = None,
             src: int | None = None) -> list[tuple[int, str, str]]:
        """(time, sender, receiver) of every ``kind`` message *sent* (delivered or not)."""
        out = []
        for at, a, b, t, body in self.sends:
            if t is kind and (src is None or a == self.node_id(src)) and (
                    job_id is None or body.get("id") == job_id
                    or (isinstance(body.get("job"), list) and body["job"][0] == job_id)):
                out.append((at, a, b))
        return out

    def addjob(self, i: int, *argv: str, settle_ms: int = 500) -> bytes:
        """ADDJOB on node ``i``; runs until it is answered and returns the job ID."""
        c = self.client()
        reply = self.cmd(i, "ADDJOB", *argv, client=c)
        if reply is not BLOCKED:
            assert isinstance(reply, str) and reply.startswith("D-"), reply
            return reply.encode()
        assert self.run_until(lambda: self.reply_to(i, c) is not None, settle_ms), "no reply"
        value = self.reply_to(i, c)
        assert isinstance(value, str) and value.startswith("D-"), value
        return value.encode()
