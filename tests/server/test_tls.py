"""TLS on the client port with real processes and real handshakes: redis-cli and redis-py,
mutual TLS, a plaintext client on the TLS port, CONFIG SET reloads, start-up errors, a
TLS-only node, and garbage at the TLS port."""

from __future__ import annotations

import os
import random
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from cli.certs import CertSet
from protocol.resp import encode_command
from tests.support.certs import client_context, make_certs
from tests.support.server import ServerProcess, free_port, repo_env

REDIS_CLI = shutil.which("redis-cli")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return make_certs(tmp_path_factory.mktemp("certs"), nodes=2)


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    """An unrelated CA, its node and client certificates."""
    return make_certs(tmp_path_factory.mktemp("other"), nodes=1, organization="elsewhere")


def tls_directives(certs: CertSet, node: int = 0, **more: Any) -> dict[str, Any]:
    cert, key = certs.nodes[node]
    return {"tls_port": free_port(), "tls_cert_file": cert, "tls_key_file": key,
            "tls_ca_cert_file": certs.ca_cert, **more}


@pytest.fixture
def node(certs: CertSet) -> Iterator[ServerProcess]:
    with ServerProcess(**tls_directives(certs)) as server:
        yield server


def tls_port(server: ServerProcess) -> int:
    return int(server.directives["tls-port"])


def tls_redis(server: ServerProcess, certs: CertSet, with_cert: bool = True,
              **options: Any) -> redis.Redis:
    client_cert = certs.client if with_cert else None
    return redis.Redis(port=tls_port(server), ssl=True, ssl_ca_certs=str(certs.ca_cert),
                       ssl_certfile=str(client_cert[0]) if client_cert else None,
                       ssl_keyfile=str(client_cert[1]) if client_cert else None,
                       socket_timeout=10, **options)


def handshake(port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    return context.wrap_socket(raw, server_hostname="localhost")


def tls_call(port: int, context: ssl.SSLContext, *args: str) -> bytes:
    """One command over a fresh TLS connection; the raw reply."""
    with handshake(port, context) as s:
        s.sendall(encode_command(*args))
        return s.recv(65536)


@pytest.mark.skipif(REDIS_CLI is None, reason="redis-cli is not installed")
def test_redis_cli_over_tls_and_plaintext_side_by_side(node: ServerProcess,
                                                       certs: CertSet) -> None:
    assert REDIS_CLI is not None
    cli = [REDIS_CLI, "-p", str(tls_port(node)), "--tls", "--cacert", str(certs.ca_cert),
           "--cert", str(certs.client[0]), "--key", str(certs.client[1])]  # type: ignore[index]
    added = subprocess.run(cli + ["ADDJOB", "q", "over tls", "0"], capture_output=True,
                           text=True, timeout=30, check=True).stdout.strip()
    assert added.startswith("D-")
    job = node.call("GETJOB", "NOHANG", "FROM", "q")  # the plaintext port, same node
    assert job == [[b"q", added.encode(), b"over tls"]]
    # No client certificate under tls-auth-clients yes: refused, and the node says why.
    refused = subprocess.run([REDIS_CLI, "-p", str(tls_port(node)), "--tls", "--cacert",
                              str(certs.ca_cert), "PING"], capture_output=True, text=True,
                             timeout=30)
    assert "PONG" not in refused.stdout
    assert node.call("PING") == b"PONG"
    deadline = time.monotonic() + 5
    while "peer did not return a certificate" not in node.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "Error accepting a client connection: peer did not return a certificate" in node.log()


def test_redis_py_ssl_and_mutual_tls(node: ServerProcess, certs: CertSet,
                                     other_certs: CertSet) -> None:
    r = tls_redis(node, certs)
    assert r.ping() is True
    job_id = r.execute_command("ADDJOB", "q", b"\x00" * 100_000, 0)
    [[_, got, body]] = r.execute_command("GETJOB", "FROM", "q")
    assert got == job_id and body == b"\x00" * 100_000
    with pytest.raises(redis.ConnectionError):
        tls_redis(node, certs, with_cert=False).ping()
    # A client certificate from another CA is refused too.
    stranger = redis.Redis(port=tls_port(node), ssl=True, ssl_ca_certs=str(certs.ca_cert),
                           ssl_certfile=str(other_certs.client[0]),  # type: ignore[index]
                           ssl_keyfile=str(other_certs.client[1]),  # type: ignore[index]
                           socket_timeout=10)
    with pytest.raises(redis.ConnectionError):
        stranger.ping()
    # The client checks the node: a client trusting another CA refuses the node's certificate.
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=tls_port(node), ssl=True, ssl_ca_certs=str(other_certs.ca_cert),
                    socket_timeout=10).ping()
    assert r.ping() is True  # the first client was not disturbed
    r.close()


