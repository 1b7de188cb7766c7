"""``tests/cluster/jobsim.JobCluster`` with the policy core (cluster/policy_sync.py) plugged in
through ``core_factories``, as the runtime routes frames by ``HANDLES``."""

from __future__ import annotations

from typing import Any

from cluster.policy_sync import PolicySync
from cluster.sim import Sim, SimNode
from cluster.wiring import attach
from tests.cluster.jobsim import JobCluster, SimJobNode


class PolicyCluster(JobCluster):
    def __init__(self, n: int = 3, seed: int = 1, tick_ms: int = 20,
                 node_timeout: int = 2000) -> None:
        self.federation = False
        self.logs = {}
        self.blocked_replies = {}
        self.trace = []
        self.sends = []
        self._client_ids = 0
        self.syncs: dict[int, PolicySync] = {}
        made: dict[int, SimJobNode] = {}

        def job_core(node: SimNode, now: int) -> Any:
            made[node.index] = SimJobNode(self, node, now)
            return made[node.index]

        def policy_core(node: SimNode, now: int) -> Any:
            sync = PolicySync(made[node.index].broker, node.membership, node.rng, now)
            attach(made[node.index].broker, policies=sync)
            self.syncs[node.index] = sync
            return sync

        self.sim = Sim(seed, tick_ms=tick_ms, core_factories=(job_core, policy_core))
        for _ in range(n):
            self.sim.add_node(node_timeout=node_timeout)
        self.sim.meet_all()
        assert self.sim.run_until(self.meshed, 20_000), "the cluster did not form"

    def policies(self, i: int) -> list[Any]:
        return self.cmd(i, "QPOLICY", "LIST")
