"""The broker's half of replicated jobs: what ADDJOB, ACKJOB, FASTACK and the job timers do
when the node is part of a cluster (``Broker.replication`` is set).

Theory of operation
-------------------
Disque's job state machine (README, "Disque state machine") is followed step by step; the
messages themselves are the cluster job core's (``cluster/jobs.py``), reached through the
``broker.replication.Replication`` Protocol. This module only changes broker state: it is
also what the job core calls when a peer's message changes a job (``acknowledge``,
``free``, ``replication_achieved``, ``enqueue``, ``requeue_later``...), so every
state change of a job still happens inside ``broker/`` with its log record.

Synchronous ADDJOB. The job is registered in WAIT_REPL, the client is blocked (the command
returns ``BLOCKED``) and a ``ReplWait`` remembers it by job ID. The job's timer in the
broker's one wheel fires every ``ADD_NODE_PERIOD_MS``: one more node is asked (and REPLJOB
re-sent to every node asked before); at the ADDJOB ms-timeout the client gets
``NOREPL_TIMEOUT``, DELJOB goes to every node asked, and the job is dropped. When
``job.repl`` nodes (myself included unless replicating externally) confirmed with GOTJOB,
``replication_achieved`` queues the job, emits its log record and then the ``Reply`` with
the ID: the runtime sends a ``Reply`` only after the log records before it are durable.

Pipelined ADDJOBs. The runtime may run a client's next ADDJOBs while earlier ones wait
(``may_run_ahead`` says which; node/conn_core.py, "Pipelined ADDJOBs"), so one client can
have several ``ReplWait``s. They are also kept in the order they ran, in
``Client.repl_waits``, and each one's ``Reply`` is emitted only when every one before it
has had its own (``_finish``): a later job confirmed first waits for the earlier one's
reply, so the runtime gets a client's ADDJOB replies in the order the client sent them.
The client counts once in ``blocked_clients`` while it has any. A client that goes away
takes the jobs still waiting for copies with it (DELJOB), as one blocked in a single
ADDJOB does; jobs already confirmed whose reply was held stay, as a job whose reply is lost
on the way does.

Acked jobs. ACKJOB (or SETACK) makes a job ACKED and logs it (a ``job`` record in state
acked, flag ``FLAG_REPLICA``); its ``qtime`` is then the next garbage-collection attempt
(``Replication.try_gc`` decides, with Disque's exponential schedule). A job is freed when
every node that may have a copy confirmed (GOTACK), with a ``del`` record.
"""

from __future__ import annotations

import random
from typing import Any, Final

from broker.clients import BLOCKED, Client
from broker.effects import Effect, LogRecord, Reply
from broker.job import FLAG_QUEUED_BEFORE, FLAG_REPLICA, FLAG_WILLQUEUE, Job, JobState
from broker.queue import PAUSE_OUT, Queue
from broker.replication import Replication
from broker.stats import Histogram
from broker.timers import TimerWheel
from protocol.commands import AddJob
from protocol.resp import Error, Status

#: While a synchronous ADDJOB waits, one more node is asked this often (Disque's
#: DELAYED_JOB_ADD_NODE_MIN_PERIOD).
ADD_NODE_PERIOD_MS: Final = 50
#: A job at least this big is given the time its copy takes to arrive at
#: ``RESEND_BYTES_PER_MS`` (10 MB/s, far below any link's speed) before one more node is
#: asked or a node already asked is sent it again: every 50 ms, a 40 MB job would be sent to
#: every node of the cluster, and again to each, faster than a link drains.
BIG_JOB_BYTES: Final = 1024 * 1024
RESEND_BYTES_PER_MS: Final = 10_000


