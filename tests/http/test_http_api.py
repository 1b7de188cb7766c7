"""The HTTP API against a real node (httpx): every mqs route and status, MQ's routes, long
polling, batches, percent-encoded IDs, bad input, and HTTP <-> RESP interoperation."""

from __future__ import annotations

import base64
import socket
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import trio

from tests.aof.test_server_durability import Conn
from tests.http.conftest import start
from tests.support.server import ServerProcess

Node = tuple[ServerProcess, str]


def q(job_id: str) -> str:
    return quote(job_id, safe="")


def test_queue_routes_and_statuses(http: httpx.Client) -> None:
    body = {"redrive_policy": None, "retention_timeout": 3600, "visibility_timeout": 30,
            "message_delay": 0, "message_deduplication": False}
    r = http.put("/queues/qa", json=body)
    assert r.status_code == 201 and r.json() == {"name": "qa", **body}
    assert http.put("/queues/qa", json=body).status_code == 409
    assert http.post("/queues/nope", json=body).status_code == 404
    assert http.put("/queues/dlq-a", json={}).status_code == 201
    r = http.post("/queues/qa", json={"redrive_policy": {"max_receives": 3,
                                                         "dead_letter_queue": "dlq-a"}})
    assert r.status_code == 200
    assert r.json()["redrive_policy"] == {"max_receives": 3, "dead_letter_queue": "dlq-a"}
    r = http.get("/queues/qa")
    assert r.status_code == 200
    assert r.json()["status"] == {"messages": 0, "visible_messages": 0, "oldest_message_age": 0}
    assert http.get("/queues/none").status_code == 404
    listing = http.get("/queues", params={"offset": 0, "limit": 100}).json()
    names = [x["name"] for x in listing["queues"]]
    assert "qa" in names and "dlq-a" in names and listing["total"] >= 2
    assert http.get("/queues", params={"limit": 1}).json()["queues"].__len__() == 1
    for bad in ({"offset": "x"}, {"limit": "-1"}, {"limit": "1.5"}):
        r = http.get("/queues", params=bad)
        assert r.status_code == 400 and "error" in r.json()
    # Deleting a dead-letter queue clears the redrive policy that used it.
    r = http.delete("/queues/dlq-a")
    assert r.status_code == 200 and r.json()["name"] == "dlq-a"
    assert http.get("/queues/qa").json()["redrive_policy"] is None
    assert http.delete("/queues/dlq-a").status_code == 404


