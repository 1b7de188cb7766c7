"""Job results and outcomes: RESOLVE and WAITJOB (sans-IO).

Theory of operation
-------------------
``RESOLVE id result`` acknowledges a job as ACKJOB does and keeps its *outcome*
``[kind, result, until_ms]`` in ``ResultTable.outcomes`` for ``result-ttl`` seconds, logged
(record kind ``result``: ``[id, kind, result, until_ms]``) and sent to the job's other holders,
which log it too. ``WAITJOB id [TIMEOUT ms]`` answers from that table, or blocks (a ``Waiter``
with ``job_id`` set, in the broker's one timer wheel) until the job's end is known here.

The other ends of a job (ACKJOB, DELJOB, TTL, a dead letter) leave an outcome only for a job
someone is watching: a client blocked in WAITJOB, a node that asked (``watchers``), or a
chained job waiting for it (``children``, broker/chains.py); a job nobody watches leaves
nothing, so plain ACKJOB and DELJOB pay one test of three empty dicts. ``hint`` names why the broker is about
to drop a job (``expired``, ``dead-lettered``); anything else not acked was ``deleted``.

On a cluster, ``sync`` (``cluster.results.ResultCore``) learns the outcome of a job this node
does not hold by asking the other nodes (``ask``) and tells the nodes that asked
(``tell``); without it a job this node does not know is unknown at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final, Protocol

from broker.clients import BLOCKED, Client, Waiter
from broker.core_api import BrokerCore
from broker.effects import LogRecord, Reply
from broker.job import JobState
from broker.memory import OUTCOME_BYTES
from protocol.resp import Error

RECORD_KIND: Final = "result"

RESOLVED: Final = "resolved"
ACKED: Final = "acked"
EXPIRED: Final = "expired"
DELETED: Final = "deleted"
DEAD_LETTERED: Final = "dead-lettered"
KINDS: Final = (RESOLVED, ACKED, EXPIRED, DELETED, DEAD_LETTERED)
# Not an outcome: the job left this node alive (federation, replication elsewhere).
MOVED: Final = "moved"
# How a chained job's parent that no node knows ended, for its children (never recorded):
# their reason reads "parent D-... unknown to the cluster".
UNKNOWN_PARENT: Final = "unknown to the cluster"

UNKNOWN: Final = Error("NOJOB Job not known in the cluster")
TOO_BIG: Final = "ERR result of {} bytes exceeds the result-max-size limit of {} bytes"

_ERRORS: Final[dict[str, Error]] = {
    EXPIRED: Error("EXPIRED Job expired before it was acknowledged"),
    DELETED: Error("DELETED Job was deleted before it was acknowledged"),
    DEAD_LETTERED: Error("DEADLETTER Job was moved to its dead-letter queue"),
}


class ResultSync(Protocol):
    """What the broker asks of the cluster about outcomes (``cluster.results.ResultCore``)."""

    def ask(self, job_id: bytes, now_ms: int) -> None:
        """Learn the outcome of a job this node does not hold (``learned`` or ``unknown``)."""
        ...

    def tell(self, job_id: bytes, outcome: list[Any], nodes: tuple[str, ...] | list[str]) -> None:
        """Send an outcome to these nodes."""
        ...

    def hopeless(self, job_id: bytes) -> bool:
        """Whether no node can be asked: none reachable, and the job's origin unknown."""
        ...


