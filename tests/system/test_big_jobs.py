"""Big jobs on a real 3-node cluster: replicated, moved to consumers, refused past the limit,
and none of it stalls the node's other clients.

One cluster serves every test of the module (starting three nodes is most of the cost). Each
prints what it measured (``pytest -s``). Select them with ``-m cluster_processes``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from protocol.resp import Error, encode_command
from tests.support.cluster import LocalCluster, wait_until
from tests.support.server import pipelined, send_command

pytestmark = pytest.mark.cluster_processes

MB = 1024 * 1024
JOIN_WITHIN_S = 20.0
# The ADDJOB timeout: what the user gave (Disque replicates 40 MB in about 1.4 s).
ADDJOB_TIMEOUT_MS = 10_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base: Path = tmp_path_factory.mktemp("bigjobs")
    c = LocalCluster(base, 3, directives=[{"loglevel": "notice"}] * 3)
    try:
        c.start()
        ids = [c.myid(i) for i in range(3)]
        for i in (1, 2):
            c.meet(i, 0)
        wait_until(lambda: c.mesh_ok([0, 1, 2], ids), JOIN_WITHIN_S, "a mesh of 3")
        yield c
    finally:
        c.close()
        print(c.logs())


def call(c: LocalCluster, i: int, *args: bytes | str, timeout: float = 30.0) -> object:
    return send_command(c.port(i), *args, timeout=timeout)


def body_of(size: int, tag: bytes) -> bytes:
    """``size`` bytes that differ from one job to the next (a copy of the wrong job fails)."""
    return (tag * (size // len(tag) + 1))[:size]


def show_body(c: LocalCluster, i: int, job_id: bytes) -> bytes | None:
    reply = call(c, i, "SHOW", job_id)
    if reply is None:
        return None
    assert isinstance(reply, list), reply
    fields = dict(zip(reply[::2], reply[1::2], strict=True))
    return fields[b"body"]


@pytest.mark.parametrize("size_mb", [17, 40])
def test_a_big_job_is_replicated_to_three_nodes(cluster: LocalCluster, size_mb: int) -> None:
    body = body_of(size_mb * MB, b"big-%d-" % size_mb)
    start = time.monotonic()
    reply = call(cluster, 0, "ADDJOB", "bigq", body, str(ADDJOB_TIMEOUT_MS), "REPLICATE", "3")
    took = time.monotonic() - start
    print(f"ADDJOB of {size_mb} MB, REPLICATE 3: {took:.2f} s")
    assert isinstance(reply, bytes) and reply.startswith(b"D-"), reply
    for i in range(3):  # every copy is whole and is this job's
        assert show_body(cluster, i, reply) == body, f"node{i}'s copy of {size_mb} MB"
    assert call(cluster, 0, "FASTACK", reply) == 1


def test_a_body_over_the_limit_is_refused_at_once_with_the_directive_named(
        cluster: LocalCluster) -> None:
    assert call(cluster, 0, "CONFIG", "GET", "job-max-body-len") == [b"job-max-body-len",
                                                                     b"134217728"]
    assert call(cluster, 0, "CONFIG", "SET", "job-max-body-len", "20mb") == b"OK"
    try:
        start = time.monotonic()
        reply = call(cluster, 0, "ADDJOB", "bigq", b"x" * (20 * MB + 1), "10000",
                     "REPLICATE", "3")
        took = time.monotonic() - start
    finally:
        call(cluster, 0, "CONFIG", "SET", "job-max-body-len", "128mb")
    print(f"ADDJOB of 20 MB + 1 byte over a 20 MB limit refused in {took:.3f} s")
    assert isinstance(reply, Error)
    assert str(reply) == ("ERR job body of 20971521 bytes exceeds the job-max-body-len limit "
                          "of 20971520 bytes")
    assert took < 2.0  # at once: not after the ADDJOB timeout
    wait_until(lambda: "over job-max-body-len" in cluster.nodes[0].log(), 5.0,
               "the refusal in node0's log")
    assert call(cluster, 0, "QLEN", "bigq") == 0
    assert call(cluster, 1, "QLEN", "bigq") == 0


def test_sixty_1mb_jobs_made_on_one_node_are_consumed_on_another_within_5s(
        cluster: LocalCluster) -> None:
    bodies = {body_of(MB, b"fed-%d-" % n) for n in range(60)}
    replies = pipelined(cluster.port(0),
                        [("ADDJOB", "fedq", b, "0", "REPLICATE", "1") for b in bodies])
    assert all(isinstance(r, bytes) and r.startswith(b"D-") for r in replies), replies[:3]
    got: set[bytes] = set()
    start = time.monotonic()
    while len(got) < 60 and time.monotonic() - start < 5.0:
        jobs = call(cluster, 2, "GETJOB", "TIMEOUT", "3000", "COUNT", "60", "FROM", "fedq")
        if jobs is None:
            continue
        assert isinstance(jobs, list)
        got.update(job[2] for job in jobs)
        assert call(cluster, 2, "ACKJOB", *[job[1] for job in jobs]) == len(jobs)
    took = time.monotonic() - start
    print(f"60 x 1 MB jobs from node0 consumed on node2: {len(got)} in {took:.2f} s")
    assert got == bodies
    assert took < 5.0


@pytest.mark.timing
def test_other_clients_ping_p99_stays_under_50ms_while_a_40mb_job_replicates(
        cluster: LocalCluster) -> None:
    latencies: list[float] = []
    stop = threading.Event()

    def pinger() -> None:
        with socket.create_connection(("127.0.0.1", cluster.port(0)), timeout=30) as s:
            ping = encode_command("PING")
            while not stop.is_set():
                t0 = time.perf_counter()
                s.sendall(ping)
                data = b""
                while not data.endswith(b"\r\n"):
                    data += s.recv(64)
                latencies.append(time.perf_counter() - t0)
                time.sleep(0.001)  # an ordinary client, not a flood

    threads = [threading.Thread(target=pinger) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.2)
        before = len(latencies)
        body = body_of(40 * MB, b"ping-40-")
        reply = call(cluster, 0, "ADDJOB", "pingq", body, str(ADDJOB_TIMEOUT_MS),
                     "REPLICATE", "3")
        during = latencies[before:]
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert isinstance(reply, bytes) and reply.startswith(b"D-"), reply
    during.sort()
    p99 = during[int(len(during) * 0.99)]
    print(f"PING while a 40 MB job replicated: {len(during)} pings, p50 "
          f"{during[len(during) // 2] * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
          f"max {during[-1] * 1000:.1f} ms")
    assert len(during) >= 20
    assert p99 < 0.050
    assert call(cluster, 0, "FASTACK", reply) == 1


def test_a_big_job_is_replicated_between_nodes_with_a_cluster_secret(
        local_cluster: Callable[..., LocalCluster]) -> None:
    """With ``cluster-secret`` a big frame's MAC is computed as it is written and checked as
    it arrives (not at once, on the loop): the copy must still arrive whole and verified."""
    c: LocalCluster = local_cluster(2, directives=[{"cluster-secret": "s3cret"}] * 2)
    ids = [c.myid(i) for i in range(2)]
    c.meet(1, 0)
    wait_until(lambda: c.mesh_ok([0, 1], ids), JOIN_WITHIN_S, "a mesh of 2")
    body = body_of(17 * MB, b"secret-17-")
    reply = call(c, 0, "ADDJOB", "bigq", body, str(ADDJOB_TIMEOUT_MS), "REPLICATE", "2")
    assert isinstance(reply, bytes) and reply.startswith(b"D-"), reply
    assert show_body(c, 1, reply) == body
    assert "MAC" not in c.nodes[1].log()  # no frame refused
