"""Failover, rebalance, auth and timeouts against in-process fake nodes (both flavours).

The fakes answer HELLO with whatever cluster the test describes, so these tests reach the
corners a single real node cannot: a node that says it is leaving, a cut in mid-command.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest
import trio

from client.aio import AsyncClient
from client.blocking import (
    AuthError,
    Client,
    LeavingError,
    TrisqueConnectionError,
    TrisqueTimeoutError,
)
from protocol.resp import Error, Status
from tests.client.fake_node import CLOSE, FakeNode
from tests.support.server import free_port

LEAVING = Error("LEAVING This node is leaving the cluster, please connect to a different one")


class Cluster:
    """Fake nodes whose HELLO lists all of them. ``behaviour[name]`` handles other commands."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.ids = {n: (n * 40)[:40] for n in names}  # node IDs like "aaaa..."
        self.priority = dict.fromkeys(names, 1)
        self.behaviour: dict[str, Callable[[list[bytes]], Any]] = {}
        self.nodes: dict[str, FakeNode] = {}

    def handler(self, name: str) -> Callable[[list[bytes]], Any]:
        def handle(argv: list[bytes]) -> Any:
            cmd = argv[0].upper()
            if cmd == b"HELLO":
                return [1, self.ids[name].encode()] + [
                    [self.ids[n].encode(), b"127.0.0.1", str(self.nodes[n].port).encode(),
                     str(self.priority[n]).encode()] for n in self.names]
            if cmd == b"PING":
                return Status("PONG")
            if name in self.behaviour:
                return self.behaviour[name](argv)
            return Error("ERR unknown command")
        return handle


@contextmanager
def cluster(*names: str) -> Iterator[Cluster]:
    c = Cluster(list(names))
    with ExitStack() as stack:
        for n in names:
            c.nodes[n] = stack.enter_context(FakeNode(c.handler(n)))
        yield c


def job_reply(queue: str, producer: str) -> Any:
    return [[queue.encode(), f"D-{producer[:8]}-AAAAAAAAAAAAAAAAAAAAAAAA-05a1".encode(), b"x"]]


def test_dead_seed_is_skipped() -> None:
    with cluster("a") as c:
        client = Client([f"127.0.0.1:{free_port()}", c.nodes["a"].address], socket_timeout=2)
        for _ in range(5):
            assert client.ping() == "PONG"
        assert client.address == ("127.0.0.1", c.nodes["a"].port)
        client.close()