class ResultTable:
    def __init__(self) -> None:
        self.outcomes: dict[bytes, list[Any]] = {}  # job ID -> [kind, result, until_ms]
        self.waiters: dict[bytes, list[Waiter]] = {}  # blocked WAITJOBs by job ID
        self.watchers: dict[bytes, set[str]] = {}  # nodes to tell, by job ID
        self.children: dict[bytes, set[bytes]] = {}  # waiting chained jobs, by parent ID
        self.hint = DELETED
        self.sync: ResultSync | None = None
        self.bytes = 0  # what the outcomes hold, counted in used_memory (broker/memory.py)

    @staticmethod
    def after_flush(old: ResultTable) -> ResultTable:
        """An empty table wired as ``old`` was (FLUSHALL forgets every outcome)."""
        table = ResultTable()
        table.sync = old.sync
        return table

    def watched(self, job_id: bytes) -> bool:
        return job_id in self.waiters or job_id in self.watchers or job_id in self.children

    def put(self, job_id: bytes, outcome: list[Any]) -> None:
        old = self.outcomes.pop(job_id, None)
        if old is not None:
            self.bytes -= len(old[1]) + OUTCOME_BYTES
        self.outcomes[job_id] = outcome  # at the end: pruned oldest first
        self.bytes += len(outcome[1]) + OUTCOME_BYTES

    def drop(self, job_id: bytes) -> None:
        old = self.outcomes.pop(job_id, None)
        if old is not None:
            self.bytes -= len(old[1]) + OUTCOME_BYTES

    def expire(self, now_ms: int) -> None:
        """Forget outcomes past their time, oldest first (the table is in insertion order)."""
        while self.outcomes:
            job_id = next(iter(self.outcomes))
            if self.outcomes[job_id][2] > now_ms:
                return
            self.drop(job_id)

    def snapshot(self) -> Iterator[tuple[str, Any]]:
        for job_id, outcome in list(self.outcomes.items()):
            yield (RECORD_KIND, [job_id, *outcome])

    def load(self, payload: list[Any], now_ms: int) -> None:
        if payload[3] > now_ms:
            self.put(payload[0], [payload[1], payload[2], payload[3]])

    def undo(self, payload: list[Any], prev: Any) -> None:
        self.drop(payload[0])
        if prev is not None:
            self.put(payload[0], prev)


def validate_record(data: Any) -> str | None:
    if not isinstance(data, list) or len(data) != 4:
        return "result record must be [id, kind, result, until_ms]"
    job_id, kind, value, until = data
    if not isinstance(job_id, bytes) or kind not in KINDS or not isinstance(value, bytes) \
            or not isinstance(until, int) or isinstance(until, bool):
        return "result record has a field of the wrong type"
    return None


class ResultBroker(BrokerCore, Protocol):
    results: ResultTable

    def parent_ended(self, parent: bytes, outcome: list[Any], now_ms: int) -> None:
        """Chained jobs waiting for ``parent`` move on (broker/chains.py)."""
        ...


def reply_of(outcome: list[Any]) -> Any:
    kind = outcome[0]
    if kind == RESOLVED:
        return outcome[1]
    if kind == ACKED:
        return b""
    return _ERRORS[kind]


def record(b: ResultBroker, job_id: bytes, outcome: list[Any]) -> None:
    """Keep ``outcome`` of ``job_id``, with its log record."""
    table = b.results
    prev = table.outcomes.get(job_id)
    table.put(job_id, outcome)
    b.outbox.append(LogRecord(RECORD_KIND, [job_id, *outcome], prev))


def resolve(b: ResultBroker, job_id: bytes, result: bytes, now_ms: int) -> Any:
    limit = int(b.config.result_max_size)
    if len(result) > limit:
        return Error(TOO_BIG.format(len(result), limit))
    table = b.results
    job = b.jobs.get(job_id)
    current = table.outcomes.get(job_id)
    if current is None or current[0] != RESOLVED:  # the first result stays
        outcome = [RESOLVED, result, now_ms + int(b.config.result_ttl) * 1000]
        record(b, job_id, outcome)
        if table.sync is not None and job is not None:
            # Before the ACK's SETACKs, on the same links: a holder keeps the result first.
            table.sync.tell(job_id, outcome, [n for n in job.delivered if n != b.node_id])
    count = b.ack_jobs((job_id,), now_ms)
    notify(b, job_id, now_ms)
    return count


