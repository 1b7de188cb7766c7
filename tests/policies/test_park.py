"""QPOLICY PARK: a script worker's failed job leaves its queue for the dead-letter queue or
the queue's error queue, with why (broker/parking.py); REDRIVE JOB runs one again."""

from __future__ import annotations

from protocol.resp import Error
from tests.aof.test_server_durability import Conn
from tests.broker.harness import Node
from tests.policies.test_policies_restart import _d
from tests.support.server import ServerProcess


def _taken(n: Node, queue: str, body: str) -> bytes:
    job = n.add(queue, body)
    assert n("GETJOB", "NOHANG", "FROM", queue)[0][1] == job
    return job


def test_park_without_redrive_goes_to_the_error_queue_with_its_note() -> None:
    n = Node()
    job = _taken(n, "w", "payload")
    n.tick(n.now + 5)
    reply = n("QPOLICY", "PARK", job, 3, "/logs/x.1.log", "exit status 3")
    assert reply[0] == b"w.err"
    parked = reply[1]
    assert n.show(job) is None  # the original is acknowledged and gone
    assert n.qlen("w") == 0 and n.qlen("w.err") == 1
    assert n("QPOLICY", "ORIGIN", parked) == [job, b"w", b"exit status 3", 3, b"/logs/x.1.log",
                                              n.now]
    # The error queue got a policy with the defaults (a day's retention), so REDRIVE knows it.
    assert _d(n("QPOLICY", "GET", "w.err"))[b"retention-timeout"] == 86400
    assert n("QPOLICY", "GET", "w") is None  # the job's own queue is left as it was
    # Run it again: a new job in w, the error queue empty.
    assert n("QPOLICY", "REDRIVE", "w.err", "JOB", parked) == 1
    assert n.qlen("w.err") == 0 and n.qlen("w") == 1
    assert n("QPOLICY", "REDRIVE", "w.err", "JOB", parked) == 0  # gone: nothing moved


def test_park_follows_the_redrive_policy_and_keeps_the_counters() -> None:
    n = Node()
    n("QPOLICY", "CREATE", "dlq")
    n("QPOLICY", "CREATE", "w", "REDRIVE", 5, "dlq")
    job = _taken(n, "w", "a")
    n("NACK", job)
    assert n("GETJOB", "NOHANG", "FROM", "w")[0][1] == job
    queue, parked = n("QPOLICY", "PARK", job, "none", "", "cannot execute the command")
    assert queue == b"dlq"
    assert n("QPOLICY", "GET", "w.err") is None
    got = n("QPEEK", "dlq", 1)[0]
    assert got[1] == parked
    assert n.show(parked)[b"nacks"] == 1
    assert n("QPOLICY", "ORIGIN", parked)[:4] == [job, b"w", b"cannot execute the command",
                                                  None]


def test_park_errors_and_plain_dead_letters_unchanged() -> None:
    n = Node()
    job = _taken(n, "w", "a")
    assert n("ACKJOB", job) == 1
    assert n("QPOLICY", "PARK", job, 0, "", "x") == Error(
        "NOJOB Job not known in the context of this node.")
    assert isinstance(n("QPOLICY", "PARK", "nope", 0, "", "x"), Error)
    assert isinstance(n("QPOLICY", "PARK", job, "zero", "", "x"), Error)
    assert isinstance(n("QPOLICY", "PARK", job, 0, ""), Error)


def test_parked_jobs_and_notes_survive_restart_and_rewrite() -> None:
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        conn = Conn(srv.port)
        job = conn.call("ADDJOB", "w", "x", 0)
        conn.call("GETJOB", "NOHANG", "FROM", "w")
        _, parked = conn.call("QPOLICY", "PARK", job, -9, "/l/f.log", "killed by SIGKILL")
        want = conn.call("QPOLICY", "ORIGIN", parked)
        assert want[:5] == [job, b"w", b"killed by SIGKILL", -9, b"/l/f.log"]
        conn.close()
        srv.kill()
        srv.start()
        conn = Conn(srv.port)
        assert conn.call("QPOLICY", "ORIGIN", parked) == want
        assert conn.call("BGREWRITEAOF") is not None
        import time

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and b"aof_rewrite_in_progress:1" in \
                conn.call("INFO", "persistence"):
            time.sleep(0.05)
        conn.close()
        srv.kill()
        srv.start()
        conn = Conn(srv.port)
        assert conn.call("QPOLICY", "ORIGIN", parked) == want
        assert conn.call("SHOW", parked) is not None  # queued again after its RETRY (Disque)
        conn.close()
