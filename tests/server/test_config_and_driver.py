"""The shipped config file, the directive table and driver-level behaviour of a real node."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

from broker.config import DIRECTIVES, Config
from tests.support.server import ServerProcess

REPO = Path(__file__).resolve().parents[2]


def test_conf_file_documents_every_directive_and_loads() -> None:
    text = (REPO / "conf" / "trisque.conf").read_text()
    mentioned = set(re.findall(r"^#? ?([a-z][a-z0-9-]+) ", text, re.M))
    missing = [name for name in DIRECTIVES if name not in mentioned]
    assert not missing, f"conf/trisque.conf does not document: {missing}"
    cfg = Config.from_argv([str(REPO / "conf" / "trisque.conf")])
    assert cfg.appendonly is True and cfg.appendfsync in ("always", "everysec")
    assert cfg.bind == "127.0.0.1"


def test_config_rewrite_persists_a_runtime_change(tmp_path: Path) -> None:
    conf = tmp_path / "node.conf"
    conf.write_text("# my node\nhz 10\n")
    with ServerProcess(config_file=str(conf)) as node:
        assert node.call("CONFIG", "SET", "hz", "20") == b"OK"
        assert node.call("CONFIG", "REWRITE") == b"OK"
    text = conf.read_text()
    assert "# my node" in text and "hz 20" in text and "hz 10" not in text


def test_protocol_error_found_after_an_unblock_closes_only_that_client() -> None:
    # The garbage waits in the buffer behind a blocked GETJOB; it is parsed by the task that
    # unblocks the client, which then closes a socket its own task is waiting on.
    with ServerProcess() as node:
        a = socket.create_connection(("127.0.0.1", node.port), timeout=5)
        a.sendall(b"GETJOB FROM crashq\r\n*x\r\n")
        time.sleep(0.3)
        assert node.call("ADDJOB", "crashq", "body", "0").startswith(b"D-")
        got = b""
        while not got.endswith(b"invalid multibulk length\r\n"):
            chunk = a.recv(4096)
            assert chunk, f"closed before the error reply; got {got!r}"
            got += chunk
        assert got.startswith(b"*1\r\n*3\r\n$6\r\ncrashq\r\n")
        assert a.recv(10) == b""  # then closed
        a.close()
        assert node.call("PING") == b"PONG"
        assert node.proc is not None and node.proc.poll() is None
        assert "Traceback" not in node.log()


def test_a_consumer_that_stops_reading_does_not_hold_up_producers() -> None:
    # The consumer pipelines many GETJOBs and never reads: each job it is handed (1 MB) fills
    # its socket. The producer, whose ADDJOBs are what unblock it, must keep getting replies.
    body = "x" * (1 << 20)
    with ServerProcess() as node:
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", node.port))
        slow.sendall(b"GETJOB FROM bigq\r\n" * 50)
        time.sleep(0.3)
        producer = socket.create_connection(("127.0.0.1", node.port), timeout=5)
        started = time.monotonic()
        for _ in range(30):
            frame = f"*4\r\n$6\r\nADDJOB\r\n$4\r\nbigq\r\n${len(body)}\r\n{body}\r\n$1\r\n0\r\n"
            producer.sendall(frame.encode())
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = producer.recv(100)
                assert chunk, "producer connection closed"
                reply += chunk
            assert reply.startswith(b"+D-")
        assert time.monotonic() - started < 20
        assert node.call("PING") == b"PONG"
        producer.close()
        slow.close()


def _restart_keeps_queue(tmp_path: Path, **directives: object) -> tuple[int, int]:
    with ServerProcess(directory=str(tmp_path), appendonly="yes", **directives) as node:
        for i in range(3):
            node.call("ADDJOB", "rq", f"job-{i}", "0")
        delivered = node.call("GETJOB", "FROM", "rq")
        assert delivered[0][2] == b"job-0"
        node.restart()  # SIGTERM, then start again on the same directory
        return node.call("QLEN", "rq"), node.call("INFO", "jobs").count(b"registered_jobs:3")


def test_a_signalled_restart_keeps_queues_exactly(tmp_path: Path) -> None:
    qlen, all_jobs_back = _restart_keeps_queue(tmp_path)
    assert (qlen, all_jobs_back) == (2, 1)  # the two undelivered jobs are queued at once


def test_without_rewrite_on_shutdown_queues_come_back_after_retry(tmp_path: Path) -> None:
    qlen, all_jobs_back = _restart_keeps_queue(tmp_path, aof_rewrite_on_shutdown="no")
    assert (qlen, all_jobs_back) == (0, 1)  # Disque's way: known, queued after RETRY