def job_done(b: ResultBroker, job_id: bytes, state: JobState, now_ms: int) -> None:
    """A watched job was acked or is leaving the broker: keep why, and tell its watchers."""
    table = b.results
    if table.hint == MOVED:
        # Alive elsewhere: whoever waits here asks the cluster as for a job never held.
        if table.sync is not None and (job_id in table.waiters or job_id in table.children):
            table.sync.ask(job_id, now_ms)
        return
    if job_id not in table.outcomes:
        kind = table.hint
        if kind == DELETED and state is JobState.ACKED:
            kind = ACKED
        record(b, job_id, [kind, b"", now_ms + int(b.config.result_ttl) * 1000])
    notify(b, job_id, now_ms)


def notify(b: ResultBroker, job_id: bytes, now_ms: int) -> None:
    """Hand the outcome of ``job_id`` to its blocked WAITJOBs, the nodes that asked and the
    jobs chained to it."""
    table = b.results
    outcome = table.outcomes.get(job_id)
    if outcome is None:
        return
    waiters = table.waiters.pop(job_id, None)
    if waiters:
        value = reply_of(outcome)
        for waiter in waiters:
            _unblock(b, waiter)
            b.outbox.append(Reply(waiter.client, value))
    nodes = table.watchers.pop(job_id, None)
    if nodes and table.sync is not None:
        table.sync.tell(job_id, outcome, sorted(nodes))
    if job_id in table.children:
        b.parent_ended(job_id, outcome, now_ms)


def _unblock(b: ResultBroker, waiter: Waiter) -> None:
    if waiter.active:
        waiter.active = False
        waiter.client.waiter = None
        b.timers.cancel(waiter)
        b.blocked_clients -= 1


def waitjob(b: ResultBroker, job_id: bytes, timeout_ms: int, client: Client, now_ms: int) -> Any:
    table = b.results
    outcome = table.outcomes.get(job_id)
    if outcome is not None:
        return reply_of(outcome)
    job = b.jobs.get(job_id)
    if job is not None and job.state is JobState.ACKED:
        return b""
    if job is None and (table.sync is None or table.sync.hopeless(job_id)):
        return UNKNOWN
    waiter = Waiter(client, (), False)
    waiter.job_id = job_id
    client.waiter = waiter
    table.waiters.setdefault(job_id, []).append(waiter)
    b.blocked_clients += 1
    if timeout_ms:
        waiter.awake = now_ms + timeout_ms
        b.timers.schedule(waiter, waiter.awake)
    if job is None and table.sync is not None:
        table.sync.ask(job_id, now_ms)
    return BLOCKED


def forget_waiter(table: ResultTable, waiter: Waiter) -> None:
    """A blocked WAITJOB ended (timeout, client gone): out of the table."""
    waiters = table.waiters.get(waiter.job_id)
    if waiters is not None:
        if waiter in waiters:
            waiters.remove(waiter)
        if not waiters:
            del table.waiters[waiter.job_id]


def learned(b: ResultBroker, job_id: bytes, outcome: list[Any], now_ms: int) -> None:
    """A peer told the outcome of ``job_id``: kept (a result is never replaced by a plain
    end) and handed on."""
    current = b.results.outcomes.get(job_id)
    if current is None or (outcome[0] == RESOLVED and current[0] != RESOLVED):
        record(b, job_id, outcome)
    notify(b, job_id, now_ms)


def unknown(b: ResultBroker, job_id: bytes, now_ms: int) -> None:
    """No node knows ``job_id``: its blocked WAITJOBs get the error; jobs chained to it fail,
    as for a failed parent (nothing says it succeeded: broker/chains.py)."""
    for waiter in b.results.waiters.pop(job_id, None) or ():
        _unblock(b, waiter)
        b.outbox.append(Reply(waiter.client, UNKNOWN))
    if job_id in b.results.children:
        b.parent_ended(job_id, [UNKNOWN_PARENT, b"", 0], now_ms)
