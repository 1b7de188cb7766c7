"""The trisque client library: the blocking flavour, and the names every user imports.

Theory of operation
-------------------
``Client`` sends prepared ``Call`` objects (``client.commands``) over plain sockets:

* A connection pool per client: a thread takes an idle connection to the current node (or
  opens one), sends, reads the reply, and puts it back. A connection whose exchange failed or
  timed out is closed, never reused: its stream may hold half a reply.
* The first connection to a node sends AUTH (when a password is given) and HELLO. HELLO
  teaches the ``NodeSelector`` every node and its priority; when the node we reached is not
  among the best, the client moves to a best one.
* On a broken connection or a ``-LEAVING`` reply the node is marked failed, the pool is
  emptied, and the command is sent once more to the next candidate when that is safe
  (``Call.retry_safe``, or any command after LEAVING, which proves nothing was applied).
* With ``rebalance_consumers=True`` the IDs of the jobs GETJOB returns feed a
  ``ProducerTracker``; when one other node produces most of them, the next command goes there.

The rules themselves (connect, AUTH, HELLO, failover, rebalancing) are plans in
``client.plans``, shared with ``client.aio.AsyncClient`` (the same API for
trio); this module performs their requests with blocking sockets.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from client import commands as cmd
from client.commands import Body, Job, JobInfo, PipelineCalls, QueueStats
from client.core import (
    DEFAULT_PORT,
    Address,
    AuthError,
    BadIdError,
    Call,
    Hello,
    LeavingError,
    MaxLenError,
    NodeInfo,
    NoJobError,
    NoReplicationError,
    PausedError,
    ResponseError,
    TrisqueConnectionError,
    TrisqueError,
    TrisqueTimeoutError,
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

__all__ = [
    "Client", "Pipeline", "Job", "JobInfo", "QueueStats", "Hello", "NodeInfo", "TrisqueError",
    "ResponseError", "NoReplicationError", "PausedError", "LeavingError", "BadIdError",
    "NoJobError", "MaxLenError", "AuthError", "TrisqueConnectionError", "TrisqueTimeoutError",
    "DEFAULT_PORT",
]

# Connection problems worth moving to another node for. socket.timeout is TimeoutError.
_NET_ERRORS: tuple[type[BaseException], ...] = (OSError, ProtocolError)


class Connection:
    """One socket to one node and its reply reader."""

    def __init__(self, address: Address, connect_timeout: float | None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.address = address
        sock = socket.create_connection(address, timeout=connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            try:
                sock = tls.wrap_socket(sock, server_hostname=address[0])
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self.reader = ReplyReader()

    def exchange(self, payload: bytes, count: int, timeout: float | None) -> list[Any]:
        """Send ``payload`` and read ``count`` replies (error replies as ``resp.Error``)."""
        self.sock.settimeout(timeout)
        self.sock.sendall(payload)
        replies: list[Any] = []
        while len(replies) < count:
            reply = self.reader.next()
            if reply is NEED_DATA:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionResetError("connection closed by the node")
                self.reader.feed(data)
            else:
                replies.append(reply)
        return replies

    def is_stale(self) -> bool:
        """An idle connection with something to read has been closed (or spoken to) by the
        node: reusing it would make a command look sent when the node never read it."""
        try:
            self.sock.settimeout(0)  # with a timeout, recv would first wait for data
            if isinstance(self.sock, ssl.SSLSocket):
                # No peeking through TLS: a record that is not data (a session ticket) is
                # consumed and is no sign; data or the end is.
                self.sock.recv(1)
            else:
                self.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, ssl.SSLWantReadError):
            return False
        except OSError:
            return True
        return True

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Client(ClientSettings):
    """A blocking trisque client, safe to share between threads.

    ``nodes``: seed addresses (``"host:port"`` strings or pairs); a random reachable one is
    used, then the best priority node HELLO tells about.
    """

    net_errors = _NET_ERRORS  # acquire_errors: OSError only (ClientSettings)

    def _init_pool(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[Connection] = []
        self._closed = False

    # -- connections ---------------------------------------------------------------------

    def _drive(self, plan: Plan) -> Any:
        """Run a plan of client.plans, performing its requests with sockets."""
        try:
            request = next(plan)
            while True:
                try:
                    result = self._perform(request)
                except BaseException as exc:
                    request = plan.throw(exc)
                else:
                    request = plan.send(result)
        except StopIteration as stop:
            return stop.value

    def _perform(self, request: Request) -> Any:
        t = type(request)
        if t is Exchange:
            conn, payload, count, timeout = request  # type: ignore[misc]
            return conn.exchange(payload, count, timeout)
        if t is Acquire:
            return self._acquire()
        if t is Release:
            return self._release(request.conn)  # type: ignore[union-attr]
        if t is Open:
            return Connection(request.address, self.connect_timeout,  # type: ignore[union-attr]
                              self.tls)
        if t is Close:
            return request.conn.close()  # type: ignore[union-attr]
        if t is Forget:
            return self._forget_node(request.address, request.leaving)  # type: ignore[union-attr]
        if t is Retarget:
            return self._retarget(request.address)  # type: ignore[union-attr]
        raise AssertionError(f"unknown request {request!r}")

    def _acquire(self) -> Connection:
        with self._lock:
            if self._closed:
                raise TrisqueConnectionError("client is closed")
            if self.selector.current is not None:
                while self._idle:
                    conn = self._idle.pop()
                    if conn.address == self.selector.current and not conn.is_stale():
                        return conn
                    conn.close()
                return self._drive(open_plan(self, self.selector.current))  # type: ignore[no-any-return]
            return self._drive(connect_plan(self))  # type: ignore[no-any-return]

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A connection to the current node (AUTH and HELLO done) for callers that drive the
        socket themselves, e.g. the Spark bulk loader streaming pipelined ADDJOBs. Back to the
        pool afterwards; closed instead if the block raised (its stream may hold half a reply)."""
        conn = self._acquire()
        try:
            yield conn
        except BaseException:
            conn.close()
            raise
        self._release(conn)

    def _release(self, conn: Connection) -> None:
        with self._lock:
            if (not self._closed and conn.address == self.selector.current
                    and len(self._idle) < self.max_idle):
                self._idle.append(conn)
                return
        conn.close()

    def _forget_node(self, address: Address, leaving: bool = False) -> None:
        with self._lock:
            if leaving:
                self.selector.mark_leaving(address)
            else:
                self.selector.mark_failed(address)
            for conn in self._idle:
                conn.close()
            self._idle.clear()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for conn in self._idle:
                conn.close()
            self._idle.clear()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop ------------------------------------------------------------------------

    def run(self, call: Call[Any]) -> Any:
        """Send one prepared call, with the failover rules of the module docstring."""
        return self._drive(run_plan(self, call))

    def run_many(self, calls: list[Call[Any]], raise_on_error: bool = True) -> list[Any]:
        """Send several calls in one write; results in order (see ``Pipeline``)."""
        return self._drive(run_many_plan(self, calls, raise_on_error))  # type: ignore[no-any-return]

    def _retarget(self, address: Address) -> None:
        with self._lock:
            self.selector.preferred = address
            self.selector.current = None  # next command connects, preferred first
            for conn in self._idle:
                conn.close()
            self._idle.clear()

    def pipeline(self) -> Pipeline:
        return Pipeline(self)

    # -- commands ------------------------------------------------------------------------

    def add_job(self, queue: str, body: Body, *, replicate: int | None = None,
                delay: int | None = None, retry: int | None = None, ttl: int | None = None,
                maxlen: int | None = None, async_: bool = False, timeout_ms: int = 0,
                priority: int | None = None, after: Iterable[str] = ()) -> str:
        result: str = self.run(cmd.add_job(
            queue, body, replicate=replicate, delay=delay, retry=retry, ttl=ttl,
            maxlen=maxlen, async_=async_, timeout_ms=timeout_ms, priority=priority,
            after=after))
        return result

    def resolve(self, job_id: str, result: Body) -> int:
        return int(self.run(cmd.resolve(job_id, result)))

    def wait_job(self, job_id: str, *, timeout_ms: int | None = None) -> bytes | None:
        value: bytes | None = self.run(cmd.wait_job(job_id, timeout_ms=timeout_ms))
        return value

    def get_job(self, *queues: str, count: int = 1, timeout_ms: int | None = None,
                nohang: bool = False, with_counters: bool = False) -> list[Job]:
        result: list[Job] = self.run(cmd.get_job(*queues, count=count, timeout_ms=timeout_ms,
                                                 nohang=nohang, with_counters=with_counters))
        return result

    def ack_job(self, *ids: str) -> int:
        return int(self.run(cmd.ack_job(*ids)))

    def fast_ack(self, *ids: str) -> int:
        return int(self.run(cmd.fast_ack(*ids)))

    def nack(self, *ids: str) -> int:
        return int(self.run(cmd.nack(*ids)))

    def working(self, job_id: str) -> int:
        return int(self.run(cmd.working(job_id)))

    def enqueue(self, *ids: str) -> int:
        return int(self.run(cmd.enqueue(*ids)))

    def dequeue(self, *ids: str) -> int:
        return int(self.run(cmd.dequeue(*ids)))

    def del_job(self, *ids: str) -> int:
        return int(self.run(cmd.del_job(*ids)))

    def show(self, job_id: str) -> JobInfo | None:
        result: JobInfo | None = self.run(cmd.show(job_id))
        return result

    def qlen(self, queue: str) -> int:
        return int(self.run(cmd.qlen(queue)))

    def qstat(self, queue: str) -> QueueStats | None:
        result: QueueStats | None = self.run(cmd.qstat(queue))
        return result

    def qpolicy_set(self, queue: str, *, backoff: tuple[int, int] | None = None,
                      max_inflight: int | None = None,
                      rate: int | None = None) -> dict[str, Any]:
        """QPOLICY SET with backoff, max_inflight, rate (see client.commands.qpolicy_set)."""
        result: dict[str, Any] = self.run(cmd.qpolicy_set(
            queue, backoff=backoff, max_inflight=max_inflight, rate=rate))
        return result

    def qpeek(self, queue: str, count: int) -> list[Job]:
        result: list[Job] = self.run(cmd.qpeek(queue, count))
        return result

    def qscan(self, *, count: int | None = None, busyloop: bool = False,
              minlen: int | None = None, maxlen: int | None = None,
              importrate: int | None = None) -> Iterator[str]:
        """Every queue name, following the cursor to its end (a name may come twice)."""
        cursor = "0"
        while True:
            cursor, names = self.run(cmd.qscan_page(cursor, count=count, busyloop=busyloop,
                                                    minlen=minlen, maxlen=maxlen,
                                                    importrate=importrate))
            yield from names
            if cursor == "0":
                return

    def jscan(self, *, count: int | None = None, busyloop: bool = False,
              queue: str | None = None, states: Iterable[str] = ()) -> Iterator[str]:
        """Every job ID (optionally of one queue / in some states), following the cursor."""
        cursor, states = "0", list(states)
        while True:
            cursor, ids = self.run(cmd.jscan_page(cursor, count=count, busyloop=busyloop,
                                                  queue=queue, states=states))
            yield from ids
            if cursor == "0":
                return

    def jscan_jobs(self, *, count: int | None = None, busyloop: bool = False,
                   queue: str | None = None, states: Iterable[str] = ()) -> Iterator[JobInfo]:
        """Like ``jscan`` with ``REPLY all``: the full description of every job."""
        cursor, states = "0", list(states)
        while True:
            cursor, infos = self.run(cmd.jscan_jobs_page(cursor, count=count, busyloop=busyloop,
                                                         queue=queue, states=states))
            yield from infos
            if cursor == "0":
                return

    def pause(self, queue: str, option: str = "state", *, bcast: bool = False) -> str:
        return str(self.run(cmd.pause(queue, option, bcast=bcast)))

    def hello(self) -> Hello:
        result: Hello = self.run(cmd.hello())
        return result

    def info(self, section: str | None = None) -> dict[str, str | int | float]:
        result: dict[str, str | int | float] = self.run(cmd.info(section))
        return result

    def ping(self) -> str:
        return str(self.run(cmd.ping()))

    def config_get(self, pattern: str) -> dict[str, str]:
        result: dict[str, str] = self.run(cmd.config_get(pattern))
        return result

    def config_set(self, name: str, value: str | int) -> None:
        self.run(cmd.config_set(name, value))

    def cluster_leaving(self, flag: bool | None = None) -> str:
        return str(self.run(cmd.cluster_leaving(flag)))

    def execute(self, *args: bytes | str | int) -> Any:
        """Any command; its raw reply (bulk and status both ``bytes``). Errors raise."""
        return self.run(cmd.execute(*args))


class Pipeline(PipelineCalls):
    """``with client.pipeline() as p: p.add_job(...); p.qlen(...)``, then ``p.execute()``:
    every call goes in one write, the results come back in order. With
    ``raise_on_error=False`` an error reply is returned in place as its exception."""

    def __init__(self, client: Client) -> None:
        super().__init__()
        self._client = client

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        calls, self.calls = self.calls, []
        return self._client.run_many(calls, raise_on_error)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.calls = []
