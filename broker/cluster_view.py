"""What the broker asks of the cluster: ``ClusterView``, and ``SoloCluster`` for one node.

Theory of operation
-------------------
The broker answers CLUSTER and HELLO and counts reachable nodes for replication, but the
node table belongs to the cluster core (``cluster.membership.Membership``), which may import
the broker and not the other way round. So the broker talks to a ``ClusterView`` Protocol
held in ``Broker.cluster``: the membership core satisfies it structurally, and
``SoloCluster`` (the default) gives today's single-node answers, so a broker built without a
cluster bus behaves as it always did. CLUSTER LEAVING stays in ``broker/admin.py`` (it is
also the broker's flag); admin tells the view with ``set_leaving``.
"""

from __future__ import annotations

from typing import Any, Protocol

from broker.config import Config
from protocol import errors


class ClusterView(Protocol):
    def command(self, sub: bytes, args: tuple[bytes, ...], now_ms: int) -> Any:
        """The reply value of ``CLUSTER <sub> <args...>`` (every subcommand but LEAVING)."""
        ...

    def hello_nodes(self) -> list[list[bytes]]:
        """Every known node as ``[id, ip, port, priority]``, this node first."""
        ...

    def reachable_nodes(self) -> int:
        """Other nodes reachable now (not failing, leaving or in handshake)."""
        ...

    def set_leaving(self, leaving: bool, now_ms: int) -> None: ...


class SoloCluster:
    """A cluster of one: no bus, so CLUSTER MEET says so."""

    def __init__(self, config: Config, node_id: str) -> None:
        self.config = config
        self.node_id = node_id
        self.leaving = False

    def command(self, sub: bytes, args: tuple[bytes, ...], now_ms: int) -> Any:
        sub = sub.lower()
        if sub == b"info" and not args:
            return (
                b"cluster_state:ok\r\n"
                b"cluster_known_nodes:1\r\n"
                b"cluster_reachable_nodes:0\r\n"
                b"cluster_size:1\r\n"
                b"cluster_stats_messages_sent:0\r\n"
                b"cluster_stats_messages_received:0\r\n"
            )
        if sub == b"nodes" and not args:
            return f"{self.node_id} :{self.config.client_port} myself 0 0 connected\n".encode()
        if sub == b"myid" and not args:
            return self.node_id.encode()
        if sub == b"meet":
            return errors.NO_CLUSTER_BUS
        return errors.BAD_CLUSTER_SUB

    def hello_nodes(self) -> list[list[bytes]]:
        priority = b"100" if self.leaving else b"1"
        return [[self.node_id.encode(), b"", str(self.config.client_port).encode(), priority]]

    def reachable_nodes(self) -> int:
        return 0

    def set_leaving(self, leaving: bool, now_ms: int) -> None:
        self.leaving = leaving
