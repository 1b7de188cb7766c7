"""Mutual TLS under the cluster bus (``tls-cluster yes``): one link's records (``TlsChannel``,
which the HTTPS front uses too: ``node/http_front.py``). The contexts are built with the
client port's, in ``node/tls.py``.

The bus reads and writes its sockets itself (``node/bus.py``: the reader's direct reads, the
flush's direct write), so TLS is an ``ssl.SSLObject`` over two memory BIOs rather than a
stream wrapper: the link's bytes still go through ``os.read``/``os.write`` on the socket, and
a ``TlsChannel`` turns them into records and back without waiting. Only the handshake waits,
before the link exists: a peer that fails it never gets a frame read.

Both directions verify the peer's chain against ``tls-ca-cert-file``/``tls-ca-cert-dir``
(inbound links require a client certificate, as Redis's bus does) and, as in Redis, not its
name: a peer is trusted for being signed by the CA, so the CA should be the cluster's own.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Any, Final

import trio

# What one read of the records asks for: a record's plaintext at most. SSLObject.read
# allocates what it is asked for before it shrinks it, and 256 KiB made a 200-byte record
# cost 43 us to decrypt instead of 5 (an mmap and munmap per read).
_RECORD_READ: Final = 16 * 1024


@dataclass(frozen=True)
class BusContexts:
    """What inbound bus links accept with, and what outbound links connect with."""

    server: ssl.SSLContext
    client: ssl.SSLContext


def describe(exc: BaseException) -> str:
    """An SSL error as one short phrase (OpenSSL's reason when there is one)."""
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc.strerror or exc).lower().replace("_", " ")
    if isinstance(exc, trio.TooSlowError):
        return "timed out"
    if isinstance(exc, (trio.BrokenResourceError, EOFError)):
        return "connection closed during the handshake"
    return str(exc) or type(exc).__name__


class TlsChannel:
    """One link's TLS state: ciphertext in (``decrypt``), plaintext out (``encrypt``), and the
    ciphertext the socket has not taken yet (``pending``), written before anything newer."""

    __slots__ = ("obj", "incoming", "outgoing", "pending", "eof")

    def __init__(self, context: ssl.SSLContext, server_side: bool) -> None:
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_side=server_side)
        self.pending = b""
        self.eof = False  # the peer sent close_notify

    async def handshake(self, sock: Any) -> None:
        """Run the handshake over ``sock`` (a trio socket); ``ssl.SSLError`` if the peer or
        its certificate is refused, ``EOFError`` if it hangs up."""
        obj, outgoing = self.obj, self.outgoing
        while True:
            try:
                obj.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
            except ssl.SSLError:
                await _send_quietly(sock, outgoing.read())  # the alert says why to the peer
                raise
            out = outgoing.read()
            if out:
                await _send_all(sock, out)
            if done:
                return
            data = await sock.recv(65536)
            if not data:
                raise EOFError
            self.incoming.write(data)

    def decrypt(self, data: bytes) -> bytes:
        """The plaintext that ``data`` (ciphertext just read) completes; ``ssl.SSLError`` on a
        bad record. Whatever TLS must answer (a key update) joins ``pending``."""
        incoming = self.incoming
        if data:
            incoming.write(data)
        obj = self.obj
        chunks: list[bytes] = []
        # A read brings whole records as a rule: once the BIO is empty nothing is left to
        # decrypt, and the read that would say so by raising is saved.
        while incoming.pending or obj.pending():
            try:
                chunk = obj.read(_RECORD_READ)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.eof = True
                break
            if not chunk:
                self.eof = True
                break
            chunks.append(chunk)
        if self.outgoing.pending:
            self.pending += self.outgoing.read()
        if not chunks:
            return b""
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def encrypt(self, data: bytes | memoryview) -> None:
        """``data`` as records, after ``pending``."""
        self.obj.write(data)
        self.pending += self.outgoing.read()

    def write_pending(self, fd: int) -> bool:
        """Write what the socket takes of ``pending`` at once; True when nothing is left.
        ``OSError`` (but a full socket) is the peer gone."""
        pending = self.pending
        try:
            sent = os.write(fd, pending)
        except BlockingIOError:
            return False
        self.pending = pending[sent:] if sent < len(pending) else b""
        return not self.pending


async def _send_all(sock: Any, data: bytes) -> None:
    view = memoryview(data)
    while view:
        sent = await sock.send(view)
        view = view[sent:]


async def _send_quietly(sock: Any, data: bytes) -> None:
    if not data:
        return
    try:
        with trio.move_on_after(1):
            await _send_all(sock, data)
    except OSError:
        pass
