"""A GOTJOB leaves only once the log holds what it promises: the bus reads the log's ticket
once per flush, after the broker's records were routed, and never reuses it outside that
flush (node/bus_core.py, ``flush_ticket``)."""

from __future__ import annotations

import os
from typing import Any

from broker.config import Config
from cluster.effects import EffectQueue, Send
from cluster.wire import MessageType as M
from node import bus_core
from node.bus_core import BusCore, LinkCore


class _Link(LinkCore):
    def wake_writer(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class _Bus(BusCore):
    def __init__(self, core: EffectQueue) -> None:
        self.ticket = 0
        self.reads = 0
        super().__init__(core, Config(), None, os.urandom(20).hex(),  # type: ignore[arg-type]
                         self._before, lambda: None, self._log_ticket, lambda: 0)

    def _before(self) -> None:
        self.ticket += 1  # the broker's records of this event went to a new log batch

    def _log_ticket(self) -> int:
        self.reads += 1
        return self.ticket

    def send_when_durable(self, ticket: int) -> bool:
        return True


def _gotjob(node_id: str, n: int) -> Send:
    return Send(node_id, M.GOTJOB, {"id": b"D-%d" % n})


def test_a_flush_reads_the_ticket_once_after_the_brokers_records() -> None:
    core = EffectQueue()
    bus = _Bus(core)
    bus.up = {"a": _Link(bus, 1, -1, "a", "127.0.0.1", "127.0.0.1", 0.0)}
    core.outbox = [_gotjob("a", n) for n in range(3)]
    bus_core.flush(bus)
    assert bus.reads == 1
    assert list(bus.held) == [1] and len(bus.held[1]) == 3
    # The next flush's records are in a newer batch: its GOTJOB waits for that one.
    core.outbox = [_gotjob("a", 3)]
    bus_core.flush(bus)
    assert bus.reads == 2 and sorted(bus.held) == [1, 2]


def test_a_send_outside_a_flush_reads_the_ticket_itself() -> None:
    core = EffectQueue()
    bus = _Bus(core)
    bus.up = {"a": _Link(bus, 1, -1, "a", "127.0.0.1", "127.0.0.1", 0.0)}
    core.outbox = [_gotjob("a", 0)]
    bus_core.flush(bus)
    bus.ticket = 7  # records routed since, outside any flush
    bus_core.route(bus, _gotjob("a", 1))
    assert bus.reads == 2 and sorted(bus.held) == [1, 7]
    held: list[Any] = bus.held[7]
    assert held[0].body == {"id": b"D-1"}
