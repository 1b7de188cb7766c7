"""Mutual TLS under the cluster bus (``tls-cluster yes``): the contexts, and one link's records
(``TlsChannel``, which the HTTPS front uses too: ``node/http_front.py``).

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

from broker.config import Config

# What one read of the records asks for: a record's plaintext at most. SSLObject.read
# allocates what it is asked for before it shrinks it, and 256 KiB made a 200-byte record
# cost 43 us to decrypt instead of 5 (an mmap and munmap per read).
_RECORD_READ: Final = 16 * 1024
# The files a CONFIG SET of which rebuilds the bus's contexts.
FILE_DIRECTIVES: Final = frozenset((
    "tls-cert-file", "tls-key-file", "tls-key-file-pass", "tls-client-cert-file",
    "tls-client-key-file", "tls-client-key-file-pass", "tls-ca-cert-file", "tls-ca-cert-dir"))


class TlsConfigError(Exception):
    """A TLS file that cannot be used: the text names it and why."""


@dataclass(frozen=True)
class BusContexts:
    """What inbound links accept with, and what outbound links connect with."""

    server: ssl.SSLContext
    client: ssl.SSLContext


def _path(config: Config, name: str) -> str:
    value = str(getattr(config, name.replace("-", "_")))
    if not value or os.path.isabs(value):
        return value
    return os.path.join(config.dir, value)


def _readable(path: str, what: str) -> None:
    if path and not os.access(path, os.R_OK):
        reason = "no such file" if not os.path.exists(path) else "not readable"
        raise TlsConfigError(f"Can't load the TLS {what} {path}: {reason}")


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "reason", None) or exc).lower().replace("_", " ")


def _load_chain(context: ssl.SSLContext, cert: str, key: str, password: str) -> None:
    _readable(cert, "certificate")
    _readable(key, "key")
    try:
        context.load_cert_chain(cert, key or None, password or None)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise TlsConfigError(f"Can't load the TLS certificate {cert} with the key "
                             f"{key or cert}: {_reason(exc)}") from None


def _load_authorities(context: ssl.SSLContext, cafile: str, capath: str) -> None:
    _readable(cafile, "CA certificates")
    if capath and not os.path.isdir(capath):
        raise TlsConfigError(f"Can't load the TLS CA certificates {capath}: not a directory")
    try:
        context.load_verify_locations(cafile or None, capath or None)
    except (ssl.SSLError, OSError) as exc:
        raise TlsConfigError(f"Can't load the TLS CA certificates {cafile or capath}: "
                             f"{_reason(exc)}") from None


def http_context(config: Config) -> ssl.SSLContext:
    """The HTTPS API's context (``http-tls yes``): the node's certificate, no client's asked
    for (requests authenticate as ACL users, docs/security.md)."""
    cert, key = _path(config, "tls-cert-file"), _path(config, "tls-key-file")
    if not cert:
        raise TlsConfigError("http-tls yes needs tls-cert-file and tls-key-file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, cert, key, str(config.tls_key_file_pass))
    context.set_alpn_protocols(["http/1.1"])
    return context


def bus_contexts(config: Config) -> BusContexts:
    """The bus's contexts from the ``tls-*`` directives; ``TlsConfigError`` names the file
    that cannot be used (a start stops on it, a CONFIG SET answers it and keeps the old)."""
    cert, key = _path(config, "tls-cert-file"), _path(config, "tls-key-file")
    cafile, capath = _path(config, "tls-ca-cert-file"), _path(config, "tls-ca-cert-dir")
    if not cert or not (cafile or capath):
        raise TlsConfigError("tls-cluster yes needs tls-cert-file, tls-key-file and "
                             "tls-ca-cert-file (or tls-ca-cert-dir)")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for context in (server, client):
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        _load_authorities(context, cafile, capath)
    client.check_hostname = False  # peers are dialled by address; the CA is the trust
    server.num_tickets = 0  # links are long-lived and never resumed
    _load_chain(server, cert, key, str(config.tls_key_file_pass))
    client_cert = _path(config, "tls-client-cert-file")
    if client_cert:
        _load_chain(client, client_cert, _path(config, "tls-client-key-file"),
                    str(config.tls_client_key_file_pass))
    else:
        _load_chain(client, cert, key, str(config.tls_key_file_pass))
    return BusContexts(server, client)


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
