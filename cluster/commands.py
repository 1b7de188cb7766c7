"""CLUSTER subcommands on the node table: argument checks, Disque's replies and error texts.

Theory of operation
-------------------
``run(table, sub, args, now_ms)`` is what ``Membership.command`` (the ``ClusterView`` method
the broker calls) does: it checks the arguments exactly as Disque's ``clusterCommand`` does,
changes the table through ``cluster.table.Table`` (which appends the effects), and returns
the RESP reply value. LEAVING is not here: it is also the broker's flag, so
``broker/admin.py`` answers it and calls ``set_leaving``. RESET's flush of the jobs is done
by admin too (the table knows no jobs).
"""

from __future__ import annotations

from typing import Any

from cluster.messages import is_node_id
from cluster.nodes_file import node_line
from cluster.table import Table, dialable
from protocol import errors
from protocol.commands import parse_int
from protocol.resp import OK


def run(t: Table, sub: bytes, args: tuple[bytes, ...], now_ms: int) -> Any:
    if sub == b"meet" and len(args) == 2:
        return _meet(t, args[0], args[1], now_ms)
    if sub == b"nodes" and not args:
        return "".join(node_line(n) + "\n" for n in t.saved_nodes()).encode()
    if sub == b"myid" and not args:
        return t.myself_id.encode()
    if sub == b"info" and not args:
        return info(t).encode()
    if sub == b"saveconfig" and not args:
        t.save()
        return OK
    if sub == b"forget" and len(args) == 1:
        return _forget(t, args[0], now_ms)
    if sub == b"reset" and len(args) <= 1:
        mode = args[0].lower() if args else b"soft"
        if mode not in (b"soft", b"hard"):
            return errors.SYNTAX
        t.reset(mode == b"hard")
        return OK
    return errors.BAD_CLUSTER_SUB


def info(t: Table) -> str:
    # Disque's cluster_state is always ok: it has no slots, every node can serve.
    return (
        "cluster_state:ok\r\n"
        f"cluster_known_nodes:{len(t.nodes)}\r\n"
        f"cluster_reachable_nodes:{t.reachable_nodes()}\r\n"
        f"cluster_size:{t.size()}\r\n"
        f"cluster_stats_messages_sent:{t.messages_sent}\r\n"
        f"cluster_stats_messages_received:{t.messages_received}\r\n"
    )


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


def _meet(t: Table, ip_arg: bytes, port_arg: bytes, now_ms: int) -> Any:
    port = parse_int(port_arg)
    if port is None:
        return errors.invalid_port(_text(port_arg))
    ip = dialable(_text(ip_arg), port)
    if ip is None:
        return errors.invalid_node_address(_text(ip_arg), _text(port_arg))
    t.start_handshake(ip, port, now_ms, meet=True)  # one already under way: still OK
    return OK


def _forget(t: Table, id_arg: bytes, now_ms: int) -> Any:
    node_id = _text(id_arg)
    if len(id_arg) != 40:
        return errors.INVALID_NODE_ID
    node = t.nodes.get(node_id) if is_node_id(node_id) else None
    if node is None:
        return errors.unknown_node(node_id)
    if node is t.myself:
        return errors.CANT_FORGET_MYSELF
    t.forget(node, now_ms)
    return OK
