"""The federation core: NEEDJOBS and YOURJOBS, sans-IO.

Theory of operation
-------------------
Jobs flow towards the nodes where consumers wait (Disque's README, "Federation"; its
``queue.c``: ``needJobsForQueue``, ``receiveNeedJobs``, ``receiveYourJobs``). The broker
calls ``need_jobs`` (``broker.federation.Federation``) when a GETJOB finds a queue empty
or a client takes a job that leaves it at its low water (0 unless importing); this core
decides whom to ask:

* **broadcast**: NEEDJOBS(queue, 1) to every other node with a link, to discover sources.
  Sent when ``now - bcast_time >= min(bcast_min << bcast_attempt, bcast_max)`` (at once the
  first time), and each send doubles the next delay (2, 4, 8, 16, 30, 30 s with Disque's
  defaults). A node never seen as a source answering resets ``bcast_attempt``.
* **ad hoc**: NEEDJOBS(queue, n) to the queue's recent sources (nodes whose YOURJOBS for it
  arrived within ``RESPONDER_TTL_MS``), n = twice the low water (below), or the COUNTs of
  the clients waiting if more, shared among the sources, within [5, 1000] (Disque: a
  second's worth at the import rate, up to 100). Sent when ``now - adhoc_time >=
  min(adhoc_min << adhoc_attempt, adhoc_max)`` (25 ms doubling to 2 s), or at once,
  unthrottled, when a client took a job that left the queue at its low water or below while
  the import rate is positive (Disque's NEEDJOBS_REACHED_ZERO, at zero; with a zero rate
  that case does nothing), or when a YOURJOBS leaves clients still waiting (``_ask_again``).
  Any YOURJOBS received resets ``adhoc_attempt``.
* **low water** (``Queue.low_water``, set at each YOURJOBS): the jobs consumers here take in
  two round trips plus four times their deviation at the import rate, the round trip being
  the time from an ad hoc NEEDJOBS to its source's next YOURJOBS, smoothed as TCP does
  (``_QueueFed.rtt``, ``rttvar``; each sample capped at 4 x adhoc_min, as a source short of
  jobs answers only once it has some). The broker
  calls ``need_jobs(q, True)`` when a job taken leaves that many or fewer, so the next
  batch is asked for before the queue runs dry and no more is asked for than it takes.
* **owed**: after an ad hoc request, the jobs asked for and not received yet. While some
  are owed, no other ad hoc request goes (of any kind) for two round trips (adhoc_min
  before one was measured): a source short of jobs keeps the ask (below) and sends the
  rest as they are queued, and asking again at each one doubled the messages per job.

Disque re-runs the "clients waiting" case from its client cron for every queue with a
blocked client; here each such queue has an explicit due time (the earlier of its next
broadcast and next ad hoc request) in a heap: ``next_deadline()`` says when, ``tick(now)``
runs the due ones. A queue whose clients left is dropped at its due time.

Answering (``_on_needjobs``): nothing if the queue is empty here (the ask is kept, below),
paused in output, or itself importing (rate > 0), or if the asker has no link (Disque takes
the jobs out first and then finds no link, losing at-most-once jobs); else ``count`` jobs
when the queue holds at least twice that, otherwise half of it (at least one; the rest at
the next tick, as for a kept ask, when the ask was short), taken out
through ``broker.federation.export_jobs`` and sent in as many YOURJOBS as their size needs
(``cluster.batches.cut``: a few MiB each, so 1 MB jobs move as fast as small ones). A job
whose body is over ``job-max-body-len`` (kept from before the limit was lowered) is not
exported, nor any job behind it: it stays queued here. A leaving node answers but never
asks. Receiving (``_on_yourjobs``): each job through ``broker.federation.import_job``;
every one queued counts towards the import rate and makes the sender a source. Blocked
clients are served as each job is queued; the "last job taken" requests that serving causes
are run after the whole message, once the rate counts it and only if the queue is still
empty (Disque serves blocked clients after the event loop iteration, with the same effect).

An ask not filled (the queue held less than twice the count, or nothing) is kept in
``_QueueFed.asks`` for ``needjobs-adhoc-max-delay``: a job then queued here with no client
to take it (``job_queued``) marks the queue, and the next tick, due at once, answers each
kept ask again for what it still lacks (``_answer_asks``: the queue shared evenly among
the askers, not Disque's half, since no client here waited for these jobs). Otherwise a job
added just after a consumer elsewhere broadcast its NEEDJOBS waits for the next broadcast,
seconds later. A broadcast (count 1) never shrinks a live kept ask.

A job this node imported within ``RECENT_IMPORT_MS`` and no longer holds (delivered, acked
and collected) is not imported again: TCP never duplicates a frame, but a duplicated or very
late YOURJOBS would otherwise deliver it twice (Disque keeps no such memory). Refusing is
safe: an at-least-once job is still held, ACTIVE, by its sender until acked, and an
at-most-once job was already delivered once.

Per-queue state lives in ``Queue.fed`` (``_QueueFed``), so it goes when the broker evicts
the idle queue, as Disque's lives in its queue. Invariants: frames only from known senders
not in handshake; a malformed body is logged (key ``malformed-fed:<ip>``) and dropped.
"""

