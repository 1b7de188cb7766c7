"""The HTTP API's listener: the message routes served here, every other request by hypercorn.

Theory of operation
-------------------
Hypercorn and Starlette cost 0.5-0.75 ms of the node's CPU per request, against a few tens of
microseconds for the command itself (profiled: Starlette's middleware, routing and responses,
hypercorn's per-request tasks and events, h11, trio's socket calls). The routes a producer or a
consumer calls in a loop are therefore answered here, on the connection's own task, over a
plain non-blocking socket that trio's epoll is asked about only when a read or write cannot
proceed: ``POST``, ``GET`` (without
``?wait=``) and ``DELETE`` of ``/messages/<queue>``, ``/messages/<id>``,
``/mq/<queue>/messages`` and ``/mq/<queue>/messages/<id>``. They call the same ``Api``
methods as the Starlette routes (node/http_api.py), which return an ``Answer``: the same
status, headers and body either way.

Only a request that is plainly simple is served here: HTTP/1.1, its head whole in the buffer,
a ``Host``, no ``Transfer-Encoding``, ``Expect``, ``Upgrade`` or ``Connection`` other than
keep-alive, a ``Content-Length`` whose body is already read, printable ASCII, credentials
that an unrestricted ACL user sends (docs/security.md). Anything else (another route, a long poll, a body still arriving,
an oversized one, a malformed head, a wrong password) hands the connection to hypercorn at
that request boundary, with the bytes already read: hypercorn then serves it as it always did
(its 400, 401, 408, 413 and disconnect handling included), until the connection closes.
"""

from __future__ import annotations

import errno
import logging
import re
import socket
from email.utils import formatdate
from http import HTTPStatus
from math import inf
from time import monotonic, time
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qsl, unquote

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config as HyperConfig
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from starlette.types import ASGIApp

from node.bus_tls import TlsChannel, describe
from node.http_api import Answer, Api, Bridge, HttpError, error_answer, make_app
from node.http_auth import request_user
from node.http_openapi import MAX_WAIT_S

if TYPE_CHECKING:
    from node.server import Server

log = logging.getLogger("trisque.http")

READ_SIZE: Final = 65536
HANDSHAKE_TIMEOUT_S: Final = 10.0
MAX_HEAD: Final = 64 * 1024  # hypercorn's h11_max_incomplete_size, as configured
# A connection handed to hypercorn, after the client's end: it still counts against
# maxclients until it closes, so no longer than the app's tasks need to see the end.
END_GRACE_S: Final = 0.5
_REASONS: Final = {s.value: s.phrase.encode() for s in HTTPStatus}
_ACCEPT_RESOURCE_ERRORS: Final = (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS)
# A control character, or a CR or LF not in a CRLF: hypercorn (h11) answers 400.
_NOT_HEAD: Final = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\r(?!\n)|(?<!\r)\n")
_HANDOVER_HEADERS: Final = frozenset((b"transfer-encoding", b"expect", b"upgrade", b"te"))
# Refused connections read until their client closes, at most this many at once (beyond,
# closed at once: a flood of them must not hold descriptors past maxclients) and this long.
MAX_REFUSING: Final = 16
REFUSE_LINGER_S: Final = 1.0
_FULL_BODY: Final = b'{"error":"max number of clients reached"}'
_FULL: Final = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
                % (len(_FULL_BODY), _FULL_BODY))


class _Handover(Exception):
    """This request is hypercorn's (from the start of its head)."""


