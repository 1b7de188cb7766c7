"""What the broker asks of the cluster's job core: the ``Replication`` Protocol.

Theory of operation
-------------------
The job state machine of a replicated job (Disque's README, "Disque state machine") is split
between two owners. The broker owns the jobs, queues, blocked clients and the one timer
wheel; the cluster job core (``cluster.jobs.JobCore``) owns the messages to other nodes.
The broker may not import ``cluster``, so it calls the core through this Protocol, held in
``Broker.replication``. ``None`` (the default) is a node without a cluster bus: every path
is then the single-node path, byte for byte as before.

Every call is synchronous and only *emits* messages (the core's outbox); none of them calls
back into the broker, so a broker handler is never re-entered. Messages from peers go the
other way: the core calls the broker's ``cluster_*`` methods.
"""

from __future__ import annotations

from typing import Protocol

from broker.job import Job


class Replication(Protocol):
    def cluster_size(self) -> int:
        """Known nodes not in handshake, myself included (Disque's ``cluster->size``)."""
        ...

    def replicate(self, job: Job, count: int, noreply: bool, now_ms: int) -> int:
        """Add up to ``count`` reachable nodes (with a link up) to ``job.delivered`` and send
        REPLJOB to every node in it but myself (NOREPLY to those already confirmed, or to all
        when ``noreply``). Returns how many nodes were added."""
        ...

    def enqueue_elsewhere(self, job: Job, delay: int) -> None:
        """ENQUEUE(job, delay) to one random node among ``job.confirmed`` (or ``delivered``)
        other than myself: an externally replicated job leaves this node."""
        ...

    def queued(self, job: Job, nack: bool) -> None:
        """QUEUED to every other node in ``job.delivered`` (INCR_NACKS or INCR_DELIV)."""
        ...

    def will_queue(self, job: Job) -> None:
        """WILLQUEUE to every other node in ``job.delivered``."""
        ...

    def working(self, job: Job) -> None:
        """WORKING to every other node in ``job.delivered``."""
        ...

    def deljob(self, job_id: bytes, nodes: tuple[str, ...] | None) -> None:
        """DELJOB to ``nodes`` (None: every known node), myself excluded."""
        ...

    def try_gc(self, job: Job, now_ms: int) -> int:
        """One garbage-collection attempt of an acked job (Disque's tryJobGC): SETACK to the
        nodes that did not confirm yet. 0 if the job may be freed now, else the time (ms) of
        the next attempt (exponential backoff with a random error)."""
        ...

    def forget(self, job_id: bytes) -> None:
        """The job left this node (freed, deleted, expired): drop any state kept for it."""
        ...

    def pause(self, queue: bytes, flags: int) -> None:
        """PAUSE(queue, flags) to every known node (PAUSE ... BCAST)."""
        ...
