"""Federation with real ``trisque-server`` processes: jobs flow to the nodes where consumers wait.

``tests/cluster/test_federation.py`` proves NEEDJOBS/YOURJOBS message by message on a fake
clock (exact backoff delays, lost and duplicated frames). These prove what only separate
processes can: that the node wires the federation core to the real bus, timers and log,
and that a user of the client library sees jobs added on one node consumed on others.
Each prints what it measured (``pytest -s``). Select them with ``-m cluster_processes``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from client.blocking import Client
from tests.support.cluster import LocalCluster, wait_until
from tests.support.server import REPO, repo_env
from tests.system.test_replicated_jobs import addr, joined, origin, pipelined

pytestmark = pytest.mark.cluster_processes

Factory = Callable[..., LocalCluster]

JOBS = 10_000
# Long enough that no job is requeued during the test: a job seen twice is a bug.
RETRY_S = 300
# A first broadcast NEEDJOBS goes at once, the next after 4 s (Disque's backoff).
BROADCAST_GAP_S = 4.0
PRODUCED_FIRST = 2_000  # of JOBS, before the consumers start


def qstat(c: LocalCluster, i: int, queue: str) -> dict[str, Any]:
    reply = c.call(i, "QSTAT", queue)
    assert isinstance(reply, list), reply
    return {reply[k].decode(): reply[k + 1] for k in range(0, len(reply), 2)}


def info(c: LocalCluster, i: int, section: str) -> dict[str, str]:
    text = c.call(i, "INFO", section).decode()
    return dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)


def test_ten_thousand_jobs_added_on_one_node_are_consumed_on_two_others_once_each(
        local_cluster: Factory) -> None:
    c, ids = joined(local_cluster)
    seen: Counter[str] = Counter()
    acked = 0
    lock = threading.Lock()
    produced = threading.Event()
    failures: list[str] = []
    sources: dict[int, list[bytes]] = {}

    def worker(node: int) -> None:
        nonlocal acked
        try:
            with Client(nodes=[addr(c, node)], socket_timeout=10.0) as client:
                while True:
                    jobs = client.get_job("fed", count=50, timeout_ms=300)
                    assert client.address == ("127.0.0.1", c.port(node))  # only on B or C
                    if not jobs:
                        with lock:
                            if produced.is_set() and acked >= JOBS:
                                return
                        continue
                    if node not in sources:
                        sources[node] = qstat(c, node, "fed")["import-from"]
                    with lock:
                        seen.update(j.id for j in jobs)
                    n = client.ack_job(*(j.id for j in jobs))
                    with lock:
                        acked += n
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(f"node{node}: {type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=worker, args=(node,), daemon=True)
               for node in (1, 2, 1, 2)]
    added: list[str] = []

    def produce(start: int) -> None:
        # Half with one copy (only federation moves them), half with the cluster's default
        # three (the consumers' nodes already hold an unqueued copy when it is exported).
        replies = pipelined(c.port(0), [("ADDJOB", "fed", f"job{k}", "0", "RETRY",
                                         str(RETRY_S), "REPLICATE", str(1 + 2 * (k % 2)))
                                        for k in range(start, start + 500)])
        added.extend(r.decode() for r in replies)

    t0 = time.monotonic()
    # Jobs are waiting when each consumer's node first broadcasts NEEDJOBS: a node whose first
    # broadcast found none asks again only after BROADCAST_GAP_S, by which time the other may
    # have drained everything (as in Disque), and this test is about both importing.
    for start in range(0, PRODUCED_FIRST, 500):
        produce(start)
    for t in workers:
        t.start()
    for start in range(PRODUCED_FIRST, JOBS, 500):
        produce(start)
    produced.set()
    produce_s = time.monotonic() - t0
    deadline = time.monotonic() + 40
    for t in workers:
        t.join(max(0.1, deadline - time.monotonic()))
    elapsed = time.monotonic() - t0
    assert not failures, failures
    assert not any(t.is_alive() for t in workers), f"acked {acked} of {JOBS} in {elapsed:.1f} s"
    assert all(origin(ids, j) == 0 for j in added)
    # Every job delivered and acked, none twice (no RETRY passed).
    assert set(seen) == set(added)
    assert [j for j, n in seen.items() if n > 1] == []
    assert acked == JOBS
    # Both consumers' nodes imported from node0, and QSTAT said so.
    exported = int(info(c, 0, "federation")["jobs_exported"])
    imported = [int(info(c, i, "federation")["jobs_imported"]) for i in (1, 2)]
    assert exported == sum(imported) == JOBS, (exported, imported)
    assert sources.get(1) == [ids[0].encode()] and sources.get(2) == [ids[0].encode()], sources
    # Nobody consumed on node0: its jobs all went over the bus.
    assert "cmdstat_getjob" not in c.call(0, "INFO", "commandstats").decode()
    # Acked everywhere: the ack GC collects every copy (node0 kept each one ACTIVE).
    wait_until(lambda: all(info(c, i, "jobs")["registered_jobs"] == "0" for i in range(3)),
               20, "every copy collected")
    print(f"{JOBS} jobs added on node0 in {produce_s:.2f} s, consumed and acked on node1 "
          f"({imported[0]}) and node2 ({imported[1]}) in {elapsed:.2f} s "
          f"({JOBS / elapsed:.0f} jobs/s), none twice")


def test_a_consumer_blocked_on_another_node_receives_a_job_added_on_the_first(
        local_cluster: Factory) -> None:
    """The federation example of docs/cluster.md: a worker on node1 waits on an empty queue; a job added on
    node0 soon after reaches it at once: node0 kept the broadcast NEEDJOBS it could not answer,
    rather than waiting for the next one (4 s after the worker blocked)."""
    c, ids = joined(local_cluster)
    got: dict[str, Any] = {}

    def consume() -> None:
        with Client(nodes=[addr(c, 1)], socket_timeout=10.0) as client:
            got["jobs"] = client.get_job("readme", timeout_ms=int(BROADCAST_GAP_S * 1000 + 3000))
            got["at"] = time.monotonic()
            got["qstat"] = client.qstat("readme")
            got["ack"] = client.ack_job(*(j.id for j in got["jobs"]))

    consumer = threading.Thread(target=consume, daemon=True)
    blocked_at = time.monotonic()
    consumer.start()
    wait_until(lambda: c.call(1, "QSTAT", "readme") and qstat(c, 1, "readme")["blocked"] == 1,
               5, "the consumer blocked on node1")
    job_id = c.call(0, "ADDJOB", "readme", "hello from node0", "0").decode()
    added_at = time.monotonic()
    consumer.join(BROADCAST_GAP_S + 6)
    assert not consumer.is_alive()
    assert [(j.id, j.body) for j in got["jobs"]] == [(job_id, b"hello from node0")]
    assert got["qstat"].import_from == [ids[0]]
    assert got["ack"] == 1
    waited = got["at"] - added_at
    # Before the second broadcast: node0 answered the first one when the job came.
    assert got["at"] - blocked_at < BROADCAST_GAP_S, (got["at"] - blocked_at, waited)
    wait_until(lambda: c.call(0, "SHOW", job_id) is None, 10, "the job collected on node0")
    print(f"a job added on node0 reached the consumer blocked on node1 {waited * 1000:.0f} ms later "
          f"({got['at'] - blocked_at:.2f} s after it blocked; broadcast gap 4 s)")


def test_a_leaving_node_never_asks_for_jobs_and_still_gives_its_own(
        local_cluster: Factory) -> None:
    c, ids = joined(local_cluster)
    # node2 holds two jobs of its own, then leaves the cluster.
    mine = [c.call(2, "ADDJOB", "drain", f"d{k}", "0", "REPLICATE", "1").decode()
            for k in range(2)]
    assert c.call(2, "CLUSTER", "LEAVING", "yes") == b"OK"
    wait_until(lambda: (ids[2], "127.0.0.1", c.port(2), 100) in c.hello(0)[1], 5,
               "node0 knowing node2 leaves")
    # node0 has jobs that node2's consumers would take if node2 asked: it never does.
    pipelined(c.port(0), [("ADDJOB", "wanted", f"w{k}", "0", "REPLICATE", "1")
                          for k in range(20)])
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2.5:
        assert c.call(2, "GETJOB", "NOHANG", "FROM", "wanted") is None
        time.sleep(0.05)
    assert c.call(0, "QLEN", "wanted") == 20
    assert info(c, 0, "federation")["jobs_exported"] == "0"
    assert qstat(c, 2, "wanted")["import-from"] == []
    # The same NOHANG polling on a node that is not leaving asks at once, and gets jobs.
    got, _ = wait_until(lambda: c.call(1, "GETJOB", "NOHANG", "FROM", "wanted"), 5,
                        "node1 importing from node0")
    assert origin(ids, got[0][1].decode()) == 0
    # And the leaving node still answers NEEDJOBS: node1's consumer empties it.
    with Client(nodes=[addr(c, 1)], socket_timeout=10.0) as client:
        taken = []
        while len(taken) < 2:
            jobs = client.get_job("drain", timeout_ms=int(BROADCAST_GAP_S * 1000 + 3000))
            assert jobs, taken
            taken += [j.id for j in jobs]
    assert sorted(taken) == sorted(mine)
    assert c.call(2, "QLEN", "drain") == 0
    print(f"leaving node2 imported nothing in {time.monotonic() - t0:.1f} s of GETJOB NOHANG; "
          "its 2 jobs were taken by node1's consumer")


def test_a_rebalancing_consumer_moves_to_the_node_that_produces_its_jobs(
        local_cluster: Factory) -> None:
    """``rebalance_consumers=True``: a consumer started on node1 receives node0's jobs
    through federation, sees from their IDs that node0 makes them, and moves there; the
    jobs then no longer travel. Without it the consumer stays where it was put."""
    c, ids = joined(local_cluster)
    pipelined(c.port(0), [("ADDJOB", "rb", f"r{k}", "0", "REPLICATE", "1")
                          for k in range(400)])
    at_first = None
    with Client(nodes=[addr(c, 1)], socket_timeout=10.0, rebalance_consumers=True,
                rebalance_window=16) as client:
        taken = 0
        moved_after = None
        exported_after_move = None
        while taken < 200:
            jobs = client.get_job("rb", count=4, timeout_ms=int(BROADCAST_GAP_S * 1000 + 3000))
            assert jobs
            at_first = at_first or client.address
            assert client.fast_ack(*(j.id for j in jobs)) == len(jobs)
            taken += len(jobs)
            if moved_after is None and client.address == ("127.0.0.1", c.port(0)):
                moved_after = taken
            elif moved_after is not None and exported_after_move is None \
                    and taken >= moved_after + 40:
                exported_after_move = int(info(c, 0, "federation")["jobs_exported"])
        assert at_first == ("127.0.0.1", c.port(1))
        # The window (16) is judged from a quarter of it on.
        assert moved_after is not None and moved_after <= 16, moved_after
        exported = int(info(c, 0, "federation")["jobs_exported"])
    # After the move every job was taken on node0 itself: none crossed the bus any more
    # (node1 keeps what it had imported for its consumer, which is gone).
    assert exported == exported_after_move, (exported_after_move, exported)
    assert "cmdstat_getjob" in c.call(0, "INFO", "commandstats").decode()
    assert c.call(0, "QLEN", "rb") == 400 - exported - (taken - moved_after)
    print(f"the consumer moved from node1 to node0 after {moved_after} jobs; "
          f"{exported} of {taken} crossed the bus")


def test_the_benchmark_cycles_from_producers_on_one_node_to_consumers_on_two(
        local_cluster: Factory) -> None:
    c, _ = joined(local_cluster)
    run = subprocess.run([sys.executable, "-m", "cli.bench", "cycle", "--produce-nodes",
                          addr(c, 0), "--consume-nodes", f"{addr(c, 1)},{addr(c, 2)}",
                          "--replicate", "1", "--retry", str(RETRY_S), "-n", "3000", "-c", "8",
                          "--json"],
                         cwd=REPO, env=repo_env(), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert (result["produced"], result["consumed"], result["errors"]) == (3000, 3000, 0), result
    assert result["produce_nodes"] == [addr(c, 0)]
    assert result["consume_nodes"] == [addr(c, 1), addr(c, 2)]
    imported = [int(info(c, i, "federation")["jobs_imported"]) for i in (1, 2)]
    # Which consumer node imports what is a race: a node whose first broadcast NEEDJOBS
    # came before the first job waits 4 s for the next one, by then the other may have
    # taken everything.
    assert int(info(c, 0, "federation")["jobs_exported"]) == sum(imported) == 3000
    assert "cmdstat_getjob" not in c.call(0, "INFO", "commandstats").decode()
    lat = result["e2e_latency_ms"]
    print(f"bench cycle node0 -> node1,node2: {result['ops_per_sec']:.0f} jobs/s, end to end "
          f"p50 {lat['p50']:.1f} ms p99 {lat['p99']:.1f} ms; imported {imported}")