class _Prefixed:
    """The connection as hypercorn's TCPServer reads it: the bytes already read, then the
    socket (the stream methods it calls, and ``socket`` for the addresses). A read or write
    that finds the connection broken cancels ``gone`` (see ``Front.serve_connection``)."""

    def __init__(self, stream: trio.SocketStream, data: bytes, gone: trio.CancelScope) -> None:
        self.stream, self.socket, self._data, self.gone = stream, stream.socket, data, gone

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._data:
            data, self._data = self._data, b""
            return data
        try:
            data = bytes(await self.stream.receive_some(max_bytes))
        except trio.BrokenResourceError:
            self.gone.cancel()
            raise
        if not data:
            _ending(self.gone)
        return data

    async def send_all(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except trio.BrokenResourceError:
            self.gone.cancel()
            raise

    async def send_eof(self) -> None:
        # Hypercorn closes from its reading task (the client's end read) while the app's task
        # may be sending the answer: trio's send_eof would hold the stream's send side over a
        # checkpoint, and that send raise BusyResourceError, which hypercorn does not catch.
        # Shut the socket instead: that send fails as a closed connection does.
        await trio.lowlevel.checkpoint()
        sock = self.socket
        if not sock.did_shutdown_SHUT_WR:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError as exc:
                raise trio.BrokenResourceError from exc

    async def aclose(self) -> None:
        await self.stream.aclose()


class _TlsHandover:
    """An HTTPS connection as hypercorn's TCPServer reads a TLS stream: the bytes already
    read, then the records (``_tls_recv``, ``_tls_send``); its handshake is done."""

    def __init__(self, io: _Tls, data: bytes, gone: trio.CancelScope) -> None:
        self.io, self._data, self.gone = io, data, gone
        self.transport_stream = trio.SocketStream(trio.socket.from_stdlib_socket(io.sock))

    async def do_handshake(self) -> None:
        await trio.lowlevel.checkpoint()

    def selected_alpn_protocol(self) -> str | None:
        return self.io.channel.obj.selected_alpn_protocol()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._data:
            data, self._data = self._data, b""
            return data
        try:
            data = await _tls_recv(self.io, False)
        except OSError as exc:  # ssl.SSLError too: as trio's TLS stream says it
            self.gone.cancel()
            raise trio.BrokenResourceError from exc
        if not data:
            _ending(self.gone)
        return data

    async def send_all(self, data: bytes) -> None:
        try:
            await _tls_send(self.io, data)
        except OSError as exc:
            self.gone.cancel()
            raise trio.BrokenResourceError from exc

    async def aclose(self) -> None:
        self.io.close()
        await trio.lowlevel.checkpoint()


def _ending(gone: trio.CancelScope) -> None:
    """The client ended the connection: hypercorn drops the answers still owed (the app is
    told the client left), but its connection waited for its keep-alive timer (30 s) before
    it closed, holding a descriptor and a place in maxclients. Whatever still runs gets
    ``END_GRACE_S``."""
    gone.deadline = min(gone.deadline, trio.current_time() + END_GRACE_S)


class _Plain:
    """A connection's socket, read and written directly (``_recv``, ``_send``, called by the
    loop itself: a method in between cost about 1 us per request)."""

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def close(self) -> None:
        _close(self.sock)

    def hand_over(self, data: bytes, gone: trio.CancelScope) -> _Prefixed | _TlsHandover:
        return _Prefixed(trio.SocketStream(trio.socket.from_stdlib_socket(self.sock)), data,
                         gone)


class _Tls:
    """An HTTPS connection after its handshake (``http-tls``): its socket, read and written
    directly as a plain one is, and its records (``node.bus_tls.TlsChannel``, as the bus's)."""

    __slots__ = ("sock", "channel")

    def __init__(self, sock: socket.socket, channel: TlsChannel) -> None:
        self.sock, self.channel = sock, channel

    def close(self) -> None:
        _close(self.sock)

    def hand_over(self, data: bytes, gone: trio.CancelScope) -> _TlsHandover:
        return _TlsHandover(self, data, gone)


class _Waiting:
    """A connection's cancel scope and when it times out (``Front._close_idle``)."""

    __slots__ = ("scope", "deadline")

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.deadline = inf


class _Date:
    """The Date header, formatted once a second."""

    def __init__(self) -> None:
        self.second = 0
        self.line = b""

    def header(self) -> bytes:
        now = int(time())
        if now != self.second:
            self.second = now
            self.line = b"date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return self.line


def encode_answer(answer: Answer, date: bytes) -> bytes:
    """The response as Starlette renders ``answer`` and hypercorn writes it."""
    status = answer.status
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"")), date]
    if answer.headers:
        for key, value in answer.headers.items():
            lines.append(key.lower().encode("latin-1") + b": " + value.encode("latin-1")
                         + b"\r\n")
    if not (status < 200 or status in (204, 304)):
        lines.append(b"content-length: %d\r\n" % len(answer.body))
    media = answer.media_type
    if media is not None:
        if media.startswith("text/") and "charset=" not in media.lower():
            media += "; charset=utf-8"
        lines.append(b"content-type: " + media.encode("latin-1") + b"\r\n")
    lines.append(b"\r\n")
    lines.append(answer.body)
    return b"".join(lines)


