"""The same ACL users over HTTP (node/http_api.py): Basic user:password, what RESP allows."""

from __future__ import annotations

import socket
import time

import httpx
import redis

from tests.http.conftest import start, wait_http
from tests.support.dashboard import page_token


def test_http_runs_each_request_as_its_acl_user() -> None:
    srv, base = start()
    try:
        r = redis.Redis(port=srv.port)
        r.execute_command("ACL", "SETUSER", "producer", "on", ">p1", "~orders:*", "+@jobs")
        r.execute_command("ACL", "SETUSER", "reader", "on", ">r1", "~*", "+@read")
        with httpx.Client(base_url=base, timeout=5) as c:
            # No password anywhere yet for the default user: anonymous requests still work.
            for q in ("open", "orders:eu", "secret"):
                assert c.put(f"/queues/{q}", json={}).status_code == 201
            assert c.post("/messages/open", content=b"x").status_code in (200, 201)
            p = ("producer", "p1")
            assert c.post("/messages/orders:eu", content=b"a", auth=p).status_code in (200, 201)
            denied = c.post("/messages/secret", content=b"a", auth=p)
            assert denied.status_code == 403 and "NOPERM" in denied.text
            assert c.post("/messages/orders:eu", content=b"a",
                          auth=("producer", "bad")).status_code == 401
            read = c.post("/messages/orders:eu", content=b"a", auth=("reader", "r1"))
            assert read.status_code == 403 and "has no permissions" in read.text
            # requirepass: anonymous is refused, Bearer and Basic with any name work as before.
            r.execute_command("CONFIG", "SET", "requirepass", "s3cret")
            assert c.get("/queues").status_code == 401
            assert c.get("/queues", headers={"authorization": "Bearer s3cret"}).status_code == 200
            assert c.get("/queues", auth=("any", "s3cret")).status_code == 200
            assert c.post("/messages/orders:eu", content=b"b", auth=p).status_code in (200, 201)
    finally:
        srv.stop()


def test_state_changing_requests_from_another_site_are_refused() -> None:
    srv, base = start()
    try:
        with httpx.Client(base_url=base, timeout=5) as c:
            assert c.put("/queues/dlq", json={}).status_code == 201
            host = base.partition("://")[2]
            evil = {"origin": "https://evil.example"}
            assert c.post("/queues/dlq/redrive", json={}, headers=evil).status_code == 403
            assert c.post("/messages/dlq", content=b"x", headers=evil).status_code == 403
            assert c.post("/messages/dlq", content=b"x",
                          headers={"sec-fetch-site": "cross-site"}).status_code == 403
            same = {"origin": f"http://{host}", "sec-fetch-site": "same-origin"}
            # A browser's own page must also carry the token its dashboard page holds.
            refused = c.post("/messages/dlq", content=b"x", headers=same)
            assert refused.status_code == 403 and "CSRF token" in refused.text
            token = page_token(c.get("/").text)
            ok = c.post("/messages/dlq", content=b"x", headers={**same, "x-csrf-token": token})
            assert ok.status_code in (200, 201)
            assert c.get("/queues", headers=evil).status_code == 200  # reads are not refused
            assert c.post("/messages/dlq", content=b"x").status_code in (200, 201)  # not a browser
    finally:
        srv.stop()


def test_a_refusal_keeps_the_connection_when_the_body_comes_late() -> None:
    """A refused request whose body arrives after its head: the node reads the body before
    the 403, so the next request on the same connection is answered too (hypercorn closes
    a connection whose answer ended before the request's body was read)."""
    srv, base = start()
    host = base.partition("://")[2]
    head = (f"POST /queues/dlq/redrive HTTP/1.1\r\nHost: {host}\r\n"
            "Origin: https://evil.example\r\nContent-Length: 2\r\n\r\n").encode()
    try:
        with socket.create_connection(("127.0.0.1", int(host.rpartition(":")[2])),
                                      timeout=5) as sock:
            sock.sendall(head)
            time.sleep(0.3)  # the head is served before the body is sent
            sock.sendall(b"{}")
            first = _response(sock)
            assert first.startswith(b"HTTP/1.1 403"), first
            sock.sendall(f"GET /queues HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            second = _response(sock)
            assert second.startswith(b"HTTP/1.1 200"), second
    finally:
        srv.stop()


def _response(sock: socket.socket) -> bytes:
    """One whole response (head and a Content-Length body) read from ``sock``; what came
    before the peer closed if it closed first."""
    buf = b""
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            for line in buf[:end].split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    if len(buf) >= end + 4 + int(line.split(b":")[1]):
                        return buf
        data = sock.recv(65536)
        if not data:
            return buf
        buf += data


def test_a_csrf_token_is_the_users_own() -> None:
    """A token from one user's dashboard page does not carry another user's request, nor
    does a made-up one; a restarted node refuses the old page's token."""
    srv, base = start()
    try:
        r = redis.Redis(port=srv.port)
        r.execute_command("ACL", "SETUSER", "ops", "on", ">o1", "~*", "+@all")
        r.execute_command("ACL", "SETUSER", "dev", "on", ">d1", "~*", "+@all")
        browser = {"sec-fetch-site": "same-origin"}
        with httpx.Client(base_url=base, timeout=5) as c:
            assert c.put("/queues/q", json={}).status_code == 201
            ops_token = page_token(c.get("/", auth=("ops", "o1")).text)
            dev_token = page_token(c.get("/", auth=("dev", "d1")).text)
            assert len(ops_token) == 64 and ops_token != dev_token
            for token in (dev_token, "0" * 64, ""):
                assert c.post("/messages/q", content=b"x", auth=("ops", "o1"),
                              headers={**browser, "x-csrf-token": token}).status_code == 403
            assert c.post("/messages/q", content=b"x", auth=("ops", "o1"),
                          headers={**browser, "x-csrf-token": ops_token}).status_code in (200, 201)
        srv.stop()
        srv.start()
        # Users without an aclfile do not survive a restart: the same user again.
        redis.Redis(port=srv.port).execute_command("ACL", "SETUSER", "ops", "on", ">o1", "~*",
                                                   "+@all")
        wait_http(srv, base)
        with httpx.Client(base_url=base, timeout=5) as c:
            assert c.post("/messages/q", content=b"x", auth=("ops", "o1"),
                          headers={**browser, "x-csrf-token": ops_token}).status_code == 403
    finally:
        srv.stop()


def test_the_dashboard_shows_a_user_only_the_queues_they_may_use() -> None:
    srv, base = start()
    try:
        r = redis.Redis(port=srv.port)
        r.execute_command("ACL", "SETUSER", "eu", "on", ">e1", "~orders:eu*", "+@all")
        mine = r.execute_command("ADDJOB", "orders:eu", "visible body", 0).decode()
        theirs = r.execute_command("ADDJOB", "payroll", "secret body", 0).decode()
        with httpx.Client(base_url=base, timeout=5) as c:
            everyone = c.get("/").text  # the default user: every queue
            assert "orders:eu" in everyone and "payroll" in everyone
            page = c.get("/", auth=("eu", "e1")).text
            assert "orders:eu" in page and "payroll" not in page
            assert c.get(f"/jobs/{mine}", auth=("eu", "e1")).status_code == 200
            for path in (f"/jobs/{theirs}", f"/jobs/{theirs}/log"):
                denied = c.get(path, auth=("eu", "e1"))
                assert denied.status_code == 404 and "secret body" not in denied.text
            assert "secret body" in c.get(f"/jobs/{theirs}").text
    finally:
        srv.stop()
