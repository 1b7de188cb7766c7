"""The trio cluster bus (node/bus.py) over real loopback sockets, driven by a fake core that
follows cluster/effects.py: joining, frames split at every byte, every kind of bad input
dropping its link with one log line, silent peers, slow readers, reconnects, log limits."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from broker.config import Config
from cluster import wire
from cluster.effects import Connect, Disconnect, LogLine, Send
from cluster.wire import Frame, MessageType
from node import bus as busmod
from node.bus import Bus
from node.clock import TrioClock
from tests.cluster.fake_core import FakeCore


@dataclass
class BusNode:
    core: FakeCore
    bus: Bus
    port: int
    saved: list[str]

    @property
    def id(self) -> str:
        return self.core.node_id


def _listener(port: int = 0) -> socket.socket:
    sock = socket.create_server(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


@asynccontextmanager
async def bus_node(node_id: str | None = None, port: int = 0, secret: str = "",
                   node_timeout: int = 2000) -> AsyncIterator[BusNode]:
    cfg = Config()
    cfg.set("cluster-node-timeout", [str(node_timeout)])
    cfg.set("cluster-secret", [secret])
    listener = _listener(port)
    port = listener.getsockname()[1]
    node_id = node_id or os.urandom(20).hex()
    core = FakeCore(node_id, port)
    saved: list[str] = []
    bus = Bus(core, cfg, TrioClock(), node_id, save_nodes=saved.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(bus.run, [listener])
        yield BusNode(core, bus, port, saved)
        bus.stop()


async def until(predicate: Callable[[], bool], timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


def bus_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "trisque.bus"]


async def test_two_nodes_join_through_one_meet(autojump_clock: trio.abc.Clock) -> None:
    async with bus_node() as a, bus_node() as b:
        a.core.meet("127.0.0.1", b.port)
        a.bus.flush()
        await until(lambda: a.core.known() == {b.id} and b.core.known() == {a.id}
                    and a.id in b.core.up and b.id in a.core.up)
        # Inbound frames carry the peer's and our own address; outbound ones the table ID.
        frame, _, peer_ip, local_ip, outbound_to = a.core.received[-1]
        assert (peer_ip, local_ip) == ("127.0.0.1", "127.0.0.1")
        assert frame.sender == b.id
        assert any(r[4] == b.id for r in a.core.received)  # PONGs on a's outbound link
        assert any(r[4] is None for r in b.core.received)  # MEET/PING on b's inbound link
        assert a.saved and b.id in a.saved[-1]
        # The handshake's temporary entry was disconnected: one outbound link per node.
        assert set(a.bus.outbound) == {b.id}


async def test_three_nodes_join_through_one_meet_each(autojump_clock: trio.abc.Clock) -> None:
    async with bus_node() as a, bus_node() as b, bus_node() as c:
        start = trio.current_time()
        for n in (a, c):
            n.core.meet("127.0.0.1", b.port)
            n.bus.flush()
        ids = {a.id, b.id, c.id}
        await until(lambda: all(n.core.known() == ids - {n.id} and len(n.core.up) == 2
                                for n in (a, b, c)))
        assert trio.current_time() - start < 2  # gossip at the fake core's 100 ms pings


async def test_frames_split_at_every_byte_still_decode(autojump_clock: trio.abc.Clock) -> None:
    async with bus_node() as a:
        sender = "b" * 40
        data = b"".join(wire.encode(Frame(MessageType.PING, sender, {"n": i, "pad": "x" * 50}))
                        for i in range(3))
        stream = await trio.open_tcp_stream("127.0.0.1", a.port)
        for i in range(len(data)):
            await stream.send_all(data[i:i + 1])
            await trio.sleep(0.001)
        await until(lambda: len(a.core.received) == 3)
        assert [f.body["n"] for f, *_ in a.core.received] == [0, 1, 2]
        # Answered on the link it came from (Answer), although the sender is not in the table.
        reply = await stream.receive_some(65536)
        dec = wire.FrameDecoder()
        dec.feed(reply)
        pong = dec.next()
        assert pong is not None and pong.type is MessageType.PONG and pong.sender == a.id
        await stream.aclose()


FAULTS: dict[str, tuple[bytes, str]] = {
    "port scanner": (bytes(range(256)) * 4, "BadMagic"),
    "http get": (b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", "BadMagic"),
    "oversized": (wire.HEADER.pack(wire.MAGIC, wire.WIRE_VERSION, 0, 1, b"c" * 40,
                                   wire.max_body_for(Config().job_max_body_len) + 1),
                  "Oversized"),
    "bad version": (wire.HEADER.pack(wire.MAGIC, 99, 0, 1, b"c" * 40, 0), "BadVersion"),
    "unknown type": (wire.HEADER.pack(wire.MAGIC, wire.WIRE_VERSION, 0, 999, b"c" * 40, 0),
                     "UnknownType"),
    "truncated then eof": (wire.encode(Frame(MessageType.PING, "c" * 40, {"x": 1}))[:-1],
                           "Truncated"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_bad_input_drops_the_link_with_one_log_line(
        fault: str, autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture) -> None:
    data, reason = FAULTS[fault]
    caplog.set_level(logging.DEBUG, logger="trisque")
    async with bus_node() as a, bus_node() as b:
        a.core.meet("127.0.0.1", b.port)
        a.bus.flush()
        await until(lambda: b.id in a.core.up and a.id in b.core.up)
        for _ in range(3):  # three times: still one line (rate-limited per peer and reason)
            stream = await trio.open_tcp_stream("127.0.0.1", a.port)
            await stream.send_all(data)
            if fault == "truncated then eof":
                await stream.send_eof()
            with trio.fail_after(5):
                while await stream.receive_some(65536):
                    pass  # closed by the node: EOF
            await stream.aclose()
        lines = [line for line in bus_lines(caplog) if "dropping link" in line]
        assert len(lines) == 1, lines
        assert "127.0.0.1" in lines[0] and reason in lines[0]
        assert a.bus.counters["links_dropped_bad_frame"] == 3
        assert not a.core.received or all(r[0].sender != "c" * 40 for r in a.core.received)
        # The node's other links are untouched: its peer still talks to it.
        seen = len(b.core.received)
        await until(lambda: len(b.core.received) > seen + 2)
        assert a.core.up.get(b.id) is not None


@pytest.mark.parametrize("peer_secret, why", [("other", "wrong MAC"), ("", "no MAC")])
async def test_wrong_or_missing_mac_never_enters_the_table(
        peer_secret: str, why: str, autojump_clock: trio.abc.Clock,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="trisque")
    async with bus_node(secret="s3cret") as a, bus_node(secret=peer_secret) as b:
        b.core.meet("127.0.0.1", a.port)
        b.bus.flush()
        await until(lambda: a.bus.counters["links_dropped_bad_frame"] >= 1)
        await trio.sleep(3)  # retries (reconnect backoff) are refused too, and not logged again
        assert a.bus.counters["links_dropped_bad_frame"] > 3
        assert a.core.received == [] and a.core.known() == set()
        assert b.core.known() == set()
        lines = [line for line in bus_lines(caplog) if "dropping link" in line]
        assert len(lines) == 1 and "BadMac" in lines[0] and why in lines[0], lines


async def test_same_secret_joins(autojump_clock: trio.abc.Clock) -> None:
    async with bus_node(secret="s3cret") as a, bus_node(secret="s3cret") as b:
        a.core.meet("127.0.0.1", b.port)
        a.bus.flush()
        await until(lambda: a.core.known() == {b.id} and b.core.known() == {a.id})


async def test_a_peer_that_never_speaks_is_closed(
        autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="trisque")
    async with bus_node(node_timeout=30_000) as a:
        assert a.bus.first_frame_timeout == busmod.FIRST_FRAME_TIMEOUT_S
        stream = await trio.open_tcp_stream("127.0.0.1", a.port)
        start = trio.current_time()
        with trio.fail_after(60):
            assert await stream.receive_some(100) == b""
        waited = trio.current_time() - start
        assert busmod.FIRST_FRAME_TIMEOUT_S <= waited < busmod.FIRST_FRAME_TIMEOUT_S + 1
        lines = [line for line in bus_lines(caplog) if "no complete frame" in line]
        assert len(lines) == 1 and "127.0.0.1" in lines[0]
        assert a.bus.counters["links_closed_silent"] == 1


async def test_inbound_links_are_limited(autojump_clock: trio.abc.Clock,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(busmod, "MAX_INBOUND", 2)
    async with bus_node() as a:
        held = [await trio.open_tcp_stream("127.0.0.1", a.port) for _ in range(2)]
        await until(lambda: a.bus.inbound == 2)
        extra = await trio.open_tcp_stream("127.0.0.1", a.port)
        with trio.fail_after(1):  # closed at once, long before the first-frame timeout
            assert await extra.receive_some(10) == b""
        assert a.bus.counters["links_refused"] == 1
        for s in held:
            await s.aclose()
        await until(lambda: a.bus.inbound == 0)


async def test_a_restarted_peer_is_reconnected_within_100_ms_every_time(
        autojump_clock: trio.abc.Clock) -> None:
    async with bus_node() as a:
        b_id = os.urandom(20).hex()
        async with bus_node(b_id) as b:
            b_port = b.port
            a.core.meet("127.0.0.1", b.port)
            a.bus.flush()
            await until(lambda: b_id in a.core.up)
            last = a.core.up[b_id]
        await until(lambda: b_id not in a.core.up)
        await trio.sleep(5)  # down for a while: the keeper tries every 80-100 ms, no backoff
        failures = a.bus.counters["connect_failures"]
        every = busmod.RECONNECT_EVERY_S
        assert 5 / every - 2 <= failures <= 5 / (0.8 * every) + 2, failures
        # Quick restarts in a row (as many as the old doubling backoff needed to reach its
        # ceiling): each one is linked within one attempt period of listening.
        for down_s in (0.05, 0.3, 2.0, 0.15, 0.5):
            async with bus_node(b_id, port=b_port):
                listening = trio.current_time()
                await until(lambda: b_id in a.core.up)
                assert trio.current_time() - listening <= every
                assert a.core.up[b_id] > last  # a new link ID, never reused
                last = a.core.up[b_id]
            await until(lambda: b_id not in a.core.up)
            await trio.sleep(down_s)
        downs = [e for e in a.core.events if e[0] == "down" and e[1] == b_id]
        assert len(downs) >= failures


async def test_send_to_a_node_that_is_not_up_is_dropped_and_counted(
        autojump_clock: trio.abc.Clock) -> None:
    async with bus_node() as a:
        a.bus.route(Send("d" * 40, MessageType.PING, {}))
        assert a.bus.counters["sends_dropped"] == 1


async def test_a_peer_that_stops_reading_is_closed(autojump_clock: trio.abc.Clock,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The core sends a lot to a node that accepted the link and never reads: the sends never
    wait, and the link is closed after the stall timeout (or the queue limit)."""
    caplog.set_level(logging.DEBUG, logger="trisque")
    sink = _listener()
    sink.listen()
    async with bus_node(node_timeout=1000) as a:
        peer_id = "e" * 40
        a.core._add(peer_id, "127.0.0.1", sink.getsockname()[1])
        a.bus.flush()
        await until(lambda: peer_id in a.core.up)
        accepted, _ = sink.accept()
        link = a.core.up[peer_id]
        big = {"pad": b"x" * (1 << 20)}
        start = trio.current_time()
        for _ in range(40):  # 40 MiB: past what the kernel buffers on loopback
            a.bus.route(Send(peer_id, MessageType.PING, big))
        assert trio.current_time() == start  # routing never waited
        await until(lambda: link not in a.bus.links)
        assert a.bus.counters["links_closed_slow"] == 1
        assert any("peer read nothing" in line or "unsent" in line for line in bus_lines(caplog))
        accepted.close()
    sink.close()


