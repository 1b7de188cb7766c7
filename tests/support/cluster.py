"""Real multi-process clusters of ``trisque-server`` for the few tests that need them.

``LocalCluster`` starts N nodes (``tests.support.server.ServerProcess``) on free loopback ports
whose bus twin (port + 10000) is free too, each with its own ``dir`` under the test's tmp_path
and a short ``cluster-node-timeout``. Every wait is bounded: ``wait_until`` polls a predicate
until a deadline and fails with what it last saw. ``close()`` kills every process it started,
whatever state the test left them in; the ``local_cluster`` fixture calls it in a ``finally`` and
prints every node's log, which pytest shows only when the test failed.

Replies are parsed into small values so that tests assert on what a user reads:
``nodes(i)`` is CLUSTER NODES as ``{id: NodeLine}``, ``info(i)`` is CLUSTER INFO as a dict,
``hello(i)`` is HELLO as ``(myid, [(id, ip, port, priority), ...])``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support.server import ServerProcess, free_port

T = TypeVar("T")

# Short enough that failure detection and handshake expiry take a second or two, long enough
# that two busy cores running five Python processes do not make healthy nodes look failing.
NODE_TIMEOUT_MS = 1000


@dataclass(frozen=True)
class NodeLine:
    """One line of CLUSTER NODES: ``id ip:port flags ping_sent pong_received link-state``."""

    id: str
    addr: str
    flags: frozenset[str]
    ping_sent: int
    pong_received: int
    link: str

    @property
    def port(self) -> int:
        return int(self.addr.rsplit(":", 1)[1] or 0)


def parse_nodes(reply: Any) -> dict[str, NodeLine]:
    if not isinstance(reply, bytes):
        raise AssertionError(f"CLUSTER NODES replied {reply!r}")
    table = {}
    for line in reply.decode().splitlines():
        fields = line.split()
        if len(fields) != 6:
            raise AssertionError(f"CLUSTER NODES line has {len(fields)} fields, not 6: {line!r}")
        node_id, addr, flags, ping, pong, link = fields
        table[node_id] = NodeLine(node_id, addr, frozenset(flags.split(",")), int(ping),
                                  int(pong), link)
    return table


def parse_info(reply: Any) -> dict[str, str]:
    if not isinstance(reply, bytes):
        raise AssertionError(f"CLUSTER INFO replied {reply!r}")
    return dict(line.split(":", 1) for line in reply.decode().split("\r\n") if line)


def parse_hello(reply: Any) -> tuple[str, list[tuple[str, str, int, int]]]:
    if not (isinstance(reply, list) and reply and reply[0] == 1):
        raise AssertionError(f"HELLO replied {reply!r}")
    return reply[1].decode(), [(i.decode(), ip.decode(), int(port), int(prio))
                               for i, ip, port, prio in reply[2:]]


def free_ports(n: int) -> list[int]:
    """n client ports whose client and bus ports (p, p + 10000) are all free and all distinct:
    free_port alone holds nothing, so two calls may give 30000 and 20000, whose bus port is
    the other's client port."""
    ports: list[int] = []
    taken: set[int] = set()
    while len(ports) < n:
        p = free_port()
        if not {p, p + 10000} & taken:
            ports.append(p)
            taken |= {p, p + 10000}
    return ports


class WaitTimeout(AssertionError):
    pass


def wait_until(predicate: Callable[[], T], timeout: float, what: str,
               interval: float = 0.05) -> tuple[T, float]:
    """Poll ``predicate`` until it returns something true or ``timeout`` seconds pass; returns
    (its value, seconds waited). A predicate that raises OSError (a node not up yet) counts as
    false. On timeout, fails with ``what`` and the predicate's last value or error."""
    start = time.monotonic()
    deadline = start + timeout
    last: Any = None
    while True:
        try:
            value = predicate()
            if value:
                return value, time.monotonic() - start
            last = value
        except (OSError, ConnectionError) as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"not within {timeout:.1f} s: {what}; last: {last!r}")
        time.sleep(interval)


