"""On real nodes: memory comes back, buffers are bounded,
the file-descriptor limit is respected, and a connection never closes on a half-written job."""

from __future__ import annotations

import socket
import time

import pytest

from client.blocking import Connection
from protocol.resp import Error, encode_command
from tests.support.server import ServerProcess


def _info(srv: ServerProcess, section: str, field: str) -> int:
    text = srv.call("INFO", section).decode()
    for line in text.split("\r\n"):
        if line.startswith(field + ":"):
            return int(line.split(":", 1)[1])
    raise KeyError(field)


def _pipeline(port: int, commands: list[bytes]) -> list[object]:
    """Send the commands in one write on one connection; their replies, in order."""
    conn = Connection(("127.0.0.1", port), 10)
    try:
        return conn.exchange(b"".join(commands), len(commands), 30)
    finally:
        conn.close()


def test_memory_of_acknowledged_jobs_comes_back() -> None:
    """Case 6: 5,000 x 10 KB jobs added and FASTACKed four times; before the fix the bodies
    stayed until their retry time and RSS grew by about 50 MB a round."""
    body = b"b" * 10_000
    with ServerProcess() as srv:
        rss = []
        for _ in range(4):
            adds = [encode_command("ADDJOB", "mem", body, 0) for _ in range(5000)]
            ids = _pipeline(srv.port, adds)
            assert all(isinstance(i, bytes) and i.startswith(b"D-") for i in ids), ids[:3]
            acks = [encode_command("FASTACK", i) for i in ids]
            assert _pipeline(srv.port, acks) == [1] * 5000
            time.sleep(1.2)  # the node samples RSS once a second
            rss.append(_info(srv, "memory", "used_memory"))
        assert _info(srv, "jobs", "registered_jobs") == 0
        growth = rss[-1] - rss[0]
        assert growth < 20_000_000, f"RSS by round: {rss}"


def test_a_blocked_client_cannot_buffer_without_limit() -> None:
    """Case 7: a client blocked in GETJOB that keeps sending is closed at the query buffer
    limit (1 MB here) and the node goes on."""
    with ServerProcess(client_query_buffer_limit="1mb") as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
            sock.sendall(encode_command("GETJOB", "FROM", "nothing-here"))
            time.sleep(0.2)
            ping = encode_command("PING")
            sent = 0
            try:
                while sent < 4_000_000:
                    sock.sendall(ping * 10_000)
                    sent += len(ping) * 10_000
            except (BrokenPipeError, ConnectionResetError):
                pass
            sock.settimeout(10)
            try:
                while sock.recv(65536):
                    pass
            except ConnectionResetError:
                pass
        assert "max query buffer length" in srv.log()
        assert srv.call("PING") == b"PONG"
        assert _info(srv, "clients", "blocked_clients") == 0


def test_past_the_open_files_limit_clients_are_refused_not_hung() -> None:
    """Case 8: with 64 descriptors, maxclients 10000 is lowered (and said so) and the clients
    past it get Redis's error instead of an accept that never comes."""
    with ServerProcess(open_files=64) as srv:
        assert "maxclients has been reduced to 32" in srv.log()
        assert srv.call("CONFIG", "GET", "maxclients") == [b"maxclients", b"32"]
        socks = []
        try:
            refused = 0
            for _ in range(40):
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
                socks.append(s)
                s.sendall(encode_command("PING"))
                reply = s.recv(100)
                if reply == b"-ERR max number of clients reached\r\n":
                    refused += 1
                else:
                    assert reply == b"+PONG\r\n"
            assert refused >= 8
        finally:
            for s in socks:
                s.close()
        time.sleep(0.3)
        assert srv.call("PING") == b"PONG"
        reply = srv.call("CONFIG", "SET", "maxclients", "1000")
        assert isinstance(reply, Error) and "not able to handle" in reply


@pytest.mark.parametrize("ending", [encode_command("QUIT"), b"*1\r\n$x\r\n"],
                         ids=["quit", "protocol-error"])
def test_a_job_reply_is_written_whole_before_the_connection_closes(ending: bytes) -> None:
    """Case 10: a blocked GETJOB with QUIT (or a malformed frame) pipelined behind it, and a
    job bigger than the socket takes at once: before the fix the reply was cut off in most
    runs, yet the job counted as delivered (with RETRY 0, lost)."""
    body = b"j" * 3_000_000
    with ServerProcess() as srv:
        for run in range(3):
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.settimeout(20)
                sock.connect(("127.0.0.1", srv.port))
                sock.sendall(encode_command("GETJOB", "FROM", f"big{run}") + ending)
                time.sleep(0.2)
                job_id = srv.call("ADDJOB", f"big{run}", body, 0, "RETRY", 0)
                time.sleep(0.5)  # let the node fill the socket and queue the rest
                data = b""
                while True:
                    chunk = sock.recv(1 << 16)
                    if not chunk:
                        break
                    data += chunk
            assert job_id in data and body in data, f"run {run}: {len(data)} bytes"
            assert data.endswith(b"+OK\r\n" if b"QUIT" in ending else b"invalid bulk length\r\n")


def test_a_huge_body_is_refused_before_it_is_kept() -> None:
    """Case 11: a body that would take the node past maxmemory is refused at once."""
    with ServerProcess(maxmemory="100mb") as srv:
        reply = srv.call("ADDJOB", "huge", b"h" * 120_000_000, 0)
        # Past 95 % with the body counted: refused before a copy is kept.
        assert reply == "OOM command not allowed when used memory > 'maxmemory'.", reply
        assert _info(srv, "jobs", "registered_jobs") == 0
        # The request's memory is given back: once the next sample sees it, small jobs pass.
        deadline = time.monotonic() + 5
        while not isinstance(srv.call("ADDJOB", "huge", b"small", 0), bytes):
            assert time.monotonic() < deadline, _info(srv, "memory", "used_memory")
            time.sleep(0.2)
