"""The client's connect, authenticate, HELLO, failover and rebalance rules, once, without I/O.

Theory of operation
-------------------
Each rule is a *plan*: a generator that yields requests for I/O (``Open``, ``Exchange``,
``Close``) or for the flavour's connection pool (``Acquire``, ``Release``, ``Forget``,
``Retarget``), receives each result back (``send``) or the exception it raised (``throw``),
and finally returns its value. ``client.blocking.Client`` drives plans with blocking sockets,
``client.aio.AsyncClient`` with trio: the flavours only perform requests, so the
rules (which errors move to another node, when a command may be sent again, how HELLO picks
the node) cannot drift apart. A flavour tells plans which exceptions are network failures
(``Rules.net_errors``), since trio has its own.
"""

from __future__ import annotations

import ssl
from collections.abc import Generator, Sequence
from typing import Any, NamedTuple, Protocol

from client import commands as cmd
from client.commands import Job
from client.core import (
    Address,
    AuthError,
    Call,
    Hello,
    LeavingError,
    NodeSelector,
    ProducerTracker,
    ResponseError,
    TrisqueConnectionError,
    TrisqueTimeoutError,
    error_from_reply,
    parse_hello,
    read_timeout,
)
from client.tls import TlsOptions, client_tls
from protocol.resp import Error


class Open(NamedTuple):
    """Connect to ``address``; the result is a connection with an ``address`` attribute."""

    address: Address


class Exchange(NamedTuple):
    """Send ``payload`` on ``conn`` and read ``n_replies`` replies within ``timeout``."""

    conn: Any
    payload: bytes
    n_replies: int
    timeout: float | None


class Close(NamedTuple):
    conn: Any


class Acquire(NamedTuple):
    """A connection to the current node from the pool (connecting to a new node if none)."""


class Release(NamedTuple):
    conn: Any


class Forget(NamedTuple):
    """The node failed (or is leaving): mark it and empty the pool."""

    address: Address
    leaving: bool = False


class Retarget(NamedTuple):
    """Send the next commands to ``address``: prefer it, drop the current node and the pool."""

    address: Address


Request = Open | Exchange | Close | Acquire | Release | Forget | Retarget
Plan = Generator[Request, Any, Any]


class Rules(Protocol):
    """What plans read of a client (both flavours have these attributes)."""

    selector: NodeSelector
    tracker: ProducerTracker
    password: str | None
    socket_timeout: float | None
    tls: ssl.SSLContext | None
    cluster_aware: bool
    rebalance_consumers: bool
    hello_reply: Hello | None
    net_errors: tuple[type[BaseException], ...]
    acquire_errors: tuple[type[BaseException], ...]


