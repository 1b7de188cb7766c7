"""CLIENT LIST's line for one connection: Disque's fields in Disque's order, then Redis 7's
``lib-name`` and ``lib-ver`` (redis-py sets them with CLIENT SETINFO).

Disque's reply buffers map onto a connection's two lists: ``obl`` is what the round has yet
to write (``out``, replies held for the append log among them), ``oll`` and ``omem`` are the
chunks the socket did not take (``pending``, owned by the sender task).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from node.conn_state import CLOSED, CLOSING, CLOSING_HELD, is_waiting

if TYPE_CHECKING:
    from node.connection import Connection


def flags(conn: Connection, monitoring: bool) -> str:
    """Disque's flag letters: O monitor, b blocked, c close after reply, A closing; N none."""
    state = conn.state
    letters = ("O" if monitoring else "") + ("b" if is_waiting(state) else "") \
        + ("c" if state is CLOSING or state is CLOSING_HELD else "") \
        + ("A" if state is CLOSED else "")
    return letters or "N"


def line(conn: Connection, now_ms: int, monotonic: float, monitoring: bool) -> str:
    client = conn.client
    pending = conn.pending
    return (
        f"id={client.id} addr={client.addr} fd={conn.fd} "
        f"name={client.name.decode('utf-8', 'replace')} "
        f"age={(now_ms - client.ctime_ms) // 1000} idle={int(monotonic - conn.last_active)} "
        f"flags={flags(conn, monitoring)} qbuf={conn.parser.buffered} "
        f"qbuf-free={conn.parser.free} obl={sum(map(len, conn.out))} oll={len(pending)} "
        f"omem={sum(map(len, pending))} events=r{'w' if pending else ''} "
        f"cmd={client.last_cmd.decode('utf-8', 'replace')} "
        f"lib-name={client.lib_name.decode('utf-8', 'replace')} "
        f"lib-ver={client.lib_ver.decode('utf-8', 'replace')}")