class LocalCluster:
    """N ``trisque-server`` processes; node i's data lives in ``base/node<i>``."""

    def __init__(self, base: Path, size: int, node_timeout_ms: int = NODE_TIMEOUT_MS,
                 directives: list[dict[str, Any]] | None = None) -> None:
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[ServerProcess] = []
        for i, port in enumerate(free_ports(size)):
            directory = base / f"node{i}"
            directory.mkdir(parents=True)
            extra = directives[i] if directives else {}
            self.nodes.append(ServerProcess(port=port, directory=str(directory),
                                            cluster_node_timeout=node_timeout_ms, **extra))

    # -- processes -------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        """Start every node at once (they boot in parallel), then wait for each to answer."""
        for node in self.nodes:
            node.start(wait=False)
        for node in self.nodes:
            node.wait_ready()
        return self

    def kill(self, i: int) -> None:
        """SIGKILL node i and reap it: it is gone when this returns."""
        self.nodes[i].kill()

    def restart(self, i: int) -> None:
        """Start node i again on its port and dir (after ``kill`` or a stop)."""
        node = self.nodes[i]
        node.stop()
        if getattr(node, "_logfile", None):
            node._logfile.close()
        node.start()

    def close(self) -> None:
        """Kill every process still running (SIGKILL: a test's end needs no snapshot)."""
        for node in self.nodes:
            try:
                node.kill()
            except Exception:  # noqa: BLE001 - keep killing the others
                if node.proc is not None:
                    node.proc.kill()
            if getattr(node, "_logfile", None):
                node._logfile.close()

    def logs(self) -> str:
        return "\n".join(f"----- node{i} (port {n.port}, {n.log_path}) -----\n{n.log()}"
                         for i, n in enumerate(self.nodes))

    # -- commands --------------------------------------------------------------------------

    def call(self, i: int, *args: Any) -> Any:
        return self.nodes[i].call(*args)

    def port(self, i: int) -> int:
        return self.nodes[i].port

    def meet(self, i: int, j: int) -> None:
        """CLUSTER MEET from node i to node j."""
        reply = self.call(i, "CLUSTER", "MEET", "127.0.0.1", self.port(j))
        assert reply == b"OK", f"CLUSTER MEET from node{i} to node{j}: {reply!r}"

    def myid(self, i: int) -> str:
        reply = self.call(i, "CLUSTER", "MYID")
        assert isinstance(reply, bytes) and len(reply) == 40, reply
        return reply.decode()

    def nodes_of(self, i: int) -> dict[str, NodeLine]:
        return parse_nodes(self.call(i, "CLUSTER", "NODES"))

    def info(self, i: int) -> dict[str, str]:
        return parse_info(self.call(i, "CLUSTER", "INFO"))

    def hello(self, i: int) -> tuple[str, list[tuple[str, str, int, int]]]:
        return parse_hello(self.call(i, "HELLO"))

    def mesh_ok(self, members: list[int], ids: list[str]) -> bool:
        """Every node of ``members`` lists exactly the nodes of ``members`` at their client
        ports, itself as ``myself``, every other one as ``noflags`` with a connected link."""
        want = {ids[m]: self.port(m) for m in members}
        for m in members:
            table = self.nodes_of(m)
            if {k: v.port for k, v in table.items()} != want:
                return False
            for node_id, line in table.items():
                expect = {"myself"} if node_id == ids[m] else {"noflags"}
                if line.flags != expect or line.link != "connected":
                    return False
        return True


@pytest.fixture
def local_cluster(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """A factory ``local_cluster(size, node_timeout_ms=..., directives=[{...}, ...])`` of
    started clusters; every process is killed at the end, and the logs printed (shown on
    failure)."""
    made: list[LocalCluster] = []

    def make(size: int, **kwargs: Any) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"cluster{len(made)}", size, **kwargs)
        made.append(cluster)
        return cluster.start()

    try:
        yield make
    finally:
        for cluster in made:
            cluster.close()
        for cluster in made:
            print(cluster.logs())
