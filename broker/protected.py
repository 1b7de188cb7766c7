"""Protected mode (Redis's ``protected-mode``): what a node without passwords refuses.

A node where no user has a password answers clients on loopback addresses only (DENIED to
the others, node/server.py); a cluster bus that authenticates nobody (no ``cluster-secret``,
no ``tls-cluster``) accepts loopback peers only (node/bus.py) and CLUSTER MEET refuses other
addresses, saying what to set.
"""

from __future__ import annotations

import ipaddress
from typing import Final

from protocol.resp import Error

MEET_REFUSED: Final = Error(
    "ERR protected mode: this node's cluster bus has no cluster-secret and no tls-cluster, so "
    "it only meets nodes on loopback addresses. Set the same 'cluster-secret' on every node "
    "(the bus then authenticates every frame), or 'tls-cluster yes' with certificates from "
    "one CA, or set 'protected-mode no' if the network is trusted.")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's own address (127.0.0.0/8, ::1, or one of them
    mapped into IPv6)."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def bus_open_to(host: str, protected_mode: bool, cluster_secret: str,
                tls_cluster: bool) -> bool:
    """Whether the cluster bus may link with a peer at ``host``: either authenticates it."""
    return not protected_mode or bool(cluster_secret) or tls_cluster or is_loopback(host)
