"""The result core: how a node learns the outcome of a job it does not hold (sans-IO).

Theory of operation
-------------------
Two messages (``MessageType.WAITFOR``, ``RESULT``):

    WAITFOR  id                       "tell me how this job ends"
    RESULT   id, kind, value, until   an outcome (``broker/results.py``'s kinds), or kind
                                      ``pending`` (I hold it and will tell you) or
                                      ``unknown`` (I know nothing of it)

A node with a blocked WAITJOB (or a chained job waiting) for a job it does not hold asks every
reachable node (``ask``), again every ``ASK_PERIOD_MS`` while it still wants to know: the
answers' holders remember the asker (``ResultTable.watchers``, in memory) and send RESULT when
the job ends, and asking again covers a holder that restarted, a lost frame or a partition
that healed. The job is *unknown* once every node asked answered ``unknown``, its origin (the
node named by the ID) among them or not in the table at all: while the origin cannot be
reached, the asker keeps waiting. RESOLVE sends the result to the job's holders (``tell``)
before its SETACKs, so every copy keeps it (logged) and answers WAITJOB itself.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Final

from broker import results
from broker.core import Broker
from cluster.effects import EffectQueue, LinkId, Send
from cluster.membership import Membership
from cluster.peer_frames import accept
from cluster.wire import Frame, MalformedBody, MessageType, received_body
from protocol.jobid import is_valid

ASK_PERIOD_MS: Final = 1000
PENDING: Final = "pending"
UNKNOWN: Final = "unknown"
RESULT_TYPES: Final = frozenset({MessageType.WAITFOR, MessageType.RESULT})

_UNREACHABLE: Final = frozenset({"myself", "handshake", "leaving", "pfail", "fail", "noaddr"})
_ANSWERS: Final = frozenset((*results.KINDS, PENDING, UNKNOWN))


@dataclass(frozen=True, slots=True)
class ResultMessage:
    type: MessageType
    job_id: bytes
    kind: str = ""
    value: bytes = b""
    until: int = 0

    def body(self) -> dict[str, Any]:
        if self.type is MessageType.WAITFOR:
            return {"id": self.job_id}
        return {"id": self.job_id, "kind": self.kind, "value": self.value, "until": self.until}


def parse(frame: Frame) -> ResultMessage:
    body = received_body(frame)
    if not isinstance(body, dict):
        raise MalformedBody("body is not a map")
    job_id = body.get("id")
    if not isinstance(job_id, bytes) or not is_valid(job_id):
        raise MalformedBody("field 'id' must be a valid job ID")
    if frame.type is MessageType.WAITFOR:
        return ResultMessage(frame.type, job_id)
    kind, value, until = body.get("kind"), body.get("value"), body.get("until")
    if not isinstance(kind, str) or kind not in _ANSWERS:
        raise MalformedBody("field 'kind' is not an outcome")
    if not isinstance(value, bytes):
        raise MalformedBody("field 'value' must be bytes")
    if not isinstance(until, int) or isinstance(until, bool) or not 0 <= until < 2**63:
        raise MalformedBody("field 'until' must be a time in ms")
    return ResultMessage(frame.type, job_id, kind, value, until)


@dataclass
class _Ask:
    next_ms: int
    unknown: set[str] = field(default_factory=set)
    asked: set[str] = field(default_factory=set)


class ResultCore(EffectQueue):
    HANDLES: frozenset[MessageType] = RESULT_TYPES

    def __init__(self, broker: Broker, membership: Membership,
                 rng: random.Random | None = None) -> None:
        self.broker = broker
        self.membership = membership
        self.rng = rng or random.Random()
        self.outbox = []
        self.asking: dict[bytes, _Ask] = {}
        self.stats: dict[str, int] = {"sent": 0, "received": 0, "malformed": 0}

    def tick(self, now_ms: int) -> None:
        for job_id, ask in list(self.asking.items()):
            if not self._wanted(job_id):
                del self.asking[job_id]
            elif now_ms >= ask.next_ms:
                self._ask_round(job_id, ask, now_ms)

    def receive(self, frame: Frame, link: LinkId, peer_ip: str, local_ip: str,
                outbound_to: str | None, now_ms: int) -> None:
        accepted = accept(self.membership, frame, peer_ip, parse, self.stats, self.outbox,
                          "result")
        if accepted is None:
            return
        msg, sender = accepted
        if msg.type is MessageType.WAITFOR:
            self._on_waitfor(msg.job_id, sender, now_ms)
        else:
            self._on_result(msg, sender, now_ms)

    # -- broker.results.ResultSync ----------------------------------------------------------

    def ask(self, job_id: bytes, now_ms: int) -> None:
        if job_id not in self.asking:
            ask = self.asking[job_id] = _Ask(now_ms)
            self._ask_round(job_id, ask, now_ms)

    def tell(self, job_id: bytes, outcome: list[Any], nodes: tuple[str, ...] | list[str]) -> None:
        msg = ResultMessage(MessageType.RESULT, job_id, outcome[0], outcome[1], outcome[2])
        for node_id in nodes:
            self._send(node_id, msg)

    def hopeless(self, job_id: bytes) -> bool:
        return not self._reachable() and self._origin(job_id) is None

    # -- handlers -----------------------------------------------------------------------------

    def _on_waitfor(self, job_id: bytes, sender: str, now_ms: int) -> None:
        b = self.broker
        table = b.results
        outcome = table.outcomes.get(job_id)
        if outcome is not None:
            self.tell(job_id, outcome, (sender,))
            return
        job = b.jobs.get(job_id)
        if job is None:
            self._send(sender, ResultMessage(MessageType.RESULT, job_id, UNKNOWN))
            return
        table.watchers.setdefault(job_id, set()).add(sender)
        if job.state.value == "acked":
            results.job_done(b, job_id, job.state, now_ms)
            return
        self._send(sender, ResultMessage(MessageType.RESULT, job_id, PENDING))

    def _on_result(self, msg: ResultMessage, sender: str, now_ms: int) -> None:
        if msg.kind == PENDING:
            ask = self.asking.get(msg.job_id)
            if ask is not None:
                ask.unknown.discard(sender)
            return
        if msg.kind == UNKNOWN:
            ask = self.asking.get(msg.job_id)
            if ask is None:
                return
            ask.unknown.add(sender)
            if ask.asked <= ask.unknown and self._origin_answered(msg.job_id, ask):
                del self.asking[msg.job_id]
                results.unknown(self.broker, msg.job_id, now_ms)
            return
        self.asking.pop(msg.job_id, None)
        if msg.until > now_ms:
            results.learned(self.broker, msg.job_id, [msg.kind, msg.value, msg.until], now_ms)

    # -- helpers ------------------------------------------------------------------------------

    def _wanted(self, job_id: bytes) -> bool:
        table = self.broker.results
        return (job_id in table.waiters or job_id in table.children) \
            and job_id not in self.broker.jobs

    def _ask_round(self, job_id: bytes, ask: _Ask, now_ms: int) -> None:
        ask.next_ms = now_ms + ASK_PERIOD_MS
        ask.asked = set(self._reachable())
        ask.unknown &= ask.asked
        if not ask.asked and self._origin(job_id) is None:
            del self.asking[job_id]
            results.unknown(self.broker, job_id, now_ms)
            return
        msg = ResultMessage(MessageType.WAITFOR, job_id)
        for node_id in sorted(ask.asked):
            self._send(node_id, msg)

    def _origin(self, job_id: bytes) -> str | None:
        """The node that made the job (its ID names the first 8 hex digits), if known."""
        prefix = job_id[2:10].decode("ascii", "replace")
        for node_id in self.membership.nodes:
            if node_id.startswith(prefix) and node_id != self.membership.myself_id:
                return node_id
        return None

    def _origin_answered(self, job_id: bytes, ask: _Ask) -> bool:
        origin = self._origin(job_id)
        return origin is None or origin in ask.unknown

    def _reachable(self) -> list[str]:
        return [n.node_id for n in self.membership.nodes.values()
                if n.link is not None and n.flags.isdisjoint(_UNREACHABLE)]

    def _send(self, node_id: str, msg: ResultMessage) -> None:
        self.stats["sent"] += 1
        self.membership.messages_sent += 1
        self.outbox.append(Send(node_id, msg.type, msg.body()))
