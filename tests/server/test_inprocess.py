"""A whole node in-process on trio's mock clock: the runtime reads time only
through node.clock, so minutes of retries and idle timeouts pass in milliseconds, with loopback
sockets and no sleeping for synchronisation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing

from broker.config import Config
from node.clock import TrioClock
from node.server import Server
from protocol.resp import NEED_DATA, ReplyReader, encode_command
from tests.support.server import free_port


class Conn:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.reader = ReplyReader()

    async def call(self, *args: object) -> object:
        await self.stream.send_all(encode_command(*[str(a) if isinstance(a, int) else a
                                                    for a in args]))  # type: ignore[misc]
        return await self.reply()

    async def reply(self) -> object:
        while True:
            value = self.reader.next()
            if value is not NEED_DATA:
                return value
            data = await self.stream.receive_some(65536)
            if not data:
                return ConnectionError("closed")
            self.reader.feed(data)


@asynccontextmanager
async def node(tmp_path, **settings: str) -> AsyncIterator[tuple[Server, int]]:
    cfg = Config()
    for name, value in settings.items():
        cfg.set(name.replace("_", "-"), [value])
    cfg.set("bind", ["127.0.0.1"])
    cfg.set("dir", [str(tmp_path)])
    port = free_port()
    cfg.set("port", [str(port)])
    async with trio.open_nursery() as nursery:
        server = Server(cfg, clock=TrioClock())
        await nursery.start(server.run)
        yield server, port
        server.shutdown_event.set()


async def connect(port: int) -> Conn:
    return Conn(await trio.open_tcp_stream("127.0.0.1", port))


async def test_a_five_minute_retry_passes_in_milliseconds(tmp_path, autojump_clock) -> None:
    async with node(tmp_path) as (_server, port):
        c = await connect(port)
        job_id = await c.call("ADDJOB", "q", "x", 0, "RETRY", 300)
        got = await c.call("GETJOB", "NOHANG", "FROM", "q")
        assert got[0][1] == job_id  # type: ignore[index]
        assert await c.call("QLEN", "q") == 0
        await trio.sleep(299)
        assert await c.call("QLEN", "q") == 0
        await trio.sleep(2)  # retry + up to 250 ms of jitter
        assert await c.call("QLEN", "q") == 1
        shown = await c.call("SHOW", job_id)
        assert shown[shown.index(b"additional-deliveries") + 1] == 1  # type: ignore[union-attr,index]


async def test_idle_clients_are_closed_but_blocked_ones_are_not(tmp_path, autojump_clock) -> None:
    """Converted from a subprocess test that slept 2.5 s: `timeout 1` closes an idle client,
    while one blocked in GETJOB is answered at its own timeout."""
    async with node(tmp_path, timeout="60") as (_server, port):
        idle = await connect(port)
        blocked = await connect(port)
        await blocked.stream.send_all(b"GETJOB TIMEOUT 120000 FROM idleq\r\n")
        assert await idle.call("PING") == b"PONG"
        await trio.sleep(61)
        assert isinstance(await idle.reply(), ConnectionError)  # closed by the node
        assert await blocked.reply() is None  # *-1 at its own timeout, 120 s
        assert trio.current_time() >= 120


async def _until(predicate) -> None:
    """Let the node run until ``predicate()`` holds (no fixed sleep: checkpoints only)."""
    with trio.fail_after(10):
        while not predicate():
            await trio.sleep(0.001)


async def test_protocol_error_found_after_an_unblock_closes_only_that_client(
        tmp_path, autojump_clock) -> None:
    """The garbage waits in the buffer behind a blocked GETJOB; it is parsed by the task that
    unblocks the client, which then closes a socket its own task is waiting on."""
    async with node(tmp_path) as (server, port):
        a = await connect(port)
        await a.stream.send_all(b"GETJOB FROM crashq\r\n*x\r\n")
        await _until(lambda: server.broker.blocked_clients == 1)
        producer = await connect(port)
        assert (await producer.call("ADDJOB", "crashq", "body", 0)).startswith(b"D-")  # type: ignore[union-attr]
        got = b""
        while not got.endswith(b"invalid multibulk length\r\n"):
            chunk = await a.stream.receive_some(4096)
            assert chunk, f"closed before the error reply; got {got!r}"
            got += chunk
        assert got.startswith(b"*1\r\n*3\r\n$6\r\ncrashq\r\n")
        assert await a.stream.receive_some(10) == b""  # then closed
        assert await producer.call("PING") == b"PONG"


async def test_a_consumer_that_stops_reading_does_not_hold_up_producers(
        tmp_path, autojump_clock) -> None:
    """The consumer pipelines many GETJOBs and never reads: each job it is handed (1 MB) fills
    its socket. The producer, whose ADDJOBs are what unblock it, must keep getting replies."""
    body = b"x" * (1 << 20)
    async with node(tmp_path) as (server, port):
        slow = trio.socket.socket()
        slow.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
        await slow.connect(("127.0.0.1", port))
        await slow.send(b"GETJOB FROM bigq\r\n" * 50)
        await _until(lambda: server.broker.blocked_clients == 1)
        producer = await connect(port)
        # Mock time: idle moments jump the clock by a timer period, so the bound is generous;
        # before the fix the producer waited forever.
        with trio.fail_after(600):
            for _ in range(30):
                assert (await producer.call("ADDJOB", "bigq", body, 0)).startswith(b"D-")  # type: ignore[union-attr]
        assert await producer.call("PING") == b"PONG"
        slow.close()