async def test_core_log_lines_are_rate_limited_per_key(
        autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="trisque")
    async with bus_node() as a:
        for _ in range(5):
            a.bus.route(LogLine("warning", "node x is failing", key="fail:x"))
        a.bus.route(LogLine("notice", "something else", key="other"))
        await trio.sleep(busmod.LOG_EVERY_S + 0.1)
        a.bus.route(LogLine("warning", "node x is failing", key="fail:x"))
        lines = [line for line in bus_lines(caplog) if "failing" in line]
        assert lines == ["node x is failing", "node x is failing (4 similar lines suppressed)"]
        assert "something else" in bus_lines(caplog)


async def test_a_peer_dribbling_bytes_is_closed_at_the_first_frame_deadline(
        autojump_clock: trio.abc.Clock) -> None:
    async with bus_node(node_timeout=30_000) as a:
        data = wire.encode(Frame(MessageType.PING, "c" * 40, {"pad": "x" * 100}))
        stream = await trio.open_tcp_stream("127.0.0.1", a.port)
        start = trio.current_time()
        sent = 0
        with trio.fail_after(60):
            while True:
                try:
                    await stream.send_all(data[sent:sent + 1])
                except trio.BrokenResourceError:
                    break
                sent += 1
                with trio.move_on_after(1):  # a byte a second, never a whole frame in time
                    try:
                        if await stream.receive_some(10) == b"":
                            break
                    except trio.BrokenResourceError:  # reset: closed with our bytes unread
                        break
        assert trio.current_time() - start <= busmod.FIRST_FRAME_TIMEOUT_S + 1.5
        assert a.bus.counters["links_closed_silent"] == 1 and a.core.received == []


