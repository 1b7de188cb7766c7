"""``http-tls yes``: the HTTP API and the dashboard over HTTPS, with real handshakes.

The message routes this node answers itself (node/http_front.py) and the ones it hands to
hypercorn both work over TLS, on one kept-alive connection too; a client that does not trust
the CA, and a plain HTTP request to the HTTPS port, get nothing served; CONFIG SET reloads
the certificate for new connections.
"""

from __future__ import annotations

import shutil
import ssl
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from cli.certs import CertSet
from protocol.resp import Error
from tests.e2e.test_startup import run_server
from tests.http.conftest import wait_http
from tests.support.certs import make_certs
from tests.support.server import ServerProcess, free_port


def start_https(certs: CertSet, cert: Path, key: Path) -> tuple[ServerProcess, str]:
    port = free_port()
    srv = ServerProcess(http_port=port, http_tls="yes", tls_cert_file=str(cert),
                        tls_key_file=str(key)).start()
    base = f"https://127.0.0.1:{port}"
    wait_http(srv, base, trusting(certs))
    return srv, base


def trusting(certs: CertSet) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs.ca_cert))


@pytest.fixture(scope="module")
def https(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str,
                                                                      CertSet]]:
    base_dir = tmp_path_factory.mktemp("https")
    certs = make_certs(base_dir / "certs", nodes=1)
    live = base_dir / "live"
    live.mkdir()
    shutil.copy(certs.nodes[0][0], live / "node.crt")
    shutil.copy(certs.nodes[0][1], live / "node.key")
    srv, base = start_https(certs, live / "node.crt", live / "node.key")
    try:
        yield srv, base, certs
    finally:
        srv.stop()


def test_the_api_and_the_dashboard_answer_over_https(
        https: tuple[ServerProcess, str, CertSet]) -> None:
    srv, base, certs = https
    with httpx.Client(base_url=base, timeout=10, verify=trusting(certs)) as client:
        # Hypercorn's routes, then the fast ones, then hypercorn's: one connection.
        assert client.put("/queues/tls-q", json={"visibility_timeout": 1}).is_success
        posted = client.post("/messages/tls-q", content=b"secret body")
        assert posted.status_code == 201, posted.text
        job_id = posted.headers["x-message-id"]
        got = client.get("/messages/tls-q")
        assert got.status_code == 200 and got.content == b"secret body", got
        assert got.headers["x-message-id"] == job_id
        assert client.delete("/messages/" + quote(job_id, safe="")).status_code == 204
        # A body of many records, arriving over several reads.
        big = bytes(range(256)) * 1200
        posted = client.post("/messages/tls-q", content=big)
        assert posted.status_code == 201, posted.text
        got = client.get("/messages/tls-q")
        assert got.status_code == 200 and got.content == big
        assert client.delete("/messages/" + quote(got.headers["x-message-id"], safe="")
                             ).status_code == 204
        page = client.get("/")
        assert page.status_code == 200 and "trisque" in page.text
        assert client.get("/metrics").status_code == 200
    assert srv.call("QLEN", "tls-q") == 0


def test_untrusted_and_plaintext_clients_get_nothing(
        https: tuple[ServerProcess, str, CertSet], tmp_path: Path) -> None:
    srv, base, certs = https
    other = make_certs(tmp_path / "other", nodes=1, organization="other")
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(base + "/openapi.json", timeout=5, verify=trusting(other))
    with pytest.raises(httpx.TransportError):
        httpx.post(base.replace("https:", "http:") + "/messages/tls-q", content=b"x",
                   timeout=5)
    assert srv.call("QLEN", "tls-q") == 0
    assert srv.call("PING") == b"PONG"


def test_config_set_reloads_the_https_certificate(
        https: tuple[ServerProcess, str, CertSet], tmp_path: Path) -> None:
    srv, base, certs = https
    renewed = make_certs(tmp_path / "renewed", nodes=1, organization="renewed")
    live = Path(srv.call("CONFIG", "GET", "tls-cert-file")[1].decode()).parent
    shutil.copy(renewed.nodes[0][0], live / "node.crt")
    shutil.copy(renewed.nodes[0][1], live / "node.key")
    # Not reloaded yet: the old certificate is still what new connections see.
    assert httpx.get(base + "/openapi.json", verify=trusting(certs)).status_code == 200
    reply = srv.call("CONFIG", "SET", "tls-cert-file", str(tmp_path / "nowhere.crt"))
    assert isinstance(reply, Error) and "nowhere.crt" in str(reply)
    assert srv.call("CONFIG", "SET", "tls-cert-file", str(live / "node.crt")) == b"OK"
    assert httpx.get(base + "/openapi.json", verify=trusting(renewed)).status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(base + "/openapi.json", verify=trusting(certs))


def test_http_tls_without_a_certificate_stops_the_start(tmp_path: Path) -> None:
    proc = run_server("--port", str(free_port()), "--bind", "127.0.0.1", "--dir", str(tmp_path),
                      "--http-port", str(free_port()), "--http-tls", "yes")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "http-tls yes needs tls-cert-file" in proc.stderr, proc.stderr
