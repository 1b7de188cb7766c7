"""Input checks on a real node (``*01`` among them): an error reply never carries a CR or
LF from the client (a forged reply), every CONFIG SET value is checked against its range before
it is applied, and a multibulk count with a leading zero is refused as Redis refuses it."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from protocol.resp import encode_command
from tests.e2e.rawclient import RawConnection
from tests.e2e.test_startup import run_server
from tests.support.server import ServerProcess, free_port


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    with ServerProcess() as server:
        yield server


def _exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` then PING; return every byte received up to and including the PONG."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data + encode_command("PING"))
        got = b""
        while not got.endswith(b"+PONG\r\n"):
            chunk = sock.recv(65536)
            assert chunk, f"closed after {got!r}"
            got += chunk
    return got


@pytest.mark.parametrize("argv", [
    (b"foo\r\n:1",),
    (b"CONFIG", b"GET\r\n+OK"),
    (b"CONFIG", b"SET", b"maxclients", b"x\r\n:1"),
    (b"CLIENT", b"BOGUS\r\n:1"),
    (b"DEBUG", b"x\n:7"),
    (b"HELLO", b"9\r\n:1"),
])
def test_an_error_never_carries_the_clients_line_breaks(srv: ServerProcess, argv) -> None:
    got = _exchange(srv.port, encode_command(*argv))
    # Exactly two replies: one error line, then the PONG. A forged ":1" would be a third.
    lines = got.split(b"\r\n")
    assert lines[0].startswith(b"-") and lines[1:] == [b"+PONG", b""], got
    assert b"\n" not in lines[0] and b"\r" not in lines[0]


@pytest.mark.parametrize("name, value", [
    ("tcp-keepalive", "2147483648"), ("tcp-keepalive", "40000"), ("maxclients", "0"),
    ("maxclients", "-1"), ("timeout", "99999999999999999999"), ("maxmemory", "-1"),
    ("maxmemory", "99999999999gb"), ("auto-aof-rewrite-percentage", "1e3"),
    ("cluster-node-timeout", "0"),
])
def test_config_set_out_of_range_is_refused_and_changes_nothing(
        srv: ServerProcess, name: str, value: str) -> None:
    with RawConnection(srv.port) as c:
        before = c.call("CONFIG", "GET", name)
        assert c.call("CONFIG", "SET", name, value) == (
            "-", f"ERR Invalid argument '{value}' for CONFIG SET '{name}'")
        assert c.call("CONFIG", "GET", name) == before
    # New connections are still served (before the fix, both values cut every new client off).
    with RawConnection(srv.port) as c:
        assert c.call("PING") == ("+", "PONG")


def test_config_set_in_range_still_works(srv: ServerProcess) -> None:
    with RawConnection(srv.port) as c:
        assert c.call("CONFIG", "SET", "tcp-keepalive", "300") == ("+", "OK")
        assert c.call("CONFIG", "GET", "tcp-keepalive") == [b"tcp-keepalive", b"300"]
        assert c.call("CONFIG", "SET", "tcp-keepalive", "0") == ("+", "OK")
    with RawConnection(srv.port) as c:
        assert c.call("PING") == ("+", "PONG")


def test_out_of_range_directive_stops_the_start(tmp_path) -> None:
    proc = run_server("--port", str(free_port()), "--bind", "127.0.0.1", "--dir", str(tmp_path),
                      "--maxclients", "0")
    assert proc.returncode != 0
    assert "maxclients" in proc.stdout + proc.stderr
    assert "between 1 and" in proc.stdout + proc.stderr


@pytest.mark.parametrize("count", [b"*01", b"*00", b"*-0", b"*+1"])
def test_multibulk_count_with_a_leading_zero_or_sign_is_refused(srv: ServerProcess,
                                                                count: bytes) -> None:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
        sock.sendall(count + b"\r\n$4\r\nPING\r\n")
        got = b""
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            got += chunk
    assert got == b"-ERR Protocol error: invalid multibulk length\r\n"