class ClientSettings:
    """The options and the rule state both flavours share (their constructor arguments)."""

    net_errors: tuple[type[BaseException], ...] = (OSError,)
    acquire_errors: tuple[type[BaseException], ...] = (OSError,)

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
        tls: bool | ssl.SSLContext | TlsOptions | None = None,
    ) -> None:
        self.selector = NodeSelector([nodes] if isinstance(nodes, str) else nodes)
        self.password = password
        # TLS to the nodes' tls-port: a context, or client.tls.TlsOptions (redis-cli's
        # options), or True (the system's CAs, no client certificate).
        self.tls = client_tls(tls)
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self.cluster_aware = cluster_aware
        self.rebalance_consumers = rebalance_consumers
        self.tracker = ProducerTracker(window=rebalance_window,
                                       min_samples=max(1, rebalance_window // 4))
        self.hello_reply: Hello | None = None
        self._init_pool()

    def _init_pool(self) -> None:
        """The flavour's own state: its connection pool and locks."""

    @property
    def address(self) -> Address | None:
        """The node commands currently go to."""
        return self.selector.current


def open_plan(client: Rules, address: Address) -> Plan:
    """Connect and, when a password is given, AUTH."""
    conn = yield Open(address)
    try:
        if client.password is not None:
            (reply,) = yield Exchange(conn, cmd.auth(client.password).payload, 1,
                                      client.socket_timeout)
            if isinstance(reply, Error):
                raise AuthError(str(reply))
    except BaseException:
        yield Close(conn)
        raise
    return conn


def connect_plan(client: Rules) -> Plan:
    """Try the candidates in order; HELLO on the first that answers, and move once to a
    better node if HELLO names one."""
    selector = client.selector
    errors: list[str] = []
    for address in selector.candidates():
        try:
            conn = yield from open_plan(client, address)
        except client.net_errors as exc:
            selector.mark_failed(address)
            errors.append(f"{address[0]}:{address[1]}: {reason(exc)}")
            continue
        selector.connected(address)
        if not client.cluster_aware:
            return conn
        try:
            (reply,) = yield Exchange(conn, cmd.hello().payload, 1, client.socket_timeout)
            hello = parse_hello(reply, address[0])
        except client.net_errors as exc:
            yield Close(conn)
            selector.mark_failed(address)
            errors.append(f"{address[0]}:{address[1]}: {reason(exc)}")
            continue
        except (ResponseError, ValueError, TypeError, IndexError):
            return conn  # not a node that speaks HELLO our way: use it as it is
        client.hello_reply = hello
        better = selector.learn(hello, address)
        if better is None:
            return conn
        try:
            moved = yield from open_plan(client, better)
        except client.net_errors:
            selector.mark_failed(better)
            selector.connected(address)
            return conn
        yield Close(conn)
        selector.connected(better)
        selector.current_id = next((n.id for n in hello.nodes if n.address == better), None)
        return moved
    raise TrisqueConnectionError("no trisque node reachable (" + "; ".join(errors) + ")")


def acquire_plan(client: Rules, attempt: int) -> Plan:
    """A connection for a call or a pipeline; None means "try again": the node in use died
    between two commands, it is forgotten and the next acquire connects elsewhere. Nothing
    was sent yet, so this failover is safe for every command."""
    try:
        conn = yield Acquire()
    except client.acquire_errors as exc:
        if client.selector.current is not None:
            yield Forget(client.selector.current)
            if attempt == 0:
                return None
        raise connection_error(exc) from exc
    return conn


def run_plan(client: Rules, call: Call[Any]) -> Plan:
    """One call with the failover rules of ``client.blocking``'s docstring."""
    for attempt in (0, 1):
        conn = yield from acquire_plan(client, attempt)
        if conn is None:
            continue
        try:
            (reply,) = yield Exchange(conn, call.payload, 1,
                                      read_timeout(call, client.socket_timeout))
        except BaseException as exc:
            yield Close(conn)
            if isinstance(exc, TimeoutError):
                raise TrisqueTimeoutError(f"no reply to {call.name} within the timeout") from exc
            if not isinstance(exc, client.net_errors):
                raise  # cancelled, or a bug: the connection is gone, the error is the caller's
            yield Forget(conn.address)
            if attempt == 0 and call.retry_safe:
                continue
            raise connection_error(exc) from exc
        yield Release(conn)
        if isinstance(reply, Error):
            error = error_from_reply(reply)
            if isinstance(error, LeavingError) and attempt == 0:
                yield Forget(conn.address, leaving=True)
                continue
            raise error
        result = call.convert(reply)
        if call.delivers_jobs and client.rebalance_consumers and result:
            yield from rebalance_plan(client, result)
        return result
    raise AssertionError("unreachable")  # pragma: no cover


def run_many_plan(client: Rules, calls: list[Call[Any]], raise_on_error: bool) -> Plan:
    """Several calls in one write; results in order. Sent again only if every call is safe."""
    if not calls:
        return []
    payload = b"".join(c.payload for c in calls)
    waits = [read_timeout(c, client.socket_timeout) for c in calls]
    timeout = None if any(w is None for w in waits) else max(w for w in waits if w is not None)
    safe = all(c.retry_safe for c in calls)
    for attempt in (0, 1):
        conn = yield from acquire_plan(client, attempt)
        if conn is None:
            continue
        try:
            replies = yield Exchange(conn, payload, len(calls), timeout)
        except BaseException as exc:
            yield Close(conn)
            if isinstance(exc, TimeoutError):
                raise TrisqueTimeoutError("no reply to the pipeline within the timeout") from exc
            if not isinstance(exc, client.net_errors):
                raise
            yield Forget(conn.address)
            if attempt == 0 and safe:
                continue
            raise connection_error(exc) from exc
        yield Release(conn)
        return cmd.pipeline_results(calls, replies, raise_on_error)
    raise AssertionError("unreachable")  # pragma: no cover


def rebalance_plan(client: Rules, jobs: list[Job]) -> Plan:
    """When one other node produces most of the jobs we get, move there."""
    client.tracker.observe(j.id for j in jobs)
    prefix = client.tracker.dominant(client.selector.current_id)
    if prefix is None:
        return None
    target = client.selector.address_of_prefix(prefix)
    if target is None or target == client.selector.current:
        return None
    yield Retarget(target)
    client.tracker.reset()
    return None


def reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def connection_error(exc: BaseException) -> TrisqueConnectionError:
    if isinstance(exc, TrisqueConnectionError):
        return exc
    return TrisqueConnectionError(reason(exc))