from __future__ import annotations

import heapq
import math
from typing import Any, Final

from broker import federation as fed_jobs
from broker.core import Broker
from broker.job import REC_ID, Job
from broker.queue import PAUSE_OUT, Queue
from cluster.batches import cut, job_record_size
from cluster.effects import EffectQueue, LinkId, LogLine, Send
from cluster.job_messages import (
    FED_TYPES,
    NEEDJOBS_MAX_COUNT,
    NEEDJOBS_MAX_REQUEST,
    FedMessage,
    NeedJobs,
    YourJobs,
    parse_federation,
)
from cluster.membership import Membership
from cluster.peer_frames import accept
from cluster.wire import Frame, MessageType

NEEDJOBS_MIN_REQUEST: Final = 5  # Disque's: the fewest jobs an ad hoc NEEDJOBS asks for
RESPONDER_TTL_MS: Final = 5000  # a source is recent this long after its last YOURJOBS
IMPORT_RATE_WINDOW_MS: Final = 5000  # no import for this long: the rate is 0
IMPORT_RATE_MIN_ELAPSED_MS: Final = 50  # never divide by less (Disque: never overestimate)
#: A job received through YOURJOBS within this long, and no longer here, is not imported
#: again: a duplicated or late frame after its ack GC finished would deliver it twice.
RECENT_IMPORT_MS: Final = 10_000
_MAX_SHIFT: Final = 30  # attempts beyond this cannot make a delay longer than its maximum


class _QueueFed:
    """One queue's federation state (Disque's needjobs_* and *_import_jobs_* fields)."""

    __slots__ = ("bcast_time", "bcast_attempt", "adhoc_time", "adhoc_attempt", "responders",
                 "cur_time", "cur_count", "prev_time", "prev_count", "due", "asks", "rtt",
                 "asked", "owed", "fetch_until", "rttvar")

    def __init__(self, now_ms: int) -> None:
        self.bcast_time: int | None = None  # None: never sent (the first one goes at once)
        self.bcast_attempt = 0
        self.adhoc_time: int | None = None
        self.adhoc_attempt = 0
        self.responders: dict[str, int] = {}  # node ID -> time of its last YOURJOBS
        self.cur_time = now_ms
        self.cur_count = 0
        self.prev_time = now_ms
        self.prev_count = 0
        self.due: int | None = None  # the queue's entry in the heap, if any
        # NEEDJOBS this node could not fully answer: asker's node ID -> (when, jobs short).
        self.asks: dict[str, tuple[int, int]] = {}
        self.rtt = -1  # ms from an ad hoc NEEDJOBS to its first answer, smoothed (-1: none)
        self.rttvar = 0  # the mean deviation of those samples from ``rtt``, smoothed
        self.asked: dict[str, int] = {}  # source -> when asked, until its next YOURJOBS
        self.owed = 0  # jobs the last ad hoc requests asked for and not received yet
        self.fetch_until = 0  # while owed: no other request before then

    def rate(self, now_ms: int) -> int:
        """Jobs per second imported lately (Disque's getQueueImportRate)."""
        if now_ms - self.cur_time > IMPORT_RATE_WINDOW_MS:
            return 0
        elapsed = max(now_ms - self.prev_time, IMPORT_RATE_MIN_ELAPSED_MS)
        return math.ceil((self.prev_count + self.cur_count) * 1000 / elapsed)

    def count_import(self, now_ms: int, jobs: int) -> None:
        """Disque's updateQueueImportRate for ``jobs`` imported: a one-second current window
        and the previous."""
        if now_ms - self.cur_time > 1000:
            self.prev_time, self.prev_count = self.cur_time, self.cur_count
            self.cur_time, self.cur_count = now_ms, 0
        self.cur_count += jobs

    def valid_responders(self, now_ms: int) -> list[str]:
        stale = [n for n, t in self.responders.items() if now_ms - t > RESPONDER_TTL_MS]
        for node_id in stale:
            del self.responders[node_id]
        return list(self.responders)


