"""Replay the reference Disque's three-node session against a real cluster.

The fixture's "Three nodes joined with CLUSTER MEET" section was recorded on three Disque
1.0-rc1 nodes. What replication and federation make meaningful is replayed on three ``trisque-server``
processes, in order, and each reply compared with the recorded one after masking what
differs from run to run (as ``tests/e2e/test_reference_replies.py`` does for one node):

* job IDs: the n-th recorded ID stands for the n-th we returned (and is sent as ours);
* node IDs and ports: the recorded node on port 27712 + i stands for our node i;
* ``ctime`` is any integer, ``ttl`` within 2 s and ``next-*-within`` within 2000 ms of the
  recording; ``nodes-delivered`` is compared as a set (Disque lists it in hash-table
  order), and for ``REPLICATE 2`` only as "two nodes, the origin among them" (which other
  node is picked is random in both servers); HELLO's node entries are compared as a set;
* QSTAT's ``import-rate`` after one imported job is 20 in the recording (one job over
  Disque's 50 ms minimum window); here it is any rate from 1 to 20, since on two busy cores
  the YOURJOBS may take longer than 50 ms to arrive after the GETJOB blocked;
* what the recording shows at once on another node but travels over the bus (an ASYNC
  copy, SHOW None after ACKJOB, the PAUSE state, HELLO's priority 100) is polled for a few
  seconds until it matches, then compared.

Left out: the first HELLO, CLUSTER NODES and CLUSTER INFO (membership's, with counters that
differ by nature; tests/system/test_cluster_processes.py covers them). The federation lines
(``fedq`` with nothing to import anywhere, ``fedq2`` added on one node and taken by a GETJOB
TIMEOUT on another, QSTAT's ``import-from``/``import-rate``) are federation's, replayed too.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.rawclient import RawConnection
from tests.e2e.reference import Exchange, load_section
from tests.support.cluster import LocalCluster, wait_until

pytestmark = pytest.mark.cluster_processes

SECTION = "Three nodes joined with CLUSTER MEET (ports 27712-27714)"
REF_BASE_PORT = 27712
JOB_ID = re.compile(r"D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}")
NODE_ID = re.compile(r"[0-9a-f]{40}")
TOLERANCE = {"ttl": 2, "next-requeue-within": 2000, "next-awake-within": 2000}
# Replies that travel over the bus: polled until they match, for at most this long.
SETTLE_S = 5.0

EXCHANGES = load_section(SECTION)
ISSUE_8 = {("HELLO",), ("CLUSTER", "NODES"), ("CLUSTER", "INFO")}


def replayed() -> list[Exchange]:
    """The exchanges replication and federation make meaningful, in the recorded order."""
    out = []
    first_hello = True
    for e in EXCHANGES:
        if e.argv in ISSUE_8 and (e.argv != ("HELLO",) or first_hello):
            first_hello = first_hello and e.argv != ("HELLO",)
            continue
        out.append(e)
    return out


class Masker:
    """Turns one side's replies (in the fixture's notation, ``tests/e2e/rawclient.py``)
    into comparable values."""

    def __init__(self, node_ids: list[str], ports: list[int]) -> None:
        self.nodes = {node_id.encode(): f"<node{i}>" for i, node_id in enumerate(node_ids)}
        self.ports = {str(p).encode(): f"<port{i}>" for i, p in enumerate(ports)}
        self.jobs: dict[bytes, str] = {}

    def job(self, job_id: bytes) -> str:
        return self.jobs.setdefault(job_id, f"<job{len(self.jobs)}>")

    def value(self, v: Any) -> Any:
        if isinstance(v, tuple):  # the recording's ('+'|'-', text)
            if v[0] == "+" and JOB_ID.fullmatch(v[1]):
                return ("+", self.job(v[1].encode()))
            return v
        if isinstance(v, bytes):
            if JOB_ID.fullmatch(v.decode("latin-1")):
                return self.job(v)
            return self.nodes.get(v) or self.ports.get(v) or v
        if isinstance(v, list):
            return [self.value(x) for x in v]
        return v

    def reply(self, argv: tuple[str, ...], v: Any, recorded: Any) -> Any:
        cmd = argv[0].upper()
        if cmd == "SHOW" and isinstance(v, list):
            return self._show(argv, v, recorded)
        if cmd == "QSTAT" and isinstance(v, list):
            return self._qstat(v)
        if cmd == "HELLO" and isinstance(v, list):
            return [v[0], self.value(v[1]), sorted(map(str, self.value(v[2:])))]
        return self.value(v)

    def _qstat(self, v: list[Any]) -> Any:
        out = []
        for key, val in zip(v[::2], v[1::2], strict=True):
            if key == b"import-rate" and isinstance(val, int) and 1 <= val <= 20:
                val = "<rate 1..20>"
            out.append((key, self.value(val)))
        return out

    def _show(self, argv: tuple[str, ...], v: list[Any], recorded: Any) -> Any:
        ref = dict(zip(recorded[::2], recorded[1::2], strict=True)) if recorded else {}
        out = []
        for key, val in zip(v[::2], v[1::2], strict=True):
            name = key.decode()
            if name == "ctime":
                val = "<int>" if isinstance(val, int) else val
            elif name in TOLERANCE and isinstance(ref.get(key), int) and isinstance(val, int):
                val = "<near>" if abs(val - ref[key]) <= TOLERANCE[name] else val
            elif name == "nodes-delivered":
                names = sorted(self.value(val))
                val = (len(names), "<node0>" in names) if len(names) == 2 else names
            else:
                val = self.value(val)
            out.append((name, val))
        return out


def test_the_three_node_session_replies_as_the_reference(
        local_cluster: Callable[..., LocalCluster]) -> None:
    c = local_cluster(3)
    ids = [c.myid(i) for i in range(3)]
    for i in (1, 2):
        c.meet(i, 0)
    wait_until(lambda: c.mesh_ok([0, 1, 2], ids), 20, "a mesh of 3")
    hello = next(e.expected for e in EXCHANGES if e.argv == ("HELLO",))
    ref_ids = sorted(((int(port), node_id.decode()) for node_id, _, port, _ in hello[2:]))
    ref = Masker([node_id for _, node_id in ref_ids], [p for p, _ in ref_ids])
    ours = Masker(ids, [c.port(i) for i in range(3)])
    to_ours: dict[str, str] = {}  # recorded job ID -> ours
    problems = []
    for e in replayed():
        assert e.port is not None
        node = e.port - REF_BASE_PORT
        argv = tuple(to_ours.get(a, a) for a in e.argv)
        want = ref.reply(e.argv, e.expected, e.expected)

        def ask(node: int = node, argv: tuple[str, ...] = argv, e: Exchange = e) -> Any:
            with RawConnection(c.port(node), timeout=10) as conn:
                got = conn.call(*argv)
            return got, ours.reply(argv, got, e.expected)

        got, masked = ask()
        if masked != want and argv[0].upper() in ("SHOW", "HELLO", "PAUSE"):
            deadline = time.monotonic() + SETTLE_S
            while masked != want and time.monotonic() < deadline:
                time.sleep(0.05)
                got, masked = ask()
        if argv[0].upper() == "ADDJOB" and isinstance(got, tuple) and got[0] == "+":
            to_ours[e.expected[1]] = got[1]
        if masked != want:
            problems.append(f"{e}\n  reference: {want!r}\n  trisque:   {masked!r}")
    assert not problems, "\n".join(problems)