def test_queue_validation_is_mqs(http: httpx.Client) -> None:
    bad = [
        {"retention_timeout": 0}, {"retention_timeout": 2**31}, {"visibility_timeout": -1},
        {"visibility_timeout": 2**31}, {"message_delay": -1}, {"message_delay": 2**31},
        {"redrive_policy": {"max_receives": 0, "dead_letter_queue": "x"}},
        {"redrive_policy": {"max_receives": 2**31, "dead_letter_queue": "x"}},
        {"redrive_policy": {"max_receives": 1, "dead_letter_queue": "does-not-exist"}},
        {"redrive_policy": {"max_receives": 1}}, {"redrive_policy": 5},
        {"retention_timeout": "10"}, {"retention_timeout": 1.5}, {"retention_timeout": True},
        {"message_deduplication": 1}, {"unknown_field": 1}, [1, 2], "text",
    ]
    for body in bad:
        r = http.put("/queues/vq", json=body)
        assert r.status_code == 400, (body, r.text)
        assert "error" in r.json()
    for raw in (b"{", b"\xff\xfe", b'{"retention_timeout": }'):
        r = http.put("/queues/vq", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "error" in r.json()
    assert http.get("/queues/vq").status_code == 404


def test_message_routes(http: httpx.Client) -> None:
    assert http.post("/messages/nowhere", content=b"x").status_code == 404
    assert http.get("/messages/nowhere").status_code == 404
    http.put("/queues/mq1", json={"visibility_timeout": 1})
    assert http.get("/messages/mq1").status_code == 204
    r = http.post("/messages/mq1", content=b"<a/>", headers={"content-type": "text/xml"})
    assert r.status_code == 201
    job_id = r.headers["x-mqs-message-id"]
    assert r.headers["x-message-id"] == job_id and r.json() == {"id": job_id}
    status = http.get("/queues/mq1").json()["status"]
    assert status["messages"] == 1 and status["visible_messages"] == 1
    r = http.get("/messages/mq1")
    assert r.status_code == 200 and r.content == b"<a/>"
    assert r.headers["content-type"].startswith("text/xml")
    assert r.headers["x-mqs-message-id"] == job_id == r.headers["x-message-id"]
    # Invisible until its visibility timeout (RETRY), then delivered again.
    assert http.get("/messages/mq1").status_code == 204
    r = http.get("/messages/mq1", params={"wait": 3})
    assert r.status_code == 200 and r.headers["x-receive-count"] == "2"
    # IDs hold '/' and '+': percent-encoded in the path.
    assert http.delete("/messages/" + q(job_id)).status_code == 204
    assert http.delete("/messages/" + q(job_id)).status_code == 404
    assert http.delete("/messages/not-an-id").status_code == 400
    # No Content-Type: application/octet-stream.
    http.post("/messages/mq1", content=b"\x00\x01")
    r = http.get("/messages/mq1")
    assert r.headers["content-type"] == "application/octet-stream" and r.content == b"\x00\x01"
    http.delete("/messages/" + q(r.headers["x-message-id"]))


def test_body_limit_and_deduplication(http: httpx.Client) -> None:
    http.put("/queues/big", json={"message_deduplication": True})
    r = http.post("/messages/big", content=b"x" * (1024 * 1024 + 1))
    assert r.status_code == 413 and "error" in r.json()
    first = http.post("/messages/big", content=b"x" * (1024 * 1024))
    assert first.status_code == 201
    again = http.post("/messages/big", content=b"x" * (1024 * 1024))
    assert again.status_code == 200
    assert again.headers["x-mqs-message-id"] == first.headers["x-mqs-message-id"]
    assert http.get("/queues/big").json()["status"]["messages"] == 1


def test_batch_receive_and_long_polling(node: Node, http: httpx.Client) -> None:
    http.put("/queues/batch", json={})
    ids = [http.post("/messages/batch", content=f"m{i}".encode()).headers["x-message-id"]
           for i in range(5)]
    r = http.get("/messages/batch", params={"count": 3})
    assert r.status_code == 200
    got = r.json()["messages"]
    assert [m["id"] for m in got] == ids[:3]
    assert [base64.b64decode(m["body_base64"]) for m in got] == [b"m0", b"m1", b"m2"]
    assert http.get("/messages/batch", params={"count": 10}).json()["messages"].__len__() == 2
    for bad in ({"count": 0}, {"count": 101}, {"wait": -1}, {"wait": 61}, {"wait": "x"}):
        assert http.get("/messages/batch", params=bad).status_code == 400
    # A long poll waits for a job added later over RESP.
    started = time.monotonic()
    r = http.get("/messages/batch", params={"wait": 1})
    assert r.status_code == 204 and 0.9 <= time.monotonic() - started < 5

    async def poll_then_add() -> httpx.Response:
        async with httpx.AsyncClient(base_url=node[1], timeout=10) as client:
            async with trio.open_nursery() as nursery:
                result: list[httpx.Response] = []

                async def poll() -> None:
                    result.append(await client.get("/messages/batch", params={"wait": 10}))

                nursery.start_soon(poll)
                await trio.sleep(0.5)
                conn = Conn(node[0].port)
                conn.call("ADDJOB", "batch", "from-resp", 0)
                conn.close()
            return result[0]

    started = time.monotonic()
    r = trio.run(poll_then_add)
    assert r.status_code == 200 and r.content == b"from-resp"
    assert time.monotonic() - started < 5


def test_resp_and_http_interoperate(node: Node, http: httpx.Client) -> None:
    conn = Conn(node[0].port)
    assert conn.call("QPOLICY", "GET", "inter") is None
    http.put("/queues/inter", json={"retention_timeout": 600})
    assert conn.call("QPOLICY", "GET", "inter")[1] == b"inter"
    job_id = http.post("/messages/inter", content=b"hello").headers["x-message-id"]
    (queue, got_id, body), = conn.call("GETJOB", "NOHANG", "FROM", "inter")
    assert (queue, got_id.decode(), body) == (b"inter", job_id, b"hello")
    shown = dict(zip(*[iter(conn.call("SHOW", job_id))] * 2, strict=True))
    assert shown[b"ttl"] > 500  # the policy's retention
    resp_id = conn.call("ADDJOB", "inter", "from-resp", 0).decode()
    r = http.get("/messages/inter")
    assert r.content == b"from-resp" and r.headers["x-message-id"] == resp_id
    assert http.delete("/messages/" + q(resp_id)).status_code == 204
    assert conn.call("SHOW", resp_id) is None
    conn.close()


def test_dead_letters_over_http(http: httpx.Client) -> None:
    assert http.put("/queues/dead", json={}).status_code == 201
    http.put("/queues/work", json={"visibility_timeout": 1, "redrive_policy": {
        "max_receives": 1, "dead_letter_queue": "dead"}})
    job_id = http.post("/messages/work", content=b"poison",
                       headers={"content-type": "text/plain"}).headers["x-message-id"]
    assert http.get("/messages/work").status_code == 200
    # Its retry comes after 1 s: a second delivery would exceed max_receives.
    assert http.get("/messages/work", params={"wait": 3}).status_code == 204
    r = http.get("/messages/dead", params={"wait": 3})
    assert r.status_code == 200 and r.content == b"poison"
    assert r.headers["x-receive-count"] == "2"
    assert r.headers["x-message-id"] != job_id
    assert r.headers["x-original-message-id"] == job_id
    assert r.headers["x-original-queue"] == "work"
    assert r.headers["content-type"].startswith("text/plain")  # kept with the body
    assert http.delete("/messages/" + q(job_id)).status_code == 404  # the original is gone


def test_mq_routes(http: httpx.Client) -> None:
    assert http.get("/mq/mqq").status_code == 404
    assert http.put("/mq/mqq", content=b"ignored").status_code == 201
    assert http.put("/mq/mqq").status_code == 200
    assert http.get("/mq/mqq").status_code == 200
    assert http.get("/mq/mqq/messages").status_code == 204
    r = http.post("/mq/mqq/messages", content=b"payload")
    assert r.status_code == 201
    job_id = r.headers["x-message-id"]
    r = http.get("/mq/mqq/messages")
    assert r.status_code == 200 and r.content == b"payload"
    assert r.headers["x-message-id"] == job_id
    assert http.delete(f"/mq/other/messages/{q(job_id)}").status_code == 404
    assert http.delete(f"/mq/mqq/messages/{q(job_id)}").status_code == 204
    assert http.delete(f"/mq/mqq/messages/{q(job_id)}").status_code == 404
    assert http.post("/mq/nope/messages", content=b"x").status_code == 404
    assert http.delete("/mq/mqq").status_code == 200
    assert http.delete("/mq/mqq").status_code == 404


def test_unknown_routes_and_methods_are_json_4xx(http: httpx.Client) -> None:
    r = http.get("/nowhere")
    assert r.status_code == 404 and "error" in r.json()
    r = http.patch("/queues/x")
    assert r.status_code == 405 and "error" in r.json()


def test_slow_and_vanishing_clients(node: Node, http: httpx.Client) -> None:
    http.put("/queues/slow", json={})
    port = int(node[1].rsplit(":", 1)[1])
    # A client that disconnects mid-body: nothing is stored, the node goes on.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"POST /messages/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
    # A client that sends part of its body and stalls gets 408 (bounded wait).
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(b"POST /messages/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        data = s.recv(4096)
        assert data.startswith(b"HTTP/1.1 408"), data
    assert http.get("/queues/slow").json()["status"]["messages"] == 0
    # A long poll whose client leaves does not swallow the next job.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /messages/slow?wait=30 HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.3)
    time.sleep(0.3)
    http.post("/messages/slow", content=b"kept")
    assert http.get("/messages/slow").content == b"kept"


def test_auth_with_requirepass() -> None:
    srv, base = start(requirepass="s3cret")
    try:
        with httpx.Client(base_url=base, timeout=5) as c:
            r = c.get("/queues")
            assert r.status_code == 401 and "Basic" in r.headers["www-authenticate"]
            assert c.get("/queues", auth=("any", "wrong")).status_code == 401
            assert c.get("/queues", headers={"authorization": "Bearer nope"}).status_code == 401
            assert c.get("/queues", headers={"authorization": "Basic !!!"}).status_code == 401
            assert c.get("/queues", auth=("any", "s3cret")).status_code == 200
            assert c.get("/queues", headers={"authorization": "Bearer s3cret"}).status_code == 200
            assert c.get("/openapi.json").status_code == 200
    finally:
        srv.stop()


class _FailingLogServer:
    """What ``node.http_api.Bridge`` uses of ``node.server.Server``, with a log whose writes
    fail (the broker undoes the records, as ``Persistence`` makes it)."""

    def __init__(self) -> None:
        import random

        from broker.config import Config
        from broker.core import Broker

        self.config = Config()
        self.broker = Broker(self.config, "ab" * 20, b"seed", now_ms=1_000_000,
                             rng=random.Random(1))
        from node.conn_core import CommandPath, NodeCounters

        self.next_client_id = 0
        self.counters = NodeCounters()
        self.cmdstats: dict[bytes, list[int]] = {}
        self.monitors: set[object] = set()
        self.command_path = CommandPath(self)  # type: ignore[arg-type]
        self.entries: list[object] = []
        self.cluster = type("C", (), {"outbox": []})()
        self.bus = type("B", (), {"flush": staticmethod(lambda: None)})()

        class Clock:
            @staticmethod
            def now_ms() -> int:
                return 1_000_000

        self.clock = Clock()

    def route(self, effects: list[object], replies: list[object]) -> int:
        self.entries = effects
        return 1

    def dispatch(self, replies: list[object], ticket: int) -> None:
        pass

    async def wait_durable(self, tickets: set[int]) -> dict[int, str]:
        for e in reversed(self.entries):
            self.broker.undo_entry((e.kind, e.payload, e.undo), 1_000_000)  # type: ignore[attr-defined]
        return {t: "No space left on device" for t in tickets}


async def test_503_with_retry_after_when_the_log_write_fails() -> None:
    from node.http_api import make_app

    server = _FailingLogServer()
    server.broker.policies.put(__import__("broker.policy_table", fromlist=["Policy"]).Policy(b"d"))
    transport = httpx.ASGITransport(app=make_app(server))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.post("/messages/d", content=b"x")
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "No space left on device" in r.json()["error"]
        r = await c.post("/mq/d/messages", content=b"x")
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert not server.broker.jobs  # undone: nothing stored, nothing reported stored


async def test_a_server_built_without_the_http_api_refuses_http_port(tmp_path: Path) -> None:
    """cli/server.py hands the server what serves HTTP (node/server.py cannot import
    node/http_api.py, which types the server it serves): a node built without it must not
    start as if the API were on."""
    from broker.config import Config
    from node.server import Server, ServerError

    cfg = Config()
    cfg.set("dir", [str(tmp_path)])
    cfg.set("http-port", ["1"])  # never bound: the start stops before
    with trio.fail_after(10), pytest.raises(ServerError, match="http-port is set"):
        await Server(cfg).run()


def test_results_and_chains(http: httpx.Client) -> None:
    assert http.put("/queues/rq", json={}).status_code == 201
    parent = http.post("/messages/rq", content=b"first").json()["id"]
    r = http.post("/messages/rq", content=b"second", params={"after": parent})
    assert r.status_code == 201
    child = r.json()["id"]
    # Only the parent can be received: the child waits for it.
    got = http.get("/messages/rq")
    assert got.status_code == 200 and got.headers["X-Message-Id"] == parent
    assert http.get("/messages/rq").status_code == 204
    assert http.get(f"/results/{q(parent)}").status_code == 204  # not resolved yet
    r = http.put(f"/results/{q(parent)}", content=b"\x00result")
    assert r.status_code == 200 and r.json() == {"resolved": 1}
    r = http.get(f"/results/{q(parent)}", params={"wait": 1})
    assert r.status_code == 200 and r.content == b"\x00result"
    got = http.get("/messages/rq")
    assert got.status_code == 200 and got.headers["X-Message-Id"] == child
    # DELETE is ACKJOB: acked without a result, an empty 200; unknown: 404; malformed: 400.
    waiting = http.post("/messages/rq", content=b"third", params={"after": child}).json()["id"]
    assert http.delete(f"/messages/{q(child)}").status_code == 204
    assert http.get(f"/results/{q(child)}").status_code == 200  # acked without a result
    assert http.get("/messages/rq").headers["X-Message-Id"] == waiting
    assert http.get("/results/D-bogus").status_code == 400
    unknown = waiting[:12] + ("A" if waiting[12] != "A" else "B") + waiting[13:]
    assert http.get(f"/results/{q(unknown)}").status_code == 404
    assert http.post("/messages/rq", content=b"x", params={"after": "nope"}).status_code == 400


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
        return head


@pytest.mark.parametrize("ctype", [b"text/plain\x00x", b"text/plain\rx-injected: 1",
                                   b"text/\x7fplain", b"text/\x0bplain"])
def test_a_content_type_that_is_no_header_value_is_refused(node: Node, http: httpx.Client,
                                                            ctype: bytes) -> None:
    # A Content-Type is sent back with the message: one with a control character was stored,
    # and then either broke the answer (hypercorn refused to send it: 500) or went out as
    # read (a bare CR splits a header in some clients). Found by tools/fuzz_http.py --tls.
    http.put("/queues/ctl", json={})
    port = int(node[1].rsplit(":", 1)[1])
    for path in (b"/messages/ctl", b"/mq/ctl/messages"):
        head = _raw(port, b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: " + ctype
                    + b"\r\nContent-Length: 2\r\n\r\nhi")
        assert head.startswith(b"HTTP/1.1 400"), head
    assert http.get("/queues/ctl").json()["status"]["messages"] == 0
    assert http.get("/messages/ctl").status_code == 204
