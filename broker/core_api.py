"""What the broker core (``broker.core.Broker``) offers the modules it delegates to.

``broker/core.py`` hands one concern each to cluster_jobs.py, federation.py, policies.py,
dead_letters.py, parking.py, periodic.py and eviction.py, and those call back into it. They
cannot import ``broker.core`` (it imports them: tests/test_layering.py refuses the cycle, typing
imports included), so they type the broker as ``BrokerCore``, this Protocol; a module whose
code reads a table of its own (the policies, the timers, the eviction walk) extends it with
that member. ``Broker`` satisfies each of them: mypy checks every call where the core passes
``self``.

Compiled, a call through a Protocol is a Python-level attribute lookup, as it was through
``Any``; the hot paths (ADDJOB with one copy, GETJOB, ACKJOB on one node) stay inside
``Broker`` and make no such call. The replicated ADDJOB's path does, on every node, so
cluster_jobs.py types the broker as a concrete base class of ``Broker`` instead
(``cluster_jobs.ReplicatingBroker``), whose calls compiled code makes directly.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

from broker.clients import Client
from broker.config import Config
from broker.effects import Effect
from broker.job import Job
from broker.queue import Queue
from broker.replication import Replication
from broker.scan import ScanList
from broker.stats import Histogram
from broker.timers import TimerWheel
from protocol.commands import AddJob


class BrokerCore(Protocol):
    config: Config
    node_id: str
    myself: tuple[str, ...]  # (node_id,): shared by every job held only here
    rng: random.Random
    leaving: bool
    log_wanted: bool  # whether anyone writes the hot paths' records (broker/state.py)
    jobs: dict[bytes, Job]
    queues: dict[bytes, Queue]
    timers: TimerWheel
    job_scan: ScanList[Job]
    outbox: list[Effect]
    replication: Replication | None
    blocked_clients: int
    repl_latency: Histogram

    @property
    def used_memory(self) -> int: ...

    def disk_full(self, adding: int) -> bool:
        """Whether ``adding`` more body bytes would take the append log past ``maxdisk``."""
        ...

    def new_ctime(self, now_ms: int) -> int:
        """A creation time unique on this node (ms * 1e6 + a sequence number)."""
        ...

    def register(self, job: Job, *, schedule: bool = True) -> None: ...

    def reachable_nodes(self) -> int:
        """Other nodes reachable now."""
        ...

    def unregister(self, job: Job) -> None: ...

    def job_alive(self, job: Job) -> bool:
        """Whether ``job`` is the registered job of its ID (a scan list keeps old objects)."""
        ...

    def reschedule(self, job: Job) -> None:
        """Arm the job's timer at its next awake time."""
        ...

    def queue_for(self, name: bytes, now_ms: int) -> Queue:
        """The queue of that name, created if missing."""
        ...

    def requeue_time(self, job: Job, now_ms: int) -> int: ...

    def enqueue_job(self, job: Job, now_ms: int, *, nack: bool = False) -> bool: ...

    def dequeue_job(self, job: Job) -> bool: ...

    def serve_waiters(self, q: Queue, now_ms: int) -> None: ...

    def log_job(self, job: Job, prev: Any) -> None:
        """Emit the job's record (``prev``: its record before the change, for the undo)."""
        ...

    # What the ADDJOB, ACKJOB and FASTACK handlers do, run for a job made or acknowledged
    # here (a policy's ADDJOB, a timer's fire, the ACK of a dead-lettered job).
    def addjob_without_policy(self, cmd: AddJob, client: Client, now_ms: int) -> Any: ...

    def ack_jobs(self, ids: tuple[bytes, ...], now_ms: int) -> Any: ...

    def job_ended(self, job: Job, now_ms: int) -> None:
        """``job`` was acked or is leaving: whoever waits for it learns how (broker/results.py)."""
        ...

    def watch_parents(self, job: Job, now_ms: int) -> None:
        """A waiting chained job was registered: follow its parents (broker/chains.py)."""
        ...

    def ending_as(self, reason: str) -> None:
        """Why the jobs dropped next leave (broker/results.py: ``expired``, ``dead-lettered``;
        ``deleted`` is the default to come back to)."""
        ...

    def fastack_jobs(self, ids: tuple[bytes, ...], now_ms: int) -> Any: ...
