"""cluster.wiring.attach is the one place the cluster cores are plugged into the broker."""

from __future__ import annotations

import random

from broker.cluster_view import SoloCluster
from broker.config import Config
from broker.core import Broker
from cluster.federation import FederationCore
from cluster.jobs import JobCore
from cluster.membership import Membership
from cluster.periodic_sync import PeriodicSync
from cluster.policy_sync import PolicySync
from cluster.wiring import attach

NODE = "ab" * 20
NOW = 1_700_000_000_000


def _parts() -> tuple[Broker, Membership, JobCore, FederationCore, PolicySync, PeriodicSync]:
    config = Config()
    broker = Broker(config, NODE, b"seed" * 5, now_ms=NOW, rng=random.Random(1))
    membership = Membership(config, NODE, random.Random(2), NOW, None)
    return (broker, membership, JobCore(broker, membership, random.Random(3)),
            FederationCore(broker, membership),
            PolicySync(broker, membership, random.Random(4), NOW),
            PeriodicSync(broker, membership, random.Random(5), NOW))


def test_building_the_cores_plugs_nothing_into_the_broker() -> None:
    broker, *_ = _parts()
    assert isinstance(broker.cluster, SoloCluster)
    assert broker.replication is None and broker.federation is None
    assert broker.policies.on_change is None
    assert broker.periodic.on_change is None and broker.periodic.owner_of is None
    assert "timers" not in broker.info_sources


def test_attach_plugs_in_each_core_given_and_leaves_the_rest() -> None:
    broker, membership, jobs, federation, policies, timers = _parts()
    attach(broker, jobs=jobs)
    assert broker.replication is jobs
    assert isinstance(broker.cluster, SoloCluster) and broker.federation is None
    attach(broker, membership=membership, federation=federation, policies=policies,
           timers=timers)
    assert broker.replication is jobs  # kept: not given this time
    assert broker.cluster is membership and broker.federation is federation
    assert broker.policies.on_change == policies.changed
    assert broker.periodic.on_change == timers.changed
    assert broker.periodic.owner_of == timers.owner
    assert broker.info_sources["timers"] == timers.info