def resend_period(job: Job) -> int:
    """How long a waiting ADDJOB lets its REPLJOBs travel before trying again (ms)."""
    size = job.body_size
    if size < BIG_JOB_BYTES:
        return ADD_NODE_PERIOD_MS
    return max(ADD_NODE_PERIOD_MS, size // RESEND_BYTES_PER_MS)

#: Ack GC attempts: 1 s doubling to 3 min, at most 10 doublings counted, with a random error
#: of +-250 ms (Disque's JOB_GC_RETRY_MIN_PERIOD, _MAX_PERIOD, _COUNT_MAX, DISQUE_TIME_ERR).
GC_MIN_PERIOD_MS: Final = 1000
GC_MAX_PERIOD_MS: Final = 180_000
GC_RETRY_COUNT_MAX: Final = 10
TIME_ERR_MS: Final = 500
_TIME_ERR_BITS: Final = TIME_ERR_MS.bit_length()

NOREPL_TIMEOUT: Final = Error(
    "NOREPL Timeout reached before replicating to the requested number of nodes")
NOREPL_REMOVED: Final = Error(
    "NOREPL job removed (expired?) before the requested replication level was achieved")

_new_tuple: Final = tuple.__new__
_WAIT_REPL: Final = JobState.WAIT_REPL
_ACTIVE: Final = JobState.ACTIVE
_QUEUED: Final = JobState.QUEUED
_ACKED: Final = JobState.ACKED


class ReplWait:
    """A client blocked in ADDJOB until its job is replicated."""

    __slots__ = ("client", "job_id", "deadline", "added", "started", "reply")

    def __init__(self, client: Client, job_id: bytes, deadline: int, added: int) -> None:
        self.client = client
        self.job_id = job_id
        self.deadline = deadline  # ms; 0: no timeout
        self.added = added  # when one more node was last tried (ADDJOB, then every 50 ms)
        self.started = added  # the ADDJOB, when its first REPLJOBs left (replication latency)
        # The ADDJOB's reply once it has one, held until the client's earlier ADDJOBs had
        # theirs (None: still waiting).
        self.reply: Any = None


class ReplicatingBroker:
    """What this module (and ``broker.federation``'s job moves) reads and calls of the
    broker: the base class of
    ``broker.state.BrokerState``, which sets these attributes and overrides every method.

    A concrete class, not a Protocol as ``broker.core_api.BrokerCore`` is, because a replicated
    ADDJOB makes about ten of these calls on each node: compiled, a call through a Protocol
    is a Python attribute lookup and call (1.3-1.6k instructions), through this class a
    direct one."""

    node_id: str
    myself: tuple[str, ...]
    rng: random.Random
    leaving: bool
    log_wanted: bool
    jobs: dict[bytes, Job]
    queues: dict[bytes, Queue]
    timers: TimerWheel
    outbox: list[Effect]
    replication: Replication | None
    blocked_clients: int
    repl_latency: Histogram
    # ADDJOBs blocked until their job is replicated, by job ID.
    repl_wait: dict[bytes, ReplWait]

    def new_ctime(self, now_ms: int) -> int:
        raise NotImplementedError

    def register(self, job: Job, *, schedule: bool = True) -> None:
        raise NotImplementedError

    def unregister(self, job: Job) -> None:
        raise NotImplementedError

    def reschedule(self, job: Job) -> None:
        raise NotImplementedError

    def queue_for(self, name: bytes, now_ms: int) -> Queue:
        raise NotImplementedError

    def requeue_time(self, job: Job, now_ms: int) -> int:
        raise NotImplementedError

    def enqueue_job(self, job: Job, now_ms: int, *, nack: bool = False) -> bool:
        raise NotImplementedError

    def dequeue_job(self, job: Job) -> bool:
        raise NotImplementedError

    def serve_waiters(self, q: Queue, now_ms: int) -> None:
        raise NotImplementedError

    def log_job(self, job: Job, prev: Any) -> None:
        raise NotImplementedError

    def job_ended(self, job: Job, now_ms: int) -> None:
        raise NotImplementedError

    def watch_parents(self, job: Job, now_ms: int) -> None:
        raise NotImplementedError

    def ending_as(self, reason: str) -> None:
        raise NotImplementedError

    def disk_full(self, adding: int) -> bool:
        raise NotImplementedError


def gc_jitter(rng: random.Random) -> int:
    """``rng.randrange(TIME_ERR_MS) - TIME_ERR_MS // 2`` with the very same draws (as
    ``broker.state.requeue_jitter``), without ``random.py``'s interpreted frames: every acked
    job of a cluster draws one on each holder, and once more at each GC attempt."""
    r = rng.getrandbits(_TIME_ERR_BITS)
    while r >= TIME_ERR_MS:
        r = rng.getrandbits(_TIME_ERR_BITS)
    return r - TIME_ERR_MS // 2


def _rep(b: ReplicatingBroker) -> Replication:
    assert b.replication is not None
    return b.replication


# =============================================================================================
# ADDJOB

def addjob(b: ReplicatingBroker, cmd: AddJob, client: Client, now_ms: int, replicate: int,
           external: bool, ttl: int, retry: int, queue: bytes, job_id: bytes) -> Any:
    """Disque's addjobCommand after the checks ``Broker.addjob_without_policy`` already made (which also
    chose the job's ID). ``Broker.addjob_without_policy`` calls it only when other nodes take part
    (``replicate > 1`` or ``external``); a single copy kept here it makes itself, with the
    same result as this function's (tests/broker/test_hot_paths.py compares them)."""
    rep = _rep(b)
    discard_local_copy = cmd.async_ and external
    # Every local job shares the broker's one (myself,) tuple: a tuple per job was ~60 bytes
    # of each queued job (ttl and retry are packed into one word, ``Job.limits``).
    job = Job(job_id, queue, cmd.body, repl=replicate, ttl=ttl,
              retry=retry, delay=cmd.delay, ctime=b.new_ctime(now_ms),
              delivered=() if external else b.myself, state=_WAIT_REPL)
    job.flags |= FLAG_REPLICA
    job.priority = cmd.priority
    job.qtime = now_ms + (cmd.delay if cmd.delay else retry) * 1000
    if cmd.after:
        job.after = cmd.after  # waits for its parents (broker/chains.py)
        job.qtime = 0
    additional = replicate if external else replicate - 1
    reply: Any
    log_now = False
    if (replicate > 1 or external) and not cmd.async_:
        job.confirmed = () if external else b.myself
        b.register(job, schedule=False)
        wait = ReplWait(client, job.id, now_ms + cmd.timeout_ms if cmd.timeout_ms else 0,
                        now_ms)
        b.repl_wait[job.id] = wait
        waits = client.repl_waits
        if waits is None:
            client.repl_waits = waits = []
        if not waits:
            b.blocked_clients += 1
        waits.append(wait)
        _schedule_wait(b, job, wait, now_ms)
        reply = BLOCKED
    else:
        if not discard_local_copy:
            if job.delay == 0 and not external and not job.after:
                b.register(job, schedule=False)
                b.enqueue_job(job, now_ms)
            else:
                job.transition(_ACTIVE)
                b.register(job)
            log_now = True
        else:
            job.transition(_ACTIVE)
        reply = Status(job.id.decode("ascii"))
    if additional > 0:
        rep.replicate(job, additional, cmd.async_, now_ms)
    if log_now:
        b.log_job(job, None)  # after replicate: the record names the nodes asked
    if discard_local_copy:
        rep.enqueue_elsewhere(job, job.delay)
    elif job.after and reply is not BLOCKED:
        b.watch_parents(job, now_ms)
    return reply


def _schedule_wait(b: ReplicatingBroker, job: Job, wait: ReplWait, now_ms: int) -> None:
    at = max(wait.added + resend_period(job), now_ms + 1)
    if wait.deadline:
        at = min(at, wait.deadline)
    # Not ``job.awake``: that is the job's own time, which a job in WAIT_REPL waits on here.
    b.timers.schedule(job, min(at, job.etime))


def replication_timer(b: ReplicatingBroker, job: Job, now_ms: int) -> None:
    """The timer of a job in WAIT_REPL: the ADDJOB timeout, or one more node every 50 ms."""
    wait = b.repl_wait.get(job.id)
    if wait is None or b.replication is None:
        # Nobody waits any more (cannot happen: client_gone drops the job); do not leak it.
        b.unregister(job)
        return
    if wait.deadline and now_ms >= wait.deadline:
        abort_wait(b, job, NOREPL_TIMEOUT)
        b.unregister(job)
        return
    if now_ms - wait.added >= resend_period(job):
        # The next try is 50 ms from this one whether or not a node was added: with no node
        # left to add, keeping the old time scheduled the timer again 1 ms later and re-sent
        # REPLJOB to every node asked about 1,000 times a second per waiting ADDJOB (Disque
        # tries from clientsCron, at most every 50 ms per blocked client).
        b.replication.replicate(job, 1, False, now_ms)
        wait.added = now_ms
    _schedule_wait(b, job, wait, now_ms)


def abort_wait(b: ReplicatingBroker, job: Job, reply: Error) -> None:
    """The blocked ADDJOB of ``job`` fails with ``reply``; best-effort DELJOB of the copies.
    The caller unregisters the job."""
    wait = b.repl_wait.pop(job.id, None)
    if wait is None:
        return
    _finish(b, wait, reply)
    if b.replication is not None:
        b.replication.deljob(job.id, job.delivered)


def _finish(b: ReplicatingBroker, wait: ReplWait, reply: Any) -> None:
    """``wait``'s ADDJOB has its reply: emit it, and those held behind it, once every ADDJOB
    the client ran before it has had its own."""
    wait.reply = reply
    # Typed: ``Client.repl_waits`` holds ReplWaits as Any (broker/clients.py cannot import
    # this module), and each field read of an Any is a Python attribute lookup.
    waits: list[ReplWait] | None = wait.client.repl_waits
    if waits is None or waits[0] is not wait:
        return  # an earlier one still waits (or the client is gone)
    done = 0
    for held in waits:
        if held.reply is None:
            break
        # A plain tuple's constructor: a NamedTuple's own __new__ is interpreted code.
        b.outbox.append(_new_tuple(Reply, (held.client, held.reply)))
        done += 1
    del waits[:done]
    if not waits:
        b.blocked_clients -= 1


def client_gone(b: ReplicatingBroker, client: Client) -> None:
    """A client blocked in ADDJOB disconnected: as Disque, each job still waiting for its
    copies is dropped (DELJOB); those confirmed, their reply held behind, stay."""
    waits = client.repl_waits
    if not waits:
        return
    client.repl_waits = None
    b.blocked_clients -= 1
    for wait in waits:
        job_id = wait.job_id
        if b.repl_wait.get(job_id) is not wait:
            continue  # confirmed (or failed) already
        del b.repl_wait[job_id]
        job = b.jobs.get(job_id)
        if job is not None:
            if b.replication is not None:
                b.replication.deljob(job_id, job.delivered)
            b.unregister(job)


def got_job(b: ReplicatingBroker, job_id: bytes, sender: str, now_ms: int) -> bool:
    """GOTJOB from ``sender``: counted only from a node this node asked (in
    ``job.delivered``): a node never asked cannot hold the copy the client is promised."""
    job = b.jobs.get(job_id)
    if job is None or job.state is not _WAIT_REPL or sender not in job.delivered:
        return False
    if sender not in job.confirmed:
        job.confirmed += (sender,)
    if len(job.confirmed) >= job.repl:
        replication_achieved(b, job, now_ms)
    return True


def replication_achieved(b: ReplicatingBroker, job: Job, now_ms: int) -> bool:
    """Disque's jobReplicationAchieved. False if the job left this node (external)."""
    waits = b.repl_wait
    wait = waits.get(job.id)  # get and del: compiled, ``dict.pop`` with a default is a
    if wait is not None:      # Python-level method call
        del waits[job.id]
        b.repl_latency.observe((now_ms - wait.started) / 1000)
    job.transition(_ACTIVE)
    job.confirmed = ()
    if b.node_id not in job.delivered:
        # Replicated externally: one of the holders queues it; this node forgets it.
        _rep(b).enqueue_elsewhere(job, job.delay)
        if wait is not None:
            _finish(b, wait, Status(job.id.decode("ascii")))
        b.ending_as("moved")  # broker/results.py: it lives on its holders
        b.unregister(job)
        b.ending_as("deleted")
        return False
    if job.delay == 0 and not job.after:
        b.enqueue_job(job, now_ms)
    else:
        b.reschedule(job)
    b.log_job(job, None)
    if wait is not None:
        _finish(b, wait, Status(job.id.decode("ascii")))
    if job.after:
        b.watch_parents(job, now_ms)
    return True


# =============================================================================================
# Acknowledgements

def acknowledge(b: ReplicatingBroker, job: Job, now_ms: int, *, collecting: bool = False
                ) -> bool:
    """Disque's ACK-JOB: False if the job was acked already. ``collecting``: the caller makes
    a GC attempt (``gc``) right after, which arms the job's timer itself."""
    if job.state is _ACKED:
        return False
    if job.state is _WAIT_REPL:
        # Acked before ADDJOB reached its replication level: the client gets its ID now.
        if not replication_achieved(b, job, now_ms):
            return False
    prev = job.to_record() if b.log_wanted else None  # log_job drops it otherwise
    b.dequeue_job(job)
    job.transition(_ACKED)
    job.confirmed = ()
    job.flags |= FLAG_REPLICA
    # The next GC attempt (ACKJOB also tries at once; a SETACK receiver waits): Disque's
    # updateJobAwakeTime for an acked job.
    job.qtime = now_ms + GC_MIN_PERIOD_MS + gc_jitter(b.rng)
    if not collecting:
        b.reschedule(job)
    b.log_job(job, prev)
    b.job_ended(job, now_ms)
    return True


def dummy_ack(b: ReplicatingBroker, job_id: bytes, now_ms: int) -> Job | None:
    """An ACK for a job this node does not know: held as an acked job with no
    ``delivered`` nodes, only for at-least-once IDs (odd TTL field), on a cluster of more
    than one node, and never on a leaving node (Disque's ackjobCommand)."""
    if b.leaving or _rep(b).cluster_size() <= 1:
        return None
    try:
        ttl_field = int(job_id[-4:], 16)
    except ValueError:
        return None  # an ID from elsewhere whose TTL field is not hex: no way to tell
    if not ttl_field & 1:
        return None
    ttl = max(1, min(ttl_field * 60, 3600 * 24 * 365 * 10))
    job = Job(job_id, b"", b"", repl=1, ttl=ttl, retry=0, delay=0,
              ctime=now_ms * 1_000_000, delivered=(), state=_ACKED)
    job.flags |= FLAG_REPLICA
    job.qtime = now_ms
    b.register(job)
    b.log_job(job, None)
    return job


def gc(b: ReplicatingBroker, job: Job, now_ms: int) -> None:
    """One GC attempt on an acked job (its timer, ACKJOB, or a SETACK that asks for it)."""
    nxt = _rep(b).try_gc(job, now_ms)
    if not nxt:
        free(b, job)
        return
    job.qtime = nxt
    b.reschedule(job)


def free(b: ReplicatingBroker, job: Job) -> None:
    """Forget a job for good (GC done, DELJOB, FASTACK), with its ``del`` record."""
    if b.jobs.get(job.id) is not job:
        return
    if not b.log_wanted:
        # No log to write it to: a FASTACK frees each job on every holder, and the record
        # (the job's whole state, for the undo) was the largest part of that.
        b.unregister(job)
        return
    prev = job.to_record()
    b.unregister(job)
    b.outbox.append(LogRecord("del", job.id, prev))


def fastack(b: ReplicatingBroker, ids: tuple[bytes, ...] | list[bytes]) -> int:
    """FASTACK on a cluster node: each job is freed here and DELJOB goes to the nodes that
    may hold it (every node for an ID not known here); returns Disque's count."""
    rep = _rep(b)
    jobs = b.jobs
    known = 0
    for job_id in ids:
        job = jobs.get(job_id)
        if job is None:
            rep.deljob(job_id, None)
        else:
            rep.deljob(job_id, job.delivered)
            free(b, job)
            known += 1
    return known


def ack_command(b: ReplicatingBroker, ids: tuple[bytes, ...] | list[bytes], now_ms: int) -> int:
    """ACKJOB on a cluster node; returns Disque's count."""
    known = 0
    for job_id in ids:
        job = b.jobs.get(job_id)
        if job is None:
            job = dummy_ack(b, job_id, now_ms)
        elif job.state is not _ACKED and job.state is not _WAIT_REPL and all(
                n == b.node_id for n in job.delivered):
            # Only this node ever held it (REPLICATE 1): nobody to tell, so the ACK is
            # collected at once with one short record, as on a single node, instead of an
            # acked job record (with its body) and a later ``del`` (Disque's tryJobGC frees
            # such a job at once too).
            prev = job.to_record()
            b.dequeue_job(job)
            job.transition(_ACKED)
            b.unregister(job)
            b.outbox.append(LogRecord("ack", job_id, prev))
            known += 1
            continue
        elif acknowledge(b, job, now_ms, collecting=True):
            known += 1
        if job is not None and b.jobs.get(job_id) is job:
            gc(b, job, now_ms)
    return known


# =============================================================================================
# What peers' messages do to a job (called by cluster/jobs.py)

def add_replica(b: ReplicatingBroker, job: Job, now_ms: int) -> None:
    """A REPLJOB's job (ACTIVE, as ``cluster.job_messages`` checked), new here: a later
    queueing of it broadcasts QUEUED."""
    job.confirmed = ()
    job.flags |= FLAG_QUEUED_BEFORE | FLAG_REPLICA
    if job.retry:
        # A copy is queued here only if nobody else did within RETRY: from now, or from the
        # end of the DELAY (the origin queues a delayed job then, without telling anyone), and
        # with this node's own random error, so holders never share one requeue instant.
        # (Disque keeps the sender's qtime: every holder of a delayed job would queue it when
        # the delay ends.)
        base = max(job.qtime, now_ms) if job.delay else now_ms
        job.qtime = b.requeue_time(job, base)
    if job.after:
        job.qtime = 0  # waiting for its parents (broker/chains.py)
    b.register(job)
    b.log_job(job, None)
    if job.after:
        b.watch_parents(job, now_ms)


def merge_delivered(job: Job, nodes: tuple[str, ...] | list[str]) -> bool:
    known = job.delivered
    for n in nodes:
        if n not in known:
            break
    else:
        return False  # the common case (a GOTACK from a holder): nothing to build
    new = tuple(n for n in dict.fromkeys(nodes) if n not in known)
    if new:
        job.delivered += new
    return bool(new)


def enqueue(b: ReplicatingBroker, job: Job, now_ms: int, delay: int) -> None:
    """ENQUEUE from the node that created the job without keeping a copy."""
    prev = job.to_record()
    job.flags &= ~FLAG_QUEUED_BEFORE  # the first queueing: no QUEUED broadcast
    if delay == 0:
        if not b.enqueue_job(job, now_ms):
            return
    else:
        job.qtime = now_ms + delay * 1000
        b.reschedule(job)
    b.log_job(job, prev)


def requeue_later(b: ReplicatingBroker, job: Job, now_ms: int, dequeue: bool, nack: bool,
                  deliv: bool) -> None:
    """QUEUED / WORKING from another holder: dequeue (if told), move the retry time."""
    prev = job.to_record()
    if dequeue:
        b.dequeue_job(job)
    if job.retry:
        job.flags |= FLAG_WILLQUEUE
        job.qtime = b.requeue_time(job, now_ms)
        b.reschedule(job)
    if nack:
        job.nacks += 1
    if deliv:
        job.deliveries += 1
    b.log_job(job, prev)


def set_pause(b: ReplicatingBroker, queue: bytes, flags: int, now_ms: int) -> None:
    """PAUSE from a peer (PAUSE ... BCAST on another node): the queue's flags become these."""
    q = b.queues.get(queue)
    if q is None:
        if not flags:
            return
        q = b.queue_for(queue, now_ms)
    was_out = q.pause & PAUSE_OUT
    q.pause = flags
    if was_out and not flags & PAUSE_OUT and q.waiters:
        b.serve_waiters(q, now_ms)


