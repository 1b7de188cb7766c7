"""``trisque certs``: the files it writes make real TLS handshakes succeed where they should
and fail where they should (another CA, a wrong name, no client certificate)."""

from __future__ import annotations

import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cli.certs import generate
from tests.support.certs import client_context, make_certs


def _handshake(client: ssl.SSLContext, server: ssl.SSLContext, hostname: str) -> None:
    """A full handshake in memory; raises ``ssl.SSLError`` when either side refuses."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname=hostname)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(20):
        for name, side in (("c", c), ("s", s)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            # TLS 1.3: the server checks the client's certificate after its own finish; a
            # round of application data brings a refusal to the client side.
            c.write(b"PING")
            s_in.write(c_out.read())
            assert s.read(4) == b"PING"
            return
    raise AssertionError("handshake did not finish")


def _server(certs, node: int, require_client: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert, key = certs.nodes[node]
    context.load_cert_chain(str(cert), str(key))
    if require_client:
        context.load_verify_locations(str(certs.ca_cert))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def test_node_certificates_verify_by_address_and_name(tmp_path: Path) -> None:
    certs = make_certs(tmp_path, nodes=2)
    for node in range(2):
        for hostname in ("127.0.0.1", "localhost", f"node-{node + 1}", "::1"):
            _handshake(client_context(certs), _server(certs, node, True), hostname)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(client_context(certs), _server(certs, 0, False), "node-2")


def test_another_ca_and_a_missing_client_certificate_are_refused(tmp_path: Path) -> None:
    ours = make_certs(tmp_path / "ours", nodes=1)
    theirs = make_certs(tmp_path / "theirs", nodes=1, organization="intruder")
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(client_context(theirs), _server(ours, 0, False), "127.0.0.1")
    with pytest.raises(ssl.SSLError):
        _handshake(client_context(theirs), _server(ours, 0, True), "localhost")
    with pytest.raises(ssl.SSLError):
        _handshake(client_context(ours, with_cert=False), _server(ours, 0, True), "localhost")


def test_node_certificate_serves_as_a_client_certificate(tmp_path: Path) -> None:
    """A bus link presents the node's own certificate when it dials a peer."""
    certs = make_certs(tmp_path, nodes=2)
    dialer = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(certs.ca_cert))
    dialer.load_cert_chain(str(certs.nodes[1][0]), str(certs.nodes[1][1]))
    _handshake(dialer, _server(certs, 0, True), "node-1")


def test_command_writes_private_keys_and_never_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "tls"
    run = [sys.executable, "-m", "cli.main", "certs", str(target), "--nodes", "2",
           "--days", "3", "--host", "10.1.2.3", "--host", "db.example"]
    first = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert "node 2:" in first.stdout
    names = sorted(p.name for p in target.iterdir())
    assert names == ["ca.crt", "ca.key", "client.crt", "client.key", "node-1.crt",
                     "node-1.key", "node-2.crt", "node-2.key"]
    for key in target.glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    before = (target / "ca.key").read_bytes()
    second = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert second.returncode == 2
    assert "exists (use --force" in second.stderr
    assert (target / "ca.key").read_bytes() == before
    forced = subprocess.run([*run, "--force"], capture_output=True, text=True, timeout=60)
    assert forced.returncode == 0, forced.stderr
    assert (target / "ca.key").read_bytes() != before


def test_extra_hosts_are_in_every_node_certificate(tmp_path: Path) -> None:
    from cryptography import x509

    certs = generate(tmp_path, nodes=1, days=1, hosts=("10.1.2.3", "db.example"))
    cert = x509.load_pem_x509_certificate(certs.nodes[0][0].read_bytes())
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "db.example" in alt.get_values_for_type(x509.DNSName)
    assert "node-1" in alt.get_values_for_type(x509.DNSName)
    assert [str(a) for a in alt.get_values_for_type(x509.IPAddress)] == [
        "127.0.0.1", "::1", "10.1.2.3"]


def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "cli.main", "certs", str(tmp_path),
                             "--days", "0"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--days" in result.stderr
