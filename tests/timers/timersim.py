"""``tests/cluster/jobsim.JobCluster`` with the periodic timer core (cluster/periodic_sync.py)
plugged in through ``core_factories``, and a record of every fire: which node fired which due
time of which timer, and what ADDJOB answered."""

from __future__ import annotations

from typing import Any

import pytest

from broker import periodic
from cluster.periodic_sync import PeriodicSync
from cluster.sim import Sim, SimNode
from cluster.wiring import attach
from tests.cluster.jobsim import JobCluster, SimJobNode


class TimerCluster(JobCluster):
    def __init__(self, monkeypatch: pytest.MonkeyPatch, n: int = 3, seed: int = 1,
                 tick_ms: int = 20, node_timeout: int = 2000) -> None:
        self.federation = False
        self.logs = {}
        self.blocked_replies = {}
        self.trace = []
        self.sends = []
        self._client_ids = 0
        self.syncs: dict[int, PeriodicSync] = {}
        # (time, node index, timer name, due time, ADDJOB's reply) of every fire
        self.fires: list[tuple[int, int, bytes, int, Any]] = []
        made: dict[int, SimJobNode] = {}

        def job_core(node: SimNode, now: int) -> Any:
            node.config.set("timer-min-period", ["1"])
            made[node.index] = SimJobNode(self, node, now)
            return made[node.index]

        def timer_core(node: SimNode, now: int) -> Any:
            sync = PeriodicSync(made[node.index].broker, node.membership, node.rng, now)
            attach(made[node.index].broker, timers=sync)
            self.syncs[node.index] = sync
            # Each core's own fire function, not the module's: compiled, the module calls
            # broker.periodic.fire directly, past a monkeypatched module attribute.
            monkeypatch.setattr(sync, "fire_due", recording_fire)
            return sync

        def recording_fire(b: Any, e: Any, due: int, now_ms: int) -> Any:
            reply = periodic.fire(b, e, due, now_ms)
            index = next(i for i, m in made.items() if m.broker is b)
            self.fires.append((now_ms, index, e.name, due, reply))
            return reply
        self.sim = Sim(seed, tick_ms=tick_ms, core_factories=(job_core, timer_core))
        for _ in range(n):
            self.sim.add_node(node_timeout=node_timeout)
        if n > 1:
            self.sim.meet_all()
            assert self.sim.run_until(self.meshed, 20_000), "the cluster did not form"

    def dues(self, name: bytes = b"t") -> list[int]:
        """The due times fired for ``name``, in the order they were fired (a repeat is a
        double fire)."""
        return [due for _, _, n, due, _ in self.fires if n == name]

    def owner(self, i: int, name: bytes = b"t") -> int:
        """The index of the node that owns ``name`` in node ``i``'s view."""
        node_id = self.syncs[i].owner(name)
        return next(k for k, n in enumerate(self.sim.nodes) if n.node_id == node_id)

    def info(self, i: int, name: str = "t") -> dict[bytes, Any]:
        reply = self.cmd(i, "TIMER", "GET", name)
        assert isinstance(reply, list), reply
        return dict(zip(reply[::2], reply[1::2], strict=True))
