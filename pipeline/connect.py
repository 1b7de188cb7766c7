"""Opening clients for Spark tasks: one node per task, spread over what HELLO reports.

A write task picks its node from the cluster's HELLO list by its partition number, so the tasks
of a job spread over every node; nodes HELLO gives priority 100 (failed, or leaving the cluster:
they refuse ADDJOB) are used only when no other node is listed. An unreachable node raises with
its address in the message.
"""

from __future__ import annotations

from client.blocking import Client, TrisqueConnectionError
from pipeline.options import Common

# Disque's HELLO priority for a node that failed or is leaving (cluster/table.py).
UNUSABLE_PRIORITY = 100


def open_client(common: Common, seeds: list[str] | None = None) -> Client:
    """A client on the first reachable seed; fails naming every address tried."""
    tried: list[str] = []
    context = None if common.tls is None else common.tls.context()
    for node in seeds or common.nodes:
        client = Client([node], password=common.password, socket_timeout=common.timeout_s,
                        cluster_aware=False, tls=context)
        try:
            client.ping()
            return client
        except (TrisqueConnectionError, OSError) as exc:
            client.close()
            tried.append(f"{node} ({exc})")
    raise TrisqueConnectionError("cannot reach trisque node " + ", ".join(tried))


def hello_nodes(common: Common) -> list[tuple[str, int]]:
    """Every node HELLO reports as (host:port, priority), in HELLO's order (the node asked
    first, then the others in the order it learnt them); the seeds given when HELLO is empty."""
    client = open_client(common)
    try:
        hello = client.hello()
        found = [(f"{n.address[0]}:{n.address[1]}", int(n.priority)) for n in hello.nodes]
    finally:
        client.close()
    return found or [(n, 1) for n in common.nodes]


def cluster_nodes(common: Common) -> list[str]:
    """Every node HELLO reports (host:port), falling back to the seeds given."""
    return [addr for addr, _ in hello_nodes(common)]


def writable_nodes(common: Common) -> list[str]:
    """The nodes HELLO does not mark failed or leaving (all of them if it marks every one)."""
    nodes = hello_nodes(common)
    good = [addr for addr, prio in nodes if prio < UNUSABLE_PRIORITY]
    return good or [addr for addr, _ in nodes]


def client_for_task(common: Common, task_number: int) -> Client:
    """A client on writable node ``task_number mod len(nodes)``, the others as fallbacks."""
    nodes = writable_nodes(common)
    start = task_number % len(nodes)
    return open_client(common, nodes[start:] + nodes[:start])
