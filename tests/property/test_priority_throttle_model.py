"""Priorities and MAXINFLIGHT against a model a reader can check by eye.

A Hypothesis state machine drives one broker with ADDJOB (with and without PRIORITY),
GETJOB NOHANG COUNT, ACKJOB, NACK, DEQUEUE and the queue's MAXINFLIGHT changing, and keeps
the model: the queued jobs as (priority, creation order) and the jobs in flight. GETJOB must
give the highest priority first and the oldest first within one, never more than the limit in
flight (counting the jobs delivered while a limit was set), and nothing only when the queue
is empty or the limit is reached; QPEEK, QLEN and
QSTAT must agree with the model after every step.
"""

from __future__ import annotations

import random

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker.clients import Client
from broker.config import Config
from broker.core import Broker
from protocol.resp import NULL_ARRAY
from tests.broker.harness import NODE, T0

RETRY_S = 600  # no clock step reaches it


class PriorityThrottleModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.b = Broker(Config(), NODE, b"seed" * 5, now_ms=T0, rng=random.Random(1))
        self.client = Client(1)
        self.limit = 0  # MAXINFLIGHT, 0: none
        self.queued: list[tuple[int, int, bytes]] = []  # (priority, sequence, id)
        self.inflight: list[bytes] = []
        # Delivered while a limit was set: only those count (broker/throttle.py).
        self.counted: set[bytes] = set()
        self.seq = 0
        self.priority: dict[bytes, int] = {}
        self.seqs: dict[bytes, int] = {}

    def run(self, *argv: object) -> object:
        args = [a if isinstance(a, bytes) else str(a).encode() for a in argv]
        return self.b.execute(args, self.client, self.now)

    def in_flight(self) -> int:
        return len(self.counted)

    def order(self) -> list[bytes]:
        return [job_id for _, _, job_id in sorted(self.queued, key=lambda e: (-e[0], e[1]))]

    @rule(priority=st.integers(0, 9), plain=st.booleans())
    def add(self, priority: int, plain: bool) -> None:
        opts = () if plain else ("PRIORITY", priority)
        reply = self.run("ADDJOB", "q", f"b{self.seq}", 0, "RETRY", RETRY_S, *opts)
        job_id = str(reply).encode()
        prio = 0 if plain else priority
        self.queued.append((prio, self.seq, job_id))
        self.priority[job_id] = prio
        self.seqs[job_id] = self.seq
        self.seq += 1
        self.now += 1

    @rule(count=st.integers(1, 4))
    def getjob(self, count: int) -> None:
        reply = self.run("GETJOB", "NOHANG", "COUNT", count, "FROM", "q")
        got = [] if reply is NULL_ARRAY else [bytes(e[1]) for e in reply]  # type: ignore[union-attr]
        room = count if not self.limit else max(0, min(count, self.limit - self.in_flight()))
        expected = self.order()[:room]
        assert got == expected
        self.queued = [e for e in self.queued if e[2] not in got]
        self.inflight += got
        if self.limit:
            self.counted.update(got)

    @rule(data=st.data(), how=st.sampled_from(["ACKJOB", "NACK"]))
    def finish(self, data: st.DataObject, how: str) -> None:
        if not self.inflight:
            return
        job_id = data.draw(st.sampled_from(self.inflight))
        assert self.run(how, job_id) == 1
        self.inflight.remove(job_id)
        self.counted.discard(job_id)
        if how == "NACK":
            # Queued again in its place among the jobs of its priority (creation order).
            self.queued.append((self.priority[job_id], self.seqs[job_id], job_id))

    @rule(data=st.data())
    def dequeue(self, data: st.DataObject) -> None:
        if not self.queued:
            return
        entry = data.draw(st.sampled_from(self.queued))
        assert self.run("DEQUEUE", entry[2]) == 1
        self.queued.remove(entry)
        assert self.run("ENQUEUE", entry[2]) == 1
        self.queued.append(entry)

    @rule(limit=st.integers(0, 4))
    def set_limit(self, limit: int) -> None:
        self.run("QPOLICY", "SET", "q", "MAXINFLIGHT", limit, "VISIBILITY", RETRY_S)
        self.limit = limit

    @invariant()
    def agrees(self) -> None:
        assert self.run("QLEN", "q") == len(self.queued)
        peek = self.run("QPEEK", "q", 100)
        assert [bytes(e[1]) for e in peek] == self.order()  # type: ignore[union-attr]
        stat = self.run("QSTAT", "q")
        if stat is not NULL_ARRAY and self.limit:
            fields = dict(zip(stat[::2], stat[1::2], strict=True))  # type: ignore[index]
            assert fields[b"inflight"] == self.in_flight()
            full = self.in_flight() >= self.limit
            assert fields[b"throttled"] == int(full)


TestPriorityThrottleModel = PriorityThrottleModel.TestCase
