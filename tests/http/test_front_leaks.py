"""Connections the HTTP API must close whatever the client does (found by tools/fuzz_http.py):
a client that asked hypercorn for HTTP/2 (``Upgrade: h2c``) and reset the connection left
the answer to its request waiting for HTTP/2 flow control forever, and the connection with
it; so did, now and then, a reset connection with pipelined requests."""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator

import pytest

from tests.http.conftest import start
from tests.support.server import ServerProcess


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
