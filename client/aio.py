"""The trio flavour of the trisque client: the same API as ``client.blocking.Client``, awaited.

Theory of operation
-------------------
Everything but the byte moving is shared with the blocking client: commands are the same
prepared ``Call`` objects (``client.commands``), and connecting, AUTH, HELLO, failover
and rebalancing are the plans of ``client.plans``, which this module drives. It only
opens trio TCP streams, keeps idle ones in a small pool (tasks of one trio run may share the
client; each exchange holds its own connection, so replies never interleave), and applies the
timeouts with ``trio.fail_after``. A connection whose exchange failed or was cancelled is
closed, never reused: its stream may hold half a reply.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import AsyncIterator, Iterable
from typing import Any

import trio

from client import commands as cmd
from client.commands import Body, Job, JobInfo, PipelineCalls, QueueStats
from client.core import (
    Address,
    Call,
    Hello,
    TrisqueConnectionError,
)
from client.plans import (
    Acquire,
    ClientSettings,
    Close,
    Exchange,
    Forget,
    Open,
    Plan,
    Release,
    Request,
    Retarget,
    connect_plan,
    open_plan,
    run_many_plan,
    run_plan,
)
from protocol.resp import NEED_DATA, ProtocolError, ReplyReader

__all__ = ["AsyncClient", "AsyncPipeline"]

_NET_ERRORS: tuple[type[BaseException], ...] = (
    OSError, trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError)


def _limit(timeout: float | None) -> float:
    return math.inf if timeout is None else timeout


class AsyncConnection:
    """One trio stream to one node and its reply reader."""

    def __init__(self, address: Address, stream: trio.abc.Stream,
                 tcp: trio.SocketStream) -> None:
        self.address = address
        self.stream = stream  # the TCP stream, or TLS over it
        self.tcp = tcp
        self.reader = ReplyReader()

    @classmethod
    async def open(cls, address: Address, connect_timeout: float | None,
                   tls: ssl.SSLContext | None = None) -> AsyncConnection:
        try:
            with trio.fail_after(_limit(connect_timeout)):
                tcp = await trio.open_tcp_stream(address[0], address[1])
                stream: trio.abc.Stream = tcp
                if tls is not None:
                    secure = trio.SSLStream(tcp, tls, server_hostname=address[0])
                    try:
                        await secure.do_handshake()
                    except BaseException:
                        await trio.aclose_forcefully(tcp)
                        raise
                    stream = secure
        except trio.TooSlowError:
            raise TimeoutError(f"connect to {address[0]}:{address[1]} timed out") from None
        except trio.BrokenResourceError as exc:  # a refused handshake
            raise ConnectionResetError(f"TLS handshake with {address[0]}:{address[1]} "
                                       f"failed: {exc.__cause__ or exc}") from None
        return cls(address, stream, tcp)

    async def exchange(self, payload: bytes, count: int, timeout: float | None) -> list[Any]:
        replies: list[Any] = []
        try:
            with trio.fail_after(_limit(timeout)):
                await self.stream.send_all(payload)
                while len(replies) < count:
                    reply = self.reader.next()
                    if reply is NEED_DATA:
                        data = await self.stream.receive_some(1 << 16)
                        if not data:
                            raise ConnectionResetError("connection closed by the node")
                        self.reader.feed(bytes(data))
                    else:
                        replies.append(reply)
        except trio.TooSlowError:
            raise TimeoutError("no reply within the timeout") from None
        return replies

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.stream.aclose()


class AsyncClient(ClientSettings):
    """A trio trisque client; the arguments are those of ``client.blocking.Client``."""

    net_errors = _NET_ERRORS
    acquire_errors = _NET_ERRORS

    def _init_pool(self) -> None:
        self._idle: list[AsyncConnection] = []
        self._connecting = trio.Lock()  # one task at a time chooses a new node
        self._closed = False

    # -- connections ---------------------------------------------------------------------

    async def _drive(self, plan: Plan) -> Any:
        """Run a plan of client.plans, performing its requests with trio."""
        try:
            request = next(plan)
            while True:
                try:
                    result = await self._perform(request)
                except BaseException as exc:
                    request = plan.throw(exc)
                else:
                    request = plan.send(result)
        except StopIteration as stop:
            return stop.value

    async def _perform(self, request: Request) -> Any:
        t = type(request)
        if t is Exchange:
            conn, payload, count, timeout = request  # type: ignore[misc]
            return await conn.exchange(payload, count, timeout)
        if t is Acquire:
            return await self._acquire()
        if t is Release:
            return await self._release(request.conn)  # type: ignore[union-attr]
        if t is Open:
            return await AsyncConnection.open(request.address,  # type: ignore[union-attr]
                                              self.connect_timeout, self.tls)
        if t is Close:
            return await request.conn.aclose()  # type: ignore[union-attr]
        if t is Forget:
            return await self._forget_node(request.address, request.leaving)  # type: ignore[union-attr]
        if t is Retarget:
            return await self._retarget(request.address)  # type: ignore[union-attr]
        raise AssertionError(f"unknown request {request!r}")

    async def _acquire(self) -> AsyncConnection:
        if self._closed:
            raise TrisqueConnectionError("client is closed")
        while self._idle and self.selector.current is not None:
            conn = self._idle.pop()
            # A readable idle connection was closed by the node (see Connection.is_stale).
            if conn.address == self.selector.current and not conn.tcp.socket.is_readable():
                return conn
            await conn.aclose()
        if self.selector.current is not None:
            return await self._drive(open_plan(self, self.selector.current))  # type: ignore[no-any-return]
        async with self._connecting:
            if self.selector.current is not None:
                return await self._drive(open_plan(self, self.selector.current))
            return await self._drive(connect_plan(self))  # type: ignore[no-any-return]

    async def _release(self, conn: AsyncConnection) -> None:
        if (not self._closed and conn.address == self.selector.current
                and len(self._idle) < self.max_idle):
            self._idle.append(conn)
        else:
            await conn.aclose()

    async def _forget_node(self, address: Address, leaving: bool = False) -> None:
        if leaving:
            self.selector.mark_leaving(address)
        else:
            self.selector.mark_failed(address)
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.aclose()

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the loop ------------------------------------------------------------------------

    async def run(self, call: Call[Any]) -> Any:
        """Send one prepared call, with the failover rules of ``client.blocking``."""
        return await self._drive(run_plan(self, call))

    async def run_many(self, calls: list[Call[Any]], raise_on_error: bool = True) -> list[Any]:
        return await self._drive(run_many_plan(self, calls, raise_on_error))  # type: ignore[no-any-return]

    async def _retarget(self, address: Address) -> None:
        self.selector.preferred = address
        self.selector.current = None
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.aclose()

    def pipeline(self) -> AsyncPipeline:
        return AsyncPipeline(self)

    # -- commands ------------------------------------------------------------------------

    async def add_job(self, queue: str, body: Body, *, replicate: int | None = None,
                delay: int | None = None, retry: int | None = None, ttl: int | None = None,
                maxlen: int | None = None, async_: bool = False, timeout_ms: int = 0,
                priority: int | None = None, after: Iterable[str] = ()) -> str:
        result: str = await self.run(cmd.add_job(
            queue, body, replicate=replicate, delay=delay, retry=retry, ttl=ttl,
            maxlen=maxlen, async_=async_, timeout_ms=timeout_ms, priority=priority,
            after=after))
        return result

    async def resolve(self, job_id: str, result: Body) -> int:
        return int(await self.run(cmd.resolve(job_id, result)))

    async def wait_job(self, job_id: str, *, timeout_ms: int | None = None) -> bytes | None:
        value: bytes | None = await self.run(cmd.wait_job(job_id, timeout_ms=timeout_ms))
        return value

    async def get_job(self, *queues: str, count: int = 1, timeout_ms: int | None = None,
                nohang: bool = False, with_counters: bool = False) -> list[Job]:
        result: list[Job] = await self.run(cmd.get_job(*queues, count=count, timeout_ms=timeout_ms,
                                                 nohang=nohang, with_counters=with_counters))
        return result

    async def ack_job(self, *ids: str) -> int:
        return int(await self.run(cmd.ack_job(*ids)))

    async def fast_ack(self, *ids: str) -> int:
        return int(await self.run(cmd.fast_ack(*ids)))

    async def nack(self, *ids: str) -> int:
        return int(await self.run(cmd.nack(*ids)))

    async def working(self, job_id: str) -> int:
        return int(await self.run(cmd.working(job_id)))

    async def enqueue(self, *ids: str) -> int:
        return int(await self.run(cmd.enqueue(*ids)))

    async def dequeue(self, *ids: str) -> int:
        return int(await self.run(cmd.dequeue(*ids)))

    async def del_job(self, *ids: str) -> int:
        return int(await self.run(cmd.del_job(*ids)))

    async def show(self, job_id: str) -> JobInfo | None:
        result: JobInfo | None = await self.run(cmd.show(job_id))
        return result

    async def qlen(self, queue: str) -> int:
        return int(await self.run(cmd.qlen(queue)))

    async def qstat(self, queue: str) -> QueueStats | None:
        result: QueueStats | None = await self.run(cmd.qstat(queue))
        return result

    async def qpolicy_set(self, queue: str, *, backoff: tuple[int, int] | None = None,
                      max_inflight: int | None = None,
                      rate: int | None = None) -> dict[str, Any]:
        """QPOLICY SET with backoff, max_inflight, rate (see client.commands.qpolicy_set)."""
        result: dict[str, Any] = await self.run(cmd.qpolicy_set(
            queue, backoff=backoff, max_inflight=max_inflight, rate=rate))
        return result

    async def qpeek(self, queue: str, count: int) -> list[Job]:
        result: list[Job] = await self.run(cmd.qpeek(queue, count))
        return result

    async def qscan(self, *, count: int | None = None, busyloop: bool = False,
              minlen: int | None = None, maxlen: int | None = None,
              importrate: int | None = None) -> AsyncIterator[str]:
        """Every queue name, following the cursor to its end (a name may come twice)."""
        cursor = "0"
        while True:
            cursor, names = await self.run(cmd.qscan_page(cursor, count=count, busyloop=busyloop,
                                                    minlen=minlen, maxlen=maxlen,
                                                    importrate=importrate))
            for name in names:
                yield name
            if cursor == "0":
                return

    async def jscan(self, *, count: int | None = None, busyloop: bool = False,
              queue: str | None = None, states: Iterable[str] = ()) -> AsyncIterator[str]:
        """Every job ID (optionally of one queue / in some states), following the cursor."""
        cursor, states = "0", list(states)
        while True:
            cursor, ids = await self.run(cmd.jscan_page(cursor, count=count, busyloop=busyloop,
                                                  queue=queue, states=states))
            for job_id in ids:
                yield job_id
            if cursor == "0":
                return

    async def jscan_jobs(self, *, count: int | None = None, busyloop: bool = False,
                   queue: str | None = None, states: Iterable[str] = ()) -> AsyncIterator[JobInfo]:
        """Like ``jscan`` with ``REPLY all``: the full description of every job."""
        cursor, states = "0", list(states)
        while True:
            cursor, infos = await self.run(cmd.jscan_jobs_page(cursor, count=count, busyloop=busyloop,
                                                         queue=queue, states=states))
            for job_info in infos:
                yield job_info
            if cursor == "0":
                return

    async def pause(self, queue: str, option: str = "state", *, bcast: bool = False) -> str:
        return str(await self.run(cmd.pause(queue, option, bcast=bcast)))

    async def hello(self) -> Hello:
        result: Hello = await self.run(cmd.hello())
        return result

    async def info(self, section: str | None = None) -> dict[str, str | int | float]:
        result: dict[str, str | int | float] = await self.run(cmd.info(section))
        return result

    async def ping(self) -> str:
        return str(await self.run(cmd.ping()))

    async def config_get(self, pattern: str) -> dict[str, str]:
        result: dict[str, str] = await self.run(cmd.config_get(pattern))
        return result

    async def config_set(self, name: str, value: str | int) -> None:
        await self.run(cmd.config_set(name, value))

    async def cluster_leaving(self, flag: bool | None = None) -> str:
        return str(await self.run(cmd.cluster_leaving(flag)))

    async def execute(self, *args: bytes | str | int) -> Any:
        """Any command; its raw reply (bulk and status both ``bytes``). Errors raise."""
        return await self.run(cmd.execute(*args))



class AsyncPipeline(PipelineCalls):
    """Collects calls like ``client.blocking.Pipeline``; ``await p.execute()`` sends them."""

    def __init__(self, client: AsyncClient) -> None:
        super().__init__()
        self._client = client

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        calls, self.calls = self.calls, []
        return await self._client.run_many(calls, raise_on_error)
