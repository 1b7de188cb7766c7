"""The broker core against a model a reader can check by eye, then its log against the core.

A Hypothesis state machine drives one broker with the job commands (ADDJOB, GETJOB, ACKJOB,
FASTACK, NACK, ENQUEUE, DEQUEUE, DELJOB) and small clock steps, and keeps beside it the
model: which jobs exist, in which state, on which queue, in creation order. After every step
the replies and QLEN, QPEEK, SHOW and INFO must agree with the model.

When a run ends, what the broker wrote is written in the log's real format, read back as
replay reads a file and loaded into a fresh broker, twice: the records emitted as the
commands ran, as after a crash (the same jobs, bodies and counters, every job waiting for its
retry time), and the snapshot SHUTDOWN writes, as after a controlled restart (the same jobs in
the same states and queue order).
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from broker import aof
from broker.clients import Client
from broker.config import Config
from broker.core import Broker
from broker.effects import LogRecord
from protocol.resp import NULL_ARRAY
from tests.broker.harness import NODE, T0

QUEUES = (b"q1", b"q2", b"q3")
RETRY_S = 60  # no clock step reaches it: a job changes state only by command


@dataclass
class Modelled:
    queue: bytes
    body: bytes
    state: str  # "queued" or "active"
    nacks: int = 0  # queued again by NACK
    deliveries: int = 0  # queued again otherwise (Disque's additional-deliveries)


def _show(b: Broker, job_id: bytes, now: int) -> dict[bytes, object] | None:
    reply = b.execute([b"SHOW", job_id], Client(9), now)
    return None if reply is None else dict(zip(reply[::2], reply[1::2], strict=True))


class BrokerModel(RuleBasedStateMachine):
    jobs = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.b = Broker(Config(), NODE, b"seed" * 5, now_ms=T0, rng=random.Random(1))
        self.client = Client(1)
        self.model: dict[bytes, Modelled] = {}
        self.order: list[bytes] = []  # creation order: a queue serves its oldest job first
        self.records: list[tuple[str, object]] = []

    def run(self, *args: bytes | str | int) -> object:
        argv = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        reply = self.b.execute(argv, self.client, self.now)
        for effect in self.b.take_effects():
            if isinstance(effect, LogRecord):
                self.records.append((effect.kind, effect.payload))
        return reply

    def queued(self, queue: bytes) -> list[bytes]:
        return [j for j in self.order
                if j in self.model and self.model[j].queue == queue
                and self.model[j].state == "queued"]

    # -- commands -------------------------------------------------------------------------

    @rule(target=jobs, queue=st.sampled_from(QUEUES), body=st.binary(max_size=12))
    def addjob(self, queue: bytes, body: bytes) -> bytes:
        reply = self.run("ADDJOB", queue, body, 0, "RETRY", RETRY_S)
        assert isinstance(reply, str) and reply.startswith("D-"), reply
        job_id = reply.encode()
        assert job_id not in self.model
        self.model[job_id] = Modelled(queue, body, "queued")
        self.order.append(job_id)
        return job_id

    @rule(queue=st.sampled_from(QUEUES), count=st.integers(1, 4))
    def getjob(self, queue: bytes, count: int) -> None:
        expected = self.queued(queue)[:count]
        reply = self.run("GETJOB", "NOHANG", "COUNT", count, "WITHCOUNTERS", "FROM", queue)
        if not expected:
            assert reply is NULL_ARRAY, reply
            return
        assert isinstance(reply, list)
        assert [item[1] for item in reply] == expected
        for item, job_id in zip(reply, expected, strict=True):
            job = self.model[job_id]
            assert item[0] == queue and item[2] == job.body
            assert item[4] == job.nacks and item[6] == job.deliveries
            job.state = "active"

    @rule(job_id=consumes(jobs), fast=st.booleans())
    def ack(self, job_id: bytes, fast: bool) -> None:
        known = job_id in self.model
        assert self.run("FASTACK" if fast else "ACKJOB", job_id) == int(known)
        self.model.pop(job_id, None)

    @rule(job_id=consumes(jobs))
    def deljob(self, job_id: bytes) -> None:
        assert self.run("DELJOB", job_id) == int(job_id in self.model)
        self.model.pop(job_id, None)

    @rule(job_id=jobs, nack=st.booleans())
    def enqueue(self, job_id: bytes, nack: bool) -> None:
        job = self.model.get(job_id)
        moved = job is not None and job.state == "active"
        assert self.run("NACK" if nack else "ENQUEUE", job_id) == int(moved)
        if moved:
            assert job is not None
            job.state = "queued"
            job.nacks += nack
            job.deliveries += not nack

    @rule(job_id=jobs)
    def dequeue(self, job_id: bytes) -> None:
        job = self.model.get(job_id)
        moved = job is not None and job.state == "queued"
        assert self.run("DEQUEUE", job_id) == int(moved)
        if moved:
            assert job is not None
            job.state = "active"

    @rule(ms=st.integers(0, 5_000))
    def clock(self, ms: int) -> None:
        self.now += ms
        self.b.tick(self.now)
        for effect in self.b.take_effects():
            if isinstance(effect, LogRecord):
                self.records.append((effect.kind, effect.payload))

    # -- what must always hold ----------------------------------------------------------------

    @invariant()
    def queues_hold_what_the_model_says(self) -> None:
        for queue in QUEUES:
            expected = self.queued(queue)
            assert self.run("QLEN", queue) == len(expected)
            peek = self.run("QPEEK", queue, 100)
            assert [item[1] for item in peek] == expected  # type: ignore[union-attr]

    @invariant()
    def every_job_shows_its_state(self) -> None:
        assert len(self.b.jobs) == len(self.model)
        for job_id, job in self.model.items():
            shown = _show(self.b, job_id, self.now)
            assert shown is not None
            assert shown[b"state"] == job.state.encode() and shown[b"queue"] == job.queue
            assert shown[b"body"] == job.body and shown[b"nacks"] == job.nacks
            assert shown[b"additional-deliveries"] == job.deliveries

    # -- the log, replayed ----------------------------------------------------------------------

    def replay(self, records: list[tuple[str, object]], controlled: bool) -> Broker:
        """A fresh broker loaded from ``records`` written and read in the log's format."""
        data = aof.encode_header() + aof.encode_records(records)
        end = aof.ReadEnd()
        replayed = list(aof.read_records(io.BytesIO(data), "model.log", end,
                                         validate=Broker.validate_record))
        assert end.state == "clean", (end.state, end.reason)
        again = Broker(Config(), NODE, b"seed" * 5, now_ms=self.now, rng=random.Random(2))
        for record in replayed:
            again.load_record(record, self.now)
        again.finish_load(self.now, enqueue_jobs_once=controlled)
        assert set(again.jobs) == set(self.model)
        return again

    def same_jobs(self, again: Broker, fields: tuple[bytes, ...]) -> None:
        for job_id in self.model:
            before, after = _show(self.b, job_id, self.now), _show(again, job_id, self.now)
            assert before is not None and after is not None
            for field in fields:
                assert after[field] == before[field], (job_id, field)

    def teardown(self) -> None:
        kept = (b"queue", b"body", b"nacks", b"additional-deliveries", b"ctime", b"retry",
                b"ttl")
        # After a crash the records written as the commands ran are all there is: every job
        # comes back, with its counters, and waits for its retry time before it is queued.
        crashed = self.replay(self.records, controlled=False)
        self.same_jobs(crashed, kept)
        assert all(_show(crashed, j, self.now)[b"state"] == b"active"  # type: ignore[index]
                   for j in self.model)
        # A controlled restart loads the snapshot SHUTDOWN writes: the queues come back exact.
        restarted = self.replay(list(self.b.snapshot()), controlled=True)
        self.same_jobs(restarted, (b"state", *kept))
        for queue in QUEUES:
            peek = restarted.execute([b"QPEEK", queue, b"100"], Client(9), self.now)
            assert [item[1] for item in peek] == self.queued(queue)


TestBrokerModel = BrokerModel.TestCase