async def test_an_error_in_the_core_is_logged_and_the_bus_goes_on(
        autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="trisque")
    async with bus_node() as a, bus_node() as b:
        real = b.core.receive
        calls = 0

        def buggy(*args: object) -> None:
            nonlocal calls
            calls += 1
            if calls <= 3:
                raise RuntimeError("a bug in the core")
            real(*args)  # type: ignore[arg-type]

        a.core.meet("127.0.0.1", b.port)
        a.bus.flush()
        await until(lambda: a.core.known() == {b.id} and b.core.known() == {a.id})
        b.core.receive = buggy  # type: ignore[method-assign]
        seen = len(b.core.received)
        await until(lambda: len(b.core.received) > seen + 3)  # PINGs after the failing ones
        assert b.bus.counters["core_errors"] == 3
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and errors[0].exc_info is not None


async def test_connect_is_idempotent_and_follows_a_new_address(
        autojump_clock: trio.abc.Clock) -> None:
    async with bus_node() as a, bus_node() as b, bus_node() as c:
        peer = "f" * 40
        a.bus.route(Connect(peer, "127.0.0.1", b.port))
        await until(lambda: peer in a.core.up)
        first = a.core.up[peer]
        a.bus.route(Connect(peer, "127.0.0.1", b.port))  # the same: nothing happens
        await trio.sleep(1)
        assert a.core.up[peer] == first and len(b.core.received) > 0
        a.bus.route(Connect(peer, "127.0.0.1", c.port))  # moved: the keeper follows
        await until(lambda: a.core.up.get(peer, first) != first and c.core.received != [])
        a.bus.route(Disconnect(peer))
        await until(lambda: not a.bus.links.get(a.core.up[peer]))
        assert peer not in a.bus.outbound


