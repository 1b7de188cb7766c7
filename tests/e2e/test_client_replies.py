"""CLIENT and LOADJOB against the reference Disque's recorded replies (the fixture's "CLIENT and
LOADJOB on one connection"), on one connection to a fresh trisque-server.

Errors and every other reply must match byte for byte. A CLIENT LIST line must carry Disque's
fields in Disque's order (Redis 7's ``lib-name`` and ``lib-ver`` may follow), with the
recorded values for the fields that do not vary from run to run; the varying ones (id, addr,
fd, age, idle, qbuf-free) are checked for their form.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import pytest

from tests.e2e.rawclient import RawConnection
from tests.e2e.reference import Exchange, load_section
from tests.support.server import ServerProcess

EXCHANGES = load_section("CLIENT and LOADJOB on one connection")
VARYING = {"id": r"\d+", "addr": r"127\.0\.0\.1:\d+", "fd": r"\d+", "age": r"\d+",
           "idle": r"\d+", "qbuf-free": r"\d+"}
EXTRA_FIELDS = ["lib-name", "lib-ver"]


def fields(line: str) -> list[tuple[str, str]]:
    return [tuple(item.split("=", 1)) for item in line.split(" ")]  # type: ignore[misc]


def check_client_list(expected: bytes, got: bytes) -> None:
    assert got.endswith(b"\n") and got.count(b"\n") == 1, got
    want, have = fields(expected.decode().rstrip("\n")), fields(got.decode().rstrip("\n"))
    assert [k for k, _ in have] == [k for k, _ in want] + EXTRA_FIELDS, got
    for (key, value), (_, ours) in zip(want, have, strict=False):
        if key in VARYING:
            assert re.fullmatch(VARYING[key], ours), (key, ours)
        else:
            assert ours == value, (key, ours, value)


@pytest.fixture(scope="module")
def replies() -> Iterator[list[object]]:
    with ServerProcess() as server, RawConnection(server.port) as conn:
        yield [conn.call(*exchange.argv) for exchange in EXCHANGES]


@pytest.mark.parametrize("index", range(len(EXCHANGES)), ids=[str(e) for e in EXCHANGES])
def test_reply_as_the_reference(replies: list[object], index: int) -> None:
    exchange: Exchange = EXCHANGES[index]
    got = replies[index]
    if exchange.argv == ("CLIENT", "LIST"):
        assert isinstance(got, bytes), got
        check_client_list(exchange.expected, got)
    else:
        assert got == exchange.expected


def test_client_list_flags_and_buffers_of_other_clients() -> None:
    """A blocked GETJOB shows ``b``, a MONITOR ``O``; a client with a half-sent command shows
    its unparsed bytes in ``qbuf``."""
    with ServerProcess() as server, RawConnection(server.port) as observer:
        blocked = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        monitor = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        partial = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        try:
            blocked.sendall(b"CLIENT SETNAME blocked\r\nGETJOB TIMEOUT 10000 FROM nothing\r\n")
            monitor.sendall(b"CLIENT SETNAME watcher\r\nMONITOR\r\n")
            partial.sendall(b"CLIENT SETNAME partial\r\n")
            assert blocked.recv(5) == b"+OK\r\n"
            assert monitor.recv(10) == b"+OK\r\n+OK\r\n"
            assert partial.recv(5) == b"+OK\r\n"
            partial.sendall(b"*2\r\n$4\r\nQLEN")
            rows: dict[str, dict[str, str]] = {}
            for _ in range(50):  # the node reads each socket in its own round
                listing = observer.call("CLIENT", "LIST").decode()
                rows = {dict(fields(r))["name"]: dict(fields(r)) for r in listing.splitlines()}
                if rows.get("partial", {}).get("qbuf") not in (None, "0") \
                        and rows.get("blocked", {}).get("flags") == "b":
                    break
            assert rows["blocked"]["flags"] == "b" and rows["blocked"]["cmd"] == "getjob"
            assert rows["watcher"]["flags"] == "O"
            assert int(rows["partial"]["qbuf"]) > 0
            assert rows[""]["flags"] == "N" and rows[""]["cmd"] == "client"
        finally:
            for sock in (blocked, monitor, partial):
                sock.close()
