"""The fuzzers' TLS client (tools/fuzz_resp.py, fuzz_http.py and fuzz_bus.py with --tls): the
records made in memory, so that the fuzzer holds the ciphertext and can damage it.

``TlsClient`` is an ``ssl.SSLObject`` over two memory BIOs on a non-blocking socket: the
handshake is run here, then ``seal`` turns plaintext into records that the caller sends (or
cuts, splits and flips first: ``damage``) and ``open`` turns what the node answered back into
plaintext, ignoring what does not decrypt (a fuzzer reads the answers only to count them).
"""

from __future__ import annotations

import random
import select
import socket
import ssl
import time
from pathlib import Path

from cli.certs import CertSet, generate


def make_certs(directory: Path, nodes: int = 1, organization: str = "trisque-fuzz") -> CertSet:
    """A CA, ``nodes`` node certificates and a client certificate for the fuzzed nodes (another
    ``organization`` in another directory: an unrelated CA)."""
    return generate(directory, nodes=nodes, days=2, organization=organization)


def node_files(certs: CertSet) -> dict[str, str]:
    """The fuzzed node's certificate and key, as directives."""
    return {"tls_cert_file": str(certs.nodes[0][0]), "tls_key_file": str(certs.nodes[0][1])}


def trusting(cafile: str | Path) -> ssl.SSLContext:
    """A client context that trusts ``cafile`` and not the host name (the nodes are reached
    by address)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(cafile))
    context.check_hostname = False
    return context


VERSIONS = (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3)


def client_context(cafile: str | Path, version: ssl.TLSVersion,
                   cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    """``trusting(cafile)`` up to ``version``, presenting ``cert`` (a certificate and its key)
    if there is one."""
    context = trusting(cafile)
    context.maximum_version = version
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    return context


def client_contexts(certs: CertSet) -> list[ssl.SSLContext]:
    """Contexts a fuzzer picks from per connection: TLSv1.2 and TLSv1.3, with and without the
    client certificate (the node runs ``tls-auth-clients optional``)."""
    return [client_context(certs.ca_cert, version, certs.client if with_cert else None)
            for version in VERSIONS for with_cert in (False, True)]


def client_hello(context: ssl.SSLContext) -> bytes:
    """A fresh ClientHello's bytes, as a new connection would send them first."""
    obj = context.wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_side=False)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


class TlsClient:
    """One connection's TLS state on the fuzzer's side (see the module docstring)."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        self.sock = sock
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_side=False)
        self.broken = False  # a record the node sent did not decrypt, or it closed

    def handshake(self, timeout: float = 5.0) -> bool:
        """Run the handshake on the (non-blocking) socket; False if the node refused it or
        took longer than ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.obj.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
            except (ssl.SSLError, ValueError):
                return False
            out = self.outgoing.read()
            if out and not _send_all(self.sock, out, deadline):
                return False
            if done:
                return True
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return False
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                return False
            if not data:
                return False
            self.incoming.write(data)

    def seal(self, data: bytes) -> bytes:
        """``data`` as records (their boundaries are TLS's: 16 KiB of plaintext at most)."""
        if data:
            self.obj.write(data)
        return self.outgoing.read()

    def close_notify(self) -> bytes:
        """The close_notify alert's record."""
        try:
            self.obj.unwrap()
        except (ssl.SSLError, ValueError):
            pass
        return self.outgoing.read()

    def open(self, data: bytes) -> bytes:
        """The plaintext that ``data`` from the node completes (b"" once it is broken)."""
        if self.broken:
            return b""
        self.incoming.write(data)
        chunks = []
        while True:
            try:
                chunk = self.obj.read(1 << 16)
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLError, ValueError):
                self.broken = True
                break
            if not chunk:
                break
            chunks.append(chunk)
        self.outgoing.read()  # a key update's answer or a ticket ack: not sent
        return b"".join(chunks)


def record_bounds(data: bytes) -> list[int]:
    """Where each TLS record in ``data`` starts (5-byte header: type, version, length)."""
    starts = []
    at = 0
    while at + 5 <= len(data):
        starts.append(at)
        at += 5 + int.from_bytes(data[at + 3:at + 5], "big")
    return starts


def damage(rng: random.Random, records: bytes, hello: bytes, plaintext: bytes) -> tuple[bytes, bool]:
    """``records`` damaged one way at the record layer, and whether the connection must then
    be closed without close_notify (the damage is a cut)."""
    r = rng.random()
    starts = record_bounds(records) or [0]
    if r < 0.25:  # truncated: a record cut anywhere, then the connection dropped
        return records[:rng.randrange(len(records) + 1)], True
    if r < 0.45:  # a flipped byte in one record (its header, or its sealed content)
        data = bytearray(records)
        if data:
            at = rng.choice(starts)
            data[min(len(data) - 1, at + rng.randrange(16))] ^= 1 << rng.randrange(8)
        return bytes(data), False
    if r < 0.6:  # plaintext after the handshake, as if TLS had ended
        return records[:rng.choice(starts)] + plaintext, False
    if r < 0.75:  # a second ClientHello, between records
        at = rng.choice(starts)
        return records[:at] + hello + records[at:], False
    if r < 0.85:  # a record header that lies about its length
        data = bytearray(records)
        if len(data) >= 5:
            at = rng.choice(starts)
            data[at + 3:at + 5] = rng.choice((0, 1, 0x4000, 0x4100, 0xFFFF)).to_bytes(2, "big")
        return bytes(data), False
    # a record of another content type (change_cipher_spec, alert, handshake, heartbeat, junk)
    kind = rng.choice((20, 21, 22, 24, 0, 99))
    body = rng.randbytes(rng.choice((0, 1, 2, 40)))
    return records + bytes((kind, 3, 3)) + len(body).to_bytes(2, "big") + body, False


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> bool:
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([], [sock], [], left)[1]:
            return False
        try:
            view = view[sock.send(view):]
        except BlockingIOError:
            continue
        except OSError:
            return False
    return True
