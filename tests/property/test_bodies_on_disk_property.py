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
