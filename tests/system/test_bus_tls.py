"""``tls-cluster yes`` with real ``trisque-server`` processes and real handshakes.

Three nodes with certificates from one CA meet, replicate and federate over mutual TLS; a
node whose certificate another CA signed never joins, a raw TLS connection with such a
certificate and a plaintext connection carrying a well-formed MEET are both refused before a
frame is read; a restarted node rejoins. Select them with ``-m cluster_processes``.
"""

from __future__ import annotations

import random
import shutil
import socket
import ssl
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cli.certs import CertSet
from cluster.messages import Meet
from cluster.wire import MessageType, encode_parts
from protocol.resp import Error
from tests.e2e.test_startup import run_server
from tests.support.certs import make_certs
from tests.support.cluster import LocalCluster, wait_until
from tests.support.server import ServerProcess, free_port, pipelined
from tests.system.test_big_jobs import ADDJOB_TIMEOUT_MS, MB, body_of, call, show_body

pytestmark = pytest.mark.cluster_processes

Factory = Callable[..., LocalCluster]
JOIN_WITHIN_S = 20.0
FAKE_ID = "f" * 40


def tls_directives(certs: CertSet, index: int, ca: Path | None = None) -> dict[str, Any]:
    cert, key = certs.nodes[index]
    return {"tls-cluster": "yes", "tls-cert-file": str(cert), "tls-key-file": str(key),
            "tls-ca-cert-file": str(ca or certs.ca_cert)}


def tls_cluster(local_cluster: Factory, certs: CertSet, n: int = 3) -> tuple[LocalCluster,
                                                                             list[str]]:
    c = local_cluster(n, directives=[tls_directives(certs, i) for i in range(n)])
    ids = [c.myid(i) for i in range(n)]
    for i in range(1, n):
        c.meet(i, 0)
    wait_until(lambda: c.mesh_ok(list(range(n)), ids), JOIN_WITHIN_S, f"a TLS mesh of {n}")
    return c, ids


def holders(c: LocalCluster, i: int, job_id: str) -> set[str]:
    reply = c.call(i, "SHOW", job_id)
    if reply is None:
        return set()
    fields = {reply[k].decode(): reply[k + 1] for k in range(0, len(reply), 2)}
    return {n.decode() for n in fields["nodes-delivered"]}


