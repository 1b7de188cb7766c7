"""Periodic timers on a real cluster of three ``trisque-server`` processes: the owner is
killed with SIGKILL, another node keeps firing, and no due time is delivered twice, also after
the killed node comes back from its append log."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.cluster import LocalCluster, wait_until
from tests.system.test_replicated_jobs import JOIN_WITHIN_S, Factory, joined

pytestmark = pytest.mark.cluster_processes

NODE_TIMEOUT_MS = 2000
DIRECTIVES = {"appendonly": "yes", "timer-min-period": "1"}


def timer(c: LocalCluster, i: int) -> dict[str, Any]:
    reply = c.call(i, "TIMER", "GET", "beat")
    assert isinstance(reply, list), reply
    return {reply[k].decode(): reply[k + 1] for k in range(0, len(reply), 2)}


def drain(c: LocalCluster, nodes: list[int], seen: dict[bytes, int]) -> int:
    """Take every queued job of the timer's queue from ``nodes`` and acknowledge it; count
    each job ID in ``seen``. Returns how many were taken."""
    taken = 0
    for i in nodes:
        while True:
            jobs = c.call(i, "GETJOB", "NOHANG", "COUNT", "100", "FROM", "beats")
            if not jobs:
                break
            for _, job_id, body in jobs:
                assert body == b"tick"
                seen[job_id] = seen.get(job_id, 0) + 1
                c.call(i, "ACKJOB", job_id)
                taken += 1
    return taken


def drain_until(c: LocalCluster, nodes: list[int], seen: dict[bytes, int], least: int) -> int:
    """``drain`` until at least ``least`` jobs were taken (fires come every second): returns
    how many were."""
    taken = 0

    def enough() -> bool:
        nonlocal taken
        taken += drain(c, nodes, seen)
        return taken >= least

    wait_until(enough, 20, f"{least} fired jobs on nodes {nodes}", interval=0.2)
    return taken


def test_owner_killed_another_node_keeps_firing_without_duplicates(
        local_cluster: Factory) -> None:
    c, ids = joined(local_cluster, 3, node_timeout_ms=NODE_TIMEOUT_MS,
                    directives=[DIRECTIVES] * 3)
    assert c.call(0, "TIMER", "ADD", "beat", "1", "beats", "tick") == b"OK"
    wait_until(lambda: all(timer(c, i)["last-fired-due"] for i in range(3)), 10,
               "the first fire, seen by every node")
    owners = {timer(c, i)["owner"].decode() for i in range(3)}
    assert len(owners) == 1, owners
    owner = ids.index(owners.pop())
    survivors = [i for i in range(3) if i != owner]
    seen: dict[bytes, int] = {}
    drain_until(c, [0, 1, 2], seen, 2)
    before = timer(c, survivors[0])["last-fired-due"]
    assert timer(c, survivors[0])["last-fired-by"].decode() == ids[owner]
    killed_ms = int(time.time() * 1000)
    c.kill(owner)

    def fired_by_survivor() -> Any:
        t = timer(c, survivors[0])
        by = t["last-fired-by"].decode()
        return by in (ids[s] for s in survivors) and t["last-fired-due"] > killed_ms and t

    t, took = wait_until(fired_by_survivor, 20, "a fire from a surviving node")
    print(f"owner node{owner} killed; node {t['last-fired-by'][:8].decode()} fired due time "
          f"{t['last-fired-due']} {took:.1f} s later (last fire before: {before})")
    after_kill = drain_until(c, survivors, seen, 3)
    assert after_kill >= 3, after_kill
    assert max(seen.values()) == 1, {k: v for k, v in seen.items() if v > 1}
    # The killed node comes back from its log and its table; still one job per due time.
    c.restart(owner)
    wait_until(lambda: c.mesh_ok([0, 1, 2], ids), JOIN_WITHIN_S, "the mesh after restart")
    wait_until(lambda: timer(c, owner)["last-fired-due"] >= t["last-fired-due"], 10,
               "the restarted node caught up")
    drain_until(c, [0, 1, 2], seen, 2)
    dups = {k: v for k, v in seen.items() if v > 1}
    assert not dups, dups
    fires = sum(timer(c, i)["fires"] for i in range(3))
    print(f"{len(seen)} jobs taken, none twice; fires counted by the live nodes: {fires}")
