"""Backoff, priorities and throttling on a real ``trisque-server`` (docs/semantics.md)."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from client.blocking import Client
from tests.aof.test_server_durability import Conn
from tests.http.conftest import start
from tests.support.server import ServerProcess, pipelined


def _d(reply: list[Any]) -> dict[bytes, Any]:
    return dict(zip(reply[::2], reply[1::2], strict=True))


def _wait_for(check: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def test_backoff_on_a_server_and_after_a_restart() -> None:
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        conn = Conn(srv.port)
        conn.call("QPOLICY", "SET", "q", "BACKOFF", 1, 8)
        job = conn.call("ADDJOB", "q", "x", 0)
        for attempt in range(2):
            assert conn.call("GETJOB", "NOHANG", "FROM", "q")[0][1] == job
            started = time.monotonic()
            assert conn.call("NACK", job) == 1
            wait = _d(conn.call("SHOW", job))[b"next-requeue-within"]
            assert 900 * 2 ** attempt <= wait <= 1100 * 2 ** attempt
            assert conn.call("QLEN", "q") == 0
            assert _wait_for(lambda: conn.call("QLEN", "q") == 1, 5)
            assert time.monotonic() - started >= 0.8 * 2 ** attempt
        conn.close()
        srv.kill()
        srv.start()
        conn = Conn(srv.port)
        assert _d(conn.call("QPOLICY", "GET", "q"))[b"backoff-max"] == 8
        assert _d(conn.call("SHOW", job))[b"nacks"] == 2
        conn.close()


def test_priorities_pipelined_and_after_a_restart() -> None:
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        commands: list[tuple[Any, ...]] = [
            ("ADDJOB", "q", f"p{p}-{k}", 0, "PRIORITY", p) for k in range(2) for p in range(10)]
        commands.append(("GETJOB", "NOHANG", "COUNT", 3, "FROM", "q"))
        replies = pipelined(srv.port, commands)
        assert [e[2] for e in replies[-1]] == [b"p9-0", b"p9-1", b"p8-0"]
        srv.kill()
        srv.start()
        conn = Conn(srv.port)
        # After a crash jobs come back only after their retry: each kept its priority.
        for (_, _, body, _, _, prio), job_id in zip(commands[:-1], replies[:-1], strict=True):
            shown = _d(conn.call("SHOW", job_id))
            assert shown[b"body"] == body.encode() and shown.get(b"priority", 0) == prio
        conn.close()


def test_priority_over_http_and_the_client_library() -> None:
    srv, base = start()
    try:
        with httpx.Client(base_url=base, timeout=10) as http:
            assert http.put("/queues/hq", json={}).status_code == 201
            assert http.post("/messages/hq?priority=10", content=b"x").status_code == 400
            low = http.post("/messages/hq", content=b"low").json()["id"]
            high = http.post("/messages/hq?priority=7", content=b"high").json()["id"]
            client = Client([f"127.0.0.1:{srv.port}"])
            try:
                assert client.show(high).priority == 7 and client.show(low).priority == 0
                third = client.add_job("hq", b"mid", priority=3)
                assert [j.id for j in client.qpeek("hq", 5)] == [high, third, low]
                assert [j.body for j in client.get_job("hq", count=3, nohang=True)] == [
                    b"high", b"mid", b"low"]
            finally:
                client.close()
    finally:
        srv.stop()


def test_throttling_on_a_server_qstat_and_the_dashboard() -> None:
    srv, base = start()
    try:
        conn = Conn(srv.port)
        conn.call("QPOLICY", "SET", "t", "MAXINFLIGHT", 1)
        first = conn.call("ADDJOB", "t", "a", 0)
        conn.call("ADDJOB", "t", "b", 0)
        assert conn.call("GETJOB", "NOHANG", "FROM", "t")[0][1] == first
        assert conn.call("GETJOB", "NOHANG", "FROM", "t") is None
        stat = _d(conn.call("QSTAT", "t"))
        assert (stat[b"inflight"], stat[b"throttled"]) == (1, 1)
        page = httpx.get(base + "/", params={"part": "main"}, timeout=10).text
        assert "throttled: 1/1 in flight" in page
        # A blocked consumer is served once the job in flight is acknowledged.
        waiter = Conn(srv.port)
        served: list[Any] = []
        thread = threading.Thread(
            target=lambda: served.append(waiter.call("GETJOB", "TIMEOUT", 5000, "FROM", "t")))
        thread.start()
        time.sleep(0.3)
        assert not served  # still held back
        started = time.monotonic()
        assert conn.call("ACKJOB", first) == 1
        thread.join(5)
        assert served and served[0][0][2] == b"b"
        assert time.monotonic() - started < 1.0
        # RATE: 5 a second on this node alone.
        client = Client([f"127.0.0.1:{srv.port}"])
        try:
            client.qpolicy_set("r", rate=5)
            for k in range(30):
                client.add_job("r", f"j{k}".encode())
            got, started = 0, time.monotonic()
            while time.monotonic() - started < 2.0:
                got += len(client.get_job("r", count=10, nohang=True))
                time.sleep(0.05)
            assert 8 <= got <= 16, got
            assert client.qstat("r").inflight == 0
        finally:
            client.close()
        waiter.close()
        conn.close()
    finally:
        srv.stop()
