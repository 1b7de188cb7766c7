"""Policies and dead letters survive a restart of a real ``trisque-server`` (append log)."""

from __future__ import annotations

from tests.aof.test_server_durability import Conn
from tests.support.server import ServerProcess


def _d(reply: list) -> dict:
    return dict(zip(reply[::2], reply[1::2], strict=True))


def test_policies_and_dead_letters_survive_kill_and_rewrite() -> None:
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        conn = Conn(srv.port)
        conn.call("QPOLICY", "CREATE", "dlq", "RETENTION", 5000)
        conn.call("QPOLICY", "CREATE", "w", "REDRIVE", 1, "dlq", "VISIBILITY", 50, "DEDUP", "yes")
        conn.call("QPOLICY", "CREATE", "gone")
        conn.call("QPOLICY", "DEL", "gone")
        job = conn.call("ADDJOB", "w", "x", 0)
        conn.call("GETJOB", "NOHANG", "FROM", "w")
        assert conn.call("NACK", job) == 0
        (_, dl_id, _), = conn.call("GETJOB", "NOHANG", "FROM", "dlq")
        kept = conn.call("ADDJOB", "w", "dup", 0)
        before = conn.call("QPOLICY", "LIST")
        conn.close()
        for how in ("kill", "rewrite"):
            if how == "kill":
                srv.kill()
            else:
                assert Conn(srv.port).call("BGREWRITEAOF") is not None
                import time

                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and b"aof_rewrite_in_progress:1" in \
                        Conn(srv.port).call("INFO", "persistence"):
                    time.sleep(0.05)
                srv.kill()
            srv.start()
            conn = Conn(srv.port)
            assert conn.call("QPOLICY", "LIST") == before, how
            assert conn.call("QPOLICY", "GET", "gone") is None
            assert _d(conn.call("QPOLICY", "GET", "w"))[b"visibility-timeout"] == 50
            assert conn.call("QPOLICY", "ORIGIN", dl_id) == [job, b"w"], how
            # Deduplication still sees the job added before the restart.
            assert conn.call("ADDJOB", "w", "dup", 0) == kept, how
            conn.close()
