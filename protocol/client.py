"""The trisque client library: the blocking flavour, and the names every user imports.

Theory of operation
-------------------
``Client`` sends prepared ``Call`` objects (``protocol.client_commands``) over plain sockets:

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

``protocol.aio_client.AsyncClient`` is the same API for trio.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from protocol import client_commands as cmd
from protocol.client_commands import Body, Job, JobInfo, PipelineCalls, QueueStats
from protocol.client_core import (
    DEFAULT_PORT,
    Address,
    AuthError,
    BadIdError,
    Call,
    Hello,
    LeavingError,
    MaxLenError,
    NodeInfo,
    NodeSelector,
    NoJobError,
    NoReplicationError,
    PausedError,
    ProducerTracker,
    ResponseError,
    TrisqueConnectionError,
    TrisqueError,
    TrisqueTimeoutError,
    error_from_reply,
    parse_hello,
    read_timeout,
)
from protocol.resp import NEED_DATA, Error, ProtocolError, ReplyReader

__all__ = [
    "Client", "Pipeline", "Job", "JobInfo", "QueueStats", "Hello", "NodeInfo", "TrisqueError",
    "ResponseError", "NoReplicationError", "PausedError", "LeavingError", "BadIdError",
    "NoJobError", "MaxLenError", "AuthError", "TrisqueConnectionError", "TrisqueTimeoutError",
    "DEFAULT_PORT",
]

# Connection problems worth moving to another node for. socket.timeout is TimeoutError.
_NET_ERRORS = (OSError, ProtocolError)


class Connection:
    """One socket to one node and its reply reader."""

    def __init__(self, address: Address, connect_timeout: float | None) -> None:
        self.address = address
        self.sock = socket.create_connection(address, timeout=connect_timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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
            self.sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return False
        except OSError:
            return True
        return True

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Client:
    """A blocking trisque client, safe to share between threads.

    ``nodes``: seed addresses (``"host:port"`` strings or pairs); a random reachable one is
    used, then the best priority node HELLO tells about.
    """

    def __init__(
        self,
        nodes: Sequence[str | Address] | str = ("127.0.0.1:7711",),
        *,
        password: str | None = None,
        socket_timeout: float | None = 5.0,
        connect_timeout: float | None = 2.0,
        max_idle: int = 8,
        cluster_aware: bool = True,
        rebalance_consumers: bool = False,
        rebalance_window: int = 64,
    ) -> None:
        self.selector = NodeSelector([nodes] if isinstance(nodes, str) else nodes)
        self.password = password
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self.cluster_aware = cluster_aware
        self.rebalance_consumers = rebalance_consumers
        self.tracker = ProducerTracker(window=rebalance_window,
                                       min_samples=max(1, rebalance_window // 4))
        self.hello_reply: Hello | None = None
        self._lock = threading.Lock()
        self._idle: list[Connection] = []
        self._closed = False

    # -- connections ---------------------------------------------------------------------

    @property
    def address(self) -> Address | None:
        """The node commands currently go to."""
        return self.selector.current

    def _open(self, address: Address) -> Connection:
        conn = Connection(address, self.connect_timeout)
        try:
            if self.password is not None:
                (reply,) = conn.exchange(cmd.auth(self.password).payload, 1, self.socket_timeout)
                if isinstance(reply, Error):
                    raise AuthError(str(reply))
        except BaseException:
            conn.close()
            raise
        return conn

    def _connect_new_node(self) -> Connection:
        """Try the candidates in order; HELLO on the first that answers (may move once)."""
        errors: list[str] = []
        for address in self.selector.candidates():
            try:
                conn = self._open(address)
            except (OSError, ProtocolError) as exc:
                self.selector.mark_failed(address)
                errors.append(f"{address[0]}:{address[1]}: {_reason(exc)}")
                continue
            self.selector.connected(address)
            if not self.cluster_aware:
                return conn
            try:
                (reply,) = conn.exchange(cmd.hello().payload, 1, self.socket_timeout)
                hello = parse_hello(reply, address[0])
            except _NET_ERRORS as exc:
                conn.close()
                self.selector.mark_failed(address)
                errors.append(f"{address[0]}:{address[1]}: {_reason(exc)}")
                continue
            except (ResponseError, ValueError, TypeError, IndexError):
                return conn  # not a node that speaks HELLO our way: use it as it is
            self.hello_reply = hello
            better = self.selector.learn(hello, address)
            if better is not None:
                try:
                    moved = self._open(better)
                except (OSError, ProtocolError):
                    self.selector.mark_failed(better)
                    self.selector.connected(address)
                    return conn
                conn.close()
                self.selector.connected(better)
                self.selector.current_id = next(
                    (n.id for n in hello.nodes if n.address == better), None)
                return moved
            return conn
        raise TrisqueConnectionError("no trisque node reachable (" + "; ".join(errors) + ")")

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
                return self._open(self.selector.current)
            return self._connect_new_node()

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
        for attempt in (0, 1):
            try:
                conn = self._acquire()
            except OSError as exc:
                # Covers the node we were using dying between two commands.
                if self.selector.current is not None:
                    self._forget_node(self.selector.current)
                    if attempt == 0:
                        continue
                raise _connection_error(exc) from exc
            try:
                (reply,) = conn.exchange(call.payload, 1, read_timeout(call, self.socket_timeout))
            except _NET_ERRORS as exc:
                conn.close()
                if isinstance(exc, TimeoutError):
                    raise TrisqueTimeoutError(
                        f"no reply to {call.name} within the timeout") from exc
                self._forget_node(conn.address)
                if attempt == 0 and call.retry_safe:
                    continue
                raise _connection_error(exc) from exc
            self._release(conn)
            if isinstance(reply, Error):
                error = error_from_reply(reply)
                if isinstance(error, LeavingError) and attempt == 0:
                    self._forget_node(conn.address, leaving=True)
                    continue
                raise error
            result = call.convert(reply)
            if call.delivers_jobs and self.rebalance_consumers and result:
                self._maybe_rebalance(result)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _maybe_rebalance(self, jobs: list[Job]) -> None:
        self.tracker.observe(j.id for j in jobs)
        prefix = self.tracker.dominant(self.selector.current_id)
        if prefix is None:
            return
        target = self.selector.address_of_prefix(prefix)
        if target is None or target == self.selector.current:
            return
        with self._lock:
            self.selector.preferred = target
            self.selector.current = None  # next command connects, preferred first
            for conn in self._idle:
                conn.close()
            self._idle.clear()
        self.tracker.reset()

    def run_many(self, calls: list[Call[Any]], raise_on_error: bool = True) -> list[Any]:
        """Send several calls in one write; results in order (see ``Pipeline``)."""
        if not calls:
            return []
        payload = b"".join(c.payload for c in calls)
        waits = [read_timeout(c, self.socket_timeout) for c in calls]
        timeout = None if any(w is None for w in waits) else max(w for w in waits if w is not None)
        safe = all(c.retry_safe for c in calls)
        for attempt in (0, 1):
            conn = self._acquire()
            try:
                replies = conn.exchange(payload, len(calls), timeout)
            except _NET_ERRORS as exc:
                conn.close()
                if isinstance(exc, TimeoutError):
                    raise TrisqueTimeoutError("no reply to the pipeline within the timeout") from exc
                self._forget_node(conn.address)
                if attempt == 0 and safe:
                    continue
                raise _connection_error(exc) from exc
            self._release(conn)
            return cmd.pipeline_results(calls, replies, raise_on_error)
        raise AssertionError("unreachable")  # pragma: no cover

    def pipeline(self) -> Pipeline:
        return Pipeline(self)

    # -- commands ------------------------------------------------------------------------

    def add_job(self, queue: str, body: Body, *, replicate: int | None = None,
                delay: int | None = None, retry: int | None = None, ttl: int | None = None,
                maxlen: int | None = None, async_: bool = False, timeout_ms: int = 0) -> str:
        result: str = self.run(cmd.add_job(
            queue, body, replicate=replicate, delay=delay, retry=retry, ttl=ttl,
            maxlen=maxlen, async_=async_, timeout_ms=timeout_ms))
        return result

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


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _connection_error(exc: BaseException) -> TrisqueConnectionError:
    if isinstance(exc, TrisqueConnectionError):
        return exc
    return TrisqueConnectionError(_reason(exc))
