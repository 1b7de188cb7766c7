"""Connections the HTTP API must close whatever the client does (found by tools/fuzz_http.py):
a client that asked hypercorn for HTTP/2 (``Upgrade: h2c``) and reset the connection left
the answer to its request waiting for HTTP/2 flow control forever, and the connection with
it; so did, now and then, a reset connection with pipelined requests; and an HTTPS
connection the client ended stayed open for hypercorn's keep-alive timer."""

from __future__ import annotations

import os
import socket
import ssl
import struct
import time
from collections.abc import Iterator

import pytest

from tests.http.conftest import start, wait_http
from tests.support.certs import make_certs
from tests.support.server import ServerProcess, free_port
from tools.fuzz_tls import TlsClient


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[ServerProcess, int]]:
    srv, base = start()
    try:
        yield srv, int(base.rsplit(":", 1)[1])
    finally:
        srv.stop()


def _sockets(srv: ServerProcess) -> set[str]:
    assert srv.proc is not None
    found = set()
    for fd in os.listdir(f"/proc/{srv.proc.pid}/fd"):
        try:
            target = os.readlink(f"/proc/{srv.proc.pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:"):
            found.add(target)
    return found


def _reset_after(port: int, data: bytes) -> None:
    """Send ``data`` on a new connection, then reset it (SO_LINGER 0: RST, not FIN)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        time.sleep(0.2)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _wait_closed(srv: ServerProcess, before: set[str], seconds: float) -> set[str]:
    deadline = time.monotonic() + seconds
    while True:
        left = _sockets(srv) - before
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_a_reset_h2c_upgrade_is_closed(node: tuple[ServerProcess, int]) -> None:
    srv, port = node
    before = _sockets(srv)
    _reset_after(port, b"GET /queues HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\n\r\n")
    # Hypercorn's keep-alive timer (30 s) does not run while a request is under way.
    assert _wait_closed(srv, before, 8) == set()
    assert srv.call("PING") == b"PONG"


@pytest.fixture(scope="module")
def https(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, int,
                                                                      ssl.SSLContext]]:
    certs = make_certs(tmp_path_factory.mktemp("certs"), nodes=1)
    port = free_port()
    srv = ServerProcess(http_port=port, http_tls="yes", tls_cert_file=str(certs.nodes[0][0]),
                        tls_key_file=str(certs.nodes[0][1])).start()
    context = ssl.create_default_context(cafile=str(certs.ca_cert))
    try:
        wait_http(srv, f"https://127.0.0.1:{port}", context)
        yield srv, port, context
    finally:
        srv.stop()


def test_an_https_connection_the_client_ends_while_idle_is_closed(
        https: tuple[ServerProcess, int, ssl.SSLContext]) -> None:
    srv, port, context = https
    before = _sockets(srv)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.setblocking(False)
        tls = TlsClient(s, context)
        assert tls.handshake()
        s.setblocking(True)
        s.sendall(tls.seal(b"GET /queues HTTP/1.1\r\nHost: a\r\n\r\n"))  # kept alive
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += tls.open(s.recv(65536))
        assert answer.startswith(b"HTTP/1.1 200 ")
        time.sleep(0.3)  # idle
        s.sendall(tls.close_notify())
    # Hypercorn's keep-alive timer (30 s) held the connection open after the client's end.
    assert _wait_closed(srv, before, 8) == set()
