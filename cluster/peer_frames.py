"""The first steps every cluster core takes with a frame from a peer (sans-IO).

Theory of operation
-------------------
The job core, the federation core and the policy core each receive frames of their own
types, and each must do the same three things first: count the frame for CLUSTER INFO's
``cluster_stats_messages_received`` (Disque's only cluster counters), ignore a sender that is
not a member (unknown, still in handshake, or claiming to be this node: Disque does the same),
and turn the body into a typed message or drop it with one rate-limited log line when it is
malformed. ``accept`` does exactly that, once, so the three cores cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from cluster.effects import ClusterEffect, LogLine
from cluster.membership import Membership
from cluster.wire import Frame, MalformedBody

M = TypeVar("M")


def accept(membership: Membership, frame: Frame, peer_ip: str, parse: Callable[[Frame], M],
           stats: dict[str, int], outbox: list[ClusterEffect], kind: str) -> tuple[M, str] | None:
    """``(message, sender ID)`` for a frame a core should handle, else None (logged).

    ``kind`` names the core in log keys (``unknown-<kind>-sender:<ip>``,
    ``malformed-<kind>:<ip>``), so the runtime rate-limits each core's lines per peer;
    ``stats`` gains ``malformed`` and ``received``."""
    membership.messages_received += 1
    sender = member(membership, frame)
    if sender is None:
        outbox.append(LogLine("debug", f"{frame.type.name} from unknown node {frame.sender[:8]}",
                              f"unknown-{kind}-sender:{peer_ip}"))
        return None
    try:
        msg = parse(frame)
    except MalformedBody as exc:
        stats["malformed"] += 1
        outbox.append(LogLine("warning",
                              f"malformed {frame.type.name} from {frame.sender[:8]}: {exc}",
                              f"malformed-{kind}:{peer_ip}"))
        return None
    stats["received"] += 1
    return msg, sender


def member(membership: Membership, frame: Frame) -> str | None:
    """The ID of the frame's sender if it is a member a core listens to, else None."""
    return member_id(membership, frame.sender)


def member_id(membership: Membership, node_id: str) -> str | None:
    """``member`` of a frame sent by ``node_id``."""
    sender = membership.nodes.get(node_id)
    if sender is None or "handshake" in sender.flags or sender is membership.myself:
        return None
    return sender.node_id
