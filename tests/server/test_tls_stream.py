"""node/tls.py in-process: TlsStream over a socketpair against a client SSLObject, its
socket-like contract (nothing to read is BlockingIOError; a full socket takes nothing until
the records it kept are written, then answers their length), and the handshake sweep."""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.config import Config
from cli.certs import CertSet
from node.bus import LogLimiter
from node.tls import HANDSHAKE_TIMEOUT_S, TlsConfigError, TlsFront, build_context
from node.tls_stream import TlsStream
from tests.support.certs import client_context, make_certs


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def now_ms(self) -> int:
        return int(self.now * 1000)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return make_certs(tmp_path_factory.mktemp("certs"), nodes=1)


def config(certs: CertSet, **more: str) -> Config:
    cfg = Config()
    cfg.tls_cert_file, cfg.tls_key_file = map(str, certs.nodes[0])
    cfg.tls_ca_cert_file = str(certs.ca_cert)
    cfg.tls_auth_clients = "no"
    for name, value in more.items():
        setattr(cfg, name, value)
    return cfg


class Client:
    """The client's end: an SSLObject driven by hand over the other socket."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        self.sock = sock
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname="localhost")

    def pump_out(self) -> None:
        if self.outgoing.pending:
            self.sock.sendall(self.outgoing.read())

    def pump_in(self) -> None:
        self.sock.setblocking(False)
        try:
            while data := self.sock.recv(1 << 20):
                self.incoming.write(data)
        except BlockingIOError:
            pass
        finally:
            self.sock.setblocking(True)


@pytest.fixture
def pair(certs: CertSet) -> Iterator[tuple[TlsFront, TlsStream, Client]]:
    clock = FakeClock()
    front = TlsFront(config(certs), clock, LogLimiter(logging.getLogger("test-tls"), clock))
    server_sock, client_sock = socket.socketpair()
    server_sock.setblocking(False)
    stream = front.wrap(server_sock, "127.0.0.1:5000")
    client = Client(client_sock, client_context(certs, with_cert=False))
    yield front, stream, client
    stream.close()
    client_sock.close()


def handshake(stream: TlsStream, client: Client) -> None:
    for _ in range(10):
        try:
            client.tls.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            done = False
        client.pump_out()
        with pytest.raises(BlockingIOError):  # handshake steps are no data
            stream.recv(65536)
        client.pump_in()
        if done:
            break
    assert stream.ready


def test_handshake_then_data_both_ways(pair: tuple[TlsFront, TlsStream, Client]) -> None:
    front, stream, client = pair
    front.started(stream, None)  # type: ignore[arg-type]
    handshake(stream, client)
    assert stream not in front.handshaking
    # Several records in one read come back together.
    for part in (b"*1\r\n", b"$4\r\n", b"PING\r\n"):
        client.tls.write(part)
    client.pump_out()
    assert stream.recv(65536) == b"*1\r\n$4\r\nPING\r\n"
    assert stream.send(b"+PONG\r\n") == 7
    client.pump_in()
    assert client.tls.read(100) == b"+PONG\r\n"
    # close_notify from the client is the end of the stream.
    with pytest.raises(ssl.SSLWantReadError):
        client.tls.unwrap()
    client.pump_out()
    assert stream.recv(65536) == b""


def test_a_full_socket_keeps_the_records_and_owes_their_length(
        pair: tuple[TlsFront, TlsStream, Client]) -> None:
    _, stream, client = pair
    handshake(stream, client)
    stream.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    payload = bytes(range(256)) * 1024  # 256 KiB: more than the socket takes at once
    taken = stream.send(payload)
    assert taken == 0 and stream.unsent and stream.owed == len(payload)
    assert stream.send(payload) == 0  # still full: nothing more is encrypted
    received = b""
    while len(received) < len(payload):
        client.pump_in()
        try:
            while chunk := client.tls.read(1 << 20):
                received += chunk
        except ssl.SSLWantReadError:
            pass
        sent = stream.send(payload)  # the caller retries with the same bytes first
        if sent:
            assert sent == len(payload)
            assert not stream.unsent
    assert received == payload


def test_plaintext_is_a_tls_error_and_logged_once_per_address(
        pair: tuple[TlsFront, TlsStream, Client], caplog: pytest.LogCaptureFixture) -> None:
    front, stream, client = pair
    client.sock.sendall(b"*1\r\n$4\r\nPING\r\n")
    with caplog.at_level(logging.INFO, logger="test-tls"), pytest.raises(ssl.SSLError):
        stream.recv(65536)
    assert front.refusals == 1
    assert "Error accepting a client connection" in caplog.text
    assert "(addr=127.0.0.1:5000)" in caplog.text
    other = TlsStream(socket.socket(), front, "127.0.0.1:5001")
    front.refused(other, "again", logging.WARNING)  # same host within LOG_EVERY_S
    assert caplog.text.count("Error accepting") == 1
    other.close()


def test_sweep_closes_handshakes_older_than_the_timeout(
        pair: tuple[TlsFront, TlsStream, Client]) -> None:
    front, stream, _ = pair
    closed: list[bool] = []

    class Conn:
        sock = stream

        def close(self) -> None:
            closed.append(True)

    front.started(stream, Conn())  # type: ignore[arg-type]
    assert front.sweep() == 0 and not closed
    front.clock.now += HANDSHAKE_TIMEOUT_S + 1  # type: ignore[attr-defined]
    assert front.sweep() == 1 and closed == [True]


def test_context_errors_name_the_file(certs: CertSet, tmp_path: Path) -> None:
    with pytest.raises(TlsConfigError, match="No tls-cert-file configured"):
        build_context(config(certs, tls_cert_file=""))
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(TlsConfigError, match=f"Failed to load certificate: {bad}"):
        build_context(config(certs, tls_cert_file=str(bad)))
    with pytest.raises(TlsConfigError, match=f"Failed to load private key: {bad}"):
        build_context(config(certs, tls_key_file=str(bad)))
    with pytest.raises(TlsConfigError, match="Failed to configure CA certificate"):
        build_context(config(certs, tls_ca_cert_file=str(bad)))
    with pytest.raises(TlsConfigError, match="Failed to configure ciphersuites"):
        build_context(config(certs, tls_ciphersuites="NOPE"))
    assert build_context(config(certs, tls_protocols="TLSv1.2")).maximum_version \
        == ssl.TLSVersion.TLSv1_2


def test_an_encrypted_key_needs_its_passphrase(certs: CertSet, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(certs.nodes[0][1].read_bytes(), password=None)
    locked = tmp_path / "locked.key"
    locked.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                         serialization.PrivateFormat.PKCS8,
                                         serialization.BestAvailableEncryption(b"sesame")))
    build_context(config(certs, tls_key_file=str(locked), tls_key_file_pass="sesame"))
    with pytest.raises(TlsConfigError, match=f"Failed to load private key: {locked}"):
        build_context(config(certs, tls_key_file=str(locked), tls_key_file_pass="wrong"))
    # None given: an error, never OpenSSL's prompt on the terminal (stdin would hang here).
    with pytest.raises(TlsConfigError, match=f"Failed to load private key: {locked}"):
        build_context(config(certs, tls_key_file=str(locked)))


def test_connections_keep_their_record_buffers(certs: CertSet) -> None:
    import ctypes

    from node.tls import _SSL_MODE_RELEASE_BUFFERS, _openssl

    ctrl, handle = _openssl(build_context(config(certs)), "SSL_CTX_ctrl")
    ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
    ctrl.restype = ctypes.c_long
    mode = ctrl(handle, 33, 0, None)  # SSL_CTRL_MODE: read the mode
    assert mode and not mode & _SSL_MODE_RELEASE_BUFFERS