async def test_messages_joined_in_a_flush_arrive_alone_and_in_order(
        autojump_clock: trio.abc.Clock) -> None:
    """GOTJOBs sent to one node in one flush travel as one BATCH frame; the receiver's core
    gets each one alone, in order with the other frames of the link."""
    async with bus_node() as a, bus_node() as b:
        a.core.meet("127.0.0.1", b.port)
        a.bus.flush()
        await until(lambda: b.id in a.bus.up and a.id in b.core.up)
        sends = [(MessageType.GOTJOB, {"id": b"1"}), (MessageType.GOTJOB, {"id": b"2"}),
                 (MessageType.ENQUEUE, {"id": b"3"}), (MessageType.GOTJOB, {"id": b"4"}),
                 (MessageType.GOTJOB, {"id": b"5"})]
        a.core.outbox += [Send(b.id, t, body) for t, body in sends]
        a.bus.flush()
        job_types = {MessageType.GOTJOB, MessageType.ENQUEUE}

        def got() -> list[tuple[MessageType, dict[str, Any]]]:
            return [(r[0].type, r[0].body) for r in b.core.received if r[0].type in job_types]

        await until(lambda: len(got()) == len(sends))
        assert got() == sends
        assert b.bus.counters["links_dropped_bad_frame"] == 0
