"""Protected mode against a real non-loopback address: a network namespace made for the test
(a veth pair on a private range that exists only inside it), removed afterwards."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.certs import make_certs
from tests.support.server import ServerProcess

NS = f"trisque-pm-{os.getpid()}"
HOST_IP, NS_IP = "10.213.77.1", "10.213.77.2"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def namespace() -> Iterator[str]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("this test needs root and iproute2 to make a network namespace")
    veth = f"tpm{os.getpid() % 100000}"
    _ip("netns", "add", NS)
    try:
        _ip("link", "add", veth, "type", "veth", "peer", "name", veth + "n")
        _ip("link", "set", veth + "n", "netns", NS)
        _ip("addr", "add", HOST_IP + "/30", "dev", veth)
        _ip("link", "set", veth, "up")
        _ip("netns", "exec", NS, "ip", "addr", "add", NS_IP + "/30", "dev", veth + "n")
        _ip("netns", "exec", NS, "ip", "link", "set", veth + "n", "up")
        yield NS
    finally:
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)


def _from_namespace(port: int, *args: str) -> str:
    """One command sent from inside the namespace: the reply's first line."""
    code = ("import socket,sys; s=socket.create_connection((sys.argv[1], int(sys.argv[2])), 5);"
            "s.sendall(sys.argv[3].encode()+b'\\r\\n'); print(s.recv(4096).decode().split('\\r\\n')[0])")
    out = subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-c", code, HOST_IP,
                          str(port), " ".join(args)], capture_output=True, text=True, timeout=20)
    return out.stdout.strip() or out.stderr.strip()


def test_protected_mode_denies_other_hosts_until_a_password_is_set(namespace: str) -> None:
    with ServerProcess(bind="0.0.0.0") as node:
        assert _from_namespace(node.port, "PING").startswith("-DENIED trisque is running in "
                                                            "protected mode")
        local = redis.Redis(port=node.port)
        assert local.ping()  # loopback: answered
        with pytest.raises(redis.ResponseError, match="protected mode.*cluster-secret"):
            local.execute_command("CLUSTER", "MEET", NS_IP, "7711")
        local.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all")
        assert _from_namespace(node.port, "AUTH", "app", "pw") == "+OK"
        local.execute_command("ACL", "DELUSER", "app")
        assert _from_namespace(node.port, "PING").startswith("-DENIED")
        local.execute_command("CONFIG", "SET", "protected-mode", "no")
        assert _from_namespace(node.port, "PING") == "+PONG"


def test_protected_mode_bus_refuses_a_remote_peer_without_cluster_secret(namespace: str) -> None:
    with ServerProcess(bind="0.0.0.0") as node:
        bus = node.port + 10000
        reply = _from_namespace(bus, "hello")
        assert reply == "" or "refused" in reply.lower() or "reset" in reply.lower(), reply
        assert "refusing a link from " + NS_IP in node.log()


def test_protected_mode_lets_tls_cluster_authenticate_remote_peers(namespace: str,
                                                                   tmp_path: Path) -> None:
    """``tls-cluster yes`` counts as ``cluster-secret``: the remote peer reaches the TLS
    handshake (and fails it, having no certificate) instead of being refused for its
    address, and CLUSTER MEET to a remote address is accepted."""
    certs = make_certs(tmp_path / "certs", nodes=1)
    cert, key = certs.nodes[0]
    with ServerProcess(bind="0.0.0.0", tls_cluster="yes", tls_cert_file=str(cert),
                       tls_key_file=str(key), tls_ca_cert_file=str(certs.ca_cert)) as node:
        _from_namespace(node.port + 10000, "hello")
        log = node.log()
        assert "refusing a link from " + NS_IP + ": TLS handshake failed" in log, log
        assert "protected mode" not in log, log
        local = redis.Redis(port=node.port)
        assert local.execute_command("CLUSTER", "MEET", NS_IP, "7711") == b"OK"
