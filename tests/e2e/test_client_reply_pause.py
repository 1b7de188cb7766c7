"""CLIENT REPLY and CLIENT PAUSE against the reference Disque's recorded bytes (the fixture's
"CLIENT REPLY and PAUSE on one connection, raw bytes"), and PAUSE's timing as recorded."""

from __future__ import annotations

import socket
import time

from tests.e2e.reference import load_section
from tests.support.server import ServerProcess

EXCHANGES = load_section("CLIENT REPLY and PAUSE on one connection, raw bytes")


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, data
        data += chunk
    return data


def _quiet(sock: socket.socket, seconds: float) -> bytes:
    """Whatever arrives within ``seconds`` (b'' when the node says nothing)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(65536)
    except TimeoutError:
        return b""
    finally:
        sock.settimeout(10)


def test_replies_byte_for_byte_as_the_reference() -> None:
    """A silenced reply would show up ahead of the next command's: each command's bytes are
    read exactly, and nothing may be left at the end."""
    with ServerProcess() as srv, socket.create_connection(("127.0.0.1", srv.port), 10) as sock:
        for exchange in EXCHANGES:
            sock.sendall(" ".join(exchange.argv).encode() + b"\r\n")
            got = _read(sock, len(exchange.expected))
            assert got == exchange.expected, str(exchange)
        assert _quiet(sock, 0.3) == b""


def test_pause_holds_every_client_until_its_time() -> None:
    with ServerProcess() as srv, \
            socket.create_connection(("127.0.0.1", srv.port), 10) as own, \
            socket.create_connection(("127.0.0.1", srv.port), 10) as other:
        start = time.monotonic()
        own.sendall(b"CLIENT PAUSE 700\r\nPING\r\n")
        assert _read(own, 5) == b"+OK\r\n"
        assert time.monotonic() - start < 0.5
        other.sendall(b"PING\r\n")
        assert _quiet(other, 0.3) == b""  # held, not refused
        assert _read(other, 7) == b"+PONG\r\n"
        assert _read(own, 7) == b"+PONG\r\n"
        assert 0.65 <= time.monotonic() - start < 3
        # A second pause sent behind the first runs when it ends, and pauses again.
        start = time.monotonic()
        own.sendall(b"CLIENT PAUSE 300\r\nCLIENT PAUSE 300\r\n")
        assert _read(own, 5) == b"+OK\r\n"
        other.sendall(b"PING\r\n")
        assert _read(other, 7) == b"+PONG\r\n"
        assert 0.55 <= time.monotonic() - start < 3
        assert _read(own, 5) == b"+OK\r\n"


def test_reply_off_silences_a_blocked_getjob_too() -> None:
    with ServerProcess() as srv, socket.create_connection(("127.0.0.1", srv.port), 10) as sock:
        sock.sendall(b"CLIENT REPLY OFF\r\nGETJOB TIMEOUT 200 FROM nothing\r\n")
        assert _quiet(sock, 0.6) == b""  # the timeout passed, its null array not sent
        sock.sendall(b"ADDJOB q x 0\r\nCLIENT REPLY ON\r\nQLEN q\r\n")
        assert _read(sock, 9) == b"+OK\r\n:1\r\n"
