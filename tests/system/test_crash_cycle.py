"""Twenty kill -9 and restart rounds under a producer/consumer load with
``appendfsync always``. After every restart, each ADDJOB the node acknowledged is there or was
acknowledged (ACKJOB) by a consumer, and no acknowledged job comes back: an ACKJOB reply, like
an ADDJOB reply, leaves only after its record is durable (docs/persistence.md)."""

from __future__ import annotations

import threading
import time

import pytest

from client.blocking import Connection
from protocol.resp import Error, encode_command
from tests.aof.test_server_durability import Conn
from tests.support.server import ServerProcess

ROUNDS = 20
LOAD_SECONDS = 0.4


def _body(n: int, i: int, size: int) -> bytes:
    return f"p{n}-{i}".encode().ljust(size, b".")


def _load(port: int, stop: threading.Event, added: dict[bytes, bytes], acked: set[bytes],
          ack_sent: set[bytes], errors: list[str], body_size: int) -> list[threading.Thread]:
    def producer(n: int) -> None:
        try:
            conn = Conn(port)
            i = 0
            while not stop.is_set():
                body = _body(n, i, body_size)
                reply = conn.call("ADDJOB", "crash", body, 0, "RETRY", 3600)
                if isinstance(reply, bytes):
                    added[reply] = body
                i += 1
        except (OSError, ConnectionError):
            pass  # the kill
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(repr(exc))

    def consumer() -> None:
        try:
            conn = Conn(port)
            while not stop.is_set():
                got = conn.call("GETJOB", "NOHANG", "COUNT", 5, "FROM", "crash")
                for _queue, job_id, _body in got or []:
                    # Sent but unanswered when the node dies, an ACKJOB may or may not have
                    # made it to the log: such a job may be gone.
                    ack_sent.add(job_id)
                    if conn.call("ACKJOB", job_id) == 1:
                        acked.add(job_id)
        except (OSError, ConnectionError):
            pass
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(3)]
    threads += [threading.Thread(target=consumer) for _ in range(2)]
    for t in threads:
        t.start()
    return threads


PIPELINE_CHUNK = 2_000


def _pipelined(port: int, commands: list[tuple[object, ...]]) -> list[object]:
    """Send the commands a chunk at a time, each in one write, reading its replies in order
    before the next: a client that sends tens of thousands of SHOWs before reading any reply
    blocks in its send once the node holds back replies the client does not read."""
    conn = Connection(("127.0.0.1", port), 10)
    try:
        replies: list[object] = []
        for i in range(0, len(commands), PIPELINE_CHUNK):
            chunk = commands[i : i + PIPELINE_CHUNK]
            payload = b"".join(encode_command(*c) for c in chunk)
            replies += conn.exchange(payload, len(chunk), 60)
        return replies
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("body_size", [0, 1000], ids=["in-memory", "bodies-on-disk"])
def test_twenty_kill_9_rounds_lose_nothing_acknowledged(body_size: int) -> None:
    """With 1 KB bodies the log holds them (body-memory-max 256): every body read back after
    each restart is the one added."""
    added: dict[bytes, bytes] = {}
    acked: set[bytes] = set()
    ack_sent: set[bytes] = set()
    errors: list[str] = []
    resurrected = 0
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        for round_ in range(ROUNDS):
            stop = threading.Event()
            threads = _load(srv.port, stop, added, acked, ack_sent, errors, body_size)
            time.sleep(LOAD_SECONDS)
            srv.kill()
            stop.set()
            for t in threads:
                t.join(10)
            srv.start()
            ids = sorted(added)
            shown_all = _pipelined(srv.port, [("SHOW", job_id) for job_id in ids])
            for job_id, shown in zip(ids, shown_all, strict=True):
                assert not isinstance(shown, Error), shown
                if job_id in acked:
                    resurrected += shown is not None
                elif job_id not in ack_sent:
                    assert shown is not None, f"round {round_}: acknowledged {job_id!r} lost"
                if shown is not None:
                    assert shown[-1] == added[job_id], f"round {round_}: {job_id!r}'s body"
            # Jobs replayed after a crash wait for their retry time (1 h): make them
            # deliverable again so the consumers keep acknowledging in the next round.
            _pipelined(srv.port, [("ENQUEUE", job_id) for job_id in sorted(added.keys() - ack_sent)])
        if body_size:
            info = srv.call("INFO", "persistence").decode()
            assert "jobs_bodies_on_disk:0\r" not in info, "the bodies stayed in memory"
    assert not errors, errors
    assert len(added) > ROUNDS * 50, f"the load did too little: {len(added)} jobs"
    assert len(acked) > ROUNDS * 10, f"the consumers did too little: {len(acked)} acks"
    assert resurrected == 0, f"{resurrected} acknowledged jobs came back"
