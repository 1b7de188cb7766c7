"""``tests/cluster/jobsim.JobCluster`` with every core a node runs: membership, jobs,
federation, queue policies, periodic timers and the shared deduplication index, routed by ``HANDLES`` as the runtime does
(the bus fuzzer's simulator side). ``recorded`` holds every frame the nodes sent each other,
as ``(type, body)``: the real bodies of a workload."""

from __future__ import annotations

from typing import Any

from cluster.dedup_sync import DedupSync
from cluster.periodic_sync import PeriodicSync
from cluster.policy_sync import PolicySync
from cluster.sim import Sim, SimNode, _Link
from cluster.user_sync import UserSync
from cluster.wire import MessageType
from cluster.wiring import attach
from tests.cluster.jobsim import JobCluster, SimJobNode


class RecordingSim(Sim):
    """A ``Sim`` that keeps what every node sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recorded: list[tuple[MessageType, dict[str, Any]]] = []

    def _transmit(self, node: SimNode, link: _Link, to_dst: bool, kind: MessageType,
                  body: dict[str, Any]) -> None:
        self.recorded.append((kind, body))
        super()._transmit(node, link, to_dst, kind, body)


class AllCoresCluster(JobCluster):
    def __init__(self, n: int = 3, seed: int = 1, tick_ms: int = 20,
                 node_timeout: int = 2000, secret: bytes | None = None) -> None:
        self.federation = True
        self.logs = {}
        self.blocked_replies = {}
        self.trace = []
        self.sends = []
        self._client_ids = 0
        made: dict[int, SimJobNode] = {}

        def job_core(node: SimNode, now: int) -> Any:
            node.config.set("timer-min-period", ["1"])
            made[node.index] = SimJobNode(self, node, now)
            return made[node.index]

        def policy_core(node: SimNode, now: int) -> Any:
            sync = PolicySync(made[node.index].broker, node.membership, node.rng, now)
            attach(made[node.index].broker, policies=sync)
            return sync

        def timer_core(node: SimNode, now: int) -> Any:
            sync = PeriodicSync(made[node.index].broker, node.membership, node.rng, now)
            attach(made[node.index].broker, timers=sync)
            return sync

        def dedup_core(node: SimNode, now: int) -> Any:
            sync = DedupSync(made[node.index].broker, node.membership, node.rng, now)
            attach(made[node.index].broker, dedup=sync)
            return sync

        def user_core(node: SimNode, now: int) -> Any:
            sync = UserSync(made[node.index].broker, node.membership, node.rng, now)
            attach(made[node.index].broker, users=sync)
            return sync

        self.sim = RecordingSim(seed, tick_ms=tick_ms,
                                core_factories=(job_core, policy_core, timer_core, dedup_core,
                                                user_core))
        for _ in range(n):
            self.sim.add_node(node_timeout=node_timeout, secret=secret)
        self.sim.meet_all()
        assert self.sim.run_until(self.meshed, 20_000), "the cluster did not form"