def test_optional_and_no_client_authentication(certs: CertSet, other_certs: CertSet) -> None:
    with ServerProcess(**tls_directives(certs, tls_auth_clients="optional")) as server:
        assert tls_redis(server, certs, with_cert=False).ping() is True
        assert tls_redis(server, certs).ping() is True
        with pytest.raises(redis.ConnectionError):  # one presented must be valid
            redis.Redis(port=tls_port(server), ssl=True, ssl_ca_certs=str(certs.ca_cert),
                        ssl_certfile=str(other_certs.client[0]),  # type: ignore[index]
                        ssl_keyfile=str(other_certs.client[1]),  # type: ignore[index]
                        socket_timeout=10).ping()
    directives = tls_directives(certs, tls_auth_clients="no")
    del directives["tls_ca_cert_file"]  # not needed when no client certificate is asked for
    with ServerProcess(**directives) as server:
        assert tls_redis(server, certs, with_cert=False).ping() is True


def test_plaintext_client_on_the_tls_port_is_dropped_and_logged_once(
        node: ServerProcess, certs: CertSet) -> None:
    r = tls_redis(node, certs)
    assert r.ping() is True
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", tls_port(node)), timeout=10) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            # The node closes it; whatever an alert says, never a RESP reply.
            data = b""
            try:
                while chunk := s.recv(100):
                    data += chunk
            except ConnectionResetError:
                pass
            assert b"PONG" not in data
    assert r.ping() is True
    assert node.call("PING") == b"PONG"
    lines = [line for line in node.log().splitlines()
             if "Error accepting a client connection" in line]
    assert len(lines) == 1, lines  # once per address (and LOG_EVERY_S), not per attempt
    assert "wrong version number" in lines[0] or "http request" in lines[0]
    r.close()


def test_config_set_reloads_for_new_connections_and_refuses_bad_files(
        certs: CertSet, other_certs: CertSet, tmp_path: Path) -> None:
    cert, key = tmp_path / "node.crt", tmp_path / "node.key"
    shutil.copy(certs.nodes[0][0], cert)
    shutil.copy(certs.nodes[0][1], key)
    directives = tls_directives(certs, tls_cert_file=cert, tls_key_file=key,
                                tls_auth_clients="no")
    with ServerProcess(**directives) as server:
        port = tls_port(server)
        ours = client_context(certs, with_cert=False)
        theirs = client_context(other_certs, with_cert=False)
        kept = handshake(port, ours)
        # A key that does not match the certificate: an error naming it, the old context stays.
        reply = server.call("CONFIG", "SET", "tls-key-file", str(other_certs.nodes[0][1]))
        assert "Failed to load private key" in str(reply)
        assert str(other_certs.nodes[0][1]) in str(reply)
        assert server.call("CONFIG", "GET", "tls-key-file") == [b"tls-key-file",
                                                                 str(key).encode()]
        missing = server.call("CONFIG", "SET", "tls-cert-file", str(tmp_path / "nope.crt"))
        assert "nope.crt" in str(missing) and "No such file" in str(missing)
        assert tls_call(port, ours, "PING") == b"+PONG\r\n"
        # Rotation: replace the files, CONFIG SET to the same path.
        shutil.copy(other_certs.nodes[0][0], cert)
        shutil.copy(other_certs.nodes[0][1], key)
        assert server.call("CONFIG", "SET", "tls-cert-file", str(cert)) == b"OK"
        assert tls_call(port, theirs, "PING") == b"+PONG\r\n"
        with pytest.raises(ssl.SSLCertVerificationError):
            tls_call(port, ours, "PING")
        # The connection opened before goes on with the certificate it had.
        kept.sendall(b"*1\r\n$4\r\nPING\r\n")
        assert kept.recv(100) == b"+PONG\r\n"
        kept.close()
        # tls-auth-clients yes needs a CA: refused without one.
        assert server.call("CONFIG", "SET", "tls-ca-cert-file", "") == b"OK"
        refused = server.call("CONFIG", "SET", "tls-auth-clients", "yes")
        assert "tls-ca-cert-file or tls-ca-cert-dir" in str(refused)
        assert server.call("CONFIG", "GET", "tls-auth-clients") == [b"tls-auth-clients", b"no"]
        assert server.call("CONFIG", "GET", "tls-key-file-pass") == [b"tls-key-file-pass", b""]


