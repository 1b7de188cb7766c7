"""The connections node/http_front.py hands to hypercorn (``_Prefixed``, ``_TlsHandover``) as
hypercorn's tasks use them: the bytes already read come first, one task may close the
connection while another still sends or reads (found by tools/fuzz_http.py)."""

from __future__ import annotations

import socket
import ssl

import trio
import trio.testing

from node.bus_tls import TlsChannel
from node.http_front import _Prefixed, _Tls


async def _pair() -> tuple[_Prefixed, trio.socket.SocketType]:
    ours, theirs = trio.socket.socketpair()
    return _Prefixed(trio.SocketStream(ours), b"already read", trio.CancelScope()), theirs


async def test_the_bytes_already_read_come_first() -> None:
    conn, peer = await _pair()
    with peer:
        await peer.send(b"then more")
        assert await conn.receive_some() == b"already read"
        assert await conn.receive_some() == b"then more"
        await conn.aclose()


async def test_a_close_while_the_app_sends_is_a_broken_connection() -> None:
    conn, peer = await _pair()
    outcome: list[object] = []

    async def answer() -> None:
        try:
            await conn.send_all(b"HTTP/1.1 200 OK\r\n\r\n")
            outcome.append("sent")
        except trio.BrokenResourceError:
            outcome.append("broken")

    with peer:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.send_eof)  # hypercorn's reader, at the client's end
            nursery.start_soon(answer)  # the app's task, in the same turn
        # Either the answer went before the shutdown or it meets a closed connection, which
        # hypercorn handles; before the fix the send raised trio.BusyResourceError, which it
        # logged as "Error in ASGI Framework" (an exception of the app).
        assert outcome in (["sent"], ["broken"])
        await conn.send_eof()  # a second close is a no-op
        await conn.aclose()


async def test_closing_an_https_connection_wakes_its_reader() -> None:
    # Hypercorn closes an HTTPS connection from one task while its reading task waits on the
    # socket. Closed under that wait, the descriptor stayed registered with trio, and a new
    # connection given the same number failed its first wait (BusyResourceError), which took
    # the HTTP API down (found by tools/fuzz_http.py --tls).
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    channel = TlsChannel(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), server_side=True)
    conn = _Tls(ours, channel).hand_over(b"", trio.CancelScope())
    ended: list[str] = []

    async def read() -> None:
        try:
            await conn.receive_some()
        except (trio.ClosedResourceError, trio.BrokenResourceError) as exc:
            ended.append(type(exc).__name__)

    with theirs, trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            await conn.aclose()
        assert ended == ["ClosedResourceError"]
        # The number is free for trio again: a new socket that gets it can be waited on.
        again, other = socket.socketpair()
        with again, other:
            other.send(b"x")
            await trio.lowlevel.wait_readable(again)
