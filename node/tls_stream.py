"""A TLS connection's layer over its non-blocking socket, compiled with the core: the part of
node/tls.py that runs for every request (see that module for the theory of operation).

``TlsStream`` has the socket's calls (``recv``, ``send``, ``fileno``, ``close``:
``node.conn_core.Stream``), so the reactor serves it like a socket; ``Front`` is what it asks
of ``node.tls.TlsFront`` (the context for the handshake, the clock, the log of refusals). It
imports no trio.
"""

from __future__ import annotations

import logging
import socket
import ssl
from typing import Any, Final, Protocol

# Plaintext bytes one send() encrypts: bounds the records held when the socket is full.
SEND_CHUNK: Final = 256 * 1024


class Clock(Protocol):
    def monotonic(self) -> float: ...


class Front(Protocol):
    """What a stream needs of ``node.tls.TlsFront``."""

    @property
    def context(self) -> ssl.SSLContext: ...

    @property
    def clock(self) -> Clock: ...

    def refused(self, stream: TlsStream, reason: str, level: int) -> None: ...

    def handshaken(self, stream: TlsStream) -> None: ...

    def forget(self, stream: TlsStream) -> None: ...


def reason(exc: BaseException) -> str:
    """A TLS or socket error in a few words, for the log and for replies."""
    # Read untyped: these attributes may be None where typeshed says str, and compiled code
    # checks declared types.
    verify: Any = getattr(exc, "verify_message", None)
    if verify:
        return f"certificate verify failed: {verify}"
    short: Any = getattr(exc, "reason", None)
    if isinstance(exc, ssl.SSLError) and short:
        return str(short).lower().replace("_", " ")
    text: Any = getattr(exc, "strerror", None)
    if text:
        return str(text)
    return str(exc)


class TlsStream:
    """A TLS server connection over a non-blocking socket, with the socket's calls (see the
    module docstring)."""

    def __init__(self, sock: socket.socket, front: Front, addr: str) -> None:
        self.sock = sock
        self.front = front
        self.addr = addr
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.tls = front.context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        # ssl.SSLObject's read, write and pending are Python methods that call the C object
        # under it: per request, calling that object directly saves their frames.
        self.engine: Any = getattr(self.tls, "_sslobj", None) or self.tls
        self.ready = False  # the handshake is done
        self.eof = False  # the client's close_notify came
        self.unsent = b""  # records the socket did not take, written first
        self.owed = 0  # plaintext bytes of the send() whose records are in ``unsent``
        self.started = front.clock.monotonic()

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv(self, size: int) -> bytes:
        if self.eof:
            return b""
        data = self.sock.recv(size)
        if not data:
            if not self.ready:
                self.front.refused(self, "connection closed during the TLS handshake",
                                   logging.INFO)
            return b""
        incoming = self.incoming
        incoming.write(data)
        if not self.ready:
            try:
                self.tls.do_handshake()
            except ssl.SSLWantReadError:
                self._flush()
                raise BlockingIOError from None
            except ssl.SSLError as exc:
                self._send_alert()
                self.front.refused(self, reason(exc), logging.WARNING)
                raise
            self.ready = True
            self.front.handshaken(self)
            self._flush()  # its last flight (and TLSv1.3's session tickets)
            if not incoming.pending:
                raise BlockingIOError
        engine = self.engine
        first = b""
        more: list[bytes] = []
        try:
            while True:
                chunk: bytes = engine.read(size)
                if not chunk:  # the client's close_notify
                    self.eof = True
                    break
                if not first:
                    first = chunk
                else:
                    more.append(chunk)
                if len(chunk) < size and not incoming.pending:
                    break  # a short read: nothing more is decrypted or buffered
                if not (incoming.pending or engine.pending()):
                    break
        except ssl.SSLWantReadError:
            pass  # a record not complete yet: the socket reports the rest
        except ssl.SSLZeroReturnError:
            self.eof = True
        if self.outgoing.pending:
            self._flush()  # a key update's answer
        if more:
            return first + b"".join(more)
        if first or self.eof:
            return first
        raise BlockingIOError

    def send(self, data: bytes | memoryview) -> int:
        if self.unsent and not self._flush():
            return 0
        if self.owed:  # those bytes' records are written now
            taken, self.owed = self.owed, 0
            return taken
        if not self.ready:
            return 0  # nothing is sent before the handshake (no reply can exist yet)
        chunk = data[:SEND_CHUNK] if len(data) > SEND_CHUNK else data
        self.engine.write(chunk)
        records = self.outgoing.read()
        try:
            sent = self.sock.send(records)
        except BlockingIOError:
            sent = 0
        if sent == len(records):
            return len(chunk)
        self.unsent = records[sent:]
        self.owed = len(chunk)
        return 0

    def _flush(self) -> bool:
        """Hand the kept and newly made records to the socket; True when none is left."""
        if self.outgoing.pending:
            self.unsent += self.outgoing.read()
        if self.unsent:
            try:
                sent = self.sock.send(self.unsent)
            except BlockingIOError:
                return False
            self.unsent = self.unsent[sent:]
        return not self.unsent

    def _send_alert(self) -> None:
        """The alert OpenSSL made for a failed handshake, so the client learns why."""
        try:
            self._flush()
        except OSError:
            pass

    def close(self) -> None:
        self.front.forget(self)
        if self.ready and not self.unsent and self.sock.fileno() >= 0:
            try:
                self.tls.unwrap()  # writes close_notify; the client's is not awaited
            except (ssl.SSLError, ValueError):
                pass
            try:
                self._flush()
            except OSError:
                pass
        self.sock.close()
