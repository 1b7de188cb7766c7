"""Cluster bus frames for fuzzing: real bodies of every message type, and their mutations.

``sample_bodies`` builds one or more bodies of every message type with the cluster's own
encoders (the membership messages' ``to_body``, the job messages' ``body``, and job, policy
and timer records made by a broker running the commands a workload sends), naming the node
IDs, job IDs and ports it is given, so a fuzzed frame can reach a core's logic, not only its
parser. ``Mutator`` turns a body into a hostile frame: fields dropped, added, replaced by a
value of any msgpack type (maps, lists, huge lists, extreme integers, NaN, binary strings),
swapped, values moved deep inside records and gossip entries, bodies sent under another
message type, and header fields (magic, version, flags, type, sender, length) changed.
Every choice comes from the ``random.Random`` it is handed: a seed replays a run, and a
Hypothesis ``randoms()`` shrinks one.

Ports and addresses are kept safe: a mutated value that a node would dial (a PING/MEET port,
a gossip entry's ip and port) is either refused by the parser or mapped onto ``ports``
(the fuzzed cluster's own) and a loopback address, so a fuzzed node never connects outside
its cluster, and never resolves a name.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker.config import Config
from broker.core import Broker
from broker.effects import LogRecord
from broker.job import Job, JobState
from cluster.job_messages import (
    Enqueue,
    GotAck,
    JobRef,
    NeedJobs,
    PauseQueue,
    Queued,
    ReplJob,
    SetAck,
    YourJobs,
)
from cluster.messages import Fail, Gossip, Ping
from cluster.wire import (
    FLAG_MAC,
    HEADER,
    MAGIC,
    WIRE_VERSION,
    MessageType,
    batch_body,
    encode_message,
)

QUEUES = (b"fuzzq", b"fuzzq2")
INTS = (0, 1, -1, 2, 3, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32, 2**53 + 1,
        2**63 - 1, 2**64 - 1, -(2**31), -(2**63))
FLOATS = (math.nan, math.inf, -math.inf, 0.0, -0.0, 1.5, 1e308)
STRS = ("", "active", "queued", "acked", "wait-repl", "leaving", "pfail", "fail", "handshake",
        "noaddr", "queue", "x" * 300, "\u00e9\u4e2d\U0001f600", "0" * 40, "g" * 40)
KEYS = ("id", "job", "jobs", "noreply", "kind", "value", "until", "entries", "delay", "nack", "deliv", "mayhave", "known", "queue",
        "flags", "count", "port", "gossip", "node", "ip", "ping_sent", "pong_received",
        "policies", "timers", "users", "full", "answer", "", "extra")
SAFE_IPS = ("", "127.0.0.1")


def _records(node_ids: list[str]) -> tuple[list[list[Any]], list[list[Any]], list[bytes]]:
    """Policy records, timer records and job IDs made by a broker of ``node_ids[0]`` running
    the commands a workload sends."""
    now = 1_795_315_000_000
    b = Broker(Config(), node_ids[0], b"fuzzseed", now_ms=now, rng=random.Random(0))
    from broker.clients import Client

    client = Client(1)
    client.authenticated = True
    q, q2 = (x.decode() for x in QUEUES)
    for argv in (["QPOLICY", "CREATE", q2], ["QPOLICY", "SET", q, "REDRIVE", "3", q2,
                                            "VISIBILITY", "30", "DEDUP", "yes"],
                 ["QPOLICY", "DEL", q2], ["TIMER", "ADD", "t1", "1000", q, "tick"],
                 ["TIMER", "ADD", "t2", "60000", q2, "x", "RETRY", "5", "TTL", "600"],
                 ["TIMER", "PAUSE", "t2"], ["TIMER", "DEL", "t1"]):
        b.execute([a.encode() for a in argv], client, now)
    job_ids = []
    for i in range(4):
        reply = b.execute([b"ADDJOB", QUEUES[i % 2], b"body%d" % i, b"0"], client, now)
        if isinstance(reply, bytes):
            job_ids.append(reply)
    policies, timers = [], []
    for effect in b.take_effects():
        if isinstance(effect, LogRecord) and effect.kind == "qpolicy" and \
                effect.payload[0] == "queue":
            policies.append(effect.payload)
        elif isinstance(effect, LogRecord) and effect.kind == "timer":
            timers.append(effect.payload)
    return policies, timers, job_ids


def _job_record(job_id: bytes, queue: bytes, holders: list[str], now: int) -> list[Any]:
    job = Job(job_id, queue, b"payload", repl=len(holders), ttl=3600, retry=30, delay=0,
              ctime=now * 1_000_000, delivered=tuple(holders), state=JobState.ACTIVE)
    return job.to_record()


def sample_bodies(node_ids: list[str], ports: list[int],
                  job_ids: Sequence[bytes] = ()) -> list[tuple[MessageType, dict[str, Any]]]:
    """Real bodies of every message type a node sends, from ``node_ids[0]`` (the sender) to
    ``node_ids[1]``; ``job_ids`` are jobs the cluster holds (more are made up)."""
    policies, timers, made_ids = _records(node_ids)
    ids = list(job_ids) + made_ids
    now = 1_795_315_000_000
    gossip = tuple(Gossip(n, "127.0.0.1", p, frozenset(), 0, now)
                   for n, p in zip(node_ids[2:], ports[2:], strict=False))
    beat = Ping(ports[0], frozenset(), gossip).to_body()
    out: list[tuple[MessageType, dict[str, Any]]] = [
        (MessageType.PING, beat), (MessageType.PONG, beat), (MessageType.MEET, beat),
        (MessageType.PING, Ping(ports[0], frozenset({"leaving"}), ()).to_body()),
        (MessageType.FAIL, Fail(node_ids[-1]).to_body()),
    ]
    for i, job_id in enumerate(ids):
        rec = _job_record(job_id, QUEUES[i % 2], node_ids, now)
        out += [
            (MessageType.REPLJOB, ReplJob(rec, bool(i % 2)).body()),
            (MessageType.YOURJOBS, YourJobs([rec]).body()),
            (MessageType.ENQUEUE, Enqueue(job_id, i).body()),
            (MessageType.QUEUED, Queued(job_id, bool(i % 2), not i % 2).body()),
            (MessageType.SETACK, SetAck(job_id, len(node_ids)).body()),
            (MessageType.GOTACK, GotAck(job_id, bool(i % 2)).body()),
            (MessageType.WAITFOR, {"id": job_id}),
            (MessageType.DEDUP, {"entries": [[QUEUES[i % 2], bytes(range(20)), job_id,
                                              now + 60_000, bool(i % 2), now, node_ids[0]]]}),
            (MessageType.RESULT, {"id": job_id, "kind": ("resolved", "pending", "unknown")[i % 3],
                                  "value": b"result", "until": now + 60_000}),
        ]
        out += [(t, JobRef(t, job_id).body()) for t in (
            MessageType.GOTJOB, MessageType.WILLQUEUE, MessageType.DELJOB, MessageType.WORKING)]
    pair = ids[:2] if len(ids) >= 2 else ids * 2
    out += [(MessageType.SETACK_BATCH, {"items": [[i, len(node_ids)] for i in pair]}),
            (MessageType.GOTACK_BATCH, {"items": [[i, True] for i in pair]}),
            (MessageType.DELJOB_BATCH, {"items": list(pair)}),
            (MessageType.WILLQUEUE_BATCH, {"items": list(pair)}),
            (MessageType.QUEUED_BATCH, {"items": [[i, False, True] for i in pair]})]
    out += [(MessageType.PAUSE, PauseQueue(QUEUES[0], 3).body()),
            (MessageType.NEEDJOBS, NeedJobs(QUEUES[1], 5).body()),
            (MessageType.QPOLICY, {"policies": policies}),
            (MessageType.QPOLICY, {"policies": policies[:1], "full": True}),
            (MessageType.TIMER, {"timers": timers}),
            (MessageType.TIMER, {"timers": timers[-1:], "full": True, "answer": True}),
            (MessageType.USERS, {"users": [["user", "fuzzu", ["on", "#" + "ab" * 32, "~q*",
                                                               "-@all", "+@jobs"],
                                            now, node_ids[0]]]}),
            (MessageType.USERS, {"users": [["user", "gone", None, now, node_ids[0]]],
                                 "full": True})]
    # What a round sends one node, joined (REPLJOBs, GOTJOBs): BATCH frames.
    for kind in (MessageType.REPLJOB, MessageType.GOTJOB):
        bodies = [body for t, body in out if t is kind]
        out.append((MessageType.BATCH, batch_body(kind, bodies[:3])))
    return out


@dataclass
class Fuzzed:
    """One fuzzed frame: its bytes, and whether the receiver may close the link for it (a
    header or a body that is not a map: always; a membership message: when malformed), so
    that a sender ends the link after it rather than lose the frames behind it."""

    data: bytes
    closes_link: bool
    what: str


class Mutator:
    def __init__(self, rng: random.Random, node_ids: list[str], ports: list[int],
                 samples: list[tuple[MessageType, dict[str, Any]]]) -> None:
        self.rng = rng
        self.node_ids = node_ids
        self.ports = ports
        self.samples = samples

    # -- values -----------------------------------------------------------------------------

    def value(self, depth: int = 0) -> Any:
        rng = self.rng
        if rng.random() < 0.004:  # big: a long list or a long string (rare: they cost time)
            n = rng.choice((1000, 1000, 20_000, 100_001))
            return [rng.choice(INTS)] * n if rng.random() < 0.5 else "x" * n
        kind = rng.randrange(11 if depth < 3 else 8)
        if kind == 0:
            return rng.choice((None, True, False))
        if kind == 1:
            return rng.choice(INTS)
        if kind == 2:
            return rng.randint(-(2**63), 2**64 - 1) if rng.random() < 0.5 \
                else rng.randint(-5, 100_000)
        if kind == 3:
            return rng.choice(FLOATS)
        if kind == 4:
            return rng.choice(STRS + tuple(self.node_ids))
        if kind == 5:
            return rng.randbytes(rng.choice((0, 1, 8, 40, 1000)))
        if kind == 6:
            return rng.choice((b"", b"fuzzq", b"D-00000000-0000", b"\x00" * 40))
        if kind == 7:
            return self.pick_sample()[1].get(rng.choice(KEYS))
        if kind == 8:
            return [self.value(depth + 1) for _ in range(rng.choice((0, 1, 2, 5, 16)))]
        if kind == 9:
            return {rng.choice(KEYS): self.value(depth + 1) for _ in range(rng.randint(0, 4))}
        return [self.value(depth + 1), self.value(depth + 1)]

    def pick_sample(self) -> tuple[MessageType, dict[str, Any]]:
        mtype, body = self.rng.choice(self.samples)
        return mtype, _copy(body)

    # -- bodies -----------------------------------------------------------------------------

    def mutate_body(self, body: Any) -> Any:
        """One to four changes anywhere in ``body`` (a copy)."""
        rng = self.rng
        for _ in range(rng.choice((1, 1, 1, 2, 4))):
            containers = _containers(body)
            parent = rng.choice(containers)
            op = rng.randrange(6)
            if isinstance(parent, dict):
                keys = list(parent)
                if op == 0 and keys:
                    del parent[rng.choice(keys)]
                elif op == 1 or not keys:
                    parent[rng.choice(KEYS) if rng.random() < 0.7 else str(self.value())] = \
                        self.value()
                elif op == 2 and len(keys) > 1:
                    a, b = rng.sample(keys, 2)
                    parent[a], parent[b] = parent[b], parent[a]
                else:
                    parent[rng.choice(keys)] = self.value()
            else:
                if op == 0 and parent:
                    del parent[rng.randrange(len(parent))]
                elif op == 1 or not parent:
                    parent.insert(rng.randint(0, len(parent)), self.value())
                elif op == 2 and len(parent) > 1:
                    i, j = rng.sample(range(len(parent)), 2)
                    parent[i], parent[j] = parent[j], parent[i]
                elif op == 3 and len(parent) < 100:
                    parent.extend(parent * rng.choice((1, 1, 10, 100)))
                else:
                    parent[rng.randrange(len(parent))] = self.value()
        if rng.random() < 0.01:
            body = self.value()  # not a map at all (the decoder refuses it)
        return self._safe(body)

    def _safe(self, body: Any) -> Any:
        """Map a dialable port onto the cluster's own, a gossip ip onto loopback."""
        if isinstance(body, dict):
            port = body.get("port")
            if type(port) is int and 1 <= port <= 65535 and port not in self.ports:
                body["port"] = self.rng.choice(self.ports)
            ip = body.get("ip")
            if isinstance(ip, str) and ip not in SAFE_IPS:
                body["ip"] = self.rng.choice(SAFE_IPS)
            gossip = body.get("gossip")
            if isinstance(gossip, list):
                for g in gossip:
                    self._safe(g)
        return body

    # -- frames -----------------------------------------------------------------------------

    def frame(self, sender: str) -> Fuzzed:
        """A fuzzed frame claiming to come from ``sender``."""
        rng = self.rng
        mtype, body = self.pick_sample()
        what = mtype.name
        if rng.random() < 0.05:  # a body sent under another type
            mtype = rng.choice(list(MessageType))
            what += f" as {mtype.name}"
        if rng.random() < 0.9:
            body = self.mutate_body(body)
        closes = not isinstance(body, dict) or mtype in (
            MessageType.PING, MessageType.PONG, MessageType.MEET, MessageType.FAIL)
        try:
            data = encode_message(mtype, sender, body)
        except Exception:  # noqa: BLE001 - a value msgpack cannot hold: send the sample
            data = b""
        if not data or (len(data) > 1 << 20 and rng.random() < 0.9):  # big frames: a few
            mtype, body = self.pick_sample()
            data = encode_message(mtype, sender, body)
            closes = True
        if rng.random() < 0.06:
            return self._bad_header(data, what)
        if rng.random() < 0.03:  # another sender: unknown, the receiver itself, a third node
            other = rng.choice([f"{rng.getrandbits(160):040x}", *self.node_ids])
            data = data[:8] + other.encode() + data[48:]
            what += " from another sender"
        return Fuzzed(data, closes, what)

    def _bad_header(self, data: bytes, what: str) -> Fuzzed:
        rng = self.rng
        magic, version, flags, mtype, sender, length = HEADER.unpack_from(data)
        body = data[HEADER.size:]
        choice = rng.randrange(7)
        if choice == 0:
            version = rng.choice((0, 2, 255))
        elif choice == 1:
            flags |= FLAG_MAC  # a MAC the receiver has no secret for
            body += rng.randbytes(32)
        elif choice == 2:
            mtype = rng.choice((0, 5, 9, 23, 39, 42, 65535))
        elif choice == 3:
            sender = rng.choice((b"X" * 40, b"A" * 40, b"0" * 39 + b" ", rng.randbytes(40)))
        elif choice == 4:
            magic = rng.choice((b"TQCA", b"\x00\x00\x00\x00", b"GET "))
        elif choice == 5:  # a length that lies: the rest of the stream is misframed
            length = rng.choice((0, 1, max(0, length - 1)))
        else:
            length = rng.choice((2**32 - 1, 16 * 1024 * 1024 + 1))
        head = struct.pack(">4sBBH40sI", magic, version, flags, mtype, sender, length)
        return Fuzzed(head + body, True, f"{what} with a bad header ({choice})")


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _containers(value: Any) -> list[Any]:
    """Every map and list inside ``value`` (itself first), breadth-first, at most 200."""
    out: list[Any] = []
    todo = [value]
    while todo and len(out) < 200:
        v = todo.pop(0)
        if isinstance(v, (dict, list)):
            out.append(v)
            todo.extend(list(v.values())[:50] if isinstance(v, dict) else v[:50])
    return out or [{}]


__all__ = ["MAGIC", "WIRE_VERSION", "Fuzzed", "Mutator", "sample_bodies"]
