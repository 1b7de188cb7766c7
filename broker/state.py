"""The broker's state: jobs, queues, blocked clients and timers of one node, without I/O.

Theory of operation
-------------------
``BrokerState`` holds what the node knows and the commands' handlers (the methods a row of
``broker/command_table.py`` names, each ``(self, command, client, now_ms) -> reply``);
``broker.core.Broker`` adds ``execute``, which looks a command up in that table. ``tick(now_ms)``
runs the timers that are due. Nothing here reads a clock, a socket or a file: the driver passes
the time in, and takes what must happen outside from one outbox (``take_effects()``):
append-log records and replies to other clients, typed in ``broker/effects.py``.
``undo_entry()`` puts back the state before a record whose write failed.

Invariants: a job is in ``jobs`` iff it is registered; it is in its queue iff its state is
QUEUED; every registered job has exactly one timer (at ``job.awake``, or its replication's
while in WAIT_REPL) and an unregistered job or
a served client none (``TimerWheel.cancel``); a queue with
neither jobs, waiters nor pause flags is evicted after ``QUEUE_IDLE_EVICT_MS``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any, Final

from broker import (
    backoff,
    chains,
    cluster_jobs,
    dead_letters,
    eviction,
    memory,
    periodic,
    policies,
    policy_table,
    results,
    throttle,
)
from broker.acl_users import Users
from broker.clients import BLOCKED, Client, Waiter
from broker.cluster_view import ClusterView, SoloCluster
from broker.config import Config
from broker.effects import Effect, LogRecord, Reply
from broker.federation import Federation
from broker.job import (
    FLAG_BACKOFF,
    FLAG_DELIVERED,
    FLAG_QUEUED_BEFORE,
    FLAG_REPLICA,
    FLAG_WILLQUEUE,
    BodyRef,
    Job,
    JobState,
    validate_record,
)
from broker.queue import PAUSE_ALL, PAUSE_IN, PAUSE_NAMES, PAUSE_NONE, PAUSE_OUT, Queue
from broker.runs import RunTable
from broker.scan import ScanList
from broker.stats import MS_LATENCY_BUCKETS, Histogram
from broker.timers import NOT_SCHEDULED, TimerWheel
from protocol import errors
from protocol.commands import (
    DEFAULT_TTL,
    AddJob,
    GetJob,
    JobsCommand,
    JScan,
    Pause,
    QPeek,
    QScan,
    QueueCommand,
)
from protocol.jobid import IdGenerator, keyed_id
from protocol.resp import NULL_ARRAY, Error, Status

# Enum member lookups (JobState.X) cost ~10x a module global on the hot path.
_WAIT_REPL: Final = JobState.WAIT_REPL
_ACTIVE: Final = JobState.ACTIVE
_QUEUED: Final = JobState.QUEUED
_ACKED: Final = JobState.ACKED


DEFAULT_RETRY: Final = 300
# Re-queue times get a random error in [-250, 250) ms so nodes holding the same job do not
# re-queue it in the same instant (Disque does the same).
REQUEUE_JITTER_MS: Final = 500
QUEUE_IDLE_EVICT_MS: Final = 300_000
QUEUE_EVICT_CHECK_MS: Final = 1_000
# The least ``job-max-body-len`` may be: a smaller body is never checked against the directive,
# so the common ADDJOB reads no attribute of the (interpreted) Config.
BODY_LIMIT_FLOOR: Final = 1024 * 1024

_JITTER_BITS: Final = REQUEUE_JITTER_MS.bit_length()

# A LogRecord made as tuple.__new__ makes it, skipping NamedTuple's interpreted __new__; both
# names bound once (Final: C statics when compiled, not a lookup by name per record).
_new_tuple: Final = tuple.__new__
_LOG_RECORD: Final = LogRecord


def _no_warning(key: str, text: str) -> None:
    pass


def requeue_jitter(rng: random.Random) -> int:
    """``rng.randrange(REQUEUE_JITTER_MS) - REQUEUE_JITTER_MS // 2``, drawing the very same
    numbers from ``rng`` as CPython's ``randrange`` does (``_randbelow``: getrandbits of the
    bound's bit length, again while too large; tests/broker/test_hot_paths.py holds it
    to that), without its three interpreted frames (about 1 us per job, compiled or not)."""
    r = rng.getrandbits(_JITTER_BITS)
    while r >= REQUEUE_JITTER_MS:
        r = rng.getrandbits(_JITTER_BITS)
    return r - REQUEUE_JITTER_MS // 2


def _no_log() -> int:
    return 0


def _no_bodies(ref: BodyRef) -> bytes | None:
    return None


class BrokerState(cluster_jobs.ReplicatingBroker):
    def __init__(self, config: Config, node_id: str, seed: bytes, *, now_ms: int,
                 rng: random.Random | None = None) -> None:
        self.config = config
        self.node_id = node_id
        self.myself = (node_id,)
        # While the log replays: queue names and holder tuples, one object each (load_record).
        self.loading_shared: dict[Any, Any] = {node_id: node_id, self.myself: self.myself}
        self.ids = IdGenerator(node_id, seed)
        self.rng = rng or random.Random(seed)
        self.jobs = {}
        self.queues = {}
        self.timers = TimerWheel()
        self.job_scan: ScanList[Job] = ScanList()
        self.queue_scan: ScanList[Queue] = ScanList()
        self.outbox = []  # see broker/effects.py
        # Whether anyone writes the log records of the hot paths (a job's state, a delivery's
        # dlv): the node clears it while its append log is off (node/persistence.py), so that
        # ADDJOB and GETJOB do not build records it would drop. Switching the log on takes a
        # snapshot of the broker first, so records not built meanwhile are not missed. So do
        # a cluster's FASTACK, DELJOB, acknowledgements and federation moves (one per job and
        # holder, broker/cluster_jobs.py, broker/federation.py); other records (a single
        # node's acks and deletes, policies, timers) are always emitted.
        self.log_wanted = True
        self.leaving = False
        # The node table's view (HELLO, CLUSTER, reachable nodes); the runtime replaces it with
        # the membership core when the cluster bus runs.
        self.cluster: ClusterView = SoloCluster(config, node_id)
        # The cluster job core (``cluster.jobs.JobCore``) when the bus runs; None: one node,
        # and every path below is the single-node one (see broker/replication.py).
        self.replication = None
        # The cluster federation core (``cluster.federation.FederationCore``) when the bus
        # runs; None: no NEEDJOBS, and QSTAT's import fields stay empty (broker/federation.py).
        self.federation: Federation | None = None
        # ADDJOBs blocked until their job is replicated: job ID -> cluster_jobs.ReplWait.
        self.repl_wait = {}
        # Seconds from a synchronous ADDJOB's REPLJOBs to its replication level (/metrics),
        # with the millisecond resolution of now_ms.
        self.repl_latency = Histogram(MS_LATENCY_BUCKETS)
        # Memory counted as broker/memory.py says: jobs as they come and go (so a burst of
        # ADDJOBs, or one huge body, is judged before it is accepted), what the runtime holds
        # (client and log buffers) as the driver last sampled it.
        self.job_overhead = memory.job_overhead()
        self.disk_job = memory.disk_job()  # a job whose body the log holds
        self.job_bytes = 0  # bodies plus job_overhead per registered job
        # Jobs whose body the append log holds (body-memory-max), and those bodies' bytes.
        self.disk_bodies = 0
        self.disk_body_bytes = 0
        # The append log's size as the node knows it (set by node/persistence.py; ``maxdisk``).
        self.log_size: Callable[[], int] = _no_log
        # The bytes of a body the log holds, read back by the node (set by
        # node/persistence.py with body-memory-max); None when they cannot be (the node logs
        # and counts why). Only queue policies call it: deduplication's index after a restart
        # and REDRIVE, which need a body's bytes, not its place.
        self.read_body: Callable[[BodyRef], bytes | None] = _no_bodies
        self.runtime_bytes = 0
        self.eviction = eviction.Walk()  # past 95 %: the jobs looked at to free (eviction.py)
        self.info_sources: dict[str, Callable[[], list[tuple[str, Any]]]] = {}
        # A warning for the node's log, ``(key, text)``: the runtime writes it, at most one per
        # key every few seconds (a client retrying a refused command must not flood the log).
        self.warn: Callable[[str, str], None] = _no_warning
        self.blocked_clients = 0
        self._last_ctime_ms = 0
        self._ctime_seq = 0
        self._next_evict_check = now_ms + QUEUE_EVICT_CHECK_MS
        self._last_tick_ms = 0
        # Queue policies (broker/policy_table.py); empty unless a client sets one.
        self.policies = policy_table.PolicyTable()
        # What script workers report of the jobs they run (JOBRUN, broker/runs.py).
        self.runs = RunTable(node_id)
        # Periodic timers (broker/periodic.py; fired by cluster/periodic_sync.py).
        self.periodic = periodic.PeriodicTable()
        # Job outcomes and blocked WAITJOBs (broker/results.py).
        self.results = results.ResultTable()
        # ACL users and ACL LOG (broker/acl_users.py); requirepass is the default user's.
        self.acl = Users()
        self.acl.node_id = node_id
        self.acl.set_requirepass(config.requirepass)

    # =========================================================================================
    # Entry points

    def take_effects(self) -> list[Effect]:
        """Everything emitted since the last call, in order (the outbox is emptied)."""
        effects, self.outbox = self.outbox, []
        return effects

    def next_deadline(self) -> int | None:
        due = self.timers.next_due()
        if self.policies.throttles and throttle.waiting(self):
            # Clients wait on a throttled queue: look again soon (broker/throttle.py).
            soon = self._last_tick_ms + throttle.POLL_MS
            due = soon if due is None else min(due, soon)
        if due is None or due > self._next_evict_check:
            return self._next_evict_check
        # A bucket that starts at or before the last tick holds only items due later within
        # it (the due ones were run): asking to be woken at its start again would make the
        # driver spin until the clock reaches them.
        return max(due, self._last_tick_ms + 1)

    def tick(self, now_ms: int) -> None:
        self._last_tick_ms = now_ms
        timers = self.timers
        item: Any
        jobs = self.jobs
        resolution = timers.resolution
        for key, items in timers.pop_due(now_ms):
            for item in items:
                if item.timer_key != NOT_SCHEDULED:
                    continue  # armed again by a timer run before it in this tick
                if type(item) is Waiter:
                    if not item.active:
                        continue
                    if item.awake <= now_ms:
                        client = item.client
                        self._unblock(item)
                        self.outbox.append(Reply(client, None if item.job_id else NULL_ARRAY))
                    else:
                        timers.schedule(item, item.awake)
                    continue
                job: Job = item
                if jobs.get(job.id) is not job:
                    continue  # gone with a timer run before it in this tick
                # Not quite due (its bucket, a later ms): again at that ms. A job whose time
                # moved since it was armed, or one in WAIT_REPL (its replication's timer,
                # robust to an early call), has its timer run now, which arms it again.
                awake = job.awake
                if awake > now_ms and awake // resolution == key and job.state is not _WAIT_REPL:
                    timers.schedule(job, awake)
                else:
                    self._job_timer(job, now_ms)
        if self.policies.throttles:
            for q in throttle.waiting(self):
                self.serve_waiters(q, now_ms)
        if now_ms >= self._next_evict_check:
            self._next_evict_check = now_ms + QUEUE_EVICT_CHECK_MS
            self._evict_idle_queues(now_ms)
            self.runs.expire(now_ms)
            self.results.expire(now_ms)

    # =========================================================================================
    # Jobs: registration, queueing, timers

    def new_ctime(self, now_ms: int) -> int:
        if now_ms > self._last_ctime_ms:
            self._last_ctime_ms = now_ms
            self._ctime_seq = 0
        else:
            self._ctime_seq += 1
        return self._last_ctime_ms * 1_000_000 + self._ctime_seq

    @property
    def used_memory(self) -> int:
        """The bytes the node holds, counted (broker/memory.py): O(1), read per ADDJOB."""
        return (self.job_bytes + len(self.queues) * memory.QUEUE_BYTES + self.runtime_bytes
                + len(self.repl_wait) * memory.REPL_WAIT_BYTES + self.results.bytes)

    def _job_cost(self, job: Job) -> int:
        """What ``job`` adds to ``job_bytes`` (its ``repl`` never changes: a replicated job
        holds its own lists of nodes, a single copy shares this node's)."""
        cost = self.disk_job if job.on_disk else len(job.body) + self.job_overhead
        return cost + memory.CLUSTER_JOB_BYTES if job.repl > 1 else cost

    def register(self, job: Job, *, schedule: bool = True) -> None:
        self.job_bytes += self._job_cost(job)
        if job.on_disk:  # an undo of a job whose body is on disk
            self.disk_bodies += 1
            self.disk_body_bytes += job.body_size
        self.jobs[job.id] = job
        self.job_scan.add(job)
        if schedule:
            self.timers.schedule(job, job.awake)

    def unregister(self, job: Job) -> None:
        if job.after:
            chains.forget(self, job)
        watched = self.results
        if watched.waiters or watched.watchers or watched.children or self.policies.shared.by_job:
            # unregister has no now_ms: the outcome's time counts from the last tick (a node
            # ticks hz times a second), or from the job's creation if that is later.
            self.job_ended(job, max(self._last_tick_ms, job.ctime // 1_000_000))
        if self.repl_wait and job.id in self.repl_wait:
            # Gone before its replication level was reached (TTL, DELJOB, DEBUG commands):
            # its client is answered and the partial copies are deleted, as Disque's
            # unregisterJob does.
            cluster_jobs.abort_wait(self, job, cluster_jobs.NOREPL_REMOVED)
        if job.state is _QUEUED:
            q = self.queues.get(job.queue)
            if q is not None:
                q.remove(job)
        del self.jobs[job.id]
        self.timers.cancel(job)
        if self.replication is not None:
            self.replication.forget(job.id)
        self.job_bytes -= self._job_cost(job)
        self.job_scan.discard(self.job_alive)
        # The scan list may keep the object until it compacts; its body goes now.
        job.body = b""
        if job.on_disk:
            self.disk_bodies -= 1
            self.disk_body_bytes -= job.body_size
            job.ref = None

    def body_stored(self, job: Job, ref: BodyRef) -> None:
        """The append log holds ``job``'s body at ``ref`` (written, not necessarily synced):
        memory keeps the reference instead of the bytes (``body-memory-max``)."""
        self.job_bytes -= self._job_cost(job)
        job.body = b""
        if not job.on_disk:
            self.disk_bodies += 1
            self.disk_body_bytes += ref.length
        job.ref = ref
        self.job_bytes += self._job_cost(job)

    def job_ended(self, job: Job, now_ms: int) -> None:
        table = self.results
        if (table.waiters or table.watchers or table.children) and table.watched(job.id):
            results.job_done(self, job.id, job.state, now_ms)
        shared = self.policies.shared
        if shared.by_job and job.id in shared.by_job and table.hint != results.MOVED:
            shared.ended(job.id, self.node_id, now_ms)  # no longer a duplicate anywhere

    def watch_parents(self, job: Job, now_ms: int) -> None:
        chains.watch(self, job, now_ms)

    def parent_ended(self, parent: bytes, outcome: list[Any], now_ms: int) -> None:
        chains.parent_ended(self, parent, outcome, now_ms)

    def ending_as(self, reason: str) -> None:
        self.results.hint = reason

    def job_alive(self, job: Job) -> bool:
        return self.jobs.get(job.id) is job

    def reschedule(self, job: Job) -> None:
        self.timers.schedule(job, job.awake)

    def queue_for(self, name: bytes, now_ms: int) -> Queue:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = Queue(name, now_ms)
            self.queue_scan.add(q)
        return q

    def requeue_time(self, job: Job, now_ms: int) -> int:
        """Arm the retry: the job comes back to a queue at the returned time (0: never)."""
        if not job.retry:
            return 0
        job.flags |= FLAG_WILLQUEUE
        return now_ms + job.retry * 1000 + requeue_jitter(self.rng)

    def enqueue_job(self, job: Job, now_ms: int, *, nack: bool = False) -> bool:
        """Put a job in its queue. Returns whether it was queued now.

        Refused for a job already queued or acked, one with no retry armed (qtime 0: an
        at-most-once job that was queued once already), and an at-most-once job that was
        delivered. Every queueing after the first counts as an additional delivery, except
        NACK, which counts as a nack.
        """
        if job.state is not _ACTIVE and job.state is not _WAIT_REPL:
            return False
        if job.after:
            return False  # waiting for its parents (broker/chains.py)
        if not job.qtime or (not job.retry and job.flags & FLAG_DELIVERED):
            return False
        waited = job.flags & FLAG_BACKOFF
        if waited:
            # The end of a backoff (broker/backoff.py): counted, and told to the other
            # holders, when it began.
            job.flags &= ~FLAG_BACKOFF
        elif self.policies.redrive and dead_letters.dead_letter(self, job, now_ms, nack):
            return False  # moved to its dead-letter queue instead
        job.transition(_QUEUED)
        again = job.flags & FLAG_QUEUED_BEFORE
        if waited:
            again = 0
            nack = False
        elif self.replication is not None and (nack or again):
            # Re-queued (or NACKed) here: the other holders move their retry time and
            # dequeue their copy if this node's ID is greater (Disque's enqueueJob).
            self.replication.queued(job, nack)
        if nack:
            job.nacks += 1
        elif again:
            job.deliveries += 1
        else:
            job.flags |= FLAG_QUEUED_BEFORE
        job.qtime = self.requeue_time(job, now_ms)
        self.reschedule(job)
        q = self.queue_for(job.queue, now_ms)
        q.push(job)
        if nack:
            q.nacks += 1
        elif again:
            q.requeues += 1
        q.atime = now_ms
        if q.waiters:
            # Waiters mean the queue was empty: the one served gets this job.
            self.serve_waiters(q, now_ms)
        elif q.fed is not None and self.federation is not None:
            self.federation.job_queued(q, now_ms)  # another node may be waiting for it
        return True

    def dequeue_job(self, job: Job) -> bool:
        if job.state is not _QUEUED:
            return False
        q = self.queues.get(job.queue)
        if q is not None:
            q.remove(job)
        job.transition(_ACTIVE)
        return True

    def _deliver(self, job: Job, q: Queue, now_ms: int) -> None:
        """A job left its queue for a client (GETJOB, or a blocked GETJOB served). Its qtime
        stays as armed when it was queued: the retry period runs from queueing, as in Disque,
        not from delivery.

        The first delivery sets ``dtime`` and emits the advisory ``dlv`` record (job ID and
        time, no body), so the wait from creation to first delivery can be read from the log;
        later deliveries emit nothing. Advisory (``broker.aof.ADVISORY_KINDS``): no reply waits
        for it and a failed write of it undoes nothing, because the delivery is not a change
        a restart must know about (the job comes back after its retry time either way). The
        same record is emitted wherever the delivery happens (GETJOB, a waiter served inside
        ADDJOB, NACK, ENQUEUE, a requeue, a PAUSE lifted, an undo), so no caller has to carry
        the delivery in a record of its own; a record the command writes next carries
        ``dtime`` too, which replay accepts in either order."""
        job.transition(_ACTIVE)
        job.flags |= FLAG_DELIVERED
        q.atime = now_ms
        if not job.dtime:
            job.dtime = now_ms
            # _new_tuple: the same LogRecord without NamedTuple's Python-level __new__
            # (0.55 -> 0.24 us here; this runs once per job consumed).
            if self.log_wanted:
                self.outbox.append(_new_tuple(_LOG_RECORD, ("dlv", [job.id, now_ms], None)))

    def _job_timer(self, job: Job, now_ms: int) -> None:
        if now_ms >= job.etime:
            # TTL reached: the job goes away whatever its state.
            prev = job.to_record()
            self.ending_as(results.EXPIRED)
            self.unregister(job)
            self.ending_as(results.DELETED)
            self.outbox.append(LogRecord("del", job.id, prev))
            return
        if job.state is _ACKED:
            if self.replication is not None:
                cluster_jobs.gc(self, job, now_ms)
            else:
                self.unregister(job)
            return
        if job.state is _WAIT_REPL:
            cluster_jobs.replication_timer(self, job, now_ms)
            return
        if job.flags & FLAG_WILLQUEUE and job.qtime and now_ms >= job.qtime - 500:
            # The early wake-up: WILLQUEUE goes to the other holders of a job not queued here.
            job.flags &= ~FLAG_WILLQUEUE
            if self.replication is not None and job.state is _ACTIVE:
                self.replication.will_queue(job)
        if job.qtime and now_ms >= job.qtime:
            if job.state is _ACTIVE:
                q = self.queues.get(job.queue)
                if job.retry and q is not None and q.pause & PAUSE_IN:
                    job.qtime = self.requeue_time(job, now_ms)  # input paused: try later
                else:
                    prev = job.to_record()
                    if (self.policies.backoff and not job.flags & FLAG_BACKOFF
                            and backoff.start(self, job, now_ms, False)):
                        self.log_job(job, prev)
                        return
                    if self.enqueue_job(job, now_ms):
                        self.log_job(job, prev)
                        return
                    if self.jobs.get(job.id) is not job or job.state is not _ACTIVE:
                        return  # dead-lettered (broker/dead_letters.py)
                    job.qtime = 0
            elif job.state is _QUEUED and job.retry:
                # Still waiting for a consumer: nothing to redo, look again after RETRY.
                job.qtime = self.requeue_time(job, now_ms)
        self.reschedule(job)

    # =========================================================================================
    # Logging

    def log_job(self, job: Job, prev: Any) -> None:
        if self.log_wanted:  # no one to write it: not even built (see __init__)
            # _new_tuple: NamedTuple's own __new__ is interpreted code (see _deliver).
            self.outbox.append(_new_tuple(_LOG_RECORD, ("job", job.to_record(), prev)))

    def undo_entry(self, entry: tuple[str, Any, Any], now_ms: int) -> None:
        """Put back the state from before ``entry`` (its write to the log failed)."""
        kind, payload, prev = entry
        if kind == policy_table.RECORD_KIND:
            self.policies.undo(payload, prev)
            return
        if kind == periodic.RECORD_KIND:
            self.periodic.undo(payload, prev)
            return
        if kind == results.RECORD_KIND:
            self.results.undo(payload, prev)
            return
        job_id = payload[0] if kind == "job" else payload
        if kind == "flushall":
            return
        current = self.jobs.get(job_id)
        if current is not None:
            self.unregister(current)
        if prev is not None:
            self._restore(Job.from_record(prev), now_ms)

    def undo_unencodable(self, entry: tuple[str, Any, Any], now_ms: int) -> None:
        """``undo_entry`` for a record that could not be encoded (a body the log holds could
        not be read back): a requeue due now waits one more retry period, or the job's timer
        would fire, and fail, at every tick."""
        self.undo_entry(entry, now_ms)
        if entry[0] != "job":
            return
        job = self.jobs.get(entry[1][0])
        if job is not None and job.qtime and job.qtime <= now_ms:
            job.qtime = now_ms + max(1, job.retry) * 1000
            self.reschedule(job)

    def _restore(self, job: Job, now_ms: int) -> None:
        """Register a job again exactly as recorded (undo of a failed log write)."""
        queued = job.state is _QUEUED
        self.register(job)
        if queued:
            q = self.queue_for(job.queue, now_ms)
            q.push(job)
            q.jobs_in -= 1  # the job is back, not new: QSTAT's jobs-in must not grow
            if q.waiters:
                # Someone may have blocked on this queue meanwhile; it gets the job now (a
                # first delivery emits its dlv record, written with the next batch).
                self.serve_waiters(q, now_ms)

    # -- replay and snapshot (the append log drives these) --------------------------------------

    @staticmethod
    def validate_record(kind: str, data: Any) -> str | None:
        if kind == policy_table.RECORD_KIND:
            return policy_table.validate_record(data)
        if kind == periodic.RECORD_KIND:
            return periodic.validate_record(data)
        if kind == results.RECORD_KIND:
            return results.validate_record(data)
        return validate_record(kind, data)

    def load_record(self, record: tuple[Any, ...], now_ms: int) -> None:
        kind, payload = record[0], record[1]
        if kind == "job":
            job = Job.from_record(payload)
            # One object per queue name and per set of holders, as live jobs share them: a
            # replay otherwise gives each job its own copies (about 180 bytes a job, which
            # took a 10-million-job replay 1.8 GB over the node's running size).
            shared = self.loading_shared
            job.queue = shared.setdefault(job.queue, job.queue)
            holders = job.delivered
            if holders:
                job.delivered = shared.setdefault(holders, holders)
            old = self.jobs.get(job.id)
            if old is not None:
                self.unregister(old)
            if job.etime <= now_ms:
                return
            self.jobs[job.id] = job
            self.job_bytes += self._job_cost(job)
            self.job_scan.add(job)
            if job.on_disk:  # a body the log holds (a split record, broker/aof.py)
                self.disk_bodies += 1
                self.disk_body_bytes += job.body_size
        elif kind in ("ack", "del"):
            old = self.jobs.get(payload)
            if old is not None:
                self.unregister(old)
        elif kind == policy_table.RECORD_KIND:
            self.policies.load(payload)
        elif kind == periodic.RECORD_KIND:
            self.periodic.load(payload)
        elif kind == results.RECORD_KIND:
            self.results.load(payload, now_ms)
        elif kind == "flushall":
            self.jobs.clear()
            self.job_bytes = 0
            self.disk_bodies = self.disk_body_bytes = 0
            self.job_scan.clear()
            self.results = results.ResultTable.after_flush(self.results)
        elif kind == "dlv":
            # Advisory: the first delivery of a job still known (an unknown one was acked,
            # deleted or expired, or its record comes later, carrying dtime itself).
            delivered = self.jobs.get(payload[0])
            if delivered is not None and not delivered.dtime:
                delivered.dtime = payload[1]

    def finish_load(self, now_ms: int, enqueue_jobs_once: bool) -> None:
        """Schedule what was loaded.

        After a crash, queues are not trusted: a job may have been delivered after the last
        record that mentions it. So, as in Disque, jobs come back to their queue only after
        their retry time (delay + retry from now), and at-most-once jobs never do. After a
        controlled restart (``enqueue_jobs_once``: the log was written by SHUTDOWN REWRITE-AOF
        with no client connected) the queues are restored exactly, at-most-once jobs included.
        """
        self.loading_shared = {}
        for job in list(self.jobs.values()):
            if job.state is _ACKED:
                if self.replication is not None and job.flags & FLAG_REPLICA:
                    # A cluster ACK is kept until every holder knows (ack GC, started again).
                    job.qtime = now_ms
                    self.timers.schedule(job, job.awake)
                else:
                    self.unregister(job)
                continue
            if job.after:
                # Waiting for its parents: watched again below, never queued before they end.
                job.qtime = 0
                self.timers.schedule(job, job.awake)
                continue
            was_queued = job.state is _QUEUED
            if job.state is not _ACTIVE:
                job.transition(_ACTIVE)  # nothing is in a queue until it is put back below
            if enqueue_jobs_once and was_queued:
                job.transition(_QUEUED)
                self.timers.schedule(job, job.awake)
                q = self.queue_for(job.queue, now_ms)
                q.push(job)
                q.jobs_in -= 1  # a restored job was counted when it first came in
                continue
            if job.retry:
                job.qtime = self.requeue_time(job, now_ms) + job.delay * 1000
            else:
                job.qtime = 0
            self.timers.schedule(job, job.awake)
        self.policies.forget_gone(self.jobs)
        for job in [j for j in self.jobs.values() if j.after]:
            chains.watch(self, job, now_ms)
        # A replayed history leaves every acknowledged job's object in the scan list (up to
        # half of it: the list compacts only past that); none is reachable from a cursor yet.
        self.job_scan.compact(self.job_alive)

    def snapshot(self) -> Iterator[tuple[str, Any]]:
        yield from list(self.policies.snapshot(self.jobs))
        yield from list(self.periodic.snapshot())
        yield from list(self.results.snapshot())
        for job in list(self.jobs.values()):
            if self.jobs.get(job.id) is job:
                yield ("job", job.to_record())

    # =========================================================================================
    # Commands: jobs

    def disk_full(self, adding: int) -> bool:
        """Whether ``adding`` more body bytes would take the append log past ``maxdisk``
        (a copy from another node is refused then, as an ADDJOB is)."""
        maxdisk = self.config.maxdisk
        if maxdisk and self.log_size() + adding > maxdisk:
            self.warn("maxdisk", "A copy of a job from another node refused: the append log "
                      "is at 'maxdisk'")
            return True
        return False

    def memory_level(self, adding: int = 0) -> int:
        """Disque's memory warning level (broker/memory.py), counting ``adding`` more bytes
        (the job about to be created)."""
        return memory.warning_level(self.used_memory + adding, self.config.maxmemory)

    def addjob(self, cmd: AddJob, client: Client, now_ms: int) -> Any:
        if self.policies.live:
            return policies.addjob(self, cmd, client, now_ms)
        return self.addjob_without_policy(cmd, client, now_ms)

    def addjob_without_policy(self, cmd: AddJob, client: Client, now_ms: int) -> Any:
        """ADDJOB once the queue's policy (if any) was applied (``policies.addjob``)."""
        size = len(cmd.body)
        if size > BODY_LIMIT_FLOOR and size > self.config.job_max_body_len:
            return self._body_too_big(size)
        adding = size + self.job_overhead
        maxdisk = self.config.maxdisk
        if maxdisk and self.log_size() + size > maxdisk:
            return errors.DISK_FULL
        level = self.memory_level(adding)
        if level >= 2:
            # Past 95 %: what nobody needs is freed first, else the command is refused.
            if not eviction.free_memory(self, adding):
                return errors.OOM
            level = self.memory_level(adding)
        reachable = self.reachable_nodes()
        replicate = cmd.replicate or min(3, 1 + reachable)
        # Leaving or short of memory, the node would replicate only to others and keep no copy.
        external = self.leaving or level > 0
        needed = replicate if external else replicate - 1
        if needed > reachable:
            if external and needed - 1 == reachable:
                why = "I'm leaving the cluster" if self.leaving else "I'm out of memory"
                return Error(
                    "NOREPL Not enough reachable nodes for the requested replication level, "
                    "since I'm unable to hold a copy of the message for the following reason: " + why
                )
            return errors.NOREPL
        q = self.queues.get(cmd.queue)
        if q is not None:
            if cmd.maxlen is not None and len(q) >= cmd.maxlen:
                return errors.MAXLEN
            if q.pause & PAUSE_IN:
                return errors.PAUSED_IN
        ttl = cmd.ttl if cmd.ttl is not None else DEFAULT_TTL
        retry = cmd.retry
        if retry is None:
            retry = max(1, min(DEFAULT_RETRY, ttl // 10))
        if cmd.id_key is None:
            job_id = self.ids.next_id(ttl, retry)
        else:
            # A periodic timer's fire (broker/periodic.py): the ID is its deduplication key,
            # and a job this node already holds under it was added already.
            job_id = keyed_id(cmd.id_key[0], cmd.id_key[1], ttl, retry)
            if job_id in self.jobs:
                return Status(job_id.decode("ascii"))
        if self.replication is not None and (replicate > 1 or external):
            # Other nodes take part: REPLJOB, maybe a blocked client (broker/cluster_jobs.py).
            return cluster_jobs.addjob(self, cmd, client, now_ms, replicate, external,
                                       ttl, retry,
                                       q.name if q is not None else cmd.queue, job_id)
        # One copy, here: what cluster_jobs.addjob does for REPLICATE 1 on a cluster node too
        # (no message, no wait), kept here so the common ADDJOB makes no call through the
        # Protocol-typed broker of that module (broker/core_api.py). A cluster node's job is a replica
        # (FLAG_REPLICA: its ACK takes part in the cluster's ack GC).
        job = Job(
            # Jobs of one queue share its name object instead of holding a copy each.
            job_id, q.name if q is not None else cmd.queue, cmd.body,
            repl=replicate, ttl=ttl, retry=retry,
            delay=cmd.delay, ctime=self.new_ctime(now_ms), delivered=self.myself,
        )
        if self.replication is not None:
            job.flags = FLAG_REPLICA
        if cmd.priority:
            job.priority = cmd.priority
        # qtime: when the job is first queued (after DELAY), or its first retry time; the
        # enqueue below re-arms it with the random error.
        job.qtime = now_ms + (cmd.delay if cmd.delay else retry) * 1000 or now_ms
        if cmd.delay or cmd.after:
            if cmd.after:
                chains.hold(self, job, cmd.after, now_ms)
            self.register(job)
        else:
            self.register(job, schedule=False)  # the enqueue arms its timer
            self.enqueue_job(job, now_ms)
        self.log_job(job, None)
        if cmd.after:
            chains.watch(self, job, now_ms)
        return Status(job.id.decode("ascii"))

    def _body_too_big(self, size: int) -> Error:
        """A job must fit in one cluster bus frame to be replicated or to move to another node
        (cluster.wire.max_body_for): refused at once rather than never replicated."""
        limit = int(self.config.job_max_body_len)
        self.warn("job-max-body-len", f"ADDJOB refused: a job body of {size} bytes is over "
                                      f"job-max-body-len ({limit} bytes)")
        return Error(f"ERR job body of {size} bytes exceeds the job-max-body-len limit of "
                     f"{limit} bytes")

    def getjob(self, cmd: GetJob, client: Client, now_ms: int) -> Any:
        # Missing queues are created even with NOHANG: they hold the federation state.
        names = cmd.queues
        if len(names) > 1:
            names = tuple(dict.fromkeys(names))  # each queue once, in order
        queues = [self.queue_for(name, now_ms) for name in names]
        found: list[Job] = []
        want = cmd.max_jobs
        throttled = self.policies.throttles
        # Round robin: one job per queue per pass, left to right, until COUNT or a dry pass.
        while len(found) < want:
            before = len(found)
            for q in queues:
                if throttled and throttle.holds(self, q, now_ms):
                    continue  # as if empty: MAXINFLIGHT or RATE reached (broker/throttle.py)
                job = None if q.pause & PAUSE_OUT else q.pop()
                if job is None:
                    if self.federation is not None:
                        self.federation.need_jobs(q, False, now_ms)
                    continue
                if self.federation is not None and len(q) <= q.low_water:
                    self.federation.need_jobs(q, True, now_ms)
                self._deliver(job, q, now_ms)
                if throttled:
                    throttle.delivered(self, job, now_ms)
                found.append(job)
                if len(found) >= want:
                    break
            if len(found) == before:
                break
        if found:
            return [self._job_entry(j, cmd.withcounters) for j in found]
        if cmd.nohang:
            return NULL_ARRAY
        if self.leaving:
            return errors.LEAVING
        waiter = Waiter(client, tuple(q.name for q in queues), cmd.withcounters,
                        cmd.max_jobs)
        client.waiter = waiter
        for q in queues:
            q.waiters.append(waiter)
            q.atime = now_ms
        self.blocked_clients += 1
        if cmd.timeout_ms:
            waiter.awake = now_ms + cmd.timeout_ms
            self.timers.schedule(waiter, waiter.awake)
        return BLOCKED

    @staticmethod
    def _job_entry(job: Job, withcounters: bool) -> list[Any]:
        if withcounters:
            return [job.queue, job.id, job.content, b"nacks",
                    job.nacks, b"additional-deliveries", job.deliveries]
        return [job.queue, job.id, job.content]

    def serve_waiters(self, q: Queue, now_ms: int) -> None:
        """Hand jobs of ``q`` to its blocked clients, first come first served, one each."""
        if q.pause & PAUSE_OUT:
            return
        throttled = self.policies.throttles
        while q.waiters and len(q):
            if throttled and throttle.holds(self, q, now_ms):
                return  # the tick serves them once it no longer holds (broker/throttle.py)
            waiter = q.waiters[0]
            job = q.pop()
            assert job is not None
            if self.federation is not None and len(q) <= q.low_water:
                self.federation.need_jobs(q, True, now_ms)
            self._deliver(job, q, now_ms)
            if throttled:
                throttle.delivered(self, job, now_ms)
            self._unblock(waiter)
            self.outbox.append(Reply(waiter.client, [self._job_entry(job, waiter.withcounters)]))

    def _unblock(self, waiter: Waiter) -> None:
        if not waiter.active:
            return
        waiter.active = False
        waiter.client.waiter = None
        self.timers.cancel(waiter)
        self.blocked_clients -= 1
        if waiter.job_id:
            results.forget_waiter(self.results, waiter)
        for name in waiter.queues:
            q = self.queues.get(name)
            if q is not None:
                try:
                    q.waiters.remove(waiter)
                except ValueError:
                    pass

    def client_gone(self, client: Client) -> None:
        """The connection closed: forget its blocked GETJOB, so no job is handed to it."""
        if client.waiter is not None:
            self._unblock(client.waiter)
        if self.repl_wait:
            cluster_jobs.client_gone(self, client)

    # Each verb's handler takes the JobsCommand its row parsed; ack_jobs, delete_jobs and
    # fastack_jobs also serve queue policies (broker/policies.py), which have IDs, not a client.

    def ackjob(self, cmd: JobsCommand, client: Client, now_ms: int) -> Any:
        return self.ack_jobs(cmd.ids, now_ms)

    def fastack(self, cmd: JobsCommand, client: Client, now_ms: int) -> Any:
        return self.fastack_jobs(cmd.ids, now_ms)

    def deljob(self, cmd: JobsCommand, client: Client, now_ms: int) -> Any:
        return self.delete_jobs(cmd.ids)

    def nack(self, cmd: JobsCommand, client: Client, now_ms: int) -> Any:
        return self._requeue_jobs(cmd.ids, now_ms, True)

    def enqueue(self, cmd: JobsCommand, client: Client, now_ms: int) -> Any:
        return self._requeue_jobs(cmd.ids, now_ms, False)

    def dequeue(self, cmd: JobsCommand, client: Client, now_ms: int) -> Any:
        count = 0
        for job_id in cmd.ids:
            job = self.jobs.get(job_id)
            if job is None:
                continue
            prev = job.to_record()
            if not self.dequeue_job(job):
                continue
            self.reschedule(job)
            self.log_job(job, prev)
            count += 1
        return count

    def show(self, cmd: JobsCommand, client: Client, now_ms: int) -> Any:
        job = self.jobs.get(cmd.ids[0])
        return None if job is None else self._show(job, now_ms)

    def working(self, cmd: JobsCommand, client: Client, now_ms: int) -> Any:
        return self._working(cmd.ids[0], now_ms)

    def ack_jobs(self, ids: tuple[bytes, ...], now_ms: int) -> Any:
        if self.replication is not None:
            return cluster_jobs.ack_command(self, ids, now_ms)
        count = 0
        jobs = self.jobs
        for job_id in ids:
            job = jobs.get(job_id)
            if job is None or job.state is _ACKED:
                continue
            prev = job.to_record()
            self.dequeue_job(job)
            job.transition(_ACKED)
            # One node: nobody else may hold a copy, so the ACK can be collected at once.
            self.unregister(job)
            self.outbox.append(LogRecord("ack", job_id, prev))
            count += 1
        return count

    def fastack_jobs(self, ids: tuple[bytes, ...], now_ms: int) -> Any:
        if self.replication is not None:
            return cluster_jobs.fastack(self, ids)
        return self.delete_jobs(ids)

    def delete_jobs(self, ids: tuple[bytes, ...]) -> int:
        """DELJOB (and FASTACK on one node): the jobs go, here only."""
        count = 0
        for job_id in ids:
            job = self.jobs.get(job_id)
            if job is None:
                continue
            prev = job.to_record()
            self.unregister(job)
            self.outbox.append(LogRecord("del", job_id, prev))
            count += 1
        return count

    def _requeue_jobs(self, ids: tuple[bytes, ...], now_ms: int, nack: bool) -> Any:
        """NACK and ENQUEUE: the jobs back in their queue now."""
        if self.memory_level() >= 2 and not eviction.free_memory(self, 0):
            return errors.OOM  # Disque's flag m: may grow memory (queue entries, messages)
        count = 0
        for job_id in ids:
            job = self.jobs.get(job_id)
            if job is None:
                continue
            prev = job.to_record()
            if nack and self.policies.backoff and backoff.start(self, job, now_ms, True):
                self.log_job(job, prev)
                count += 1
                continue
            if not self.enqueue_job(job, now_ms, nack=nack):
                continue
            self.log_job(job, prev)
            count += 1
        return count

    def _working(self, job_id: bytes, now_ms: int) -> Any:
        job = self.jobs.get(job_id)
        if job is None:
            return errors.NOJOB
        if now_ms - job.ctime // 1_000_000 > job.ttl * 1000 // 2:
            return errors.TOOLATE
        prev = job.to_record()
        # The worker holds the job: take it out of the queue so nobody else gets it meanwhile.
        self.dequeue_job(job)
        if job.retry and job.qtime:
            job.qtime = self.requeue_time(job, now_ms)
        self.reschedule(job)
        self.log_job(job, prev)
        if self.replication is not None:
            self.replication.working(job)
        return job.retry

    def _show(self, job: Job, now_ms: int) -> list[Any]:
        shown = [
            b"id", job.id,
            b"queue", job.queue,
            b"state", chains.WAITING if job.after and job.state is _ACTIVE
            else job.state.value.encode(),
            b"repl", job.repl,
            b"ttl", max(0, job.etime // 1000 - now_ms // 1000),
            b"ctime", job.ctime,
            b"delay", job.delay,
            b"retry", job.retry,
            b"nacks", job.nacks,
            b"additional-deliveries", job.deliveries,
            b"nodes-delivered", [n.encode() for n in job.delivered],
            b"nodes-confirmed", [n.encode() for n in job.confirmed],
            b"next-requeue-within", max(0, job.qtime - now_ms) if job.qtime else None,
            b"next-awake-within", max(0, job.awake - now_ms) if job.awake else None,
            b"body", job.content,
        ]
        if job.priority:
            # Only when set: SHOW of a job without one stays Disque's reply.
            shown += [b"priority", job.priority]
        # trisque's own fields, only for jobs that have them (Disque's reply otherwise).
        if job.after:
            shown += [b"after", list(job.after)]
        note = self.policies.notes.get(job.id) if self.policies.notes else None
        if note is not None:
            shown += [b"reason", str(note[0]).encode()]
        return shown

    # =========================================================================================
    # Commands: queues

    def qlen(self, cmd: QueueCommand, client: Client, now_ms: int) -> Any:
        q = self.queues.get(cmd.queue)
        return len(q) if q is not None else 0

    def qstat(self, cmd: QueueCommand, client: Client, now_ms: int) -> Any:
        q = self.queues.get(cmd.queue)
        if q is None:
            return NULL_ARRAY
        fed = self.federation
        return [
            b"name", q.name,
            b"len", len(q),
            b"age", (now_ms - q.ctime) // 1000,
            b"idle", (now_ms - q.atime) // 1000,
            b"blocked", len(q.waiters),
            b"import-from", [n.encode() for n in fed.import_from(q, now_ms)] if fed else [],
            b"import-rate", fed.import_rate(q, now_ms) if fed else 0,
            b"jobs-in", q.jobs_in,
            b"jobs-out", q.jobs_out,
            b"pause", PAUSE_NAMES[q.pause].encode(),
            *(throttle.qstat_fields(self, q, now_ms) if self.policies.throttles else ()),
            # With bodies in the log: the bytes the queue's bodies hold, wherever they lie.
            *((b"bytes", sum(j.body_size for j in q)) if self.disk_bodies else ()),
        ]

    def qpeek(self, cmd: QPeek, client: Client, now_ms: int) -> Any:
        q = self.queues.get(cmd.queue)
        if q is None:
            return []
        return [[j.queue, j.id, j.content] for j in q.peek(cmd.n)]

    def qscan(self, cmd: QScan, client: Client, now_ms: int) -> Any:
        def keep(q: Queue) -> bool:
            if self.queues.get(q.name) is not q:
                return False
            n = len(q)
            if cmd.minlen is not None and n < cmd.minlen:
                return False
            if cmd.maxlen is not None and n > cmd.maxlen:
                return False
            if cmd.importrate is None:
                return True
            rate = self.federation.import_rate(q, now_ms) if self.federation else 0
            return rate >= cmd.importrate

        cursor, found = self.queue_scan.scan(cmd.cursor, 0 if cmd.busyloop else cmd.hint, keep)
        return [str(cursor).encode(), [q.name for q in found]]

    def jscan(self, cmd: JScan, client: Client, now_ms: int) -> Any:
        def keep(job: Job) -> bool:
            if self.jobs.get(job.id) is not job:
                return False
            if cmd.queue is not None and job.queue != cmd.queue:
                return False
            return not cmd.states or job.state.value in cmd.states

        cursor, found = self.job_scan.scan(cmd.cursor, 0 if cmd.busyloop else cmd.hint, keep)
        if cmd.reply_all:
            items: list[Any] = [self._show(j, now_ms) for j in found]
        else:
            items = [Status(j.id.decode("ascii")) for j in found]
        return [str(cursor).encode(), items]

    def pause(self, cmd: Pause, client: Client, now_ms: int) -> Any:
        flags = {"in": PAUSE_IN, "out": PAUSE_OUT, "all": PAUSE_ALL, "none": PAUSE_NONE}
        setting = [flags[o] for o in cmd.options if o in flags]
        q = self.queues.get(cmd.queue)
        if setting:
            new = PAUSE_NONE
            for f in setting:
                new = PAUSE_NONE if f == PAUSE_NONE else new | f
            if q is None:
                if new == PAUSE_NONE:
                    return Status("none")
                q = self.queue_for(cmd.queue, now_ms)
            was_out = q.pause & PAUSE_OUT
            q.pause = new
            if was_out and not new & PAUSE_OUT and q.waiters:
                # Output resumed: clients blocked meanwhile get the jobs that piled up.
                self.serve_waiters(q, now_ms)
        if "bcast" in cmd.options and self.replication is not None:
            self.replication.pause(cmd.queue, q.pause if q is not None else PAUSE_NONE)
        return Status(PAUSE_NAMES[q.pause] if q is not None else "none")

    def _evict_idle_queues(self, now_ms: int) -> None:
        # Under memory pressure empty queues go sooner: 300 s normally, 10 s above 75 % of
        # maxmemory, 2 s above 95 % (Disque's figures).
        level = self.memory_level()
        max_idle = QUEUE_IDLE_EVICT_MS if level == 0 else 10_000 if level == 1 else 2_000
        idle = [name for name, q in self.queues.items()
                if q.is_idle_empty() and now_ms - q.atime >= max_idle]
        for name in idle:
            del self.queues[name]
            self.queue_scan.discard(lambda q: self.queues.get(q.name) is q)

    # =========================================================================================
    # Commands: server and cluster

    def reachable_nodes(self) -> int:
        """Other nodes reachable now."""
        return self.cluster.reachable_nodes()

    def hello_nodes(self) -> list[list[bytes]]:
        return self.cluster.hello_nodes()

    def set_node_id(self, node_id: str, seed: bytes) -> None:
        """The node's ID changed (CLUSTER RESET HARD, ``cluster.effects.NewNodeId``): HELLO and
        new job IDs use the new one. Jobs are gone already: the reset flushed them."""
        self.node_id = node_id
        self.myself = (node_id,)
        self.ids = IdGenerator(node_id, seed)
        self.runs.prefix = node_id[:8].encode()

    def set_leaving(self, leaving: bool) -> None:
        self.leaving = leaving
        if leaving:
            # Clients waiting here would wait for jobs a leaving node no longer gets.
            for q in self.queues.values():
                for waiter in list(q.waiters):
                    self._unblock(waiter)
                    self.outbox.append(Reply(waiter.client, errors.LEAVING))

    def flushall(self) -> None:
        """Forget every job and queue; blocked GETJOB clients get the timeout reply."""
        for q in self.queues.values():
            for waiter in list(q.waiters):
                self._unblock(waiter)
                self.outbox.append(Reply(waiter.client, NULL_ARRAY))
        for waiters in list(self.results.waiters.values()):
            for waiter in list(waiters):
                self._unblock(waiter)
                self.outbox.append(Reply(waiter.client, None))
        self.results = results.ResultTable.after_flush(self.results)
        for job_id in list(self.repl_wait):
            job = self.jobs.get(job_id)
            if job is not None:
                cluster_jobs.abort_wait(self, job, cluster_jobs.NOREPL_REMOVED)
        if self.replication is not None:
            for job_id in self.jobs:
                self.replication.forget(job_id)
        self.jobs.clear()
        self.job_bytes = 0
        self.disk_bodies = self.disk_body_bytes = 0
        self.job_scan.clear()
        self.timers.clear()
        self.queues.clear()
        self.queue_scan.clear()
        self.policies.forget_gone(self.jobs)
        if self.federation is not None:
            self.federation.forget_jobs()
        self.outbox.append(LogRecord("flushall", None, None))
