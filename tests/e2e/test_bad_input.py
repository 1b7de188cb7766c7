"""What a real trisque-server does with bad input: it refuses, it survives, nobody else waits.

Every test here talks to one server process shared by the module (a fresh one replaces it if a
test killed it, so one crash fails one test, not the rest). Each test proves three things:

* the exact reply Redis/Disque gives to the mistake, where clients depend on its text;
* the server is alive afterwards and another connection gets PONG, during and after;
* a refused command changed nothing (QLEN, registered jobs and queues are as before).

Error texts come from the recorded reference replies where they are recorded, otherwise from
Redis's networking.c (protocol errors) and Disque's command table and job.c (facts, not code).
"""

from __future__ import annotations

import random
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from protocol.resp import encode_command
from tests.e2e.rawclient import Incomplete, RawConnection, parse_one
from tests.support.server import ServerProcess

GOOD_ID = "D-00000000-000000000000000000000000-05a1"  # well-formed, unknown to the server


class Node:
    """The module's server; ``fresh()`` hands out a live one."""

    def __init__(self) -> None:
        self.server: ServerProcess | None = None

    def fresh(self) -> ServerProcess:
        if self.server is None or self.server.proc is None or self.server.proc.poll() is not None:
            if self.server is not None:
                self.server.__exit__(None, None, None)
            self.server = ServerProcess().start()
            with RawConnection(self.server.port) as c:
                # A queue with one job, so "nothing changed" has something to look at.
                assert c.call("ADDJOB", "stable", "x", "0")[0] == "+"
        return self.server

    def close(self) -> None:
        if self.server is not None:
            self.server.__exit__(None, None, None)


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    holder = Node()
    yield holder
    holder.close()


@pytest.fixture
def srv(node: Node) -> Iterator[ServerProcess]:
    server = node.fresh()
    yield server
    assert_healthy(server)


def info_field(conn: RawConnection, section: str, name: str) -> int:
    text = conn.call("INFO", section)
    assert isinstance(text, bytes), f"INFO {section} answered {text!r}"
    for line in text.decode().splitlines():
        if line.startswith(name + ":"):
            return int(line.split(":", 1)[1])
    raise AssertionError(f"INFO {section} has no {name}: {text!r}")


def state(server: ServerProcess, *queues: str) -> dict[str, Any]:
    with RawConnection(server.port) as c:
        snap: dict[str, Any] = {
            "registered_jobs": info_field(c, "jobs", "registered_jobs"),
            "registered_queues": info_field(c, "queues", "registered_queues"),
        }
        for q in ("stable", *queues):
            snap[f"QLEN {q}"] = c.call("QLEN", q)
    return snap


def assert_healthy(server: ServerProcess) -> None:
    assert server.proc is not None
    code = server.proc.poll()
    assert code is None, f"the server exited with {code}:\n{server.log()[-4000:]}"
    with RawConnection(server.port, timeout=3) as c:
        assert c.call("PING") == ("+", "PONG")


def ping(conn: RawConnection) -> None:
    """Another client is served while the bad one is in progress."""
    t0 = time.monotonic()
    assert conn.call("PING") == ("+", "PONG")
    assert time.monotonic() - t0 < 2.0, "PING took over 2 s while another client misbehaved"


