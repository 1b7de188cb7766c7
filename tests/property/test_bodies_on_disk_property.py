"""Property: with bodies kept in the append log, every body read back (SHOW, GETJOB, QPEEK)
equals the body added, whatever sizes (around body-memory-max), NACKs, rewrites and restarts
came in between."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.server import ServerProcess, send_command, wait_rewrite

OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 4000), st.integers(0, 255)),
    st.tuples(st.just("get"), st.just(0), st.just(0)),
    st.tuples(st.just("nack"), st.just(0), st.just(0)),
    st.tuples(st.just("rewrite"), st.just(0), st.just(0)),
    st.tuples(st.just("restart"), st.just(0), st.just(0)),
), min_size=1, max_size=25)


@pytest.fixture(scope="module")
def node() -> Iterator[ServerProcess]:
    with ServerProcess(appendonly="yes", appendfsync="everysec", body_memory_max=100) as srv:
        yield srv


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_every_body_read_back_equals_the_body_added(node: ServerProcess, ops) -> None:
    port = node.port
    send_command(port, "DEBUG", "FLUSHALL")
    added: dict[bytes, bytes] = {}
    out: list[bytes] = []  # delivered, not acked
    for op, size, fill in ops:
        if op == "add":
            body = bytes([fill]) * size + size.to_bytes(2, "big")
            added[send_command(port, "ADDJOB", "p", body, 0, "RETRY", 3600)] = body
        elif op == "get":
            for _q, job_id, body in send_command(port, "GETJOB", "NOHANG", "FROM", "p") or []:
                assert body == added[job_id]
                out.append(job_id)
        elif op == "nack" and out:
            assert send_command(port, "NACK", out.pop()) == 1
        elif op == "rewrite":
            send_command(port, "BGREWRITEAOF")
            wait_rewrite(port)
        elif op == "restart":
            node.stop()  # SIGTERM: the exact snapshot, bodies read back into it
            node.start()
            out.clear()  # the queues are restored exactly: delivered jobs are not queued
    for job_id, body in added.items():
        shown = send_command(port, "SHOW", job_id)
        assert shown[shown.index(b"body") + 1] == body
    peeked = send_command(port, "QPEEK", "p", 10_000)
    assert all(p[2] == added[p[1]] for p in peeked)


POLICY_OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 3000), st.integers(0, 255)),
    st.tuples(st.just("again"), st.integers(0, 1000), st.just(0)),  # an earlier body
    st.tuples(st.just("get"), st.just(0), st.just(0)),
    st.tuples(st.just("nack"), st.just(0), st.just(0)),
    st.tuples(st.just("redrive"), st.just(0), st.just(0)),
    st.tuples(st.just("rewrite"), st.just(0), st.just(0)),
    st.tuples(st.just("restart"), st.just(0), st.just(0)),
    st.tuples(st.just("kill"), st.just(0), st.just(0)),
), min_size=1, max_size=25)


@pytest.fixture(scope="module")
def policy_node() -> Iterator[ServerProcess]:
    with ServerProcess(appendonly="yes", appendfsync="always", body_memory_max=100) as srv:
        send_command(srv.port, "QPOLICY", "CREATE", "pdlq")
        send_command(srv.port, "QPOLICY", "CREATE", "pp", "DEDUP", "yes", "REDRIVE", "2", "pdlq")
        yield srv


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=POLICY_OPS)
def test_every_body_of_a_policy_queue_read_back_equals_the_body_added(
        policy_node: ServerProcess, ops) -> None:
    """A queue with deduplication and a redrive policy, its bodies in the log: deduplication
    answers the job of the same body (across restarts, a kill -9 included), dead letters and
    the jobs REDRIVE makes of them carry the body that was added."""
    node = policy_node
    port = node.port
    send_command(port, "DEBUG", "FLUSHALL")
    added: dict[bytes, bytes] = {}  # job ID -> body, as ADDJOB answered
    bodies: list[bytes] = []
    out: list[bytes] = []  # delivered, not acked
    for op, size, fill in ops:
        if op in ("add", "again"):
            if op == "again" and not bodies:
                continue
            body = (bodies[size % len(bodies)] if op == "again"
                    else bytes([fill]) * size + len(bodies).to_bytes(2, "big"))
            job_id = send_command(port, "ADDJOB", "pp", body, 0, "RETRY", 3600)
            assert added.setdefault(job_id, body) == body
            if op == "add":
                bodies.append(body)
        elif op == "get":
            got = send_command(port, "GETJOB", "NOHANG", "COUNT", 5, "FROM", "pp", "pdlq") or []
            for _q, job_id, body in got:
                assert body == added.get(job_id, body) and body in bodies
                out.append(job_id)
        elif op == "nack" and out:
            send_command(port, "NACK", out.pop())
        elif op == "redrive":
            assert isinstance(send_command(port, "QPOLICY", "REDRIVE", "pdlq"), int)
        elif op == "rewrite":
            send_command(port, "BGREWRITEAOF")
            wait_rewrite(port)
        elif op in ("restart", "kill"):
            if op == "kill":
                node.kill()  # the replay: delivered jobs wait their retry
            else:
                node.stop()  # SIGTERM: the exact snapshot
            node.start()
            out.clear()
    long_bodies = 0
    for queue in ("pp", "pdlq"):
        for entry in send_command(port, "JSCAN", "QUEUE", queue, "REPLY", "all", "COUNT", 10_000)[1]:
            fields = dict(zip(entry[::2], entry[1::2], strict=True))
            assert fields[b"body"] == added.get(fields[b"id"], fields[b"body"])
            assert fields[b"body"] in bodies
            long_bodies += len(fields[b"body"]) > 100
    queued = send_command(port, "QPEEK", "pp", 10_000)
    # Deduplication held: no two queued jobs of the deduplicating queue share a body.
    assert len({p[2] for p in queued}) == len(queued)
    info = send_command(port, "INFO", "persistence").decode()
    on_disk = int(info.split("jobs_bodies_on_disk:")[1].split()[0])
    assert on_disk == long_bodies  # policy queues keep no long body in memory
