"""The cluster job core: replicated jobs' messages, sans-IO.

Theory of operation
-------------------
Disque's job state machine (README, "Disque implementation details") is split in two. The
broker owns jobs, queues, blocked clients and the one timer wheel, and calls this core
through ``broker.replication.Replication`` when a command or a timer must tell other nodes
(REPLJOB at ADDJOB and every 50 ms while slow, WILLQUEUE 500 ms before a requeue, QUEUED on
a requeue or NACK, WORKING, SETACK during ack GC, DELJOB, ENQUEUE, PAUSE). This core owns
those messages: it picks nodes from the membership core's table, emits ``Send`` effects,
and handles the same messages from peers (``receive``), changing jobs only through
``broker.cluster_jobs`` so every change carries its append-log record.

Handlers (one per message type, ``_on_<type>``), each the README's step list:
REPLJOB -> ``_on_repljob``, GOTJOB -> ``_on_gotjob``, ENQUEUE -> ``_on_enqueue``,
WILLQUEUE -> ``_on_willqueue``, QUEUED and WORKING -> ``_on_queued``, SETACK ->
``_on_setack``, GOTACK -> ``_on_gotack``, DELJOB -> ``_on_deljob``, PAUSE -> ``_on_pause``.

Batches: a run of SETACK, GOTACK, DELJOB, WILLQUEUE or QUEUED messages to one node, with
nothing else to that node in between, leaves as one ``*_BATCH`` frame (``_send``), and a
received batch is handled entry by entry, as the single messages would be.

Invariants: a frame is handled only from a sender in the node table (not in handshake), as
Disque's ``if (!sender) return``; a malformed body is logged (key ``malformed-job:<ip>``)
and dropped, never raised; no handler calls back into a broker command, and no broker call
re-enters this core except to emit messages. State kept here: the GC retry count of acked
jobs (Disque's ``gc_retry``), dropped when the broker forgets the job.

Ordering the runtime must keep (durability): take the broker's effects *before* this
core's after every event, and send a GOTJOB only once the log records emitted before it are
durable (a node answers GOTJOB only for a job it will still have after kill -9).
"""

from __future__ import annotations

import random
from typing import Any, Final

from broker import cluster_jobs
from broker.cluster_jobs import (
    BIG_JOB_BYTES,
    GC_MAX_PERIOD_MS,
    GC_MIN_PERIOD_MS,
    GC_RETRY_COUNT_MAX,
    gc_jitter,
)
from broker.core import Broker
from broker.job import REC_CONFIRMED, REC_STATE, Job, JobState, state_name
from cluster.effects import ClusterEffect, EffectQueue, LinkId, LogLine, Send
from cluster.job_messages import (
    BATCH_OF,
    JOB_TYPES,
    MAX_BATCH,
    Batch,
    Enqueue,
    GotAck,
    JobMessage,
    JobRef,
    PauseQueue,
    Queued,
    ReplJob,
    SetAck,
    batch_item,
    batch_items,
    parse,
    repljob_body,
    repljob_fields,
    single_body,
)
from cluster.membership import Membership
from cluster.peer_frames import accept, member, member_id
from cluster.wire import Frame, MalformedBody, MessageType, new_frame, received_body
from protocol.jobid import is_valid

_WAIT_REPL: Final = JobState.WAIT_REPL
_ACTIVE: Final = JobState.ACTIVE
# Its record name, read once: compiled, ``_ACTIVE.value`` is a Python-level descriptor call.
_ACTIVE_NAME: Final = state_name(_ACTIVE)
_QUEUED: Final = JobState.QUEUED
_ACKED: Final = JobState.ACKED

_DELJOB: Final = MessageType.DELJOB
_REPLJOB: Final = MessageType.REPLJOB
_SETACK: Final = MessageType.SETACK
_GOTACK: Final = MessageType.GOTACK
_DELJOB_BATCH: Final = MessageType.DELJOB_BATCH
_SETACK_BATCH: Final = MessageType.SETACK_BATCH
_GOTACK_BATCH: Final = MessageType.GOTACK_BATCH

_UNREACHABLE: Final = frozenset({"myself", "handshake", "leaving", "pfail", "fail", "noaddr"})


