"""Backoff, priorities and throttling on a real ``trisque-server`` (docs/semantics.md)."""

from __future__ import annotations

import time
from typing import Any

from tests.aof.test_server_durability import Conn
from tests.support.server import ServerProcess


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