class Front:
    """Accepts the HTTP API's connections (``serve``)."""

    def __init__(self, server: Server, api: Api, app: ASGIApp, hyper: HyperConfig) -> None:
        self.server, self.api, self.hyper = server, api, hyper
        self.config = server.config
        self.app = ASGIWrapper(app)  # type: ignore[arg-type]
        self.context = WorkerContext(None)
        self.date = _Date()
        self.keep_alive_s = float(hyper.keep_alive_timeout)
        self.read_s = float(hyper.read_timeout or inf)
        self.waiting: set[_Waiting] = set()
        self.refusing = 0  # refused connections still read (``_linger``)

    async def serve(self, listeners: list[socket.socket],
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                listener.setblocking(False)
                nursery.start_soon(self._accept, listener, nursery)
            nursery.start_soon(self._close_idle)
            task_status.started()

    async def _accept(self, listener: socket.socket, nursery: trio.Nursery) -> None:
        while True:
            await trio.lowlevel.checkpoint()
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                await trio.lowlevel.wait_readable(listener)
                continue
            except OSError as exc:
                if exc.errno in _ACCEPT_RESOURCE_ERRORS:
                    log.error("HTTP API: cannot accept a connection (%s); retrying", exc)
                    await trio.sleep(0.1)
                continue  # a client gone before its connection was accepted
            sock.setblocking(False)
            server = self.server
            if len(server.connections) + server.http_connections >= self.config.maxclients:
                self._refuse(sock, nursery)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            server.http_connections += 1
            nursery.start_soon(self.connection, sock)

    def _refuse(self, sock: socket.socket, nursery: trio.Nursery) -> None:
        """Past ``maxclients`` (RESP and HTTP connections together): 503 and closed, as a
        RESP client gets its error; an HTTPS client is closed before its handshake."""
        self.server.rejected += 1
        if self.server.http_tls is not None or self.refusing >= MAX_REFUSING:
            _close(sock)
            return
        try:
            sock.send(_FULL)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            _close(sock)
            return
        self.refusing += 1
        nursery.start_soon(self._linger, sock)

    async def _linger(self, sock: socket.socket) -> None:
        """Read what a refused client sends until it closes, for REFUSE_LINGER_S at most: a
        socket closed with the request unread resets the connection, and the client may then
        lose the 503 before reading it."""
        try:
            with trio.move_on_after(REFUSE_LINGER_S):
                while True:
                    try:
                        if not sock.recv(READ_SIZE):
                            break
                    except BlockingIOError:
                        await trio.lowlevel.wait_readable(sock)
                    except OSError:
                        break
        finally:
            self.refusing -= 1
            _close(sock)

    async def _close_idle(self) -> None:
        """Close the connections idle past their deadline (keep-alive, or a head that stalls),
        checked once a second: one timer for all instead of a cancel scope per read."""
        while True:
            await trio.sleep(1)
            now = monotonic()
            for waiting in list(self.waiting):
                if waiting.deadline < now:
                    waiting.scope.cancel()

    async def connection(self, sock: socket.socket) -> None:
        try:
            await self._connection(sock)
        finally:
            self.server.http_connections -= 1

    async def _connection(self, sock: socket.socket) -> None:
        try:
            host, port = sock.getpeername()[:2]
        except OSError:
            sock.close()
            return
        peer = f"http:{host}:{port}"  # as MONITOR shows the client
        tls = self.server.http_tls
        if tls is None:
            await self.serve_connection(_Plain(sock), peer)
            return
        channel = TlsChannel(tls, server_side=True)
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                await channel.handshake(trio.socket.from_stdlib_socket(sock))
        except (OSError, EOFError, trio.TooSlowError) as exc:
            # A client that does not trust the certificate, or speaks plain HTTP.
            log.debug("HTTPS: handshake with %s failed: %s", peer, describe(exc))
            _close(sock)
            return
        except Exception:  # noqa: BLE001 - a bug met by one connection closes that one only
            log.exception("Unexpected error serving an HTTP client at %s", peer)
            _close(sock)
            return
        await self.serve_connection(_Tls(sock, channel), peer)

    async def serve_connection(self, io: _Plain | _Tls, peer: str) -> None:
        """Answer the requests this module serves, then hand the connection to hypercorn."""
        recv: Any
        send: Any
        end: Any
        if isinstance(io, _Plain):
            recv, send, end = _recv, _send, io.sock
        else:
            recv, send, end = _tls_recv, _tls_send, io
        buf = b""
        waiting = _Waiting()
        self.waiting.add(waiting)
        try:
            with waiting.scope:
                while True:
                    out: list[bytes] = []
                    try:
                        while buf:
                            request = self._parse(buf)
                            if request is None:
                                break  # the head is not all here yet
                            (method, *args), used = request
                            try:
                                answer = await method(peer, *args)
                            except HttpError as exc:
                                answer = error_answer(exc)
                            out.append(encode_answer(answer, self.date.header()))
                            buf = buf[used:]
                    except _Handover:
                        break
                    if out:
                        await send(end, b"".join(out) if len(out) > 1 else out[0])
                    waiting.deadline = monotonic() + (self.read_s if buf else self.keep_alive_s)
                    # Just answered: the next request is not here yet, wait for it at once.
                    data = await recv(end, bool(out))
                    waiting.deadline = inf
                    if not data:
                        io.close()
                        return
                    buf += data
            if waiting.scope.cancelled_caught:
                io.close()
                return
            self.waiting.discard(waiting)
            if out:
                await send(end, b"".join(out))
        except (OSError, trio.BrokenResourceError):
            io.close()
            return
        except Exception:  # noqa: BLE001 - a bug met by one connection closes that one only
            log.exception("Unexpected error serving an HTTP client at %s", peer)
            io.close()
            return
        except BaseException:  # cancelled: the node is stopping
            io.close()
            raise
        finally:
            self.waiting.discard(waiting)
        # Hypercorn does not always end a connection whose client is gone (its HTTP/2 side
        # after Upgrade: h2c; its reading task waiting behind pipelined requests for an
        # answer whose write failed): the connection and its tasks stayed for ever. A read
        # or write that finds the connection broken therefore cancels all of it.
        with trio.CancelScope() as gone:
            try:
                await TCPServer(self.app, self.hyper, self.context, ConnectionState({}),
                                io.hand_over(buf, gone))  # type: ignore[arg-type]
            except Exception:  # noqa: BLE001 - a bug met by one connection closes that one only
                log.exception("Unexpected error serving an HTTP client at %s", peer)
        io.close()

    def _parse(self, buf: bytes) -> tuple[Any, int] | None:
        """The first request in ``buf`` as ((``Api`` coroutine method, its arguments after the
        peer), bytes it used); None if its head is incomplete; _Handover if it is not one this
        module serves."""
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD:
                raise _Handover
            return None
        head = buf[:end]
        if not head.isascii() or _NOT_HEAD.search(head) is not None:
            raise _Handover
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or parts[2] != b"HTTP/1.1" or not parts[1].startswith(b"/"):
            raise _Handover
        method, target = parts[0], parts[1]
        length = -1
        has_host = False
        headers: list[tuple[bytes, bytes]] = []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name.replace(b"-", b"").isalnum():
                raise _Handover
            name = name.lower()
            value = value.strip(b" \t")
            if name == b"content-length":
                if length >= 0 or not value.isdigit():
                    raise _Handover
                length = int(value)
            elif name == b"host":
                has_host = True
            elif name in _HANDOVER_HEADERS or name == b"connection" \
                    and value.lower() != b"keep-alive":
                raise _Handover
            headers.append((name, value))
        used = end + 4 + max(length, 0)
        if not has_host or used > len(buf):
            raise _Handover  # no Host (hypercorn's 400), or a body still arriving
        if any(name in (b"origin", b"sec-fetch-site") for name, _ in headers):
            raise _Handover  # a browser's request: the app checks it is not cross-site
        user = request_user(headers, self.server.broker.acl)
        if user is None or user.restricted:
            raise _Handover  # hypercorn's app answers 401, or runs the request as the user
        raw_path, _, raw_query = target.partition(b"?")
        path = unquote(raw_path.decode("ascii"))
        query = (dict(parse_qsl(raw_query.decode("latin-1"), keep_blank_values=True))
                 if raw_query else {})
        body = buf[end + 4:used]
        api = self.api
        if path.startswith("/messages/"):
            target_name = path[len("/messages/"):]
            encoded = target_name.encode("utf-8", "surrogateescape")
            if method == b"POST" and encoded and "after" not in query:
                ctype = _header(headers, b"content-type")
                return (api.publish, encoded, body, ctype, query), used
            if method == b"GET" and encoded and "wait" not in query:
                return (api.receive, encoded, query), used
            if method == b"DELETE":
                return (api.delete_message, encoded, None), used
            raise _Handover
        if path.startswith("/mq/"):
            queue, _, rest = path[len("/mq/"):].partition("/")
            if not queue or not rest.startswith("messages"):
                raise _Handover
            encoded = queue.encode("utf-8", "surrogateescape")
            if rest == "messages":
                if method == b"POST" and "after" not in query:
                    ctype = _header(headers, b"content-type")
                    return (api.publish, encoded, body, ctype, query), used
                if method == b"GET" and "wait" not in query:
                    return (api.receive, encoded, query), used
            elif rest.startswith("messages/") and len(rest) > len("messages/") \
                    and method == b"DELETE":
                job_id = rest[len("messages/"):].encode("utf-8", "surrogateescape")
                return (api.delete_message, job_id, encoded), used
        raise _Handover


def _close(sock: socket.socket) -> None:
    """Close a connection's socket, waking a task that waits on it first: hypercorn closes an
    HTTPS connection (``_TlsHandover.aclose``) from one task while its reading task waits,
    and the descriptor, closed under that wait, once reused by a new connection made the new
    one's first wait fail (trio.BusyResourceError), which took the HTTP API down."""
    if sock.fileno() >= 0:
        trio.lowlevel.notify_closing(sock)
        sock.close()


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return "application/octet-stream"


async def _send(sock: socket.socket, data: bytes) -> None:
    """Write ``data``, waiting for the socket only when it is full."""
    while True:
        try:
            sent = sock.send(data)
        except BlockingIOError:
            sent = 0
        if sent == len(data):
            return
        data = data[sent:]
        await trio.lowlevel.wait_writable(sock)


async def _recv(sock: socket.socket, wait_first: bool) -> bytes:
    """What the client sent next (b"" at its end): trio's epoll is asked only when nothing is
    there yet (its socket methods would add two trips through the scheduler to every call);
    a read that finds data at once still takes a checkpoint, so a client that keeps its
    socket full cannot hold the node."""
    try:
        if wait_first:
            raise BlockingIOError
        data = sock.recv(READ_SIZE)
    except BlockingIOError:
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                return sock.recv(READ_SIZE)
            except BlockingIOError:
                continue  # woken for nothing
    await trio.lowlevel.checkpoint()
    return data


async def _tls_recv(io: _Tls, wait_first: bool) -> bytes:
    """``_recv`` over TLS: the plaintext of the next whole records (b"" at the end). First
    what the last read (or the handshake's) left in the channel."""
    channel = io.channel
    plain = channel.decrypt(b"")
    while not plain and not channel.eof:
        data = await _recv(io.sock, wait_first)
        if not data:
            return b""
        plain = channel.decrypt(data)
        wait_first = True  # a record cut by the read: the rest is not there yet
    return plain


async def _tls_send(io: _Tls, data: bytes) -> None:
    """``_send`` over TLS: ``data`` as records, after whatever TLS itself had to answer."""
    channel = io.channel
    channel.encrypt(data)
    records, channel.pending = channel.pending, b""
    await _send(io.sock, records)


async def serve(server: Server, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Run the HTTP API on ``http-port`` at the client listeners' addresses until cancelled:
    ``Front`` accepts the connections and hands hypercorn what it does not serve."""
    cfg = server.config
    hosts = [h for h, _ in server.listening] or ["127.0.0.1"]
    hyper = HyperConfig()
    hyper.accesslog = None
    hyper.errorlog = log
    hyper.include_server_header = False
    hyper.h11_max_incomplete_size = 64 * 1024
    hyper.keep_alive_timeout = 30
    # A client that stalls mid-request (headers) is dropped; long polls keep the connection
    # quiet for up to MAX_WAIT_S, so the limit is above that.
    hyper.read_timeout = MAX_WAIT_S + 30
    hyper.bind = [f"[{h}]:{cfg.http_port}" if ":" in h else f"{h}:{cfg.http_port}"
                  for h in dict.fromkeys(hosts)]
    listeners = hyper.create_sockets().insecure_sockets  # bound as hypercorn binds them
    for sock in listeners:
        sock.listen(hyper.backlog)
    api = Api(Bridge(server))
    front = Front(server, api, make_app(server, api), hyper)
    await front.serve(listeners, task_status=task_status)
