"""The clients over TLS against a real node's tls-port (tls-auth-clients yes): `trisque` in
its modes, `trisque-benchmark`, the blocking and trio client libraries, the Spark connector's
client."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from cli.certs import CertSet
from client.aio import AsyncClient
from client.blocking import Client
from client.tls import TlsOptions
from pipeline.connect import open_client
from pipeline.options import _common
from tests.support.certs import make_certs
from tests.support.cluster import wait_until
from tests.support.server import ServerProcess, free_port, repo_env
from tests.support.worker import WorkerProcess, add_job, script

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return make_certs(tmp_path_factory.mktemp("certs"), nodes=1)


@pytest.fixture(scope="module")
def node(certs: CertSet) -> Iterator[ServerProcess]:
    cert, key = certs.nodes[0]
    with ServerProcess(tls_port=free_port(), tls_cert_file=cert, tls_key_file=key,
                       tls_ca_cert_file=certs.ca_cert) as server:
        yield server


def port(node: ServerProcess) -> str:
    return str(node.directives["tls-port"])


def tls_args(certs: CertSet) -> list[str]:
    assert certs.client is not None
    return ["--tls", "--cacert", str(certs.ca_cert), "--cert", str(certs.client[0]),
            "--key", str(certs.client[1])]


def trisque(*args: str, stdin: bytes = b"", timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, env=repo_env(),
                          input=stdin, capture_output=True, timeout=timeout)


def options(certs: CertSet) -> TlsOptions:
    assert certs.client is not None
    return TlsOptions(cacert=str(certs.ca_cert), cert=str(certs.client[0]),
                      key=str(certs.client[1]))


def test_trisque_modes_over_tls(node: ServerProcess, certs: CertSet) -> None:
    tls = ["-p", port(node), *tls_args(certs)]
    added = trisque(*tls, "ADDJOB", "cliq", "one", "0")
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith(b"D-")
    assert trisque(*tls, "-X", "@", "ADDJOB", "cliq", "@", "0",
                   stdin=b"\x00two").stdout.startswith(b"D-")
    lines = trisque(*tls, stdin=b"QLEN cliq\nPING\n")
    assert lines.stdout == b"2\nPONG\n"
    pipe = b"".join(b"ADDJOB piped j%d 0\n" % i for i in range(5000))
    piped = trisque(*tls, "--pipe", stdin=pipe)
    assert piped.returncode == 0, piped.stderr
    assert b"errors: 0, replies: 5000" in piped.stdout
    assert node.call("QLEN", "piped") == 5000
    latency = trisque(*tls, "--latency", "-i", "0.3")
    assert latency.returncode == 0 and len(latency.stdout.split()) == 4
    stat = subprocess.Popen([sys.executable, "-m", "cli.main", *tls, "--stat", "-i", "0.3"],
                            cwd=REPO, env=repo_env(), stdout=subprocess.PIPE)
    try:
        assert stat.stdout is not None
        lines_out = [stat.stdout.readline().decode() for _ in range(3)]
    finally:
        stat.terminate()
        stat.wait(10)
    assert lines_out[1].split()[:3] == ["held", "queued", "active"]
    assert int(lines_out[2].split()[1]) >= 5002  # queued: cliq's and piped's jobs
    uri = trisque("-u", f"rediss://127.0.0.1:{port(node)}", *tls_args(certs)[1:], "PING")
    assert uri.stdout == b"PONG\n"


def test_trisque_refused_without_the_right_certificates(node: ServerProcess,
                                                        certs: CertSet) -> None:
    no_ca = trisque("-p", port(node), "--tls", "PING")
    assert no_ca.returncode == 1 and b"certificate verify failed" in no_ca.stderr
    no_cert = trisque("-p", port(node), "--tls", "--cacert", str(certs.ca_cert), "PING")
    assert no_cert.returncode == 1 and b"certificate required" in no_cert.stderr
    plaintext = trisque("-p", port(node), "PING")
    assert plaintext.returncode == 1 and b"PONG" not in plaintext.stdout
    assert trisque("-p", port(node), "--tls", "--cert", "x.crt", "PING").returncode == 2


def test_benchmark_over_tls(node: ServerProcess, certs: CertSet) -> None:
    run = subprocess.run([sys.executable, "-m", "cli.bench", "-p", port(node), *tls_args(certs),
                          "-n", "3000", "-c", "10", "-P", "4", "--json"],
                         cwd=REPO, env=repo_env(), capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["ops"] == 3000 and result["errors"] == 0
    consume = subprocess.run([sys.executable, "-m", "cli.bench", "consume", "-p", port(node),
                              *tls_args(certs), "-n", "2000", "-c", "4", "--json"],
                             cwd=REPO, env=repo_env(), capture_output=True, timeout=120)
    assert consume.returncode == 0, consume.stderr
    assert json.loads(consume.stdout)["errors"] == 0


def test_client_libraries_over_tls(node: ServerProcess, certs: CertSet) -> None:
    address = f"127.0.0.1:{port(node)}"
    with Client([address], tls=options(certs), cluster_aware=False) as client:
        job_id = client.add_job("libq", b"\xffbody")
        [job] = client.get_job("libq", timeout_ms=1000)
        assert (job.id, job.body) == (job_id, b"\xffbody")
        assert client.ack_job(job_id) == 1

    async def aio() -> None:
        with trio.fail_after(20):
            async with AsyncClient([address], tls=options(certs),
                                   cluster_aware=False) as aclient:
                job_id = await aclient.add_job("libq", b"async")
                [job] = await aclient.get_job("libq", timeout_ms=1000)
                assert job.id == job_id
                assert await aclient.ping() == "PONG"

    trio.run(aio)
    with Client([address], tls=TlsOptions(cacert=str(certs.ca_cert)),
                connect_timeout=5, socket_timeout=5) as refused:
        with pytest.raises(ConnectionError):
            refused.ping()  # no client certificate under tls-auth-clients yes


def test_spark_connector_passes_its_tls_options(node: ServerProcess, certs: CertSet) -> None:
    assert certs.client is not None
    common = _common({"nodes": f"127.0.0.1:{port(node)}", "cacert": str(certs.ca_cert),
                      "cert": str(certs.client[0]), "key": str(certs.client[1])})
    assert common.tls is not None
    client = open_client(common)
    try:
        assert client.ping() == "PONG"
    finally:
        client.close()
    assert _common({"nodes": "127.0.0.1:7711"}).tls is None


def test_worker_over_tls(node: ServerProcess, certs: CertSet, tmp_path: Path) -> None:
    job = script(tmp_path / "job.sh", """
        #!/bin/sh
        echo done >&3
        """)
    with WorkerProcess([int(port(node))], ["wq"], [job], log_dir=tmp_path / "logs",
                       options=tuple(tls_args(certs))) as worker:
        job_id = add_job(node.port, "wq", "over tls")  # the plaintext port of the same node
        wait_until(lambda: f"job {job_id}: done" in worker.log(), 30.0,
                   "the worker to run the job")
    assert f"nodes 127.0.0.1:{port(node)}" in worker.log()
