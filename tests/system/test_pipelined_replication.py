"""Pipelined replicated ADDJOBs with real ``trisque-server`` processes on a 3-node cluster.

A client that pipelines synchronous ADDJOBs has the next ones replicated while the earlier
ones wait for their copies (node/conn_core.py, "Pipelined ADDJOBs"): replies leave in order,
each only once its own job is confirmed (or failed), a command that could see their jobs waits
for their replies, and at most ``MAX_ADDJOBS_WAITING`` wait per connection. A stopped process
(SIGSTOP) keeps its links up and answers nothing, so replication waits for real.
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from node.conn_core import MAX_ADDJOBS_WAITING
from protocol.resp import Error, encode_command
from tests.support.cluster import LocalCluster, wait_until
from tests.support.server import pipelined, read_replies
from tests.system.test_replicated_jobs import joined

pytestmark = pytest.mark.cluster_processes

Factory = Callable[..., LocalCluster]
SETTLE_S = 5.0
TIMEOUT = "NOREPL Timeout reached before replicating to the requested number of nodes"
NOREPL = "NOREPL Not enough reachable nodes for the requested replication level"


@contextmanager
def stopped(c: LocalCluster, i: int) -> Iterator[None]:
    proc = c.nodes[i].proc
    assert proc is not None
    proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGCONT)


def body_of(c: LocalCluster, i: int, job_id: str) -> Any:
    reply = c.call(i, "SHOW", job_id)
    assert isinstance(reply, list), (job_id, reply)
    return dict(zip(reply[::2], reply[1::2], strict=True))[b"body"]


def info(c: LocalCluster, i: int, field: str) -> str:
    text = c.call(i, "INFO").decode()
    return dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)[field]


def registered(c: LocalCluster, i: int) -> int:
    return int(info(c, i, "registered_jobs"))


@pytest.mark.parametrize("log", ["no", "always", "everysec"])
def test_pipelined_replicated_addjobs_are_all_confirmed_and_replied_in_order(
        local_cluster: Factory, log: str) -> None:
    """With the log on, each reply also waits for its job's record: replies dispatched once
    their batches are durable must still leave in order."""
    directives = [{"appendonly": "yes", "appendfsync": log}] * 3 if log != "no" else None
    c, _ = joined(local_cluster, directives=directives)
    n = 400
    replies = pipelined(c.port(0), [("ADDJOB", "q", f"job-{k}", "5000", "REPLICATE", "3")
                                    for k in range(n)])
    assert all(isinstance(r, bytes) and r.startswith(b"D-") for r in replies), replies[:3]
    assert len(set(replies)) == n
    # In order: the k-th reply is the ID of the k-th job, held by every node.
    for k in (0, 1, n // 2, n - 1):
        for i in range(3):
            assert body_of(c, i, replies[k].decode()) == f"job-{k}".encode()
    assert [registered(c, i) for i in range(3)] == [n] * 3
    assert c.call(0, "QLEN", "q") == n


def test_timeouts_and_refusals_are_answered_in_their_place_and_waited_for_together(
        local_cluster: Factory) -> None:
    """With node2 stopped, every REPLICATE 3 times out while REPLICATE 2 succeeds with node1;
    REPLICATE 4 is refused at once. Each reply is in its place, and the timeouts ran together:
    five 800 ms timeouts take about 0.8 s, not 4 s one after the other."""
    c, _ = joined(local_cluster)
    pipeline: list[tuple[Any, ...]] = []
    for k in range(5):
        pipeline.append(("ADDJOB", "t", f"slow-{k}", "800", "REPLICATE", "3"))
        pipeline.append(("ADDJOB", "t", f"fast-{k}", "800", "REPLICATE", "2"))
    pipeline[4:4] = [("ADDJOB", "t", "refused", "800", "REPLICATE", "4"),
                     ("ADDJOB", "t", "async", "0", "ASYNC", "REPLICATE", "3")]
    pipeline.append(("PING",))
    with stopped(c, 2):
        t0 = time.monotonic()
        replies = pipelined(c.port(0), pipeline)
        waited = time.monotonic() - t0
    shape = [str(r) if isinstance(r, Error) else
             ("id" if isinstance(r, bytes) and r.startswith(b"D-") else r) for r in replies]
    assert shape == [TIMEOUT, "id", TIMEOUT, "id",
                     NOREPL, "id",
                     TIMEOUT, "id", TIMEOUT, "id", TIMEOUT, "id", b"PONG"]
    assert 0.7 <= waited < 2.5, waited
    assert body_of(c, 0, replies[5].decode()) == b"async"
    assert body_of(c, 1, replies[1].decode()) == b"fast-0"
    # The timed-out jobs left no copy anywhere (DELJOB).
    wait_until(lambda: c.call(1, "QLEN", "t") == 0 and registered(c, 1) == 6, SETTLE_S,
               "node1 keeps the five REPLICATE 2 jobs and the ASYNC one only")
    print(f"five pipelined 800 ms timeouts answered after {waited:.2f} s")


def test_a_node_killed_while_addjobs_wait_fails_them_in_order_and_the_rest_succeed(
        local_cluster: Factory) -> None:
    c, _ = joined(local_cluster)
    with socket.create_connection(("127.0.0.1", c.port(0)), timeout=30) as s:
        with stopped(c, 2):
            cmds = [("ADDJOB", "k", f"b{k}", "1500", "REPLICATE", "3" if k % 2 else "2")
                    for k in range(40)]
            s.sendall(b"".join(encode_command(*cmd) for cmd in cmds))
            wait_until(lambda: registered(c, 1) == 40, SETTLE_S,
                       "node1 holds a copy of every waiting job")
            c.kill(2)
        replies = read_replies(s, len(cmds))
    for k, reply in enumerate(replies):
        if k % 2:
            assert str(reply) in (TIMEOUT, NOREPL), (k, reply)
        else:
            assert isinstance(reply, bytes) and body_of(c, 0, reply.decode()) == f"b{k}".encode()


def test_a_client_gone_mid_pipeline_takes_its_waiting_jobs_and_leaves_confirmed_ones(
        local_cluster: Factory) -> None:
    """As for Disque's client gone from a blocked ADDJOB: each job still waiting for its
    copies is deleted (DELJOB); one confirmed whose reply was held behind them stays."""
    c, _ = joined(local_cluster)
    with stopped(c, 2):
        with socket.create_connection(("127.0.0.1", c.port(0)), timeout=5) as s:
            cmds = [("ADDJOB", "gone", f"w{k}", "0", "REPLICATE", "3") for k in range(20)]
            cmds.append(("ADDJOB", "kept", "confirmed", "0", "REPLICATE", "2"))
            s.sendall(b"".join(encode_command(*cmd) for cmd in cmds))
            wait_until(lambda: c.call(0, "QLEN", "kept") == 1 and registered(c, 1) == 21,
                       SETTLE_S, "the copies on node1 while the first 20 wait")
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1)  # nothing answered: the first ADDJOB still waits
        wait_until(lambda: all(c.call(i, "QLEN", "gone") == 0 and
                               c.call(i, "JSCAN", "QUEUE", "gone")[1] == [] for i in (0, 1)),
                   SETTLE_S, "no copy left of the ADDJOBs whose client left")
        assert c.call(0, "QLEN", "kept") == 1
        assert info(c, 0, "blocked_clients") == "0"


def test_a_mixed_pipeline_keeps_sequential_semantics(local_cluster: Factory) -> None:
    """GETJOB waits for the ADDJOBs before it, so it sees their jobs as a client sending one
    command at a time would; an ADDJOB with MAXLEN counts the jobs added before it."""
    c, _ = joined(local_cluster)
    replies = pipelined(c.port(0), [
        ("ADDJOB", "m", "one", "5000", "REPLICATE", "3"),
        ("ADDJOB", "m", "two", "5000", "REPLICATE", "3"),
        ("GETJOB", "NOHANG", "COUNT", "10", "FROM", "m"),
        ("ADDJOB", "m", "three", "5000", "REPLICATE", "3"),
        ("ADDJOB", "m", "four", "5000", "REPLICATE", "3", "MAXLEN", "1"),
        ("QLEN", "m"),
        ("ADDJOB", "m", "five", "5000", "REPLICATE", "3"),
        ("GETJOB", "NOHANG", "COUNT", "10", "FROM", "m"),
    ])
    one, two, got, three, four, qlen, five, got2 = replies
    assert [job[1] for job in got] == [one, two]
    assert str(four) == "MAXLEN Queue is already longer than the specified MAXLEN count"
    assert qlen == 1
    assert [job[1] for job in got2] == [three, five]


def test_at_most_the_bound_of_addjobs_wait_per_connection(local_cluster: Factory) -> None:
    c, _ = joined(local_cluster)
    n = MAX_ADDJOBS_WAITING + 50
    with socket.create_connection(("127.0.0.1", c.port(0)), timeout=30) as s:
        with stopped(c, 2):
            s.sendall(b"".join(encode_command("ADDJOB", "b", f"j{k}", "0", "REPLICATE", "3")
                               for k in range(n)))
            wait_until(lambda: registered(c, 0) == MAX_ADDJOBS_WAITING, SETTLE_S,
                       "the bound of waiting ADDJOBs")
            time.sleep(0.3)
            assert registered(c, 0) == MAX_ADDJOBS_WAITING  # the rest wait unread
            assert info(c, 0, "blocked_clients") == "1"
        replies = read_replies(s, n)
    assert [body_of(c, 0, r.decode()) for r in replies[:3]] == [b"j0", b"j1", b"j2"]
    assert body_of(c, 0, replies[-1].decode()) == f"j{n - 1}".encode()
    assert registered(c, 0) == n


def test_the_query_buffer_limit_still_closes_a_client_behind_waiting_addjobs(
        local_cluster: Factory) -> None:
    c, _ = joined(local_cluster, directives=[{"client_query_buffer_limit": "1mb"}] * 3)
    body = "x" * 50_000
    with stopped(c, 2):
        with socket.create_connection(("127.0.0.1", c.port(0)), timeout=10) as s:
            # Closed: 40 jobs of 50 KB wait unread behind the bound (a reset, when the node
            # closes with input unread).
            with pytest.raises((ConnectionResetError, BrokenPipeError, EOFError)):
                s.sendall(b"".join(encode_command("ADDJOB", "big", body, "0", "REPLICATE",
                                                  "3") for _ in range(MAX_ADDJOBS_WAITING + 40)))
                if s.recv(1) == b"":
                    raise EOFError
        assert "max query buffer length" in c.logs()
        wait_until(lambda: registered(c, 0) == 0 and info(c, 0, "blocked_clients") == "0",
                   SETTLE_S, "the waiting jobs of the closed client dropped")


def test_addjobs_behind_a_command_carried_out_in_its_own_task_and_a_protocol_error(
        local_cluster: Factory) -> None:
    """CONFIG SET appendonly waits in the connection's own task, which runs the ADDJOBs after
    it; a protocol error behind waiting ADDJOBs is answered after their replies, then the
    connection closes."""
    c, _ = joined(local_cluster)
    replies = pipelined(c.port(0), [("CONFIG", "SET", "appendonly", "yes")]
                        + [("ADDJOB", "task", f"t{k}", "5000", "REPLICATE", "3")
                           for k in range(5)] + [("PING",)])
    assert replies[0] == b"OK" and replies[-1] == b"PONG"
    assert [body_of(c, 1, r.decode()) for r in replies[1:6]] == [f"t{k}".encode()
                                                                for k in range(5)]
    with socket.create_connection(("127.0.0.1", c.port(0)), timeout=10) as s:
        s.sendall(b"".join(encode_command("ADDJOB", "perr", f"p{k}", "5000", "REPLICATE", "3")
                           for k in range(3)) + b"*1\r\n$x\r\n")
        got = read_replies(s, 4)
        assert [body_of(c, 2, r.decode()) for r in got[:3]] == [b"p0", b"p1", b"p2"]
        assert str(got[3]).startswith("ERR Protocol error"), got[3]
        s.settimeout(5)
        assert s.recv(1) == b""
