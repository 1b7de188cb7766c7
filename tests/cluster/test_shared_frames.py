"""A replicated job's REPLJOB is made once for its replicas: the job core sends every replica
the same body, and the bus encodes a batch of bodies it has just encoded for another link
only once (node/bus_core.py), the frame's bytes the same as an encoding of their own."""

from __future__ import annotations

import os
from typing import Any

from broker.config import Config
from cluster import wire
from cluster.effects import EffectQueue
from cluster.wire import MessageType as M
from node import bus_core
from node.bus_core import BusCore, LinkCore
from tests.cluster.jobsim import JobCluster


class _Link(LinkCore):
    def wake_writer(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _bus(secret: bytes | None) -> tuple[BusCore, _Link, _Link]:
    bus = BusCore(EffectQueue(), Config(), secret, os.urandom(20).hex(), lambda: None,  # type: ignore[arg-type]
                  lambda: None, lambda: 0, lambda: 0)
    a = _Link(bus, 1, -1, "a", "127.0.0.1", "127.0.0.1", 0.0)
    b = _Link(bus, 2, -1, "b", "127.0.0.1", "127.0.0.1", 0.0)
    bus.up = {"a": a, "b": b}
    bus.flushing = True  # as in a flush: the frames wait in the batches
    return bus, a, b


def _frames(link: LinkCore, secret: bytes | None) -> list[wire.Frame]:
    decoder = wire.FrameDecoder(secret)
    decoder.feed(b"".join(p for p in link.queue if isinstance(p, bytes)))
    frames = []
    while (frame := decoder.next()) is not None:
        frames.append(frame)
    return frames


def test_the_replicas_of_a_job_are_sent_one_body() -> None:
    c = JobCluster(3)
    c.cmd(0, "ADDJOB", "q", "payload", "500", client=c.client())
    repljobs = [(dst, body) for _, _, dst, t, body in c.sends if t is M.REPLJOB]
    assert len(repljobs) == 2 and repljobs[0][0] != repljobs[1][0]
    assert repljobs[0][1] is repljobs[1][1]


def test_the_same_bodies_are_encoded_once_and_decode_the_same_on_both_links() -> None:
    for secret in (None, b"s3cret"):
        bus, a, b = _bus(secret)
        record: list[Any] = [b"D-1", b"q", b"body"]
        shared = {"job": record, "noreply": False}
        other = {"job": record, "noreply": True}
        for body in (shared, other):
            bus_core.send(bus, a, M.REPLJOB, body)
            bus_core.send(bus, b, M.REPLJOB, body)
        bus_core.close_batch(bus, a)
        bus_core.close_batch(bus, b)
        assert len(a.queue) == len(b.queue) == 1
        assert a.queue[0] is b.queue[0]  # one encoding for both
        for link in (a, b):
            [frame] = _frames(link, secret)
            assert frame.type is M.BATCH
            assert [f.body for f in wire.unbatch(frame)] == [shared, other]
        # Another batch (a new body, equal but not the same object) is encoded anew.
        bus_core.send(bus, a, M.REPLJOB, dict(shared))
        bus_core.send(bus, b, M.REPLJOB, {"job": [b"D-2", b"q", b"x"], "noreply": False})
        bus_core.close_batch(bus, a)
        bus_core.close_batch(bus, b)
        assert a.queue[1] is not b.queue[1]
        assert _frames(a, secret)[1].body == shared
        assert _frames(b, secret)[1].body["job"][0] == b"D-2"
        assert bus.counters["frames_sent"] == 6
