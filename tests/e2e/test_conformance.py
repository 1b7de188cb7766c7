"""Replies found to differ from Disque 1.0-rc1, each now as Disque (or Redis,
whose code Disque shares for these commands) gives it."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator

import pytest

from tests.e2e.rawclient import RawConnection
from tests.support.server import ServerProcess


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    with ServerProcess() as server:
        yield server


def test_info_cpu_header_and_commandstats_in_info_all(srv: ServerProcess) -> None:
    with RawConnection(srv.port) as c:
        c.call("ADDJOB", "cs", "x", "0")
        c.call("ADDJOB", "cs", "y", "0")
        default = c.call("INFO").decode()
        everything = c.call("INFO", "all").decode()
    assert "# CPU\r\n" in default and "# Cpu" not in default
    assert "# Commandstats" not in default
    assert "# Commandstats\r\n" in everything
    m = re.search(r"cmdstat_addjob:calls=(\d+),usec=(\d+),usec_per_call=(\d+\.\d\d)\r\n",
                  everything)
    assert m is not None, everything[-600:]
    assert int(m.group(1)) >= 2 and float(m.group(3)) > 0
    with RawConnection(srv.port) as c:
        assert c.call("CONFIG", "RESETSTAT") == ("+", "OK")
        assert "cmdstat_addjob" not in c.call("INFO", "commandstats").decode()


def test_client_list_shows_each_clients_command(srv: ServerProcess) -> None:
    with RawConnection(srv.port) as a, RawConnection(srv.port) as b:
        a.call("CLIENT", "SETNAME", "qlen-er")
        a.call("QLEN", "x")
        listing = b.call("CLIENT", "LIST").decode()
    line = next(row for row in listing.splitlines() if "name=qlen-er" in row)
    assert " cmd=qlen " in line
    mine = next(row for row in listing.splitlines() if " cmd=client " in row)
    assert mine


def test_client_kill_by_address_and_by_filter(srv: ServerProcess) -> None:
    with RawConnection(srv.port) as killer:
        victim = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        victim.sendall(b"CLIENT ID\r\n")
        victim_id = int(victim.recv(100)[1:-2])
        addr = f"127.0.0.1:{victim.getsockname()[1]}"
        assert killer.call("CLIENT", "KILL", addr) == ("+", "OK")
        assert victim.recv(100) == b""  # closed by the node
        assert killer.call("CLIENT", "KILL", addr) == ("-", "ERR No such client")
        other = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        other.sendall(b"CLIENT ID\r\n")
        other_id = int(other.recv(100)[1:-2])
        assert other_id != victim_id
        assert killer.call("CLIENT", "KILL", "ID", str(other_id)) == 1
        assert other.recv(100) == b""
        assert killer.call("CLIENT", "KILL", "TYPE", "master") == 0
        assert killer.call("CLIENT", "KILL", "TYPE", "bogus") == (
            "-", "ERR Unknown client type 'bogus'")
        assert killer.call("CLIENT", "KILL", "ID", "1", "ADDR") == ("-", "ERR syntax error")
        assert killer.call("PING") == ("+", "PONG")  # SKIPME yes by default
        victim.close()
        other.close()


def test_monitor_streams_commands_as_redis_does(srv: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as mon:
        mon.sendall(b"MONITOR\r\n")
        assert mon.recv(100) == b"+OK\r\n"
        with RawConnection(srv.port) as c:
            c.call("QLEN", 'a "quoted"\nname')
            c.call("AUTH", "secret")  # never shown: it carries a password
            c.call("PING")
        time.sleep(0.2)
        data = mon.recv(65536).decode()
    lines = data.splitlines()
    assert re.fullmatch(r'\+\d+\.\d{6} \[0 127\.0\.0\.1:\d+\] "QLEN" "a \\"quoted\\"\\nname"',
                        lines[0]), lines
    assert re.fullmatch(r'\+\d+\.\d{6} \[0 127\.0\.0\.1:\d+\] "PING"', lines[1]), lines
    assert "secret" not in data


def test_maxmemory_policy_takes_disques_values(srv: ServerProcess) -> None:
    with RawConnection(srv.port) as c:
        assert c.call("CONFIG", "SET", "maxmemory-policy", "noeviction") == ("+", "OK")
        assert c.call("CONFIG", "SET", "maxmemory-policy", "acks") == ("+", "OK")
        assert c.call("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")[0] == "-"
