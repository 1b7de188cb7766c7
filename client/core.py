"""The sans-IO part of the trisque client: errors, calls, and the cluster decisions.

Theory of operation
-------------------
Both client flavours (``client.blocking.Client``, blocking; ``client.aio.AsyncClient``,
trio) are thin loops around the objects in this module, so every decision that needs no socket
is made (and tested) once:

* ``Call`` is one prepared command: its encoded request, the function that turns the raw reply
  into the typed result, and two facts the I/O loop needs: whether the command may be sent
  again to another node after the connection died mid-way (``retry_safe``: reads and GETJOB;
  never ADDJOB, which may have been applied), and how much longer than the socket timeout the
  reply may legitimately take (``extra_wait``: GETJOB TIMEOUT, ADDJOB's replication timeout;
  ``None`` means the server may block forever).
* ``error_from_reply`` maps an ``-CODE text`` reply to a typed exception by its code. Any error
  reply proves the command was refused, so a ``-LEAVING`` reply may always be retried on
  another node.
* ``NodeSelector`` is the client's view of the cluster, as Disque documents for clients: seed
  addresses, then what HELLO said (node IDs, addresses, priorities: lower is better, 100 means
  leaving). ``candidates()`` is the order in which to try nodes; failed nodes go to the back
  (not away: after a restart they are good again), and the failure marks are forgotten once
  every candidate has failed, so the client never gives up on a node for good.
* ``ProducerTracker`` counts which node produced the jobs a consumer receives (job ID chars
  2..10 are the producer's first 8 node-ID hex chars). When one other known node clearly
  dominates a full enough window, the client may move to it (``rebalance_consumers``), which
  is what Disque suggests so that consumers sit where their jobs are made.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from protocol.resp import Error, encode_command

T = TypeVar("T")

LEAVING_PRIORITY: Final = 100
DEFAULT_PORT: Final = 7711

# ---------------------------------------------------------------------------------------------
# Errors


class TrisqueError(Exception):
    """Base class of everything the client raises."""


class ResponseError(TrisqueError):
    """The server answered ``-CODE text``. ``code`` is ``CODE``; ``str(exc)`` the whole text."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text
        self.code = text.split(" ", 1)[0] if text else ""


class NoReplicationError(ResponseError):
    """NOREPL: not enough reachable nodes for the requested replication level."""


class PausedError(ResponseError):
    """PAUSED: the queue is paused in the direction asked for."""


class LeavingError(ResponseError):
    """LEAVING: the node is leaving the cluster; the client moves to another node."""


class BadIdError(ResponseError):
    """BADID: the argument is not a well formed job ID."""


class NoJobError(ResponseError):
    """NOJOB: the job is not known to this node."""


class MaxLenError(ResponseError):
    """MAXLEN: the queue is already longer than ADDJOB's MAXLEN."""


class AuthError(ResponseError):
    """NOAUTH / WRONGPASS, or a refused AUTH."""


class TrisqueConnectionError(TrisqueError, ConnectionError):
    """No node could be reached, or the connection broke before the reply was complete."""


class TrisqueTimeoutError(TrisqueError, TimeoutError):
    """The node did not answer within the timeout (the connection is dropped)."""


_ERRORS_BY_CODE: Final[dict[str, type[ResponseError]]] = {
    "NOREPL": NoReplicationError,
    "PAUSED": PausedError,
    "LEAVING": LeavingError,
    "BADID": BadIdError,
    "NOJOB": NoJobError,
    "MAXLEN": MaxLenError,
    "NOAUTH": AuthError,
    "WRONGPASS": AuthError,
}


# Disque answers ADDJOB on a leaving node with NOREPL and this reason, not with -LEAVING;
# for a client it means the same thing: go to another node.
_LEAVING_NOREPL = "I'm leaving the cluster"


def error_from_reply(reply: Error | str) -> ResponseError:
    text = str(reply)
    code = text.split(" ", 1)[0]
    if code == "NOREPL" and text.endswith(_LEAVING_NOREPL):
        return LeavingError(text)
    return _ERRORS_BY_CODE.get(code, ResponseError)(text)


# ---------------------------------------------------------------------------------------------
# Calls


