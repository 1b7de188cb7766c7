"""HTTP requests run their commands through the node's one command path, as RESP's do: they
show in INFO commandstats and to MONITOR clients (with the HTTP client's address), the
dashboard's buttons included, and CLIENT PAUSE holds them; the HTTP front serves keep-alive and
pipelined requests and hands what it does not serve (another route, a wrong password) to the
general server on the same connection."""

from __future__ import annotations

import re
import socket
import time
from urllib.parse import quote

import httpx

from protocol.resp import NEED_DATA
from tests.aof.test_server_durability import Conn
from tests.http.conftest import start
from tests.support.server import ServerProcess

Node = tuple[ServerProcess, str]


def calls(conn: Conn, command: str) -> int:
    info = conn.call("INFO", "commandstats").decode()
    found = re.search(rf"^cmdstat_{command}:calls=(\d+),", info, re.MULTILINE)
    return int(found.group(1)) if found else 0


def next_line(monitor: Conn) -> str:
    while True:
        reply = monitor.reader.next()
        if reply is not NEED_DATA:
            return bytes(reply).decode()
        data = monitor.sock.recv(65536)
        assert data, "the monitor's connection closed"
        monitor.reader.feed(data)


def monitor_lines(monitor: Conn, until: str) -> list[str]:
    lines = []
    while not lines or until not in lines[-1]:
        lines.append(next_line(monitor))
    return lines


def raw_requests(port: int, *requests: bytes) -> bytes:
    """Send ``requests`` at once on one keep-alive connection; what came back once the last
    response (a JSON object) is complete."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"".join(requests))
        data = b""
        while data.count(b"HTTP/1.1 ") < len(requests) or not data.endswith(b"}"):
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
    return data


def test_http_commands_show_in_commandstats_and_monitor(node: Node, http: httpx.Client) -> None:
    conn = Conn(node[0].port)
    monitor = Conn(node[0].port)
    assert monitor.call("MONITOR") == b"OK"
    assert http.put("/queues/cp", json={}).status_code == 201
    before = {c: calls(conn, c) for c in ("addjob", "getjob", "ackjob")}
    r = http.post("/messages/cp", content=b"over-http")
    assert r.status_code == 201
    job_id = r.headers["x-message-id"]
    assert http.get("/messages/cp").content == b"over-http"
    assert http.delete("/messages/" + quote(job_id, safe="")).status_code == 204
    after = {c: calls(conn, c) for c in ("addjob", "getjob", "ackjob")}
    assert {c: after[c] - before[c] for c in after} == {"addjob": 1, "getjob": 1, "ackjob": 1}

    conn.call("ADDJOB", "cp", "over-resp", 0)
    lines = monitor_lines(monitor, '"over-resp"')
    http_add = next(line for line in lines if '"over-http"' in line)
    http_get = next(line for line in lines if '"GETJOB"' in line)
    resp_add = lines[-1]
    # Redis's format, with the HTTP client's address where a RESP client's would be.
    shape = r'^\d+\.\d{6} \[0 (\S+)\] "ADDJOB" "cp" "over-(http|resp)" "\d+"'
    http_match, resp_match = re.match(shape, http_add), re.match(shape, resp_add)
    assert http_match and resp_match, (http_add, resp_add)
    assert re.fullmatch(r"http:127\.0\.0\.1:\d+", http_match.group(1)), http_add
    assert re.fullmatch(r"127\.0\.0\.1:\d+", resp_match.group(1)), resp_add
    assert re.match(r'^\d+\.\d{6} \[0 http:127\.0\.0\.1:\d+\] "GETJOB" "NOHANG" "COUNT" "1" '
                    r'"WITHCOUNTERS" "FROM" "cp"$', http_get), http_get
    monitor.close()
    conn.close()


def test_dashboard_buttons_show_in_commandstats(node: Node, http: httpx.Client) -> None:
    conn = Conn(node[0].port)
    assert http.put("/queues/btn", json={}).status_code == 201
    job_id = http.post("/messages/btn", content=b"x").headers["x-message-id"]
    acks, policies = calls(conn, "ackjob"), calls(conn, "qpolicy")
    # The Delete button's request, and the Redrive button's.
    assert http.delete("/messages/" + quote(job_id, safe="")).status_code == 204
    assert http.post("/queues/btn/redrive").json() == {"moved": 0}
    assert calls(conn, "ackjob") == acks + 1
    assert calls(conn, "qpolicy") >= policies + 1
    conn.close()


def test_pipelined_keep_alive_requests_are_answered_in_order(node: Node,
                                                             http: httpx.Client) -> None:
    port = int(node[1].rsplit(":", 1)[1])
    assert http.put("/queues/pipe", json={}).status_code == 201
    post = b"POST /messages/pipe HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\n"
    get = b"GET /messages/pipe HTTP/1.1\r\nHost: t\r\n\r\n"
    data = raw_requests(port, post + b"one", post + b"two", get, get, get,
                        b"GET /queues/pipe HTTP/1.1\r\nHost: t\r\n\r\n")
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", data)
    # The last request, not a message route, is answered by the general server after the
    # others, on the same connection.
    assert statuses == [b"201", b"201", b"200", b"200", b"204", b"200"], data
    assert data.index(b"\r\n\r\none") < data.index(b"\r\n\r\ntwo")
    assert b'"name":"pipe"' in data


def test_client_pause_holds_http_requests(node: Node, http: httpx.Client) -> None:
    conn = Conn(node[0].port)
    assert http.put("/queues/held", json={}).status_code == 201
    assert conn.call("CLIENT", "PAUSE", 1000) == b"OK"
    started = time.monotonic()
    assert http.post("/messages/held", content=b"x").status_code == 201
    assert 0.5 <= time.monotonic() - started < 5  # held until the pause ended
    conn.close()


def test_message_routes_need_the_password() -> None:
    srv, base = start(requirepass="s3cret")
    port = int(base.rsplit(":", 1)[1])
    try:
        with httpx.Client(base_url=base, timeout=5) as c:
            assert c.put("/queues/locked", json={}, auth=("any", "s3cret")).status_code == 201
            for auth in (None, ("any", "wrong")):
                assert c.post("/messages/locked", content=b"x", auth=auth).status_code == 401
                assert c.get("/messages/locked", auth=auth).status_code == 401
        post = (b"POST /messages/locked HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer %s\r\n"
                b"Content-Length: 1\r\n\r\nx")
        data = raw_requests(port, post % b"nope", post % b"s3cret")
        assert re.findall(rb"HTTP/1\.1 (\d{3}) ", data) == [b"401", b"201"], data
    finally:
        srv.stop()
