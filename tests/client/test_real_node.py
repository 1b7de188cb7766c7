"""The client library and `trisque` against real trisque-server processes.

Everything else about the
client is covered against fake nodes in test_failover_fake.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
import trio

from client.aio import AsyncClient
from client.blocking import (
    BadIdError,
    Client,
    LeavingError,
    NoJobError,
    PausedError,
    TrisqueConnectionError,
)
from tests.support.server import REPO, ServerProcess, free_port

BINARY = bytes(range(256)) + b"\xff\xfe\x00\r\n"


@pytest.fixture(scope="module")
def node() -> Iterator[ServerProcess]:
    with ServerProcess() as n:
        yield n


@pytest.fixture
def client(node: ServerProcess) -> Iterator[Client]:
    c = Client([f"127.0.0.1:{node.port}"], socket_timeout=5)
    yield c
    c.close()


def test_binary_body_round_trip(client: Client) -> None:
    job_id = client.add_job("rt", BINARY)
    assert job_id.startswith("D-")
    jobs = client.get_job("rt", timeout_ms=1000, with_counters=True)
    assert [(j.queue, j.id, j.body, j.nacks) for j in jobs] == [("rt", job_id, BINARY, 0)]
    assert client.ack_job(job_id) == 1
    assert client.ack_job(job_id) == 0


def test_str_body_is_utf8(client: Client) -> None:
    job_id = client.add_job("utf", "caf\u00e9")
    assert client.show(job_id).body == b"caf\xc3\xa9"  # type: ignore[union-attr]
    client.del_job(job_id)


def test_queue_inspection(client: Client) -> None:
    ids = [client.add_job("insp", f"b{i}") for i in range(3)]
    assert client.qlen("insp") == 3
    assert [j.id for j in client.qpeek("insp", 2)] == ids[:2]
    stats = client.qstat("insp")
    assert stats is not None and stats.name == "insp" and stats.len == 3
    assert client.qstat("never-used") is None
    info = client.show(ids[0])
    assert info is not None and info.state == "queued" and info.queue == "insp"
    assert "insp" in set(client.qscan(count=2))
    assert set(ids) <= set(client.jscan(queue="insp"))
    assert {i.id for i in client.jscan_jobs(queue="insp", busyloop=True)} >= set(ids)
    assert client.dequeue(ids[0]) == 1 and client.qlen("insp") == 2
    assert client.enqueue(ids[0]) == 1
    assert client.del_job(*ids) == 3
    assert client.show(ids[0]) is None


def test_nohang_empty_and_errors(client: Client) -> None:
    assert client.get_job("empty-q", nohang=True) == []
    assert client.get_job("empty-q", timeout_ms=50) == []
    with pytest.raises(BadIdError):
        client.show("bogus")
    with pytest.raises(NoJobError):
        client.working("D-00000000-000000000000000000000000-0001")
    assert client.pause("pq", "in") == "in"
    with pytest.raises(PausedError):
        client.add_job("pq", b"x")
    assert client.pause("pq", "none") == "none"


def test_pipeline_in_order(client: Client) -> None:
    p = client.pipeline()
    p.add_job("pipe", b"1").add_job("pipe", b"2").qlen("pipe").execute_command("PING")
    job1, job2, length, pong = p.execute()
    assert length == 2 and pong == b"PONG"
    assert [j.body for j in client.get_job("pipe", count=2, timeout_ms=500)] == [b"1", b"2"]
    client.ack_job(job1, job2)


def test_hello_info_config(client: Client) -> None:
    hello = client.hello()
    assert len(hello.nodes) == 1 and hello.nodes[0].id == hello.my_id
    assert "registered_jobs" in client.info()
    assert client.ping() == "PONG"
    assert "cluster-node-timeout" in client.config_get("cluster-node-timeout")


async def test_async_round_trip(node: ServerProcess) -> None:
    with trio.fail_after(10):
        async with AsyncClient([f"127.0.0.1:{node.port}"]) as client:
            job_id = await client.add_job("aio", BINARY)
            jobs = await client.get_job("aio", timeout_ms=1000)
            assert [(j.id, j.body) for j in jobs] == [(job_id, BINARY)]
            assert await client.ack_job(job_id) == 1
            p = client.pipeline()
            p.qlen("aio").ping()
            assert await p.execute() == [0, "PONG"]


async def test_async_scans_follow_the_cursor_to_the_end(node: ServerProcess) -> None:
    # COUNT 2 over 7 jobs forces several pages: the async iterators must follow the cursor
    # instead of stopping after the first reply.
    with trio.fail_after(10):
        async with AsyncClient([f"127.0.0.1:{node.port}"]) as client:
            ids = [await client.add_job("aioscan", f"b{i}") for i in range(7)]
            names = [name async for name in client.qscan(count=2)]
            assert "aioscan" in names
            found = [job_id async for job_id in client.jscan(count=2, queue="aioscan")]
            assert set(found) == set(ids)
            infos = [i async for i in client.jscan_jobs(count=2, queue="aioscan",
                                                          states=["queued"])]
            assert {i.id for i in infos} == set(ids)
            assert {i.body for i in infos} == {f"b{i}".encode() for i in range(7)}
            assert all(i.queue == "aioscan" and i.state == "queued" for i in infos)
            assert await client.del_job(*ids) == 7
            assert [j async for j in client.jscan(queue="aioscan")] == []


@pytest.fixture
def two_nodes() -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with ServerProcess() as a, ServerProcess() as b:
        yield a, b


def test_results_and_chains(client: Client) -> None:
    parent = client.add_job("res", "work")
    child = client.add_job("res-next", "then", after=[parent])
    assert client.show(child).state == "waiting"  # type: ignore[union-attr]
    assert client.wait_job(parent, timeout_ms=50) is None
    assert client.resolve(parent, BINARY) == 1
    assert client.wait_job(parent) == BINARY
    assert client.show(child).state == "queued"  # type: ignore[union-attr]
    other = client.add_job("res", "x")
    client.del_job(other)
    unknown = other[:12] + ("A" if other[12] != "A" else "B") + other[13:]
    with pytest.raises(NoJobError):
        client.wait_job(unknown)


async def test_async_results(node: ServerProcess) -> None:
    async with AsyncClient([f"127.0.0.1:{node.port}"]) as c:
        job_id = await c.add_job("ares", "b")
        async with trio.open_nursery() as nursery:
            got: list[bytes | None] = []

            async def wait() -> None:
                got.append(await c.wait_job(job_id, timeout_ms=5000))

            nursery.start_soon(wait)
            await trio.sleep(0.2)
            assert await c.resolve(job_id, "done") == 1
        assert got == [b"done"]


def test_client_carries_on_when_its_node_is_killed(
        two_nodes: tuple[ServerProcess, ServerProcess]) -> None:
    a, b = two_nodes
    seeds = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]
    client = Client(seeds, socket_timeout=5, connect_timeout=1)
    client.add_job("k", b"first")
    used, other = (a, b) if client.address == ("127.0.0.1", a.port) else (b, a)
    used.kill()
    job_id = client.add_job("k", b"second")  # the pooled connection is dead: not sent there
    assert client.address == ("127.0.0.1", other.port)
    assert [j.id for j in client.get_job("k", timeout_ms=1000)] == [job_id]
    client.close()


def test_client_leaves_a_leaving_node(two_nodes: tuple[ServerProcess, ServerProcess]) -> None:
    a, b = two_nodes
    client = Client([f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], socket_timeout=5)
    client.ping()
    used, other = (a, b) if client.address == ("127.0.0.1", a.port) else (b, a)
    other_id = other.call("ADDJOB", "lv", "waiting", "0")
    assert used.call("CLUSTER", "LEAVING", "yes") == b"OK"
    jobs = client.get_job("lv", timeout_ms=1000)  # -LEAVING, then sent to the other node
    assert [j.id.encode() for j in jobs] == [other_id]
    assert client.address == ("127.0.0.1", other.port)
    assert client.add_job("lv", b"x").startswith("D-")
    client.close()


def test_all_nodes_leaving_surfaces_the_error(
        two_nodes: tuple[ServerProcess, ServerProcess]) -> None:
    a, b = two_nodes
    for n in (a, b):
        n.call("CLUSTER", "LEAVING", "yes")
    client = Client([f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], socket_timeout=5)
    with pytest.raises(LeavingError):
        client.add_job("q", b"x")
    client.close()


def test_no_node_left(two_nodes: tuple[ServerProcess, ServerProcess]) -> None:
    a, b = two_nodes
    client = Client([f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], connect_timeout=1)
    client.ping()
    a.kill()
    b.kill()
    with pytest.raises(TrisqueConnectionError):
        client.qlen("q")


def trisque(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, input=stdin,
                          capture_output=True, timeout=20)


def test_cli_against_a_node(node: ServerProcess) -> None:
    p = str(node.port)
    r = trisque("-p", p, "ADDJOB", "cliq", "hello", "0")
    job_id = r.stdout.decode().strip()
    assert r.returncode == 0 and job_id.startswith("D-")
    r = trisque("-p", p, "--no-raw", "QPEEK", "cliq", "1")
    assert r.stdout.decode() == f'1) 1) "cliq"\n   2) "{job_id}"\n   3) "hello"\n'
    r = trisque("-p", p, "--no-raw", "ADDJOB", "cliq", "x", "0", "FOO")
    assert r.stdout == b"(error) ERR syntax error\n" and r.returncode == 1
    # A non-UTF-8 body typed with \x escapes on stdin, read back as JSON bytes.
    r = trisque("-p", p, stdin=b'ADDJOB binq "\\xff\\x00z" 0\n')
    assert r.returncode == 0
    r = trisque("-p", p, "--json", "GETJOB", "NOHANG", "FROM", "binq")
    doc = json.loads(r.stdout)
    assert doc[0][0] == "binq" and doc[0][2] == {"$bytes": "/wB6"}
    r = trisque("-p", p, "--no-raw", "GETJOB", "NOHANG", "FROM", "binq")
    assert r.stdout == b"(nil)\n"