class JobCore(EffectQueue):
    HANDLES: frozenset[MessageType] = JOB_TYPES

    def __init__(self, broker: Broker, membership: Membership,
                 rng: random.Random | None = None) -> None:
        self.broker = broker
        self.membership = membership
        self.rng = rng or random.Random()
        self.outbox = []
        self.gc_retry: dict[bytes, int] = {}
        # Big jobs only: job ID -> node -> when its REPLJOB was last sent there.
        self.big_sent: dict[bytes, dict[str, int]] = {}
        self.stats: dict[str, int] = {"sent": 0, "received": 0, "malformed": 0}
        # Node ID -> the batchable run open in the outbox for it: [single type, the run's
        # index in the outbox, its entries]; cleared when the outbox is taken.
        self._runs: dict[str, list[Any]] = {}

    # =========================================================================================
    # The runtime's side (cluster/effects.py)

    def take_effects(self) -> list[ClusterEffect]:
        effects, self.outbox = self.outbox, []
        self._runs.clear()
        return effects

    def tick(self, now_ms: int) -> None:
        """Nothing: every job timer is in the broker's wheel (``Broker.tick``)."""

    def receive(self, frame: Frame, link: LinkId, peer_ip: str, local_ip: str,
                outbound_to: str | None, now_ms: int) -> None:
        mtype = frame.type
        if mtype is MessageType.GOTJOB or mtype is MessageType.REPLJOB:
            # The most frequent job messages (one of each per replica of every replicated
            # ADDJOB): their fields read here, no message object (a frozen dataclass's
            # ``__init__`` is interpreted even when compiled); anything odd takes ``accept``.
            sender_id = member(self.membership, frame)
            body = received_body(frame)
            if sender_id is not None and type(body) is dict:
                if mtype is MessageType.GOTJOB:
                    job_id = body.get("id")
                    if type(job_id) is bytes and is_valid(job_id):
                        self._count_received()
                        self._got_job(job_id, sender_id, now_ms)
                        return
                else:
                    try:
                        record, noreply = repljob_fields(body)
                    except MalformedBody:
                        pass  # ``accept`` logs it
                    else:
                        self._count_received()
                        self._repl_job(Job.from_record(record), noreply, sender_id, now_ms)
                        return
        elif mtype is _DELJOB_BATCH or mtype is _SETACK_BATCH or mtype is _GOTACK_BATCH:
            # A round's FASTACK DELJOBs or ack GC (a frame per round and holder): the entries,
            # checked as ``parse`` checks them, are handled with no message object; a batch
            # with any entry wrong takes ``accept``, which drops it.
            sender_id = member(self.membership, frame)
            body = received_body(frame)
            if sender_id is not None and type(body) is dict:
                single = (_DELJOB if mtype is _DELJOB_BATCH
                          else _SETACK if mtype is _SETACK_BATCH else _GOTACK)
                try:
                    items = batch_items(body, single)
                except MalformedBody:
                    pass  # ``accept`` logs it
                else:
                    self._count_received()
                    if single is _DELJOB:
                        b = self.broker
                        jobs = b.jobs
                        for job_id in items:
                            job = jobs.get(job_id)
                            if job is not None:
                                cluster_jobs.free(b, job)
                    elif single is _SETACK:
                        for job_id, may_have in items:
                            self._set_ack(job_id, may_have, sender_id, now_ms)
                    else:
                        for job_id, known in items:
                            self._got_ack(job_id, known, sender_id, now_ms)
                    return
        accepted = accept(self.membership, frame, peer_ip, parse, self.stats, self.outbox, "job")
        if accepted is not None:
            msg, sender_id = accepted
            if type(msg) is Batch:  # WILLQUEUE and QUEUED batches: the others return above
                for one in msg.messages():
                    _HANDLERS[one.type](self, one, sender_id, now_ms)
            else:
                _HANDLERS[msg.type](self, msg, sender_id, now_ms)

    def receive_gotjobs(self, frame: Frame, bodies: list[dict[str, Any]], link: LinkId,
                        peer_ip: str, local_ip: str, outbound_to: str | None,
                        now_ms: int) -> None:
        """A BATCH of GOTJOBs (``bodies``, checked maps: ``cluster.wire.batch_of``), as
        ``receive`` of each one alone would handle them, in order, with no frame or call per
        message: the origin of a replicated ADDJOB gets one per replica. A body that is not a
        plain GOTJOB from a member takes ``receive`` (which logs and drops it)."""
        sender = frame.sender
        sender_id = member_id(self.membership, sender)
        handled = 0
        for body in bodies:
            job_id = body.get("id")
            if sender_id is not None and type(job_id) is bytes and is_valid(job_id):
                handled += 1
                self._got_job(job_id, sender_id, now_ms)
            else:
                self.receive(new_frame(MessageType.GOTJOB, sender, body), link, peer_ip,
                             local_ip, outbound_to, now_ms)
        if handled:  # what ``accept`` counts for the frames it lets through
            self.membership.messages_received += handled
            self.stats["received"] += handled

    def _count_received(self) -> None:
        """What ``accept`` counts for a frame it lets through."""
        self.membership.messages_received += 1
        self.stats["received"] += 1

    # =========================================================================================
    # broker.replication.Replication

    def cluster_size(self) -> int:
        return self.membership.size()

    def _reachable(self) -> list[str]:
        return [n.node_id for n in self.membership.nodes.values()
                if n.link is not None and n.flags.isdisjoint(_UNREACHABLE)]

    def _others(self) -> list[str]:
        me = self.membership.myself_id
        return [n.node_id for n in self.membership.nodes.values()
                if n.node_id != me and "handshake" not in n.flags]

    def replicate(self, job: Job, count: int, noreply: bool, now_ms: int) -> int:
        added = 0
        if count > 0:
            candidates = self._reachable()
            shuffle(self.rng, candidates)
            delivered = job.delivered
            for node_id in candidates:
                if node_id not in delivered:
                    delivered += (node_id,)
                    added += 1
                    if added == count:
                        break
            job.delivered = delivered
        record = job.to_record()
        record[REC_STATE] = _ACTIVE_NAME  # the copy is ACTIVE at the receiver
        record[REC_CONFIRMED] = []
        # A big job is sent again to a node already asked only once its copy had time to
        # arrive (cluster_jobs.resend_period), even when a new holder was added.
        sent_at = None
        resend_ms = 0
        if job.body_size >= BIG_JOB_BYTES:
            sent_at = self.big_sent.setdefault(job.id, {})
            resend_ms = cluster_jobs.resend_period(job)
        # One body per noreply value, shared by the replicas: the bus encodes a body it has
        # just encoded for another link only once (``node/bus_core.py``).
        body: dict[str, Any] | None = None
        quiet_body: dict[str, Any] | None = None
        me = self.membership.myself_id
        confirmed_ids = job.confirmed
        outbox = self.outbox
        runs = self._runs
        sent = 0
        for node_id in job.delivered:
            if node_id == me:
                continue
            confirmed = node_id in confirmed_ids
            if confirmed and added == 0:
                continue  # Disque: a node that has its copy hears again only of new holders
            if sent_at is not None:
                last = sent_at.get(node_id)
                if last is not None and now_ms - last < resend_ms:
                    continue  # its copy may still be on the way
                sent_at[node_id] = now_ms
            if noreply or confirmed:
                if quiet_body is None:
                    quiet_body = repljob_body(record, True)
                one = quiet_body
            else:
                if body is None:
                    body = repljob_body(record, False)
                one = body
            if runs:
                runs.pop(node_id, None)
            outbox.append(Send(node_id, _REPLJOB, one))
            sent += 1
        if sent:  # what ``_send_body`` counts, once for the job
            self.stats["sent"] += sent
            self.membership.messages_sent += sent
        return added

    def enqueue_elsewhere(self, job: Job, delay: int) -> None:
        me = self.membership.myself_id
        pool = [n for n in (job.confirmed or job.delivered) if n != me]
        if pool:
            self._send(self.rng.choice(pool), Enqueue(job.id, delay))

    def queued(self, job: Job, nack: bool) -> None:
        self._to_delivered(job, Queued(job.id, nack, not nack))

    def will_queue(self, job: Job) -> None:
        self._to_delivered(job, JobRef(MessageType.WILLQUEUE, job.id))

    def working(self, job: Job) -> None:
        self._to_delivered(job, JobRef(MessageType.WORKING, job.id))

    def deljob(self, job_id: bytes, nodes: tuple[str, ...] | None) -> None:
        me = self.membership.myself_id
        for node_id in (self._others() if nodes is None else nodes):
            if node_id != me:
                self._send_item(node_id, _DELJOB, job_id)

    def try_gc(self, job: Job, now_ms: int) -> int:
        """Disque's tryJobGC. 0: free the job now; else the time of the next attempt."""
        me = self.membership.myself_id
        dummy = not job.delivered
        retry = self.gc_retry.get(job.id, 0)
        if retry != GC_RETRY_COUNT_MAX:
            self.gc_retry[job.id] = retry + 1
        if not job.confirmed:
            job.confirmed = (me,)
        all_reached = not dummy and _all_in(job.delivered, job.confirmed)
        if all_reached or (dummy and self.cluster_size() == 1):
            return 0
        targets = job.delivered if job.delivered else tuple(self._others())
        for node_id in targets:
            if node_id != me and node_id not in job.confirmed:
                self._send_item(node_id, _SETACK, [job.id, len(job.delivered)])
        period = min(GC_MIN_PERIOD_MS * (1 << retry), GC_MAX_PERIOD_MS)
        return now_ms + period + gc_jitter(self.rng)

    def forget(self, job_id: bytes) -> None:
        # ``in`` and ``del``, not ``pop(key, None)``: compiled, a method call each.
        gc_retry = self.gc_retry
        if job_id in gc_retry:
            del gc_retry[job_id]
        big_sent = self.big_sent
        if big_sent and job_id in big_sent:
            del big_sent[job_id]

    def pause(self, queue: bytes, flags: int) -> None:
        for node_id in self._others():
            self._send(node_id, PauseQueue(queue, flags))

    # =========================================================================================
    # Handlers: one per message type, Disque's README steps

    def _on_repljob(self, msg: ReplJob, sender: str, now_ms: int) -> None:
        self._repl_job(msg.job(), msg.noreply, sender, now_ms)

    def _repl_job(self, job: Job, noreply: bool, sender: str, now_ms: int) -> None:
        b = self.broker
        # Not while short of memory or leaving: no GOTJOB, the sender tries another node.
        if b.memory_level() > 0 or b.leaving:
            return
        q = b.queues.get(job.queue)
        if q is not None and q.pause & 1:  # paused in input
            return
        existing = b.jobs.get(job.id)
        if existing is not None:
            # Step 2: a duplicate (or a refresh every 50 ms): learn the other holders.
            if existing.state is not _ACKED:
                cluster_jobs.merge_delivered(existing, job.delivered)
        elif b.disk_full(job.body_size):
            return  # past maxdisk: no copy, no GOTJOB, as short of memory
        else:
            cluster_jobs.add_replica(b, job, now_ms)
        if not noreply:
            self._send_body(sender, MessageType.GOTJOB, {"id": job.id})

    def _on_gotjob(self, msg: JobRef, sender: str, now_ms: int) -> None:
        self._got_job(msg.job_id, sender, now_ms)

    def _got_job(self, job_id: bytes, sender: str, now_ms: int) -> None:
        if not cluster_jobs.got_job(self.broker, job_id, sender, now_ms):
            job = self.broker.jobs.get(job_id)
            if job is not None and job.state is _WAIT_REPL:
                self._log("debug", f"GOTJOB from {sender[:8]}, a node not asked",
                          f"gotjob-not-asked:{sender}")

    def _on_enqueue(self, msg: Enqueue, sender: str, now_ms: int) -> None:
        b = self.broker
        job = b.jobs.get(msg.job_id)
        if job is None or job.state not in (_WAIT_REPL, _ACTIVE):
            return
        q = b.queues.get(job.queue)
        if q is not None and q.pause & 1:
            return
        if job.state is _WAIT_REPL:
            return  # ours, still replicating: the origin queues it when replicated
        cluster_jobs.enqueue(b, job, now_ms, msg.delay)

    def _on_queued(self, msg: Queued | JobRef, sender: str, now_ms: int) -> None:
        b = self.broker
        job = b.jobs.get(msg.job_id)
        if job is None:
            return
        if job.state is _ACKED:
            # Someone queued a job acked here: make it drop it.
            self._send(sender, SetAck(job.id, len(job.delivered)))
            return
        if job.state is _WAIT_REPL:
            return
        working = msg.type is MessageType.WORKING
        dequeue = job.state is _QUEUED and (working or sender > b.node_id)
        nack = isinstance(msg, Queued) and msg.nack
        deliv = isinstance(msg, Queued) and msg.deliv
        cluster_jobs.requeue_later(b, job, now_ms, dequeue, nack, deliv)

    def _on_willqueue(self, msg: JobRef, sender: str, now_ms: int) -> None:
        job = self.broker.jobs.get(msg.job_id)
        if job is None:
            return
        if job.state in (_ACTIVE, _QUEUED):
            cluster_jobs.merge_delivered(job, (sender,))
        if job.state is _QUEUED:
            self._to_delivered(job, Queued(job.id))
        elif job.state is _ACKED:
            self._send(sender, SetAck(job.id, len(job.delivered)))

    def _on_setack(self, msg: SetAck, sender: str, now_ms: int) -> None:
        self._set_ack(msg.job_id, msg.may_have, sender, now_ms)

    def _set_ack(self, job_id: bytes, may_have: int, sender: str, now_ms: int) -> None:
        b = self.broker
        job = b.jobs.get(job_id)
        if job is not None:
            cluster_jobs.acknowledge(b, job, now_ms)
            if b.jobs.get(job_id) is not job:
                job = None  # externally replicated: it just left this node
        if job is None or len(job.delivered) <= may_have:
            if job is not None and job.state is _ACKED and _all_in_two(
                    job.delivered, self.membership.myself_id, sender):
                # The sender acked it and is the only other holder this node knows: nobody
                # else can requeue a copy this one must stop, so it goes now, instead of
                # at the sender's DELJOB once this GOTACK arrived (which it no longer
                # sends for a job of two holders, ``_got_ack``).
                cluster_jobs.free(b, job)
            self._send_item(sender, _GOTACK, [job_id, job is not None])
        else:
            if may_have == 0:
                self._send_item(sender, _GOTACK, [job_id, True])
            cluster_jobs.gc(b, job, now_ms)

    def _on_gotack(self, msg: GotAck, sender: str, now_ms: int) -> None:
        self._got_ack(msg.job_id, msg.known, sender, now_ms)

    def _got_ack(self, job_id: bytes, known: bool, sender: str, now_ms: int) -> None:
        b = self.broker
        job = b.jobs.get(job_id)
        if job is None or job.state is not _ACKED:
            return
        delivered = job.delivered
        dummy = not delivered
        if dummy and known:
            cluster_jobs.free(b, job)  # an authoritative node has it: drop the dummy
            return
        if not dummy and (known or sender in delivered) and _all_in_two(
                delivered, self.membership.myself_id, sender):
            # The only other holder answered (a job moved here and acked here): every copy
            # is confirmed, with nothing to record first. That holder freed its copy when it
            # answered (``_set_ack``), so no DELJOB; a node that did not (an older version)
            # collects it with its own GC, and its SETACK then finds the job gone here.
            cluster_jobs.free(b, job)
            return
        if not job.confirmed:
            job.confirmed = (self.membership.myself_id,)
        if known or sender in job.delivered:
            cluster_jobs.merge_delivered(job, (sender,))
        if known or sender in job.delivered or dummy:
            if sender not in job.confirmed:
                job.confirmed += (sender,)
        if dummy:
            if len(job.confirmed) >= self.cluster_size():
                cluster_jobs.free(b, job)  # nobody knows the job: a wrong ID
            return
        if _all_in(job.delivered, job.confirmed):
            if not _all_in_two(job.delivered, self.membership.myself_id, sender):
                self.deljob(job.id, job.delivered)
            cluster_jobs.free(b, job)

    def _on_deljob(self, msg: JobRef, sender: str, now_ms: int) -> None:
        job = self.broker.jobs.get(msg.job_id)
        if job is not None:
            cluster_jobs.free(self.broker, job)

    def _on_pause(self, msg: PauseQueue, sender: str, now_ms: int) -> None:
        cluster_jobs.set_pause(self.broker, msg.queue, msg.flags, now_ms)

    # =========================================================================================

    def _send(self, node_id: str, msg: JobMessage) -> None:
        """Queue ``msg`` for ``node_id``. A SETACK, GOTACK, DELJOB, WILLQUEUE or QUEUED
        following one of the same type to the same node, with nothing else sent to that
        node between them, joins its frame (a ``Batch``): one frame per run instead of one
        per job, and each node still receives every message in the order it was sent."""
        if msg.type in BATCH_OF:
            self._send_item(node_id, msg.type, batch_item(msg))  # type: ignore[arg-type]
            return
        runs = self._runs
        if runs:
            runs.pop(node_id, None)  # what follows for that node goes after this
        self.stats["sent"] += 1
        self.membership.messages_sent += 1
        self.outbox.append(Send(node_id, msg.type, msg.body()))

    def _send_item(self, node_id: str, single: MessageType, item: Any) -> None:
        """``_send`` of a batchable message given as its batch entry ``item`` (``batch_item``),
        with no message object: a FASTACK or an ACKJOB of 100 IDs sends 200 of them."""
        runs = self._runs
        run = runs.get(node_id)
        if run is not None and run[0] is single and len(run[2]) < MAX_BATCH:
            items: list[Any] = run[2]
            items.append(item)
            if len(items) == 2:  # the run's first frame becomes a batch of both
                batch_type = BATCH_OF[single]
                self.outbox[run[1]] = Send(node_id, batch_type, Batch(batch_type,
                                                                          items).body())
            return
        runs[node_id] = [single, len(self.outbox), [item]]
        self.stats["sent"] += 1
        self.membership.messages_sent += 1
        self.outbox.append(Send(node_id, single, single_body(single, item)))

    def _send_body(self, node_id: str, mtype: MessageType, body: dict[str, Any]) -> None:
        """Queue a message already made into its body (not one of ``BATCH_OF``'s types)."""
        runs = self._runs
        if runs:
            runs.pop(node_id, None)
        self.stats["sent"] += 1
        self.membership.messages_sent += 1
        self.outbox.append(Send(node_id, mtype, body))

    def _to_delivered(self, job: Job, msg: JobMessage) -> None:
        me = self.membership.myself_id
        for node_id in job.delivered:
            if node_id != me:
                self._send(node_id, msg)

    def _log(self, level: str, text: str, key: str) -> None:
        self.outbox.append(LogLine(level, text, key))


