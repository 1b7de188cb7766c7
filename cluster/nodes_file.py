"""``nodes.conf``: the node table as text, rendered and parsed (pure: no file is touched).

Theory of operation
-------------------
The format is Disque's: the file is the ``CLUSTER NODES`` listing minus the nodes still in
handshake, one node per line, six space-separated fields::

    <40-hex id> <ip>:<port> <flags> <ping_sent> <pong_received> <connected|disconnected>

``flags`` is a comma-separated list of ``myself``, ``fail?`` (also read as ``pfail``),
``fail``, ``handshake``, ``noaddr``, ``leaving``, or ``noflags``. Exactly one line carries
``myself``; its ip may be empty (``:7711``) until the node has learnt its address from a
peer. That makes the one-line file the single-node code wrote before the cluster existed
(``<id> :<port> myself 0 0 connected``) a valid file. Lines starting with ``vars`` hold
``name value`` pairs for later needs (none are written today; they are kept on parse). Blank
lines are skipped.

``parse`` refuses anything else with ``NodesFileError`` naming the line and the problem:
a node table silently reset would give the node a new identity and lose its peers, which is
worse than refusing to start. Writing the file atomically is the runtime's job
(``cluster.effects.SaveNodes``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cluster.messages import is_node_id

#: Display order of the flags, as CLUSTER NODES prints them (Disque's order).
FLAG_NAMES = (("myself", "myself"), ("pfail", "fail?"), ("fail", "fail"),
              ("handshake", "handshake"), ("noaddr", "noaddr"), ("leaving", "leaving"))
_FLAG_OF_NAME = {shown: flag for flag, shown in FLAG_NAMES} | {"pfail": "pfail"}


class NodesFileError(ValueError):
    """The file cannot be trusted; ``line`` is 1-based (0: the file as a whole)."""

    def __init__(self, line: int, reason: str) -> None:
        where = f"line {line}" if line else "the file"
        super().__init__(f"corrupt cluster config file, {where}: {reason}")
        self.line = line
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SavedNode:
    node_id: str
    ip: str
    port: int
    flags: frozenset[str]
    ping_sent: int
    pong_received: int
    connected: bool


@dataclass(frozen=True, slots=True)
class SavedNodes:
    myself_id: str
    nodes: tuple[SavedNode, ...]  # myself included
    vars: tuple[tuple[str, str], ...] = ()

    @property
    def myself(self) -> SavedNode:
        return next(n for n in self.nodes if n.node_id == self.myself_id)


def show_flags(flags: Iterable[str]) -> str:
    present = set(flags)
    shown = [name for flag, name in FLAG_NAMES if flag in present]
    return ",".join(shown) if shown else "noflags"


def node_line(n: SavedNode) -> str:
    link = "connected" if n.connected else "disconnected"
    return (f"{n.node_id} {n.ip}:{n.port} {show_flags(n.flags)} "
            f"{n.ping_sent} {n.pong_received} {link}")


def render(nodes: Iterable[SavedNode], vars: Iterable[tuple[str, str]] = ()) -> str:
    lines = [node_line(n) for n in nodes if "handshake" not in n.flags]
    pairs = list(vars)
    if pairs:
        lines.append("vars " + " ".join(f"{k} {v}" for k, v in pairs))
    return "".join(line + "\n" for line in lines)


def _number(text: str, lineno: int, what: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        raise NodesFileError(lineno, f"{what} {text!r} is not a non-negative integer")
    return int(text)


def _parse_line(fields: list[str], lineno: int) -> SavedNode:
    if len(fields) != 6:
        raise NodesFileError(lineno, f"expected 6 fields, found {len(fields)}")
    node_id, address, flag_text, ping_sent, pong_received, link = fields
    if not is_node_id(node_id):
        raise NodesFileError(lineno, f"node ID {node_id!r} is not 40 lowercase hex characters")
    ip, colon, port_text = address.rpartition(":")
    if not colon:
        raise NodesFileError(lineno, f"address {address!r} has no ':port'")
    port = _number(port_text, lineno, "port")
    if port > 65535:
        raise NodesFileError(lineno, f"port {port} is out of range")
    flags: set[str] = set()
    for name in flag_text.split(","):
        if name == "noflags":
            continue
        flag = _FLAG_OF_NAME.get(name)
        if flag is None:
            raise NodesFileError(lineno, f"unknown flag {name!r}")
        flags.add(flag)
    if link not in ("connected", "disconnected"):
        raise NodesFileError(lineno, f"link state {link!r} is not connected/disconnected")
    return SavedNode(node_id, ip, port, frozenset(flags), _number(ping_sent, lineno, "ping_sent"),
                     _number(pong_received, lineno, "pong_received"), link == "connected")


def parse(text: str) -> SavedNodes:
    nodes: list[SavedNode] = []
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    myself: str | None = None
    for lineno, line in enumerate(text.split("\n"), start=1):
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "vars":
            if len(fields) % 2 == 0:
                raise NodesFileError(lineno, "vars line needs name value pairs")
            pairs.extend(zip(fields[1::2], fields[2::2], strict=True))
            continue
        node = _parse_line(fields, lineno)
        if node.node_id in seen:
            raise NodesFileError(lineno, f"node {node.node_id} is listed twice")
        seen.add(node.node_id)
        if "myself" in node.flags:
            if myself is not None:
                raise NodesFileError(lineno, "a second line has the myself flag")
            myself = node.node_id
        nodes.append(node)
    if myself is None:
        raise NodesFileError(0, "no line has the myself flag")
    return SavedNodes(myself, tuple(nodes), tuple(pairs))
