"""Plugging the cluster cores into the broker, in one place.

The broker calls the cluster through four seams: ``Broker.cluster`` (the node table's view,
``broker/cluster_view.py``), ``Broker.replication`` (the job core), ``Broker.federation``
(NEEDJOBS/YOURJOBS) and the change hooks of its policy and timer tables, INFO's ``timers``
section, ``Broker.results.sync`` (the result core, job outcomes) and the shared
deduplication index's ``on_change``, and the ACL users' ``changed`` listeners. The cores do not set these themselves: whoever builds them (the node,
``node/server.py``; the in-process harnesses of the tests; the benchmarks) calls ``attach``
once they exist, so what a broker is connected to is read in one call. Each core given
replaces what the broker had; one not given leaves it as it was (a test harness may attach
the cores it builds one at a time).

The job core must be attached before an append log is replayed: replay keeps acked cluster
jobs (for their ack GC) only when ``Broker.replication`` is set.
"""

from __future__ import annotations

from broker.core import Broker
from cluster.dedup_sync import DedupSync
from cluster.federation import FederationCore
from cluster.jobs import JobCore
from cluster.membership import Membership
from cluster.periodic_sync import PeriodicSync
from cluster.policy_sync import PolicySync
from cluster.results import ResultCore
from cluster.user_sync import UserSync


def attach(broker: Broker, *, membership: Membership | None = None,
           jobs: JobCore | None = None, federation: FederationCore | None = None,
           policies: PolicySync | None = None, timers: PeriodicSync | None = None,
           results: ResultCore | None = None, dedup: DedupSync | None = None,
           users: UserSync | None = None) -> None:
    if membership is not None:
        broker.cluster = membership
    if jobs is not None:
        broker.replication = jobs
    if federation is not None:
        broker.federation = federation
    if policies is not None:
        broker.policies.on_change = policies.changed
    if timers is not None:
        broker.periodic.owner_of = timers.owner
        broker.periodic.on_change = timers.changed
        broker.info_sources["timers"] = timers.info
    if results is not None:
        broker.results.sync = results
    if dedup is not None:
        broker.policies.shared.on_change = dedup.changed
    if users is not None:
        broker.acl.changed.append(users.changed)