def test_protocols_ciphers_and_ciphersuites(certs: CertSet) -> None:
    directives = tls_directives(certs, tls_auth_clients="no", tls_protocols="TLSv1.3",
                                tls_ciphersuites="TLS_CHACHA20_POLY1305_SHA256")
    with ServerProcess(**directives) as server:
        context = client_context(certs, with_cert=False)
        with handshake(tls_port(server), context) as s:
            assert s.version() == "TLSv1.3"
            assert s.cipher()[0] == "TLS_CHACHA20_POLY1305_SHA256"  # type: ignore[index]
        only12 = client_context(certs, with_cert=False)
        only12.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(ssl.SSLError):
            handshake(tls_port(server), only12)
        assert server.call("CONFIG", "SET", "tls-protocols", "TLSv1.2") == b"OK"
        assert server.call("CONFIG", "SET", "tls-ciphers", "ECDHE-ECDSA-AES128-GCM-SHA256") \
            == b"OK"
        with handshake(tls_port(server), context) as s:
            assert s.version() == "TLSv1.2"
            assert s.cipher()[0] == "ECDHE-ECDSA-AES128-GCM-SHA256"  # type: ignore[index]
        bad = server.call("CONFIG", "SET", "tls-protocols", "SSLv3")
        assert "Invalid tls-protocols" in str(bad)
        assert "Failed to configure ciphers" in str(
            server.call("CONFIG", "SET", "tls-ciphers", "NOT-A-CIPHER"))
        assert server.call("CONFIG", "GET", "tls-ciphers")[1] == b"ECDHE-ECDSA-AES128-GCM-SHA256"


def _start_error(port: int | None = None, **directives: Any) -> str:
    server = ServerProcess(**directives)
    if port is not None:
        server.port = port
    proc = subprocess.run(server.argv(), cwd=Path(__file__).resolve().parents[2],
                          env=repo_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    return proc.stderr


def test_start_refuses_missing_or_mismatched_files(certs: CertSet, other_certs: CertSet,
                                                   tmp_path: Path) -> None:
    missing = _start_error(**tls_directives(certs, tls_cert_file=tmp_path / "gone.crt"))
    assert f"Failed to load certificate: {tmp_path / 'gone.crt'}" in missing
    mismatched = _start_error(**tls_directives(certs, tls_key_file=other_certs.nodes[0][1]))
    assert f"Failed to load private key: {other_certs.nodes[0][1]}" in mismatched
    assert "key values mismatch" in mismatched
    no_ca = tls_directives(certs)
    del no_ca["tls_ca_cert_file"]
    assert "tls-ca-cert-file or tls-ca-cert-dir" in _start_error(**no_ca)
    assert "port 0 needs tls-port" in _start_error(port=0)


def test_a_tls_only_node_serves_and_its_bus_follows_tls_port(certs: CertSet) -> None:
    directives = tls_directives(certs)
    port = directives["tls_port"]
    server = ServerProcess(**directives)
    server.port = 0  # --port 0: no plaintext port; readiness is checked over TLS below
    server.start(wait=False)
    try:
        context = client_context(certs)
        deadline = time.monotonic() + 30
        while True:
            try:
                reply = tls_call(port, context, "HELLO")
                break
            except OSError:
                assert time.monotonic() < deadline, server.log()
                time.sleep(0.1)
        assert f"\r\n{port}\r\n".encode() in reply  # HELLO gives the TLS port as the node's
        with socket.create_connection(("127.0.0.1", port + 10000), timeout=5):
            pass  # the cluster bus listens on tls-port + 10000
    finally:
        server.stop()


def test_garbage_and_truncated_handshakes_leave_the_node_whole(
        node: ServerProcess, certs: CertSet) -> None:
    port = tls_port(node)
    rng = random.Random(7)
    # A real ClientHello to cut short at random places.
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    hello_obj = client_context(certs).wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        hello_obj.do_handshake()
    hello = outgoing.read()
    r = tls_redis(node, certs)
    stalled = []
    for i in range(60):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i % 3 == 0:
            s.sendall(os.urandom(rng.randint(1, 4096)))
        elif i % 3 == 1:
            s.sendall(hello[:rng.randint(1, len(hello) - 1)])
        else:
            s.sendall(hello[:5] + os.urandom(rng.randint(1, 600)))
        if i % 10 == 0:
            stalled.append(s)  # left open mid-handshake
        else:
            s.close()
        if i % 20 == 0:
            assert r.ping() is True
    assert r.ping() is True
    assert tls_call(port, client_context(certs), "PING") == b"+PONG\r\n"
    assert node.call("PING") == b"PONG"
    assert "Unexpected error" not in node.log()
    for s in stalled:
        s.close()
    r.close()


def test_a_stalled_handshake_is_closed_by_the_idle_timeout(certs: CertSet) -> None:
    with ServerProcess(**tls_directives(certs, timeout=1)) as server:
        with socket.create_connection(("127.0.0.1", tls_port(server)), timeout=10) as s:
            s.sendall(b"\x16\x03\x01")  # a record header, then nothing
            started = time.monotonic()
            assert s.recv(100) == b""  # closed by the node
            assert time.monotonic() - started < 8