def test_no_reachable_node_is_a_connection_error() -> None:
    client = Client([f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"], connect_timeout=1)
    with pytest.raises(TrisqueConnectionError) as info:
        client.ping()
    assert "no trisque node reachable" in str(info.value)
    assert isinstance(info.value, ConnectionError)


def test_leaving_node_at_connect_sends_client_to_another() -> None:
    with cluster("a", "b") as c:
        c.priority["a"] = 100
        client = Client([c.nodes["a"].address], socket_timeout=2)
        client.ping()
        assert client.address == ("127.0.0.1", c.nodes["b"].port)
        client.close()


def test_getjob_retried_on_other_node_after_leaving_reply() -> None:
    with cluster("a", "b") as c:
        c.behaviour["a"] = lambda argv: LEAVING
        c.behaviour["b"] = lambda argv: job_reply("q", c.ids["b"])
        client = Client([c.nodes["a"].address], socket_timeout=2)
        client.selector.rng.seed(0)
        # Whichever node HELLO made current first, the job comes from b.
        for _ in range(3):
            jobs = client.get_job("q", timeout_ms=100)
            assert [j.queue for j in jobs] == ["q"]
        assert client.address == ("127.0.0.1", c.nodes["b"].port)
        client.close()


def test_addjob_after_leaving_reply_goes_to_other_node_once() -> None:
    with cluster("a", "b") as c:
        c.behaviour["a"] = lambda argv: LEAVING
        c.behaviour["b"] = lambda argv: LEAVING
        client = Client([c.nodes["a"].address], socket_timeout=2)
        with pytest.raises(LeavingError):
            client.add_job("q", b"x")
        adds = [cmd for n in c.nodes.values() for cmd in n.commands if cmd[0] == b"ADDJOB"]
        assert len(adds) == 2  # tried once, retried once, then the error is the caller's
        client.close()


def test_cut_connection_does_not_resend_addjob() -> None:
    with cluster("a", "b") as c:
        c.priority["b"] = 2  # HELLO makes a the best, so the client stays on a
        c.behaviour["a"] = lambda argv: CLOSE
        c.behaviour["b"] = lambda argv: Status("D-bbbbbbbb-x")
        client = Client([c.nodes["a"].address], socket_timeout=2)
        with pytest.raises(TrisqueConnectionError):
            client.add_job("q", b"body")  # may have been applied: not sent again
        assert any(cmd[0] == b"ADDJOB" for cmd in c.nodes["a"].commands)
        assert not any(cmd[0] == b"ADDJOB" for cmd in c.nodes["b"].commands)
        # The next command goes to the other node.
        assert client.add_job("q", b"body") == "D-bbbbbbbb-x"
        client.close()


def test_cut_connection_getjob_moves_to_known_node() -> None:
    with cluster("a", "b") as c:
        c.behaviour["a"] = lambda argv: CLOSE
        c.behaviour["b"] = lambda argv: job_reply("q", c.ids["b"])
        c.priority["b"] = 2  # HELLO makes a the best, so the client starts on a
        client = Client([c.nodes["a"].address], socket_timeout=2)
        jobs = client.get_job("q", timeout_ms=10)
        assert jobs and jobs[0].id.startswith("D-bbbbbbbb")
        assert client.address == ("127.0.0.1", c.nodes["b"].port)
        assert any(cmd[0] == b"GETJOB" for cmd in c.nodes["a"].commands)
        client.close()


def test_rebalance_moves_consumer_to_dominant_producer() -> None:
    with cluster("a", "b") as c:
        c.priority["b"] = 2
        c.behaviour["a"] = lambda argv: job_reply("q", c.ids["b"])
        c.behaviour["b"] = lambda argv: job_reply("q", c.ids["b"])
        client = Client([c.nodes["a"].address], socket_timeout=2, rebalance_consumers=True,
                        rebalance_window=8)
        for _ in range(8):
            client.get_job("q", timeout_ms=10)
        client.get_job("q", timeout_ms=10)
        assert client.address == ("127.0.0.1", c.nodes["b"].port)
        assert any(cmd[0] == b"GETJOB" for cmd in c.nodes["b"].commands)
        client.close()


def test_without_rebalance_consumer_stays() -> None:
    with cluster("a", "b") as c:
        c.priority["b"] = 2
        c.behaviour["a"] = lambda argv: job_reply("q", c.ids["b"])
        client = Client([c.nodes["a"].address], socket_timeout=2)
        for _ in range(20):
            client.get_job("q", timeout_ms=10)
        assert client.address == ("127.0.0.1", c.nodes["a"].port)
        client.close()


def test_auth_sent_first_and_wrong_password_raises() -> None:
    def handle(argv: list[bytes]) -> Any:
        if argv[0] == b"AUTH":
            return Status("OK") if argv[1] == b"secret" else Error("ERR invalid password")
        if argv[0] == b"PING":
            return Status("PONG")
        return Error("ERR no")

    with FakeNode(handle) as node:
        good = Client([node.address], password="secret", cluster_aware=False)
        assert good.ping() == "PONG"
        assert node.commands[0] == [b"AUTH", b"secret"]
        good.close()
        with pytest.raises(AuthError):
            Client([node.address], password="nope", cluster_aware=False).ping()


def test_slow_node_times_out() -> None:
    def handle(argv: list[bytes]) -> Any:
        time.sleep(1.0)
        return Status("PONG")

    with FakeNode(handle) as node:
        client = Client([node.address], socket_timeout=0.2, cluster_aware=False)
        start = time.monotonic()
        with pytest.raises(TrisqueTimeoutError):
            client.ping()
        assert time.monotonic() - start < 0.9
        client.close()


async def test_async_client_fails_over_on_leaving_and_cut() -> None:
    with cluster("a", "b") as c:
        c.priority["b"] = 2
        c.behaviour["a"] = lambda argv: LEAVING if argv[0] == b"ADDJOB" else CLOSE
        c.behaviour["b"] = lambda argv: (Status("D-bbbbbbbb-y") if argv[0] == b"ADDJOB"
                                         else job_reply("q", c.ids["b"]))
        with trio.fail_after(10):
            async with AsyncClient([c.nodes["a"].address], socket_timeout=2) as client:
                assert await client.add_job("q", b"x") == "D-bbbbbbbb-y"
                assert client.address == ("127.0.0.1", c.nodes["b"].port)
                jobs = await client.get_job("q", timeout_ms=10)
                assert jobs[0].body == b"x"


async def test_async_slow_node_times_out() -> None:
    def handle(argv: list[bytes]) -> Any:
        time.sleep(1.0)
        return Status("PONG")

    with FakeNode(handle) as node:
        with trio.fail_after(5):
            async with AsyncClient([node.address], socket_timeout=0.2,
                                   cluster_aware=False) as client:
                with pytest.raises(TrisqueTimeoutError):
                    await client.ping()
