"""The append log through real ``trisque-server`` processes: crash, restart, controlled restart.

These are the few tests that need whole processes: a kill -9 cannot be simulated in-process.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from protocol.resp import NEED_DATA, Error, ReplyReader, encode_command
from tests.support.server import ServerProcess


class Conn:
    """One persistent loopback connection; every read has a timeout."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.reader = ReplyReader()

    def call(self, *args: Any) -> Any:
        self.sock.sendall(encode_command(*[a if isinstance(a, bytes) else str(a) for a in args]))
        while True:
            reply = self.reader.next()
            if reply is not NEED_DATA:
                return reply
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            self.reader.feed(data)

    def close(self) -> None:
        self.sock.close()


def _show(conn: Conn, job_id: bytes) -> dict[bytes, Any] | None:
    reply = conn.call("SHOW", job_id)
    if reply is None:
        return None
    return dict(zip(reply[::2], reply[1::2], strict=True))


def _all_job_ids(conn: Conn) -> set[bytes]:
    ids: set[bytes] = set()
    cursor = b"0"
    for _ in range(100_000):
        cursor, page = conn.call("JSCAN", cursor, "COUNT", 1000)
        ids.update(page)
        if cursor == b"0":
            return ids
    raise AssertionError("JSCAN did not finish")


def test_kill9_during_16_connection_load_loses_no_acknowledged_job():
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        acked: list[set[bytes]] = [set() for _ in range(16)]
        sent_bodies: set[bytes] = set()
        stop = threading.Event()

        def load(k: int) -> None:
            try:
                conn = Conn(srv.port)
                for i in range(1_000_000):
                    if stop.is_set():
                        return
                    body = b"c%d-%d" % (k, i)
                    sent_bodies.add(body)
                    reply = conn.call("ADDJOB", f"q{k % 4}", body, 0)
                    if isinstance(reply, Error):
                        raise AssertionError(reply)
                    acked[k].add(reply)
            except (OSError, ConnectionError):
                return  # the server was killed under us: this ADDJOB was not acknowledged

        threads = [threading.Thread(target=load, args=(k,), daemon=True) for k in range(16)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        srv.kill()
        stop.set()
        for t in threads:
            t.join(10)
        confirmed = set().union(*acked)
        assert len(confirmed) > 200, "the load did not get going"
        srv.start()
        conn = Conn(srv.port)
        missing = [j for j in confirmed if _show(conn, j) is None]
        assert not missing, f"{len(missing)} acknowledged jobs lost, e.g. {missing[:3]}"
        present = _all_job_ids(conn)
        # Nothing invented: at most the 16 ADDJOBs in flight at the kill are extra, and every
        # job present carries a body a client sent.
        extra = present - confirmed
        assert len(extra) <= 16
        for job_id in extra:
            assert _show(conn, job_id)[b"body"] in sent_bodies
        conn.close()


def test_shutdown_rewrite_aof_restores_queues_exactly():
    with ServerProcess(appendonly="yes", appendfsync="everysec") as srv:
        conn = Conn(srv.port)
        for q in ("a", "b", "c"):
            for i in range(10):
                conn.call("ADDJOB", q, f"{q}{i}", 0, "RETRY", 60)
        for _ in range(3):
            conn.call("GETJOB", "NOHANG", "FROM", "b")  # delivered: out of the queue
        before = {q: conn.call("QPEEK", q, 100) for q in ("a", "b", "c")}
        assert [len(before[q]) for q in ("a", "b", "c")] == [10, 7, 10]
        try:
            conn.call("SHUTDOWN", "REWRITE-AOF")
        except ConnectionError:
            pass
        conn.close()
        srv.proc.wait(10)
        srv.start()
        conn = Conn(srv.port)
        after = {q: conn.call("QPEEK", q, 100) for q in ("a", "b", "c")}
        assert after == before
        # The restored queues are trusted once: after a later crash, jobs wait for their
        # retry time again. (A crash, because a SIGTERM now ends with the same kind of exact
        # snapshot: aof-rewrite-on-shutdown.)
        srv.kill()
        srv.start()
        conn = Conn(srv.port)
        assert [conn.call("QLEN", q) for q in ("a", "b", "c")] == [0, 0, 0]
        assert len(_all_job_ids(conn)) == 30
        conn.close()


def test_restart_keeps_state_and_counters_and_at_most_once_jobs_are_not_redelivered():
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        conn = Conn(srv.port)
        retry_id = conn.call("ADDJOB", "q", "with-retry", 0, "RETRY", 1)
        once_id = conn.call("ADDJOB", "q1", "at-most-once", 0, "RETRY", 0)
        acked_id = conn.call("ADDJOB", "q", "acked", 0)
        assert conn.call("ACKJOB", acked_id) == 1
        got = conn.call("GETJOB", "NOHANG", "FROM", "q")
        assert got[0][1] == retry_id
        assert conn.call("NACK", retry_id) == 1
        got = conn.call("GETJOB", "NOHANG", "FROM", "q1")
        assert got[0][1] == once_id
        before = _show(conn, retry_id)
        conn.close()
        srv.kill()
        srv.start()
        conn = Conn(srv.port)
        after = _show(conn, retry_id)
        assert after is not None and _show(conn, acked_id) is None
        for field in (b"nacks", b"additional-deliveries", b"ctime", b"body", b"retry"):
            assert after[field] == before[field], field
        assert _show(conn, once_id) is not None
        # The retry job comes back after its retry time; the RETRY 0 job never does.
        deadline = time.monotonic() + 10
        while conn.call("QLEN", "q") == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert conn.call("QLEN", "q") == 1
        assert conn.call("QLEN", "q1") == 0
        conn.close()


def test_bgrewriteaof_under_load_then_restart():
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        conn = Conn(srv.port)
        ids = [conn.call("ADDJOB", "q", f"j{i}", 0) for i in range(2000)]
        for job_id in ids[::2]:
            conn.call("ACKJOB", job_id)
        path = os.path.join(srv.dir, conn.call("CONFIG", "GET", "appendfilename")[1].decode())
        size_before = os.path.getsize(path)
        assert conn.call("BGREWRITEAOF") == b"Background append only file rewriting started"
        more = [conn.call("ADDJOB", "q", f"m{i}", 0) for i in range(300)]
        deadline = time.monotonic() + 20
        while b"aof_rewrite_in_progress:1" in conn.call("INFO", "persistence"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        info = conn.call("INFO", "persistence").decode()
        assert "aof_last_bgrewrite_status:ok" in info and "aof_fsync_count:" in info
        assert os.path.getsize(path) < size_before
        conn.close()
        srv.kill()
        srv.start()
        conn = Conn(srv.port)
        assert _all_job_ids(conn) == set(ids[1::2]) | set(more)
        conn.close()


def test_log_switched_on_at_run_time_has_what_was_done_while_it_was_off():
    """With the log off the broker builds no job or delivery records (log_wanted); CONFIG SET
    appendonly yes snapshots the node, so a kill -9 after it loses nothing done before it."""
    with ServerProcess(appendonly="no", appendfsync="always") as srv:
        conn = Conn(srv.port)
        delivered = conn.call("ADDJOB", "q", "delivered while off", 0, "RETRY", 300)
        waiting = conn.call("ADDJOB", "q", "queued while off", 0)
        got = conn.call("GETJOB", "NOHANG", "FROM", "q")
        assert got[0][1] == delivered
        before = _show(conn, delivered)
        assert conn.call("CONFIG", "SET", "appendonly", "yes") == b"OK"
        after_on = conn.call("ADDJOB", "q", "added with the log on", 0)
        conn.close()
        srv.kill()
        srv.directives["appendonly"] = "yes"
        srv.start()
        conn = Conn(srv.port)
        assert _all_job_ids(conn) == {delivered, waiting, after_on}
        restored = _show(conn, delivered)
        assert restored is not None and before is not None
        for field in (b"body", b"ctime", b"retry", b"queue", b"state"):
            assert restored[field] == before[field], field
        conn.close()
