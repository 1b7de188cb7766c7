"""The same ACL users over HTTP (node/http_api.py): Basic user:password, what RESP allows."""

from __future__ import annotations

import httpx
import redis

from tests.http.conftest import start


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
            assert c.post("/messages/dlq", content=b"x", headers=same).status_code in (200, 201)
            assert c.get("/queues", headers=evil).status_code == 200  # reads are not refused
    finally:
        srv.stop()