class FederationCore(EffectQueue):
    HANDLES: frozenset[MessageType] = FED_TYPES

    def __init__(self, broker: Broker, membership: Membership) -> None:
        self.broker = broker
        self.membership = membership
        self.outbox = []
        self.stats: dict[str, int] = {"sent": 0, "received": 0, "malformed": 0,
                                      "imported": 0, "exported": 0, "needjobs_sent": 0,
                                      "yourjobs_sent": 0}
        self._heap: list[tuple[int, bytes]] = []
        self._recent: dict[bytes, int] = {}  # job ID -> when imported (insertion order)
        # While a YOURJOBS is being queued: the "last job taken" calls, run after it.
        self._deferred: list[Queue] | None = None
        # Queues that got jobs while a NEEDJOBS for them was still short: answered at the
        # next tick, due at once, so the jobs a burst of commands queued leave together.
        self._answers: dict[bytes, Queue] = {}
        self._answers_at: int | None = None

    # =========================================================================================
    # The runtime's side (cluster/effects.py)

    def next_deadline(self) -> int | None:
        """When ``tick`` next has a queue to look at (ms), or None."""
        due = self._heap[0][0] if self._heap else None
        at = self._answers_at
        return at if at is not None and (due is None or at < due) else due

    def tick(self, now_ms: int) -> None:
        self._forget_old_imports(now_ms)
        if self._answers:
            answers, self._answers, self._answers_at = self._answers, {}, None
            for name, asked in answers.items():
                if self.broker.queues.get(name) is asked:
                    self._answer_asks(asked, now_ms)
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            due, name = heapq.heappop(heap)
            q = self.broker.queues.get(name)
            st = q.fed if q is not None else None
            if st is None or st.due != due:
                continue  # a stale entry: the queue was re-armed or evicted since
            st.due = None
            if q is not None and q.waiters:  # Disque's cron: clients still waiting
                self.need_jobs(q, False, now_ms)

    def receive(self, frame: Frame, link: LinkId, peer_ip: str, local_ip: str,
                outbound_to: str | None, now_ms: int) -> None:
        accepted = accept(self.membership, frame, peer_ip, parse_federation, self.stats,
                          self.outbox, "fed")
        if accepted is None:
            return
        msg, sender_id = accepted
        if isinstance(msg, NeedJobs):
            self._on_needjobs(msg, sender_id, now_ms)
        else:
            self._on_yourjobs(msg, sender_id, now_ms)

    # =========================================================================================
    # broker.federation.Federation

    def need_jobs(self, q: Queue, reached_zero: bool, now_ms: int) -> None:
        """Disque's needJobsForQueue (see the module docstring for the rules)."""
        if self._deferred is not None:
            if reached_zero:
                self._deferred.append(q)
            return
        if self.broker.leaving:
            return  # a leaving node never asks for jobs
        st = self._state(q, now_ms)
        rate = st.rate(now_ms)
        if reached_zero:
            if rate == 0:
                q.low_water = 0
                return  # no flow to keep up: the next client to block asks
            if now_ms < st.fetch_until:
                return  # a request is on its way: its answer refills the queue
            if len(q):
                self._ask_ahead(q, st, rate, now_ms)
                return
        sources = st.valid_responders(now_ms)
        to_fetch = self._request_size(q, st, rate, len(sources))
        if st.bcast_time is None or now_ms - st.bcast_time >= self._bcast_delay(st):
            st.bcast_time = now_ms
            st.bcast_attempt += 1
            # Only to discover sources: one job is enough.
            for node_id in self._others_linked():
                self._send(node_id, NeedJobs(q.name, 1))
        if sources and (reached_zero or st.adhoc_time is None
                        or now_ms - st.adhoc_time >= self._adhoc_delay(st)
                        and now_ms >= st.fetch_until):
            self._ask_sources(q, st, sources, to_fetch, now_ms)
        if not reached_zero or q.waiters:
            self._arm(q, st, now_ms)

    def job_queued(self, q: Queue, now_ms: int) -> None:
        st: _QueueFed = q.fed
        if st.asks and q.name not in self._answers:
            self._answers[q.name] = q
            if self._answers_at is None:
                self._answers_at = now_ms

    def _request_size(self, q: Queue, st: _QueueFed, rate: int, sources: int) -> int:
        """How many jobs an ad hoc NEEDJOBS asks each source for: twice the low water
        (``_low_water``: one to wait for, one to ask ahead with), or what the clients
        waiting here asked for (their COUNTs) if that is more, shared
        among the sources, within [NEEDJOBS_MIN_REQUEST, NEEDJOBS_MAX_COUNT]. Disque asks for
        a second's worth, up to 100: jobs beyond what the consumers take before the next
        answer only wait here instead of on the source."""
        demand = 0
        for waiter in q.waiters:
            demand += waiter.count
            if demand >= NEEDJOBS_MAX_COUNT * max(sources, 1):
                break
        ahead = 2 * self._low_water(st, rate)
        if ahead > NEEDJOBS_MAX_REQUEST:
            # Whole YOURJOBS frames (100 jobs each): a last frame of a few jobs costs a
            # message, and both ends' handling of it, for little.
            ahead = -(-ahead // NEEDJOBS_MAX_REQUEST) * NEEDJOBS_MAX_REQUEST
        size = max(ahead, demand)
        if sources:
            size = -(-size // sources)
        return min(max(size, NEEDJOBS_MIN_REQUEST), NEEDJOBS_MAX_COUNT)

    def _low_water(self, st: _QueueFed, rate: int) -> int:
        """Jobs the consumers here take at ``rate`` in two round trips of a NEEDJOBS and its
        answer plus four times their deviation (the ad hoc minimum delay, twice, until one
        was measured): twice, as consumers take jobs in bursts (their processes get the CPU
        in slices) rather than at the rate; the deviation, as a loaded source answers late
        now and then (TCP's retransmission timeout is sized alike), and the consumers here
        waited on an empty queue each time. A round trip is never taken as less than 1 ms,
        the clock's step: measured as 0 on a fast link, it made every request the least (5
        jobs), one NEEDJOBS per 5 jobs."""
        if st.rtt < 0:
            wait = 2 * int(self.broker.config.needjobs_adhoc_min_delay)
        else:
            wait = 2 * max(st.rtt, 1) + 4 * st.rttvar
        return min(-(-rate * wait // 1000), NEEDJOBS_MAX_COUNT)

    def _ask_ahead(self, q: Queue, st: _QueueFed, rate: int, now_ms: int) -> None:
        """A client took a job and left no more than the consumers take in one round trip:
        ask the sources now, so the answer comes before the queue runs dry."""
        sources = st.valid_responders(now_ms)
        if sources:
            self._ask_sources(q, st, sources, self._request_size(q, st, rate, len(sources)),
                              now_ms)

    def _ask_sources(self, q: Queue, st: _QueueFed, sources: list[str], count: int,
                     now_ms: int) -> None:
        """An ad hoc NEEDJOBS to each source. No other goes until the jobs asked for came or
        two round trips passed (the ad hoc minimum delay before one was measured): a source
        short of jobs keeps the ask and sends the rest as they are queued, one YOURJOBS
        each, and asking again at each one only doubled the messages. Not longer: the count
        cannot tell an answer to this request from one to the previous, and jobs queued on a
        source whose ask was filled wait for the next request."""
        st.adhoc_time = now_ms
        st.adhoc_attempt += 1
        wait = 2 * st.rtt if st.rtt >= 0 else int(self.broker.config.needjobs_adhoc_min_delay)
        st.fetch_until = now_ms + max(wait, 1)
        st.owed = count * len(sources)
        for node_id in sources:
            st.asked[node_id] = now_ms
            self._send(node_id, NeedJobs(q.name, count))

    def _ask_again(self, q: Queue, now_ms: int) -> None:
        """A YOURJOBS was queued and clients still wait: ask the sources at once rather than
        at the ad hoc delay. One request per answer received, so a source that has nothing
        (it does not answer) ends the chain and the backoff applies again."""
        if self.broker.leaving:
            return
        st = self._state(q, now_ms)
        sources = st.valid_responders(now_ms)
        if not sources or now_ms < st.fetch_until:
            return  # no source, or the rest of what was asked for comes as it is queued
        to_fetch = self._request_size(q, st, st.rate(now_ms), len(sources))
        self._ask_sources(q, st, sources, to_fetch, now_ms)
        self._arm(q, st, now_ms)

    def import_from(self, q: Queue, now_ms: int) -> list[str]:
        st: _QueueFed | None = q.fed
        return list(st.responders) if st is not None else []

    def import_rate(self, q: Queue, now_ms: int) -> int:
        st: _QueueFed | None = q.fed
        return st.rate(now_ms) if st is not None else 0

    def info(self) -> list[tuple[str, Any]]:
        # Messages too, not only jobs: what an idle cluster's consumers cost the bus.
        return [("jobs_imported", self.stats["imported"]),
                ("jobs_exported", self.stats["exported"]),
                ("needjobs_sent", self.stats["needjobs_sent"]),
                ("yourjobs_sent", self.stats["yourjobs_sent"])]

    # =========================================================================================
    # Handlers

    def _on_needjobs(self, msg: NeedJobs, sender: str, now_ms: int) -> None:
        b = self.broker
        q = b.queues.get(msg.queue)
        st: _QueueFed | None = q.fed if q is not None else None
        if st is not None and st.rate(now_ms) > 0:
            return  # importing this queue ourselves: not a source for it
        node = self.membership.nodes.get(sender)
        if node is None or node.link is None:
            return  # the jobs could not be sent: keep them queued here
        if q is None:
            q = b.queue_for(msg.queue, now_ms)  # to keep the ask: its jobs may come next
        if q.pause & PAUSE_OUT:
            return
        short = msg.count - self._export(q, sender, msg.count, now_ms)
        if short > 0:
            # Kept as long as the asker's ad hoc requests may be apart: jobs queued here
            # meanwhile go to it at once, not at its next request (up to seconds later).
            asks = self._state(q, now_ms).asks
            kept = asks.get(sender)
            if kept is not None and now_ms - kept[0] <= self.broker.config.needjobs_adhoc_max_delay:
                # A broadcast (count 1) must not shrink what the asker's ad hoc request
                # still waits for.
                short = max(short, kept[1])
            asks[sender] = (now_ms, short)
            if len(q):
                # The half kept back goes at the next tick, after the clients of this one:
                # the asker waits for what it asked for rather than asking again.
                self.job_queued(q, now_ms)
        elif st is not None:
            st.asks.pop(sender, None)

    def _export(self, q: Queue, to_node: str, count: int, now_ms: int,
                share: int = 0) -> int:
        """Send ``to_node`` jobs of ``q`` for a request of ``count``, at most ``share`` if
        given; how many went."""
        qlen = len(q)
        if not qlen:
            return 0
        if share:
            reply = min(count, share)
        else:
            # Never let one asker drain the queue: all it asked for only if we have twice
            # that, else half of what we have, but at least one.
            reply = count if qlen >= count * 2 else max(qlen // 2, 1)
        b = self.broker
        records = fed_jobs.export_jobs(b, q, reply, to_node, now_ms, b.config.job_max_body_len)
        if records:
            self.stats["exported"] += len(records)
            # In frames of a few MiB: a hundred 1 MB jobs in one frame is too big to send.
            for batch in cut(records, job_record_size, NEEDJOBS_MAX_REQUEST):
                self._send(to_node, YourJobs(batch))
        return len(records)

    def _answer_asks(self, q: Queue, now_ms: int) -> None:
        """Jobs were queued in ``q`` while NEEDJOBS for it were short: send each asker what
        it still lacks, the queue shared evenly among them. Not Disque's half: no client here
        waited for these jobs (``job_queued``), and keeping half of one or two jobs back held
        them until the asker's next request, which it no longer sends while it waits for
        what it asked for."""
        st: _QueueFed = q.fed
        if st.rate(now_ms) > 0 or q.pause & PAUSE_OUT:
            st.asks.clear()  # importing it ourselves (or paused): not a source for it now
            return
        ttl = self.broker.config.needjobs_adhoc_max_delay
        askers = list(st.asks.items())
        for i, (node_id, (asked, short)) in enumerate(askers):
            node = self.membership.nodes.get(node_id)
            if now_ms - asked > ttl or node is None or node.link is None:
                del st.asks[node_id]
                continue
            share = -(-len(q) // (len(askers) - i))
            if not share:
                break
            short -= self._export(q, node_id, short, now_ms, share)
            if short > 0:
                st.asks[node_id] = (asked, short)
            else:
                del st.asks[node_id]

    def _on_yourjobs(self, msg: YourJobs, sender: str, now_ms: int) -> None:
        b = self.broker
        me = self.membership.myself_id
        recent = self._recent
        self._forget_old_imports(now_ms)
        self._deferred = []
        touched: dict[bytes, Queue] = {}
        received: dict[bytes, int] = {}
        imported = 0
        try:
            jobs = b.jobs
            q: Queue | None = None
            for rec in msg.records:
                # A job held here already (a replica: every job, with REPLICATE as many as
                # nodes) is queued as it is; only one not held is built from its record.
                job = jobs.get(rec[REC_ID])
                if job is None:
                    job = Job.from_record(rec)
                    if job.id in recent:
                        continue  # imported, delivered and collected here: a duplicate frame
                if not fed_jobs.import_job(b, job, me, now_ms):
                    continue
                job_id = job.id
                if job_id in recent:
                    del recent[job_id]  # to the end: the window is kept in import order
                recent[job_id] = now_ms
                imported += 1
                if q is None or q.name != job.queue:  # a YOURJOBS is mostly of one queue
                    q = b.queue_for(job.queue, now_ms)
                    touched[q.name] = q
                received[q.name] = received.get(q.name, 0) + 1
        finally:
            deferred, self._deferred = self._deferred, None
        self.stats["imported"] += imported
        # Each queue's sources and rate once per message, not per job: nothing read while
        # the jobs were queued depends on them (the "last job taken" calls are deferred).
        for name, q in touched.items():
            count = received[name]
            st = self._state(q, now_ms)
            if sender not in st.responders:
                st.bcast_attempt = 0  # a new source: broadcast sooner again
            st.responders[sender] = now_ms
            st.count_import(now_ms, count)
            st.adhoc_attempt = 0
            if st.due is not None and q.waiters:
                self._arm(q, st, now_ms)  # the ad hoc delay just got shorter
            self._round_trip(st, sender, count, now_ms)
            q.low_water = self._low_water(st, st.rate(now_ms))
            if q.waiters and not q.pause & PAUSE_OUT:
                self._ask_again(q, now_ms)  # not enough for every waiting client
        for q in dict.fromkeys(deferred):
            # At the mark only if still there after the whole message (Disque serves its
            # blocked clients after it), and not asked again just above.
            if len(q) <= q.low_water and not q.waiters:
                self.need_jobs(q, True, now_ms)

    def _round_trip(self, st: _QueueFed, sender: str, jobs: int, now_ms: int) -> None:
        """A YOURJOBS of ``jobs`` came: what was asked for may all be here, and the first
        answer to a request measures the round trip (smoothed; capped, as a source short of
        jobs answers only once it has some)."""
        st.owed -= jobs
        if st.owed <= 0:
            st.owed = st.fetch_until = 0
        asked = st.asked.pop(sender, None)
        if asked is not None:
            sample = min(now_ms - asked, 4 * int(self.broker.config.needjobs_adhoc_min_delay))
            if st.rtt < 0:
                st.rtt, st.rttvar = sample, sample // 2
            else:
                # TCP's estimator (RFC 6298), gains 1/4 for both; the deviation rounded down
                # so a steady link's decays to 0.
                st.rttvar = (3 * st.rttvar + abs(sample - st.rtt)) // 4
                st.rtt = (3 * st.rtt + sample + 2) // 4

    # =========================================================================================

    def forget_jobs(self) -> None:
        self._recent.clear()

    def _forget_old_imports(self, now_ms: int) -> None:
        """The window of recent imports: trimmed at each YOURJOBS and each tick, so it holds
        the last ``RECENT_IMPORT_MS`` of imports at most, and nothing once they stop."""
        recent = self._recent
        old: list[bytes] = []
        for job_id, at in recent.items():
            if now_ms - at <= RECENT_IMPORT_MS:
                break
            old.append(job_id)
        # Deleted after one pass: a new iterator per entry would first step over every
        # entry deleted before it, quadratic in the jobs a YOURJOBS trims.
        for job_id in old:
            del recent[job_id]

    def _state(self, q: Queue, now_ms: int) -> _QueueFed:
        st: _QueueFed | None = q.fed
        if st is None:
            st = q.fed = _QueueFed(now_ms)
        return st

    def _bcast_delay(self, st: _QueueFed) -> int:
        cfg = self.broker.config
        return int(min(cfg.needjobs_bcast_min_delay << min(st.bcast_attempt, _MAX_SHIFT),
                       cfg.needjobs_bcast_max_delay))

    def _adhoc_delay(self, st: _QueueFed) -> int:
        cfg = self.broker.config
        return int(min(cfg.needjobs_adhoc_min_delay << min(st.adhoc_attempt, _MAX_SHIFT),
                       cfg.needjobs_adhoc_max_delay))

    def _arm(self, q: Queue, st: _QueueFed, now_ms: int) -> None:
        """Put the queue's next request time in the heap (the earlier of the two kinds)."""
        assert st.bcast_time is not None
        due = st.bcast_time + self._bcast_delay(st)
        if st.responders:
            adhoc = now_ms if st.adhoc_time is None else st.adhoc_time + self._adhoc_delay(st)
            due = min(due, max(adhoc, st.fetch_until))
        due = max(due, now_ms + 1)
        if st.due != due:
            st.due = due
            heap = self._heap
            heapq.heappush(heap, (due, q.name))
            if len(heap) > 2 * len(self.broker.queues) + 64:
                # Entries left behind by re-arming, each stale until its old due time: keep
                # one per armed queue, so the heap is bounded by the queues, not the arms.
                live: list[tuple[int, bytes]] = []
                for name, queue in self.broker.queues.items():
                    armed: _QueueFed | None = queue.fed
                    if armed is not None and armed.due is not None:
                        live.append((armed.due, name))
                heapq.heapify(live)
                self._heap = live

    def _others_linked(self) -> list[str]:
        me = self.membership.myself_id
        return [n.node_id for n in self.membership.nodes.values()
                if n.node_id != me and "handshake" not in n.flags and n.link is not None]

    def _send(self, node_id: str, msg: FedMessage) -> None:
        self.stats["sent"] += 1
        self.stats["needjobs_sent" if type(msg) is NeedJobs else "yourjobs_sent"] += 1
        self.membership.messages_sent += 1
        self.outbox.append(Send(node_id, msg.type, msg.body()))

    def _log(self, level: str, text: str, key: str) -> None:
        self.outbox.append(LogLine(level, text, key))
