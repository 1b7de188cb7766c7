"""Priorities, MAXINFLIGHT and chains against a model a reader can check by eye.

A Hypothesis state machine drives one broker with ADDJOB (with and without PRIORITY, with and
without AFTER), GETJOB NOHANG COUNT, ACKJOB, RESOLVE, NACK, DEQUEUE, DELJOB, QPOLICY PARK (a
dead letter) and the queue's MAXINFLIGHT changing, and keeps the model: the queued jobs as
(priority, creation order), the jobs in flight, and the waiting children with the parents
they still wait for. GETJOB must give the highest priority first and the oldest first within
one, never more than the limit in flight (counting the jobs delivered while a limit was set; removing it forgets them),
and nothing only when the queue is empty or the limit is reached. A child is queued when its
last parent is acked or resolved, and deleted (the queue has no dead-letter queue) when a
parent is deleted, dead-lettered or unknown: a job that ended without a trace (a plain ACKJOB
while no child waited for it) is unknown to a child added later (docs/semantics.md). QPEEK,
QLEN, QSTAT and SHOW must agree with the model after every step.
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
        self.waiting: dict[bytes, set[bytes]] = {}  # child -> parents not done yet
        self.ended: list[bytes] = []  # jobs that ended (acked, resolved, deleted, parked)
        self.outcome: dict[bytes, bool] = {}  # kept outcomes: succeeded or not

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

    def live(self) -> list[bytes]:
        return [e[2] for e in self.queued] + self.inflight + sorted(self.waiting)

    def watched(self, job_id: bytes) -> bool:
        return any(job_id in parents for parents in self.waiting.values())

    def end(self, job_id: bytes, ok: bool, keep: bool = False) -> None:
        """``job_id`` left (acked or resolved when ``ok``): its outcome is kept if it was
        resolved (``keep``) or a child waited for it, and its children move on."""
        self.ended.append(job_id)
        if keep or self.watched(job_id):
            self.outcome[job_id] = ok
        for child, parents in sorted(self.waiting.items()):
            if child not in self.waiting or job_id not in parents:
                continue
            if not ok:
                del self.waiting[child]
                self.end(child, False)  # deleted: its own children fail in turn
                continue
            parents.discard(job_id)
            if not parents:
                del self.waiting[child]
                self.queued.append((self.priority[child], self.seqs[child], child))

    @rule(data=st.data(), priority=st.integers(0, 9), n=st.integers(1, 3))
    def add_child(self, data: st.DataObject, priority: int, n: int) -> None:
        known = self.live() + self.ended
        if not known:
            return
        parents = [data.draw(st.sampled_from(known)) for _ in range(n)]
        after = [w for p in parents for w in (b"AFTER", p)]
        reply = self.run("ADDJOB", "q", f"c{self.seq}", 0, "RETRY", RETRY_S,
                         "PRIORITY", priority, *after)
        child = str(reply).encode()
        self.priority[child] = priority
        self.seqs[child] = self.seq
        self.seq += 1
        self.now += 1
        pending = {p for p in parents if p not in self.ended}
        if any(p in self.ended and not self.outcome.get(p, False) for p in parents):
            self.ended.append(child)  # a parent failed or is unknown: deleted at once
            assert child not in self.b.jobs
        elif pending:
            self.waiting[child] = pending
        else:
            self.queued.append((priority, self.seqs[child], child))

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

    @rule(data=st.data(), how=st.sampled_from(["ACKJOB", "NACK", "RESOLVE", "PARK"]))
    def finish(self, data: st.DataObject, how: str) -> None:
        if not self.inflight:
            return
        job_id = data.draw(st.sampled_from(self.inflight))
        if how == "PARK":
            assert isinstance(self.run("QPOLICY", "PARK", job_id, 1, "-", "failed"), list)
        elif how == "RESOLVE":
            assert self.run(how, job_id, "result") == 1
        else:
            assert self.run(how, job_id) == 1
        self.inflight.remove(job_id)
        self.counted.discard(job_id)
        if how != "NACK":
            self.end(job_id, how in ("ACKJOB", "RESOLVE"), keep=how == "RESOLVE")
        else:
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

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        live = self.live()
        if not live:
            return
        job_id = data.draw(st.sampled_from(live))
        assert self.run("DELJOB", job_id) == 1
        self.queued = [e for e in self.queued if e[2] != job_id]
        if job_id in self.inflight:
            self.inflight.remove(job_id)
        self.counted.discard(job_id)
        self.waiting.pop(job_id, None)
        self.end(job_id, False)

    @rule(limit=st.integers(0, 4))
    def set_limit(self, limit: int) -> None:
        self.run("QPOLICY", "SET", "q", "MAXINFLIGHT", limit, "VISIBILITY", RETRY_S)
        self.limit = limit
        if not limit:
            self.counted.clear()  # unthrottled: the queue's counts are dropped

    @invariant()
    def agrees(self) -> None:
        assert self.run("QLEN", "q") == len(self.queued)
        peek = self.run("QPEEK", "q", 100)
        assert [bytes(e[1]) for e in peek] == self.order()  # type: ignore[union-attr]
        for child, parents in self.waiting.items():
            shown = self.run("SHOW", child)
            fields = dict(zip(shown[::2], shown[1::2], strict=True))  # type: ignore[index]
            assert fields[b"state"] == b"waiting"
            assert set(fields[b"after"]) == parents
        for job_id in self.ended[-5:]:
            assert job_id not in self.b.jobs
        stat = self.run("QSTAT", "q")
        if stat is not NULL_ARRAY and self.limit:
            fields = dict(zip(stat[::2], stat[1::2], strict=True))  # type: ignore[index]
            assert fields[b"inflight"] == self.in_flight()
            full = self.in_flight() >= self.limit
            assert fields[b"throttled"] == int(full)


TestPriorityThrottleModel = PriorityThrottleModel.TestCase
