"""A BATCH of GOTJOBs goes to the job core whole (``JobCore.receive_gotjobs``, reached from
``node/bus_core.py``'s ``take_frames``): the same outcome as each GOTJOB received alone, in
order, and an entry that is not a plain GOTJOB from a member still handled as one alone."""

from __future__ import annotations

import os
from typing import Any

from broker.clients import BLOCKED
from broker.config import Config
from broker.job import JobState
from cluster import wire
from cluster.effects import EffectQueue
from cluster.sim import Faults
from cluster.wire import MessageType as M
from node import bus_core
from node.bus_core import BusCore, LinkCore
from tests.cluster.jobsim import JobCluster


class _Link(LinkCore):
    def wake_writer(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _blocked_jobs(n: int) -> tuple[JobCluster, list[bytes]]:
    """``n`` ADDJOB REPLICATE 3 on node 0 whose GOTJOBs never arrive by themselves."""
    c = JobCluster(3)
    c.sim.faults[(1, 0)] = Faults(drop=1.0)
    c.sim.faults[(2, 0)] = Faults(drop=1.0)
    client = c.client()
    for i in range(n):
        assert c.cmd(0, "ADDJOB", "q", f"body{i}", "0", "REPLICATE", "3",
                     client=client) is BLOCKED
    ids = list(c.broker(0).repl_wait)
    assert len(ids) == n
    return c, ids


def _batch(c: JobCluster, sender: int, bodies: list[Any]) -> wire.Frame:
    return wire.Frame(M.BATCH, c.node_id(sender), wire.batch_body(M.GOTJOB, bodies))


def test_a_batch_of_gotjobs_confirms_its_jobs_in_order() -> None:
    c, ids = _blocked_jobs(3)
    core = c.jn(0).core
    before = core.stats["received"]
    for sender in (1, 2):
        frame = _batch(c, sender, [{"id": job_id} for job_id in ids])
        core.receive_gotjobs(frame, frame.body["bodies"], 0, "127.0.0.1", "127.0.0.1", None,
                             c.sim.now)
    assert core.stats["received"] == before + 6
    b = c.broker(0)
    assert b.repl_wait == {} and all(b.jobs[j].state is JobState.QUEUED for j in ids)
    # The replies in the order the client sent the ADDJOBs.
    replies = [e.value for e in b.outbox if type(e).__name__ == "Reply"]
    assert replies == [j.decode() for j in ids]


def test_an_odd_entry_is_handled_as_a_lone_gotjob_would_be() -> None:
    c, ids = _blocked_jobs(1)
    core = c.jn(0).core
    malformed = core.stats["malformed"]
    frame = _batch(c, 1, [{"id": 7}, {"id": ids[0]}])
    core.receive_gotjobs(frame, frame.body["bodies"], 0, "127.0.0.1", "127.0.0.1", None,
                         c.sim.now)
    assert core.stats["malformed"] == malformed + 1  # logged and dropped, as alone
    assert c.broker(0).jobs[ids[0]].confirmed == (c.node_id(0), c.node_id(1))
    # From a node that is not a member: nothing counts.
    stranger = wire.Frame(M.BATCH, os.urandom(20).hex(), wire.batch_body(M.GOTJOB,
                                                                          [{"id": ids[0]}]))
    core.receive_gotjobs(stranger, stranger.body["bodies"], 0, "127.0.0.1", "127.0.0.1",
                         None, c.sim.now)
    assert c.broker(0).jobs[ids[0]].state is JobState.WAIT_REPL


def test_the_bus_hands_a_read_batch_of_gotjobs_to_the_job_core() -> None:
    c, ids = _blocked_jobs(2)
    core = c.jn(0).core
    bus = BusCore(EffectQueue(), Config(), None, c.node_id(0), lambda: None,  # type: ignore[arg-type]
                  lambda: None, lambda: 0, lambda: c.sim.now)
    bus.jobs = core
    link = _Link(bus, 1, -1, None, "127.0.0.1", "127.0.0.1", 0.0)
    data = b"".join(wire.encode_message(M.BATCH, c.node_id(sender),
                                        wire.batch_body(M.GOTJOB, [{"id": j} for j in ids]))
                    for sender in (1, 2))
    bus_core.take_frames(link, data)
    assert bus.counters["frames_received"] == 4 and bus.received_by_type == {M.GOTJOB: 4}
    b = c.broker(0)
    assert b.repl_wait == {} and all(b.jobs[j].state is JobState.QUEUED for j in ids)