def _identity(reply: Any) -> Any:
    return reply


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One prepared command (see the module docstring)."""

    payload: bytes
    convert: Callable[[Any], T]
    retry_safe: bool = False
    extra_wait: float | None = 0.0
    name: str = ""
    #: Set on GETJOB calls so the client can feed the producer tracker.
    delivers_jobs: bool = False

    @staticmethod
    def make(
        *args: bytes | str | int,
        convert: Callable[[Any], T] = _identity,
        retry_safe: bool = False,
        extra_wait: float | None = 0.0,
        delivers_jobs: bool = False,
    ) -> Call[T]:
        name = args[0] if isinstance(args[0], str) else str(args[0])
        return Call(encode_command(*args), convert, retry_safe, extra_wait, name.upper(),
                    delivers_jobs)


def check(reply: Any) -> Any:
    """Raise the typed exception for an error reply (also one nested in an array's first level)."""
    if isinstance(reply, Error):
        raise error_from_reply(reply)
    return reply


def read_timeout(call: Call[Any], socket_timeout: float | None) -> float | None:
    """How long to wait for ``call``'s reply: the socket timeout plus what the command may take."""
    if socket_timeout is None or call.extra_wait is None:
        return None
    return socket_timeout + call.extra_wait


# ---------------------------------------------------------------------------------------------
# Cluster view

Address = tuple[str, int]


def parse_address(text: str | Address, default_port: int = DEFAULT_PORT) -> Address:
    """``"host:port"``, ``"host"``, ``"[::1]:7711"`` or a ``(host, port)`` pair."""
    if isinstance(text, tuple):
        return (text[0], int(text[1]))
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return (host, int(rest[1:]) if rest.startswith(":") else default_port)
    if text.count(":") == 1:
        host, port = text.split(":")
        return (host or "127.0.0.1", int(port))
    return (text, default_port)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node as HELLO describes it. Lower priority is better; 100 means leaving."""

    id: str
    host: str
    port: int
    priority: int

    @property
    def address(self) -> Address:
        return (self.host, self.port)


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    my_id: str
    nodes: list[NodeInfo] = field(default_factory=list)

    def me(self) -> NodeInfo | None:
        for n in self.nodes:
            if n.id == self.my_id:
                return n
        return None


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def parse_hello(reply: Any, connected_host: str = "127.0.0.1") -> Hello:
    """``[version, my_id, [id, ip, port, priority], ...]``. An empty ip (a node that never met
    another one does not know its own address) is read as the host we connected to."""
    check(reply)
    if not isinstance(reply, list) or len(reply) < 2:
        raise ResponseError(f"ERR unexpected HELLO reply: {reply!r}")
    nodes = []
    for entry in reply[2:]:
        node_id, ip, port, prio = (_text(x) for x in entry[:4])
        nodes.append(NodeInfo(node_id, ip or connected_host, int(port), int(prio)))
    return Hello(int(reply[0]), _text(reply[1]), nodes)


class NodeSelector:
    """Which node to talk to (see the module docstring). Not thread-safe by itself: the blocking
    client calls it under its pool lock."""

    def __init__(self, seeds: Sequence[str | Address], rng: random.Random | None = None) -> None:
        if not seeds:
            raise ValueError("at least one seed node is needed")
        self.seeds: list[Address] = [parse_address(s) for s in seeds]
        self.rng = rng or random.Random()
        self.nodes: dict[str, NodeInfo] = {}  # by node ID, from the last HELLO
        self.failed: set[Address] = set()
        self.current: Address | None = None
        self.current_id: str | None = None
        self.preferred: Address | None = None  # set by a rebalance decision

    def candidates(self) -> list[Address]:
        """Addresses in the order to try them: a preferred one (rebalance), then known nodes by
        priority (random among equals, so clients spread out), then the seeds in random order;
        addresses that failed lately go last."""
        known = list(self.nodes.values())
        self.rng.shuffle(known)
        known.sort(key=lambda n: n.priority)
        seeds = list(self.seeds)
        self.rng.shuffle(seeds)
        order: list[Address] = []
        if self.preferred is not None:
            order.append(self.preferred)
        for addr in [n.address for n in known] + seeds:
            if addr not in order:
                order.append(addr)
        if all(a in self.failed for a in order):
            self.failed.clear()
        return [a for a in order if a not in self.failed] + [a for a in order if a in self.failed]

    def mark_failed(self, addr: Address) -> None:
        self.failed.add(addr)
        if addr == self.preferred:
            self.preferred = None
        if addr == self.current:
            self.current = None
            self.current_id = None

    def mark_leaving(self, addr: Address) -> None:
        """The node answered -LEAVING: treat it as the worst priority until HELLO says better."""
        for node_id, n in self.nodes.items():
            if n.address == addr:
                self.nodes[node_id] = NodeInfo(n.id, n.host, n.port, LEAVING_PRIORITY)
        self.mark_failed(addr)

    def connected(self, addr: Address) -> None:
        self.current = addr
        self.failed.discard(addr)

    def learn(self, hello: Hello, addr: Address) -> Address | None:
        """Record a HELLO reply got from ``addr``. Returns a better node to move to, if the
        current one is not among the best priority (e.g. it is leaving)."""
        self.nodes = {n.id: n for n in hello.nodes}
        me = hello.me()
        if me is not None and me.address != addr:
            # The node may call itself by another name than the one we dialled; keep ours.
            self.nodes[me.id] = NodeInfo(me.id, addr[0], addr[1], me.priority)
        self.current_id = hello.my_id
        self.current = addr
        if me is None or not self.nodes:
            return None
        best = min(n.priority for n in self.nodes.values())
        if me.priority <= best or (addr == self.preferred and me.priority < LEAVING_PRIORITY):
            # A node chosen by rebalance is kept unless it leaves: it is where the jobs are.
            return None
        better = [n.address for n in self.nodes.values()
                  if n.priority == best and n.address not in self.failed]
        return self.rng.choice(better) if better else None

    def address_of_prefix(self, prefix: str) -> Address | None:
        """The known node whose ID starts with ``prefix`` (from a job ID), unless it is leaving."""
        for n in self.nodes.values():
            if n.id.startswith(prefix) and n.priority < LEAVING_PRIORITY:
                return n.address
        return None


def producer_prefix(job_id: str) -> str | None:
    """The producing node's 8 first hex chars, from a ``D-xxxxxxxx-...`` job ID."""
    if len(job_id) >= 10 and job_id.startswith("D-"):
        return job_id[2:10]
    return None


class ProducerTracker:
    """Counts the producers of the last ``window`` received jobs."""

    def __init__(self, window: int = 64, min_samples: int = 16, share: float = 0.6) -> None:
        self.window: deque[str] = deque(maxlen=window)
        self.min_samples = min_samples
        self.share = share

    def observe(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            prefix = producer_prefix(job_id)
            if prefix is not None:
                self.window.append(prefix)

    def dominant(self, current_id: str | None) -> str | None:
        """A producer prefix, other than the current node's, holding at least ``share`` of a
        window of at least ``min_samples`` jobs."""
        if len(self.window) < self.min_samples:
            return None
        prefix, count = Counter(self.window).most_common(1)[0]
        if current_id is not None and current_id.startswith(prefix):
            return None
        if count < self.share * len(self.window):
            return None
        return prefix

    def reset(self) -> None:
        self.window.clear()