def refused_and_closed(server: ServerProcess, data: bytes, expected: bytes,
                       timeout: float = 3.0) -> None:
    """Send ``data``; the server must answer exactly ``expected`` and close the connection."""
    with RawConnection(server.port) as watcher, RawConnection(server.port) as bad:
        try:
            bad.send(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it may close before reading everything; what it sent is checked below
        ping(watcher)
        t0 = time.monotonic()
        got = bad.read_until_closed(timeout)
        assert got == expected
        assert time.monotonic() - t0 < timeout
        ping(watcher)


# ---------------------------------------------------------------------------------------------
# Commands the server understands the framing of, but not the content


ARITY = [
    (("ADDJOB",), "addjob"),
    (("ADDJOB", "q"), "addjob"),
    (("ADDJOB", "q", "body"), "addjob"),
    (("addjob", "q"), "addjob"),
    (("AdDjOb", "q", "body"), "addjob"),
    (("GETJOB",), "getjob"),
    (("SHOW",), "show"),
    (("SHOW", GOOD_ID, GOOD_ID), "show"),
    (("WORKING",), "working"),
    (("WORKING", GOOD_ID, GOOD_ID), "working"),
    (("QLEN",), "qlen"),
    (("QLEN", "a", "b"), "qlen"),
    (("QSTAT",), "qstat"),
    (("QSTAT", "a", "b"), "qstat"),
    (("QPEEK", "stable"), "qpeek"),
    (("QPEEK", "stable", "1", "2"), "qpeek"),
    (("PAUSE", "stable"), "pause"),
    (("PAUSE",), "pause"),
    (("DEBUG",), "debug"),
    (("CONFIG",), "config"),
    (("CLUSTER",), "cluster"),
    (("TIME", "now"), "time"),
    (("BGREWRITEAOF", "now"), "bgrewriteaof"),
    (("PING", "a", "b"), "ping"),
]


@pytest.mark.parametrize("argv, name", ARITY, ids=[" ".join(a) for a, _ in ARITY])
def test_wrong_arity(srv: ServerProcess, argv: tuple[str, ...], name: str) -> None:
    before = state(srv, "q")
    with RawConnection(srv.port) as c:
        assert c.call(*argv) == ("-", f"ERR wrong number of arguments for '{name}' command")
        assert c.call("PING") == ("+", "PONG")  # the connection stays usable
    assert state(srv, "q") == before


@pytest.mark.parametrize(
    "argv, text",
    [
        (("FOOBAR",), "ERR unknown command 'FOOBAR'"),
        (("foobar", "a", "b"), "ERR unknown command 'foobar'"),
        (("SET", "k", "v"), "ERR unknown command 'SET'"),
        (("",), "ERR unknown command ''"),
    ],
)
def test_unknown_command(srv: ServerProcess, argv: tuple[str, ...], text: str) -> None:
    before = state(srv)
    with RawConnection(srv.port) as c:
        assert c.call(*argv) == ("-", text)
        assert c.call("PING") == ("+", "PONG")
    assert state(srv) == before


@pytest.mark.parametrize(
    "argv, text",
    [
        # Recorded replies of the reference server.
        (("ADDJOB", "bq", "b", "abc"), "ERR timeout is not an integer or out of range"),
        (("GETJOB", "NOHANG", "COUNT", "0", "FROM", "bq"), "ERR COUNT must be a number greater than zero"),
        # Redis's getTimeoutFromObjectOrReply and string2ll, which Disque reuses.
        (("ADDJOB", "bq", "b", "-1"), "ERR timeout is negative"),
        (("ADDJOB", "bq", "b", "1.5"), "ERR timeout is not an integer or out of range"),
        (("ADDJOB", "bq", "b", "99999999999999999999"), "ERR timeout is not an integer or out of range"),
        (("ADDJOB", "bq", "b", " 1"), "ERR timeout is not an integer or out of range"),
        (("GETJOB", "TIMEOUT", "abc", "FROM", "bq"), "ERR timeout is not an integer or out of range"),
        (("GETJOB", "TIMEOUT", "-5", "FROM", "bq"), "ERR timeout is negative"),
        (("GETJOB", "NOHANG", "COUNT", "-3", "FROM", "bq"), "ERR COUNT must be a number greater than zero"),
        (("QPEEK", "stable", "abc"), "ERR value is not an integer or out of range"),
        (("QPEEK", "stable", "1e3"), "ERR value is not an integer or out of range"),
        # Disque's addjobCommand: a value that is not a number gets the option's own text.
        (("ADDJOB", "bq", "b", "0", "RETRY", "x"), "ERR RETRY time must be a non negative number"),
        (("ADDJOB", "bq", "b", "0", "DELAY", "1.5"), "ERR DELAY time must be a non negative number"),
        (("ADDJOB", "bq", "b", "0", "TTL", "x"), "ERR TTL must be a number > 0"),
        (("ADDJOB", "bq", "b", "0", "MAXLEN", "x"), "ERR MAXLEN must be a positive number"),
        (("ADDJOB", "bq", "b", "0", "REPLICATE", "x"), "ERR REPLICATE must be between 1 and 65535"),
        (("GETJOB", "COUNT", "x", "FROM", "bq"), "ERR COUNT must be a number greater than zero"),
        # Past what Disque's 32-bit job fields hold: refused (Disque would truncate them).
        (("ADDJOB", "bq", "b", "0", "RETRY", "9223372036854775807"), "ERR RETRY must be at most 4294967295"),
        (("ADDJOB", "bq", "b", "0", "RETRY", "4294967296"), "ERR RETRY must be at most 4294967295"),
        (("ADDJOB", "bq", "b", "0", "DELAY", "4294967296"), "ERR DELAY must be at most 4294967295"),
        (("ADDJOB", "bq", "b", "0", "TTL", "4294967296"), "ERR TTL must be at most 4294967295"),
        (("ADDJOB", "bq", "b", "0", "RETRY", "99999999999999999999"), "ERR RETRY time must be a non negative number"),
        # Disque's parseScanCursorOrReply.
        (("QSCAN", "abc"), "ERR invalid cursor or option name"),
        (("QSCAN", "-1"), "ERR invalid cursor or option name"),
        (("JSCAN", "1x"), "ERR invalid cursor or option name"),
    ],
)
def test_bad_numbers(srv: ServerProcess, argv: tuple[str, ...], text: str) -> None:
    before = state(srv, "bq")
    with RawConnection(srv.port) as c:
        assert c.call(*argv) == ("-", text)
    assert state(srv, "bq") == before


@pytest.mark.parametrize(
    "argv",
    [
        ("ADDJOB", "bq", "b", "0", "DELAY", "abc"),
        ("ADDJOB", "bq", "b", "0", "DELAY", "-1"),
        ("ADDJOB", "bq", "b", "0", "TTL", "0"),
        ("ADDJOB", "bq", "b", "0", "TTL", "x"),
        ("ADDJOB", "bq", "b", "0", "RETRY", "-1"),
        ("ADDJOB", "bq", "b", "0", "MAXLEN", "0"),
        ("ADDJOB", "bq", "b", "0", "REPLICATE", "0"),
        ("ADDJOB", "bq", "b", "0", "REPLICATE", "70000"),
        ("ADDJOB", "bq", "b", "0", "DELAY"),  # option without its value
        ("GETJOB", "COUNT", "abc", "FROM", "bq"),
        ("GETJOB", "TIMEOUT", "10", "bq"),  # no FROM
    ],
)
def test_bad_options_are_refused(srv: ServerProcess, argv: tuple[str, ...]) -> None:
    # The texts differ between Disque versions; what matters is an ERR and no job/queue.
    before = state(srv, "bq")
    with RawConnection(srv.port) as c:
        reply = c.call(*argv)
        assert isinstance(reply, tuple) and reply[0] == "-" and reply[1].startswith("ERR "), reply
    assert state(srv, "bq") == before


@pytest.mark.parametrize(
    "verb", ["SHOW", "ACKJOB", "FASTACK", "WORKING", "NACK", "ENQUEUE", "DEQUEUE", "DELJOB"]
)
@pytest.mark.parametrize(
    "bad_id",
    ["bogus", "", GOOD_ID[:-1], GOOD_ID + "0", "X" + GOOD_ID[1:], GOOD_ID.replace("-", "_")],
    ids=["word", "empty", "short", "long", "prefix", "separators"],
)
def test_bad_job_id(srv: ServerProcess, verb: str, bad_id: str) -> None:
    before = state(srv)
    with RawConnection(srv.port) as c:
        assert c.call(verb, bad_id) == ("-", "BADID Invalid Job ID format.")
    assert state(srv) == before


@pytest.mark.parametrize("verb", ["ACKJOB", "FASTACK", "NACK", "DEQUEUE", "DELJOB"])
def test_one_bad_id_refuses_the_whole_command(srv: ServerProcess, verb: str) -> None:
    with RawConnection(srv.port) as c:
        job = c.call("ADDJOB", "mixed", "x", "0")
        assert job[0] == "+", job
        before = state(srv, "mixed")
        assert c.call(verb, job[1], "bogus") == ("-", "BADID Invalid Job ID format.")
        assert state(srv, "mixed") == before
        assert c.call("FASTACK", job[1]) == 1  # clean up for the next verb


# ---------------------------------------------------------------------------------------------
# Broken framing: Redis answers one protocol error and closes the connection


@pytest.mark.parametrize(
    "data, error",
    [
        (b"*1\r\n$x\r\n", b"invalid bulk length"),
        (b"*1\r\n$-1\r\n", b"invalid bulk length"),
        (b"*99999999999\r\n", b"invalid multibulk length"),
        (b"*1048577\r\n", b"invalid multibulk length"),
        (b"*x\r\n", b"invalid multibulk length"),
        (b"*2\r\n$4\r\nECHO\r\nx3\r\nabc\r\n", b"expected '$', got 'x'"),
        (b'ECHO "abc\r\n', b"unbalanced quotes in request"),
        (b"ECHO 'abc\r\n", b"unbalanced quotes in request"),
    ],
    ids=["bulk-x", "bulk-negative", "mbulk-huge", "mbulk-over-limit", "mbulk-x", "dollar",
         "double-quote", "single-quote"],
)
def test_protocol_error_then_close(srv: ServerProcess, data: bytes, error: bytes) -> None:
    before = state(srv)
    refused_and_closed(srv, data, b"-ERR Protocol error: " + error + b"\r\n")
    assert state(srv) == before


def test_commands_before_the_error_are_answered(srv: ServerProcess) -> None:
    refused_and_closed(srv, b"PING\r\n*1\r\n$4\r\nPING\r\n*1\r\n$x\r\n",
                       b"+PONG\r\n+PONG\r\n-ERR Protocol error: invalid bulk length\r\n")


def test_two_gigabyte_bulk_is_refused_at_once(srv: ServerProcess) -> None:
    # Only the header is sent: the server must refuse on it, not wait for 2 GB (or buffer it).
    before = state(srv)
    refused_and_closed(srv, b"*1\r\n$2147483648\r\n",
                       b"-ERR Protocol error: invalid bulk length\r\n", timeout=2.0)
    assert state(srv) == before


def test_huge_inline_line_without_newline(srv: ServerProcess) -> None:
    before = state(srv)
    refused_and_closed(srv, b"a" * (70 * 1024),
                       b"-ERR Protocol error: too big inline request\r\n")
    assert state(srv) == before


@pytest.mark.parametrize("seed", range(8))
def test_binary_garbage(srv: ServerProcess, seed: int) -> None:
    rng = random.Random(seed)
    garbage = bytes(rng.getrandbits(8) for _ in range(4096))
    before = state(srv)
    with RawConnection(srv.port) as watcher, RawConnection(srv.port) as bad:
        try:
            bad.send(garbage)
        except (BrokenPipeError, ConnectionResetError):
            pass
        ping(watcher)
        # The server may answer errors (garbage read as inline commands), close, or wait for
        # the rest of a frame the garbage started; all fine as long as it never answers
        # anything but errors and stays up.
        try:
            received = bad.read_until_closed(timeout=1.5)
        except TimeoutError:
            received = bad.buf
        pos = 0
        while True:
            try:
                reply, pos = parse_one(received, pos)
            except Incomplete:
                break
            assert isinstance(reply, tuple) and reply[0] == "-", (
                f"garbage (seed {seed}) got a non-error reply {reply!r}")
        ping(watcher)
    assert state(srv) == before


# ---------------------------------------------------------------------------------------------
# Inline commands and odd pacing


def test_inline_commands(srv: ServerProcess) -> None:
    with RawConnection(srv.port) as c:
        c.send(b"PING\r\n")
        assert c.reply() == ("+", "PONG")
        c.send(b"PING\n")
        assert c.reply() == ("+", "PONG")
        c.send(b'ADDJOB inl "a b" 0\r\n')
        job = c.reply()
        assert isinstance(job, tuple) and job[0] == "+", job
        c.send(b"QLEN inl\r\n")
        assert c.reply() == 1
        c.send(b"GETJOB NOHANG FROM inl\r\n")
        assert c.reply() == [[b"inl", job[1].encode(), b"a b"]]
        c.send(b"FASTACK " + job[1].encode() + b"\r\n")
        assert c.reply() == 1


def test_pipelined_mix_of_inline_and_multibulk(srv: ServerProcess) -> None:
    with RawConnection(srv.port) as c:
        c.send(b"PING\r\n" + encode_command("QLEN", "stable") + b"QLEN stable\r\n" * 100)
        assert c.reply() == ("+", "PONG")
        for _ in range(101):
            assert c.reply() == 1


def test_byte_by_byte_writer(srv: ServerProcess) -> None:
    data = encode_command("ADDJOB", "slow", "slow body", "0") + b"QLEN slow\r\n"
    with RawConnection(srv.port) as watcher, RawConnection(srv.port) as slow:
        for i in range(len(data)):
            slow.send(data[i : i + 1])
            time.sleep(0.002)
            if i % 16 == 0:
                ping(watcher)  # the slow client does not hold anybody up
        job = slow.reply()
        assert isinstance(job, tuple) and job[0] == "+", job
        assert slow.reply() == 1
        assert slow.call("FASTACK", job[1]) == 1


def test_partial_command_then_close(srv: ServerProcess) -> None:
    before = state(srv, "partial")
    with RawConnection(srv.port) as watcher:
        with RawConnection(srv.port) as bad:
            bad.send(b"*4\r\n$6\r\nADDJOB\r\n$7\r\npartial\r\n$4\r\nbo")
            ping(watcher)  # served while the half command sits in the server
        ping(watcher)
        time.sleep(0.1)
    assert state(srv, "partial") == before


def test_partial_command_then_reset(srv: ServerProcess) -> None:
    before = state(srv, "partial")
    bad = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    bad.sendall(b"*4\r\n$6\r\nADDJOB\r\n$7\r\npartial\r\n$1048576\r\n" + b"x" * 1000)
    # SO_LINGER 0: close with a TCP reset instead of a clean FIN.
    bad.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    bad.close()
    time.sleep(0.1)
    assert state(srv, "partial") == before


def qstat_blocked(conn: RawConnection, queue: str) -> int:
    reply = conn.call("QSTAT", queue)
    if reply is None:
        return 0
    assert isinstance(reply, list) and b"blocked" in reply, reply
    return int(reply[reply.index(b"blocked") + 1])


def wait_blocked(conn: RawConnection, queue: str, n: int) -> None:
    deadline = time.monotonic() + 3
    while qstat_blocked(conn, queue) != n:
        assert time.monotonic() < deadline, f"QSTAT {queue} never showed {n} blocked client(s)"
        time.sleep(0.02)


@pytest.mark.parametrize("how", ["close", "reset"])
def test_blocked_client_disconnects(srv: ServerProcess, how: str) -> None:
    queue = f"blocked-{how}"
    with RawConnection(srv.port) as other:
        waiter = RawConnection(srv.port)
        waiter.send(encode_command("GETJOB", "TIMEOUT", "0", "FROM", queue))
        wait_blocked(other, queue, 1)
        ping(other)
        if how == "reset":
            waiter.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        waiter.close()
        wait_blocked(other, queue, 0)
        # The job must stay queued, not be handed to the client that is gone.
        job = other.call("ADDJOB", queue, "for nobody", "0")
        assert isinstance(job, tuple) and job[0] == "+", job
        time.sleep(0.1)
        assert other.call("QLEN", queue) == 1
        assert other.call("GETJOB", "NOHANG", "FROM", queue) == [[queue.encode(), job[1].encode(), b"for nobody"]]
        assert other.call("FASTACK", job[1]) == 1


def test_blocked_client_times_out_with_null_array(srv: ServerProcess) -> None:
    with RawConnection(srv.port) as c:
        c.send(encode_command("GETJOB", "TIMEOUT", "50", "FROM", "nobody-adds"))
        assert c.raw_reply(timeout=3) == b"*-1\r\n"
        assert c.call("PING") == ("+", "PONG")



def test_job_goes_to_the_waiter_still_connected(srv: ServerProcess) -> None:
    # The first waiter leaves; the job must reach the second, not vanish into the first.
    queue = "two-waiters"
    with RawConnection(srv.port) as other, RawConnection(srv.port) as second:
        first = RawConnection(srv.port)
        first.send(encode_command("GETJOB", "TIMEOUT", "0", "FROM", queue))
        wait_blocked(other, queue, 1)
        second.send(encode_command("GETJOB", "TIMEOUT", "0", "FROM", queue))
        wait_blocked(other, queue, 2)
        first.close()
        wait_blocked(other, queue, 1)
        job = other.call("ADDJOB", queue, "for the second", "0")
        assert isinstance(job, tuple) and job[0] == "+", job
        assert second.reply(timeout=3) == [[queue.encode(), job[1].encode(), b"for the second"]]
        assert other.call("QLEN", queue) == 0
        assert other.call("FASTACK", job[1]) == 1
