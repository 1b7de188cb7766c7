"""Results and chains with real ``trisque-server`` processes: a client blocked in WAITJOB on a
node that does not hold the job gets its result, a result and a waiting chained job outlive
kill -9 (the append log), a child on one node is released by its parent's RESOLVE on
another, and a DEDUP queue finds a duplicate added on another node. The protocols are tested on the simulator (tests/cluster/test_results.py,
test_chains.py, tests/policies/test_dedup_cluster.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from protocol.resp import Error
from tests.support.cluster import LocalCluster, wait_until
from tests.support.server import ServerProcess, send_command

pytestmark = pytest.mark.cluster_processes

DURABLE = {"appendonly": "yes", "appendfsync": "always"}


def _joined(local_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    c = local_cluster(3, directives=[DURABLE] * 3)
    ids = [c.myid(i) for i in range(3)]
    for i in (1, 2):
        c.meet(i, 0)
    wait_until(lambda: c.mesh_ok([0, 1, 2], ids), 20.0, "a mesh of 3")
    return c


def _show(c: LocalCluster, i: int, job: str) -> dict[str, Any] | None:
    reply = c.call(i, "SHOW", job)
    return None if reply is None else {reply[k].decode(): reply[k + 1]
                                       for k in range(0, len(reply), 2)}


def test_waitjob_on_a_node_without_the_job_gets_the_result(
        local_cluster: Callable[..., LocalCluster]) -> None:
    c = _joined(local_cluster)
    job = c.call(0, "ADDJOB", "q", "work", "5000", "REPLICATE", "2").decode()
    outsider = next(i for i in (1, 2) if _show(c, i, job) is None)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(
        send_command(c.port(outsider), "WAITJOB", job, "TIMEOUT", "20000", timeout=30)))
    waiter.start()
    time.sleep(1.0)
    assert not got  # still waiting
    assert c.call(0, "RESOLVE", job, "the result") == 1
    waiter.join(30)
    assert got == [b"the result"]
    # A node that never held the job and an unknown ID.
    assert c.call(outsider, "WAITJOB", job) == b"the result"
    unknown = job[:-6] + ("X" if job[-6] != "X" else "Y") + job[-5:]
    assert isinstance(c.call(outsider, "WAITJOB", unknown, "TIMEOUT", "5000"), Error)


def test_a_result_outlives_kill_9(tmp_path: Any) -> None:
    with ServerProcess(directory=str(tmp_path), **DURABLE) as node:
        job = node.call("ADDJOB", "q", "work", "0").decode()
        assert node.call("RESOLVE", job, "kept") == 1
        node.kill()
        node.restart()
        assert node.call("WAITJOB", job) == b"kept"
        expired = node.call("ADDJOB", "q", "x", "0", "TTL", "1").decode()
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(
            send_command(node.port, "WAITJOB", expired, timeout=30)))
        waiter.start()
        waiter.join(30)
        assert len(got) == 1 and isinstance(got[0], Error) and got[0].startswith("EXPIRED")


def test_a_chain_across_nodes_and_kill_9(local_cluster: Callable[..., LocalCluster]) -> None:
    c = _joined(local_cluster)
    parent = c.call(0, "ADDJOB", "q", "first", "5000", "REPLICATE", "1").decode()
    child = c.call(1, "ADDJOB", "next", "second", "5000", "REPLICATE", "2", "AFTER",
                   parent).decode()
    shown = _show(c, 1, child)
    assert shown is not None and shown["state"] == b"waiting"
    assert shown["after"] == [parent.encode()]
    c.kill(1)  # kill -9: the waiting child comes back from the log
    c.restart(1)
    shown = _show(c, 1, child)
    assert shown is not None and shown["state"] == b"waiting"
    assert c.call(0, "RESOLVE", parent, "ok") == 1
    wait_until(lambda: (_show(c, 1, child) or {}).get("state") == b"queued", 20.0,
               "the child is queued once its parent is resolved")
    job = c.call(1, "GETJOB", "NOHANG", "FROM", "next")
    assert job[0][1].decode() == child


def test_a_duplicate_added_on_another_node(local_cluster: Callable[..., LocalCluster]) -> None:
    c = _joined(local_cluster)
    assert isinstance(c.call(0, "QPOLICY", "CREATE", "orders", "DEDUP", "yes"), list)
    wait_until(lambda: isinstance(c.call(2, "QPOLICY", "GET", "orders"), list), 10.0,
               "the policy on every node")
    first = c.call(0, "ADDJOB", "orders", "order-17", "5000", "REPLICATE", "1")
    time.sleep(0.5)  # the index entry's trip (a node asked too early adds its own job)
    assert c.call(2, "ADDJOB", "orders", "order-17", "5000", "REPLICATE", "1") == first
    assert c.call(1, "ADDJOB", "orders", "order-17", "5000", "REPLICATE", "1") == first
    c.call(1, "ACKJOB", first)  # node 1 does not hold it: a dummy ACK, SETACK to node 0
    wait_until(lambda: c.call(2, "ADDJOB", "orders", "order-17", "5000",
                              "REPLICATE", "1") != first, 10.0, "the ack ends the window")
