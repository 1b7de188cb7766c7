"""Opening clients for Spark tasks: one node per task, spread over what HELLO reports.

A task picks its node from the cluster's HELLO list by its partition number, so the tasks of a
job spread over every node. An unreachable node raises with its address in the message.
"""

from __future__ import annotations

from pipeline.options import Common
from protocol.client import Client, TrisqueConnectionError


def open_client(common: Common, seeds: list[str] | None = None) -> Client:
    """A client on the first reachable seed; fails naming every address tried."""
    tried: list[str] = []
    for node in seeds or common.nodes:
        client = Client([node], password=common.password, socket_timeout=common.timeout_s,
                        cluster_aware=False)
        try:
            client.ping()
            return client
        except (TrisqueConnectionError, OSError) as exc:
            client.close()
            tried.append(f"{node} ({exc})")
    raise TrisqueConnectionError("cannot reach trisque node " + ", ".join(tried))


def cluster_nodes(common: Common) -> list[str]:
    """Every node HELLO reports (host:port), falling back to the seeds given."""
    client = open_client(common)
    try:
        hello = client.hello()
        found = [f"{n.address[0]}:{n.address[1]}" for n in hello.nodes]
    finally:
        client.close()
    return found or list(common.nodes)


def client_for_task(common: Common, task_number: int) -> Client:
    """A client on node ``task_number mod len(nodes)``, the others as fallbacks."""
    nodes = cluster_nodes(common)
    start = task_number % len(nodes)
    return open_client(common, nodes[start:] + nodes[:start])
