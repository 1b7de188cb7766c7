"""Whole nodes in-process with their cluster bus on (node/server.py + node/bus.py + the
membership core), over loopback, on trio's mock clock: joining through CLUSTER MEET, bad input
on the bus port while clients are served, nodes.conf written atomically and reloaded, a
restarted peer rejoining without a MEET, CLUSTER RESET HARD changing the job IDs' node."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from broker.config import Config
from cluster.wire import WIRE_VERSION
from node.bus import BUS_PORT_OFFSET
from node.clock import TrioClock
from node.server import Server
from tests.server.test_inprocess import Conn, connect
from tests.support.server import free_port


@asynccontextmanager
async def node(directory: Path, port: int | None = None,
               **settings: str) -> AsyncIterator[tuple[Server, Conn]]:
    cfg = Config()
    cfg.set("cluster-node-timeout", ["2000"])
    for name, value in settings.items():
        cfg.set(name.replace("_", "-"), [value])
    cfg.set("bind", ["127.0.0.1"])
    cfg.set("dir", [str(directory)])
    cfg.set("port", [str(port or free_port())])
    async with trio.open_nursery() as nursery:
        server = Server(cfg, clock=TrioClock())
        await nursery.start(server.run)
        conn = await connect(cfg.port)
        yield server, conn
        await conn.stream.aclose()
        server.shutdown_event.set()


async def until(predicate: Callable[[], bool], timeout: float = 30) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


def known(server: Server) -> set[str]:
    return {n.decode() for n, *_ in server.broker.hello_nodes()}


def linked(server: Server, others: list[Server]) -> bool:
    want = {s.node_id for s in others} | {server.node_id}
    return known(server) == want and server.broker.reachable_nodes() == len(others)


async def test_three_nodes_join_through_one_meet_each(tmp_path: Path,
                                                     autojump_clock: trio.abc.Clock) -> None:
    dirs = [tmp_path / n for n in "abc"]
    for d in dirs:
        d.mkdir()
    async with node(dirs[0]) as (a, ca), node(dirs[1]) as (b, cb), node(dirs[2]) as (c, cc):
        start = trio.current_time()
        assert await cb.call("CLUSTER", "MEET", "127.0.0.1", a.config.port) == b"OK"
        assert await cc.call("CLUSTER", "MEET", "127.0.0.1", a.config.port) == b"OK"
        nodes = [a, b, c]
        await until(lambda: all(linked(n, [m for m in nodes if m is not n]) for n in nodes))
        joined = trio.current_time() - start
        assert joined < 10, joined
        # Each node's plain links (one out, one in per peer) are read by its reactor's loop.
        for n in nodes:
            assert len(n.reactor.links) == 4
            assert set(n.reactor.links.values()) == set(n.bus.links.values())
        listing = await ca.call("CLUSTER", "NODES")
        assert isinstance(listing, bytes)
        assert {line.split()[0] for line in listing.decode().splitlines()} == {
            a.node_id, b.node_id, c.node_id}
        info = await ca.call("CLUSTER", "INFO")
        assert b"cluster_known_nodes:3" in info  # type: ignore[operator]
        assert b"cluster_reachable_nodes:2" in info  # type: ignore[operator]
        # Each node's table is in its nodes.conf.
        for n in nodes:
            await n.nodes_file.flush()
        assert all(n.node_id in (d / "nodes.conf").read_text() for d in dirs for n in nodes)


async def test_garbage_on_the_bus_port_while_clients_are_served(
        tmp_path: Path, autojump_clock: trio.abc.Clock,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="trisque")
    async with node(tmp_path) as (a, ca):
        for data in (b"GET / HTTP/1.0\r\n\r\n", os.urandom(4096) + b"\x00",
                     b"TQCB" + bytes([WIRE_VERSION]) + b"\x00\x00\x01" + b"f" * 40
                     + b"\xff\xff\xff\xff"):
            stream = await trio.open_tcp_stream("127.0.0.1", a.config.port + BUS_PORT_OFFSET)
            await stream.send_all(data)
            with trio.fail_after(5):
                while await stream.receive_some(4096):
                    pass
            await stream.aclose()
            assert await ca.call("PING") == b"PONG"
        silent = await trio.open_tcp_stream("127.0.0.1", a.config.port + BUS_PORT_OFFSET)
        with trio.fail_after(30):
            assert await silent.receive_some(10) == b""
        assert await ca.call("PING") == b"PONG"
        lines = [r.getMessage() for r in caplog.records if r.name == "trisque.bus"]
        assert sum("BadMagic" in line for line in lines) == 1, lines
        assert sum("Oversized" in line for line in lines) == 1, lines
        assert sum("no complete frame" in line for line in lines) == 1, lines
        assert known(a) == {a.node_id}


async def test_nodes_conf_is_reloaded_and_a_restarted_peer_rejoins(
        tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    da, db = tmp_path / "a", tmp_path / "b"
    da.mkdir()
    db.mkdir()
    b_port = free_port()
    async with node(da) as (a, ca):
        async with node(db, b_port) as (b, cb):
            b_id = b.node_id
            await cb.call("CLUSTER", "MEET", "127.0.0.1", a.config.port)
            await until(lambda: linked(a, [b]) and linked(b, [a]))
        # b is down: its file has its ID and a's address; no temporary file is left behind.
        text = (db / "nodes.conf").read_text()
        assert b_id in text and a.node_id in text
        assert sorted(os.listdir(db)) == ["nodes.conf"]
        async with node(db, b_port) as (b2, cb2):
            assert b2.node_id == b_id  # the same node
            await until(lambda: linked(a, [b2]) and linked(b2, [a]))  # and no MEET
            assert (await cb2.call("CLUSTER", "MYID")) == b_id.encode()


async def test_cluster_reset_hard_gives_new_job_ids_a_new_node_id(
        tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    async with node(tmp_path) as (a, ca):
        old = a.node_id
        assert (await ca.call("ADDJOB", "q", "x", 0)).startswith(f"D-{old[:8]}".encode())  # type: ignore[union-attr]
        assert await ca.call("CLUSTER", "RESET", "HARD") == b"OK"
        new = (await ca.call("CLUSTER", "MYID")).decode()  # type: ignore[union-attr]
        assert new != old and a.node_id == new
        assert (await ca.call("ADDJOB", "q", "x", 0)).startswith(f"D-{new[:8]}".encode())  # type: ignore[union-attr]
        await a.nodes_file.flush()
        assert new in (tmp_path / "nodes.conf").read_text()


async def test_config_of_the_bus(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    async with node(tmp_path, cluster_secret="s3cret") as (a, ca):
        assert await ca.call("CONFIG", "GET", "cluster-secret") == [b"cluster-secret",
                                                                    b"(hidden)"]
        assert a.bus.secret == b"s3cret"
        reply = await ca.call("CONFIG", "SET", "cluster-secret", "x")
        assert "Unsupported" in str(reply)
        assert await ca.call("CONFIG", "SET", "cluster-node-timeout", "5000") == b"OK"
        assert a.bus.node_timeout == 5.0
    (tmp_path / "plain").mkdir()
    async with node(tmp_path / "plain") as (_, cb):
        assert await cb.call("CONFIG", "GET", "cluster-secret") == [b"cluster-secret", b""]


def test_a_corrupt_nodes_conf_is_refused_by_the_server_constructor(tmp_path: Path) -> None:
    (tmp_path / "nodes.conf").write_text("a" * 40 + " :7711 myself 0 0 connected\n"
                                         "garbage line\n")
    cfg = Config()
    cfg.set("dir", [str(tmp_path)])
    from node.server import ServerError

    with pytest.raises(ServerError, match=r"nodes\.conf.*line 2"):
        Server(cfg)
    assert "garbage" in (tmp_path / "nodes.conf").read_text()  # never reset


def test_a_missing_nodes_conf_is_written_at_once(tmp_path: Path) -> None:
    cfg = Config()
    cfg.set("dir", [str(tmp_path)])
    server = Server(cfg)
    assert server.node_id in (tmp_path / "nodes.conf").read_text()
    assert Server(cfg).node_id == server.node_id


async def test_nodes_with_different_secrets_never_join(
        tmp_path: Path, autojump_clock: trio.abc.Clock,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="trisque")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with node(tmp_path / "a", cluster_secret="one") as (a, _), \
            node(tmp_path / "b", cluster_secret="two") as (b, cb):
        assert await cb.call("CLUSTER", "MEET", "127.0.0.1", a.config.port) == b"OK"
        await trio.sleep(10)  # 5 node timeouts: the handshake entry is long gone
        assert known(a) == {a.node_id} and known(b) == {b.node_id}
        lines = [r.getMessage() for r in caplog.records if "BadMac" in r.getMessage()]
        assert len(lines) == 1, lines  # b retries several times: one line per peer address
        assert a.bus.counters["links_dropped_bad_frame"] >= 2


async def test_config_rewrite_keeps_the_secret(tmp_path: Path,
                                               autojump_clock: trio.abc.Clock) -> None:
    conf = tmp_path / "node.conf"
    conf.write_text("cluster-secret s3cret\nhz 10\n")
    cfg_dir = tmp_path / "data"
    cfg_dir.mkdir()
    async with node(cfg_dir, cluster_secret="s3cret") as (a, ca):
        a.config.config_file = str(conf)  # as if started with it
        assert await ca.call("CONFIG", "SET", "cluster-node-timeout", "3000") == b"OK"
        assert await ca.call("CONFIG", "REWRITE") == b"OK"
    text = conf.read_text()
    assert "cluster-secret s3cret" in text and "cluster-node-timeout 3000" in text


async def test_a_busy_bus_port_stops_the_start_with_one_line(tmp_path: Path) -> None:
    from node.server import ServerError

    port = free_port()
    cfg = Config()
    for name, value in (("bind", "127.0.0.1"), ("dir", str(tmp_path)), ("port", str(port))):
        cfg.set(name, [value])
    with socket.create_server(("127.0.0.1", port + BUS_PORT_OFFSET)):
        with pytest.raises(ServerError, match=f"127.0.0.1:{port + BUS_PORT_OFFSET}.*bus"):
            await Server(cfg).run()
    # The client port was given back: the node starts once the bus port is free.
    async with node(tmp_path, port) as (_, conn):
        assert await conn.call("PING") == b"PONG"


async def test_the_leaving_flag_survives_a_restart(tmp_path: Path,
                                                   autojump_clock: trio.abc.Clock) -> None:
    port = free_port()
    async with node(tmp_path, port) as (a, ca):
        assert await ca.call("CLUSTER", "LEAVING", "yes") == b"OK"
    async with node(tmp_path, port) as (a, ca):
        assert await ca.call("CLUSTER", "LEAVING") == b"yes"
        assert "leaving" in str(await ca.call("ADDJOB", "q", "x", 0))