def _all_in(nodes: tuple[str, ...], among: tuple[str, ...]) -> bool:
    """``set(nodes) <= set(among)`` for the few node IDs of a job, without building sets
    (two per acked job's GC attempt and GOTACK)."""
    for n in nodes:
        if n not in among:
            return False
    return True


def _all_in_two(nodes: tuple[str, ...], one: str, other: str) -> bool:
    """Whether every node of ``nodes`` is ``one`` or ``other``."""
    for n in nodes:
        if n != one and n != other:
            return False
    return True


def shuffle(rng: random.Random, items: list[str]) -> None:
    """``rng.shuffle(items)``, compiled: the same swaps from the same draws (so a seeded
    harness picks the same nodes), without ``random.py``'s interpreted loop per ADDJOB."""
    i = len(items) - 1
    while i > 0:
        n = i + 1
        bits = n.bit_length()
        j = rng.getrandbits(bits)
        while j >= n:
            j = rng.getrandbits(bits)
        items[i], items[j] = items[j], items[i]
        i -= 1


_HANDLERS: Final[dict[MessageType, Any]] = {
    MessageType.REPLJOB: JobCore._on_repljob,
    MessageType.GOTJOB: JobCore._on_gotjob,
    MessageType.ENQUEUE: JobCore._on_enqueue,
    MessageType.WILLQUEUE: JobCore._on_willqueue,
    MessageType.QUEUED: JobCore._on_queued,
    MessageType.WORKING: JobCore._on_queued,
    MessageType.SETACK: JobCore._on_setack,
    MessageType.GOTACK: JobCore._on_gotack,
    MessageType.DELJOB: JobCore._on_deljob,
    MessageType.PAUSE: JobCore._on_pause,
}
