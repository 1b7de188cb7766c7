"""maxclients counts the HTTP API's connections with the RESP clients: both hold a descriptor,
so a flood of HTTP connections cannot take every descriptor from RESP clients (or the other
way round). Past it an HTTP client gets 503 and the connection is closed."""

from __future__ import annotations

import socket
import time

import httpx

from client.blocking import Connection
from protocol.resp import encode_command
from tests.http.conftest import start


def _rejected(resp: Connection) -> int:
    """INFO's count, on the one RESP connection the test holds (a new one would be refused)."""
    [text] = resp.exchange(encode_command("INFO", "stats"), 1, 5)
    assert isinstance(text, bytes), text
    return int(text.decode().split("rejected_connections:")[1].split("\r\n")[0])


def _get(base: str) -> httpx.Response:
    return httpx.get(base + "/queues", timeout=5, headers={"connection": "close"})


def _raw_request(port: int) -> bytes:
    """One request on a new connection; everything the node sent until it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /queues HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_http_connections_count_against_maxclients() -> None:
    srv, base = start(maxclients=3)
    port = int(base.rsplit(":", 1)[1])
    try:
        resp = Connection(("127.0.0.1", srv.port), 5)  # 1 RESP client
        assert resp.exchange(encode_command("PING"), 1, 5) == [b"PONG"]
        # Two kept-alive HTTP connections make three clients.
        # (start's own probe may hold its place for a moment after it ended: END_GRACE_S)
        kept = [httpx.Client(base_url=base, timeout=5) for _ in range(2)]
        deadline = time.monotonic() + 5
        for client in kept:
            while (status := client.get("/queues").status_code) == 503:
                assert time.monotonic() < deadline, "an ended HTTP connection kept its place"
                time.sleep(0.05)
            assert status == 200
        rejected = _rejected(resp)
        answer = _raw_request(port)
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert b"max number of clients reached" in answer and b"retry-after: 1" in answer
        # And a RESP client is refused while the HTTP connections hold their places.
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as late:
            assert late.recv(100) == b"-ERR max number of clients reached\r\n"
        assert _rejected(resp) == rejected + 2
        # A place freed by an HTTP client is taken by the next one.
        kept.pop().close()
        deadline = time.monotonic() + 10
        while _raw_request(port).startswith(b"HTTP/1.1 503 "):
            assert time.monotonic() < deadline, "the closed HTTP connection was never counted out"
            time.sleep(0.05)
        assert _get(base).status_code == 200
        for client in kept:
            client.close()
        resp.close()
        assert srv.audit() == []
    finally:
        srv.stop()