def test_three_tls_nodes_meet_replicate_federate_and_rejoin(local_cluster: Factory,
                                                              tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs", nodes=3)
    c, ids = tls_cluster(local_cluster, certs)
    job = c.call(0, "ADDJOB", "q", "over tls", "0", "REPLICATE", "3").decode()
    for i in range(3):  # every node holds a copy, and knows every holder
        wait_until(lambda i=i: holders(c, i, job) == set(ids), 10, f"node{i} holds the job")
    # Federation: a consumer on node 1 gets the job queued on node 0.
    got = c.call(1, "GETJOB", "TIMEOUT", "10000", "FROM", "q")
    assert got is not None and got[0][1].decode() == job and got[0][2] == b"over tls", got

    c.restart(2)
    wait_until(lambda: c.mesh_ok([0, 1, 2], ids), JOIN_WITHIN_S, "node2 back in the mesh")
    again = c.call(2, "ADDJOB", "q2", "after restart", "0", "REPLICATE", "3").decode()
    wait_until(lambda: holders(c, 0, again) == set(ids), 10, "a job from node2 replicated")
    for i in range(3):
        log = c.nodes[i].log()
        assert "TLS handshake failed" not in log and "no TLS link" not in log, log


def test_a_node_from_another_ca_never_joins(local_cluster: Factory, tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs", nodes=3)
    foreign = make_certs(tmp_path / "foreign", nodes=1, organization="intruder")
    c, ids = tls_cluster(local_cluster, certs, n=3)
    # The intruder trusts the cluster's CA, so only the cluster's own checks stop it.
    intruder = ServerProcess(directory=str(tmp_path / "intruder"), cluster_node_timeout=1000,
                             **tls_directives(foreign, 0, ca=certs.ca_cert))
    (tmp_path / "intruder").mkdir()
    with intruder:
        assert intruder.call("CLUSTER", "MEET", "127.0.0.1", str(c.port(0))) == b"OK"
        assert c.call(1, "CLUSTER", "MEET", "127.0.0.1", str(intruder.port)) == b"OK"
        intruder_id = intruder.call("CLUSTER", "MYID").decode()
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            for i in range(3):
                table = c.nodes_of(i)
                assert intruder_id not in table, table
                # Node 1's MEET shows its target in handshake (a temporary ID) until it
                # expires: never linked, never the intruder's own ID.
                for node_id, line in table.items():
                    assert node_id in ids or (line.flags == {"handshake"}
                                              and line.link == "disconnected"), table
            assert set(intruder.call("CLUSTER", "NODES").decode().split()) & set(ids) == set()
            time.sleep(0.2)
        wait_until(lambda: set(c.nodes_of(1)) == set(ids), 10, "node1's handshake expires")
        wait_until(lambda: "refusing a link from 127.0.0.1: TLS handshake failed"
                   in c.nodes[0].log(), 10, "node0 logs the refused handshake")
        wait_until(lambda: "no TLS link to 127.0.0.1" in c.nodes[1].log(), 10,
                   "node1 logs that the intruder's certificate is refused")
        assert c.mesh_ok([0, 1, 2], ids)


def test_frames_without_a_valid_certificate_are_never_read(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs", nodes=1)
    foreign = make_certs(tmp_path / "foreign", nodes=1, organization="intruder")
    (tmp_path / "node").mkdir()
    node = ServerProcess(directory=str(tmp_path / "node"), http_port=free_port(),
                         **tls_directives(certs, 0))
    bus = ("127.0.0.1", node.port + 10000)
    meet = b"".join(encode_parts(MessageType.MEET, FAKE_ID,
                                 Meet(port=node.port + 1, flags=frozenset()).to_body()))
    with node:
        # Plaintext: a well-formed MEET is not a TLS ClientHello.
        with socket.create_connection(bus, timeout=5) as plain:
            plain.sendall(meet)
            assert _closed(plain), "the plaintext connection stays open"
        # TLS with a certificate the node's CA did not sign.
        wrong = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        wrong.check_hostname = False
        wrong.load_verify_locations(str(certs.ca_cert))
        wrong.load_cert_chain(str(foreign.nodes[0][0]), str(foreign.nodes[0][1]))
        with socket.create_connection(bus, timeout=5) as raw:
            try:
                with wrong.wrap_socket(raw) as tls:
                    tls.sendall(meet)  # TLS 1.3: the server's refusal arrives after this
                    assert _closed(tls), "the TLS connection with a foreign cert stays open"
            except (ssl.SSLError, ConnectionError):
                pass  # refused during the handshake itself
        # And without any certificate.
        anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        anonymous.check_hostname = False
        anonymous.load_verify_locations(str(certs.ca_cert))
        with socket.create_connection(bus, timeout=5) as raw:
            try:
                with anonymous.wrap_socket(raw) as tls:
                    tls.sendall(meet)
                    assert _closed(tls), "the TLS connection without a cert stays open"
            except (ssl.SSLError, ConnectionError):
                pass
        wait_until(lambda: "TLS handshake failed" in node.log(), 10, "the refusal is logged")
        wait_until(lambda: metric(node, "trisque_bus_links_refused_tls_total") == 3, 10,
                   "three refusals counted")
        info = dict(line.split(":", 1) for line in
                    node.call("CLUSTER", "INFO").decode().split("\r\n") if ":" in line)
        assert info["cluster_stats_messages_received"] == "0", info
        assert info["cluster_known_nodes"] == "1", info
        assert FAKE_ID not in node.call("CLUSTER", "NODES").decode()


def metric(node: ServerProcess, name: str) -> float:
    url = f"http://127.0.0.1:{node.directives['http-port']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def _closed(sock: socket.socket) -> bool:
    """Whether the peer closes ``sock`` (EOF or reset) within a few seconds."""
    sock.settimeout(5)
    try:
        while True:
            if not sock.recv(4096):
                return True
    except (ConnectionError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


def test_a_certificate_that_cannot_be_used_stops_the_start(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs", nodes=2)
    settings = tls_directives(certs, 0)
    missing = dict(settings, **{"tls-cert-file": str(tmp_path / "nowhere.crt")})
    mismatched = dict(settings, **{"tls-key-file": str(certs.nodes[1][1])})
    no_ca = {k: v for k, v in settings.items() if k != "tls-ca-cert-file"}
    for directives, expect in ((missing, "nowhere.crt"), (mismatched, str(certs.nodes[1][1])),
                               (no_ca, "tls-ca-cert-file")):
        argv = ["--port", str(free_port()), "--bind", "127.0.0.1", "--dir", str(tmp_path)]
        for name, value in directives.items():
            argv += [f"--{name}", value]
        proc = run_server(*argv)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert expect in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # no traceback


def test_certificates_rotate_to_a_new_ca_without_a_split(local_cluster: Factory,
                                                         tmp_path: Path) -> None:
    """docs/security.md's rotation: both CAs trusted, new certificates, the old CA dropped;
    CONFIG SET of a file (the same path) reloads it, and the links up go on meanwhile."""
    old = make_certs(tmp_path / "old", nodes=2)
    new = make_certs(tmp_path / "new", nodes=2, organization="renewed")
    live = tmp_path / "live"
    live.mkdir()
    for i in range(2):  # the paths each node's directives name
        shutil.copy(old.nodes[i][0], live / f"node-{i}.crt")
        shutil.copy(old.nodes[i][1], live / f"node-{i}.key")
        shutil.copy(old.ca_cert, live / f"ca-{i}.crt")
    directives = [{"tls-cluster": "yes", "tls-cert-file": str(live / f"node-{i}.crt"),
                   "tls-key-file": str(live / f"node-{i}.key"),
                   "tls-ca-cert-file": str(live / f"ca-{i}.crt")} for i in range(2)]
    c = local_cluster(2, directives=directives)
    ids = [c.myid(i) for i in range(2)]
    c.meet(1, 0)
    wait_until(lambda: c.mesh_ok([0, 1], ids), JOIN_WITHIN_S, "a TLS mesh of 2")

    bad = c.call(0, "CONFIG", "SET", "tls-cert-file", str(tmp_path / "nowhere.crt"))
    assert isinstance(bad, Error) and "nowhere.crt" in str(bad), bad
    assert c.call(0, "CONFIG", "GET", "tls-cert-file")[1] == str(live / "node-0.crt").encode()
    assert c.call(0, "CONFIG", "GET", "tls-key-file-pass") == [b"tls-key-file-pass", b""]
    # A passphrase is never shown (the key is not encrypted: OpenSSL ignores it).
    assert c.call(0, "CONFIG", "SET", "tls-key-file-pass", "p4ss") == b"OK"
    assert c.call(0, "CONFIG", "GET", "tls-key-file-pass") == [b"tls-key-file-pass",
                                                               b"(hidden)"]
    # tls-cluster is read at start: switching it on one node would split the cluster.
    refused = c.call(0, "CONFIG", "SET", "tls-cluster", "no")
    assert isinstance(refused, Error) and "Unsupported CONFIG parameter" in str(refused)

    def rotate(i: int, cas: list[Path]) -> None:
        (live / f"ca-{i}.crt").write_bytes(b"".join(p.read_bytes() for p in cas))
        shutil.copy(new.nodes[i][0], live / f"node-{i}.crt")
        shutil.copy(new.nodes[i][1], live / f"node-{i}.key")

    # Node 0 trusts both CAs and shows its new certificate from now on.
    rotate(0, [old.ca_cert, new.ca_cert])
    assert c.call(0, "CONFIG", "SET", "tls-cert-file", str(live / "node-0.crt")) == b"OK"
    assert "TLS configuration reloaded" in c.nodes[0].log()
    assert c.mesh_ok([0, 1], ids)  # the links up go on with their session
    # Node 1, restarted before it trusts the new CA, refuses node 0's new certificate.
    c.restart(1)
    wait_until(lambda: "no TLS link" in c.nodes[1].log(), 10, "node1 refuses node0's cert")
    # Its turn: both CAs, its new certificate, restarted; then the old CA goes.
    c.kill(1)
    rotate(1, [old.ca_cert, new.ca_cert])
    c.restart(1)
    wait_until(lambda: c.mesh_ok([0, 1], ids), JOIN_WITHIN_S, "the mesh on new certificates")
    for i in range(2):
        (live / f"ca-{i}.crt").write_bytes(new.ca_cert.read_bytes())
        assert c.call(i, "CONFIG", "SET", "tls-ca-cert-file", str(live / f"ca-{i}.crt")) \
            == b"OK"
    c.restart(1)
    wait_until(lambda: c.mesh_ok([0, 1], ids), JOIN_WITHIN_S, "the mesh on the new CA alone")


def test_a_big_job_crosses_a_tls_bus_with_a_secret_too(local_cluster: Factory,
                                                      tmp_path: Path) -> None:
    """A 17 MB body: the writer's path (records made a chunk at a time, the MAC computed as
    written) and the reader's big reads, both under TLS; pipelined small jobs around it."""
    certs = make_certs(tmp_path / "certs", nodes=2)
    directives = [dict(tls_directives(certs, i), **{"cluster-secret": "s3cret"})
                  for i in range(2)]
    c = local_cluster(2, directives=directives)
    ids = [c.myid(i) for i in range(2)]
    c.meet(1, 0)
    wait_until(lambda: c.mesh_ok([0, 1], ids), JOIN_WITHIN_S, "a mesh of 2")
    body = body_of(17 * MB, b"tls-17-")
    reply = call(c, 0, "ADDJOB", "bigq", body, str(ADDJOB_TIMEOUT_MS), "REPLICATE", "2")
    assert isinstance(reply, bytes) and reply.startswith(b"D-"), reply
    assert show_body(c, 1, reply) == body
    small = pipelined(c.port(0), [("ADDJOB", "smallq", f"job {i}", "0", "REPLICATE", "2")
                                  for i in range(500)])
    assert all(isinstance(r, bytes) and r.startswith(b"D-") for r in small), small[:3]
    for i in range(2):
        log = c.nodes[i].log()
        assert "TLS error" not in log and "MAC" not in log, log


def test_outbound_links_present_tls_client_cert_file(local_cluster: Factory,
                                                     tmp_path: Path) -> None:
    """``tls-client-cert-file``/``tls-client-key-file``: the certificate a node's own links
    present. Node 1's is the CA's client certificate (the mesh forms), then another CA's:
    node 0 then refuses node 1's new links, while node 1's server certificate is unchanged."""
    certs = make_certs(tmp_path / "certs", nodes=2)
    foreign = make_certs(tmp_path / "foreign", nodes=1, organization="intruder")
    assert certs.client is not None and foreign.client is not None
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(certs.client[0], live / "client.crt")
    shutil.copy(certs.client[1], live / "client.key")
    directives = [tls_directives(certs, 0),
                  dict(tls_directives(certs, 1),
                       **{"tls-client-cert-file": str(live / "client.crt"),
                          "tls-client-key-file": str(live / "client.key")})]
    c = local_cluster(2, directives=directives)
    ids = [c.myid(i) for i in range(2)]
    c.meet(1, 0)
    wait_until(lambda: c.mesh_ok([0, 1], ids), JOIN_WITHIN_S, "a mesh of 2")
    assert "TLS handshake failed" not in c.nodes[0].log()
    shutil.copy(foreign.client[0], live / "client.crt")
    shutil.copy(foreign.client[1], live / "client.key")
    assert c.call(1, "CONFIG", "SET", "tls-client-cert-file", str(live / "client.crt")) \
        == b"OK"
    c.restart(0)  # node 1's links to it are new ones
    wait_until(lambda: "refusing a link from 127.0.0.1: TLS handshake failed"
               in c.nodes[0].log(), 10, "node0 refuses node1's foreign client certificate")


def test_garbage_and_cut_handshakes_leave_a_tls_cluster_whole(local_cluster: Factory,
                                                              tmp_path: Path) -> None:
    """Random bytes, and real ClientHellos cut anywhere, at a TLS bus port: each is refused
    alone, the node answers and its links stay up."""
    certs = make_certs(tmp_path / "certs", nodes=2)
    c, ids = tls_cluster(local_cluster, certs, n=2)
    rng = random.Random(7)
    hello_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    hello_ctx.check_hostname = False
    hello_ctx.verify_mode = ssl.CERT_NONE
    bus = ("127.0.0.1", c.port(0) + 10000)
    for i in range(60):
        if i % 2:
            payload = rng.randbytes(rng.randint(1, 4096))
        else:
            obj = hello_ctx.wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO())
            try:
                obj.do_handshake()
            except ssl.SSLWantReadError:
                pass
            hello = outgoing.read()
            payload = hello[:rng.randint(1, len(hello) - 1)]
        with socket.create_connection(bus, timeout=5) as sock:
            sock.sendall(payload)
            if i % 3 == 0:
                _closed(sock)  # some wait for the refusal, the others hang up at once
    assert c.call(0, "PING") == b"PONG"
    assert c.mesh_ok([0, 1], ids)
    info = c.info(0)
    assert info["cluster_known_nodes"] == "2", info
