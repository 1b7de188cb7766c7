"""Policies replicated to every node (cluster/policy_sync.py) on the in-process harness."""

from __future__ import annotations

from cluster.sim import Faults
from cluster.wire import Frame, MessageType
from tests.policies.policysim import PolicyCluster


def same_everywhere(c: PolicyCluster) -> bool:
    up = [i for i, n in enumerate(c.sim.nodes) if n.up]
    first = c.policies(up[0])
    return all(c.policies(i) == first for i in up)


def test_create_update_delete_reach_every_node() -> None:
    c = PolicyCluster(3)
    c.cmd(0, "QPOLICY", "CREATE", "dlq")
    # The dead-letter queue must exist where the redrive policy is set: it arrives first.
    assert c.run_until(lambda: c.policies(1)[0] == 1, 1000)
    c.cmd(1, "QPOLICY", "CREATE", "w", "REDRIVE", "3", "dlq", "VISIBILITY", "10")
    assert c.run_until(lambda: c.policies(2)[0] == 2 and same_everywhere(c), 1000)
    c.cmd(2, "QPOLICY", "UPDATE", "w", "DEDUP", "yes")
    assert c.run_until(lambda: same_everywhere(c), 1000)
    c.cmd(0, "QPOLICY", "DEL", "dlq")  # clears w's redrive policy, on every node
    assert c.run_until(lambda: c.policies(1)[0] == 1 and same_everywhere(c), 1000)
    (entry,) = c.policies(1)[1]
    got = dict(zip(entry[::2], entry[1::2], strict=True))
    assert got[b"dead-letter-queue"] is None and got[b"message-deduplication"] == 1
    # Each node logged what it received: a restart keeps it.
    c.sim.restart(1)
    assert c.run_until(c.meshed, 10_000)
    assert c.policies(1) == c.policies(0)


def test_a_node_that_joins_later_gets_every_policy() -> None:
    c = PolicyCluster(2)
    c.cmd(0, "QPOLICY", "CREATE", "a", "RETENTION", "99")
    c.cmd(0, "QPOLICY", "CREATE", "gone")
    assert c.run_until(lambda: c.policies(1)[0] == 2, 1000)
    c.cmd(1, "QPOLICY", "DEL", "gone")
    c.run_for(200)
    c.sim.add_node()
    c.sim.command(0, "MEET", c.sim.nodes[2].ip, str(c.sim.nodes[2].port))
    assert c.run_until(lambda: c.meshed() and c.policies(2) == c.policies(0), 10_000)
    assert c.policies(2)[0] == 1


def test_lost_broadcasts_and_a_node_down_converge_by_anti_entropy() -> None:
    c = PolicyCluster(3)
    for a in range(3):
        for b in range(3):
            if a != b:
                c.sim.faults[(a, b)] = Faults(drop=0.5)
    c.sim.kill(2)
    for k in range(5):
        c.cmd(k % 2, "QPOLICY", "SET", f"q{k}", "RETENTION", str(100 + k))
    c.sim.restart(2)
    assert c.run_until(lambda: c.sim.nodes[2].up and c.policies(2)[0] == 5
                       and same_everywhere(c), 60_000)


def test_concurrent_updates_converge_to_the_newest_stamp() -> None:
    c = PolicyCluster(2)
    c.cmd(0, "QPOLICY", "CREATE", "q")
    assert c.run_until(lambda: c.policies(1)[0] == 1, 1000)
    c.sim.partition({0}, {1})
    c.cmd(0, "QPOLICY", "UPDATE", "q", "DELAY", "5")
    c.cmd(1, "QPOLICY", "UPDATE", "q", "DELAY", "7")
    c.sim.heal()
    assert c.run_until(lambda: c.meshed() and same_everywhere(c), 30_000)


def test_malformed_and_unknown_sender_frames_change_nothing() -> None:
    c = PolicyCluster(2)
    sync = c.syncs[0]
    for body in ({"policies": [["queue", b"q", {"x": 1}, 1, "n"]]}, {"nope": 1},
                 {"policies": "x"}, {"policies": [["origin", b"a", b"b", b"c"]]},
                 {"full": True}):  # no policies at all: once a KeyError out of the core
        sync.receive(Frame(MessageType.QPOLICY, c.node_id(1), body), 0, "127.0.0.1",
                     "127.0.0.1", None, c.sim.now)
    good = {"policies": [["queue", b"q", None, 1, "n"]]}
    sync.receive(Frame(MessageType.QPOLICY, "f" * 40, good), 0, "127.0.0.1", "127.0.0.1",
                 None, c.sim.now)
    logged = [e for e in sync.take_effects() if getattr(e, "key", "").startswith("malformed-")]
    assert len(logged) == 5  # one rate-limited line per malformed frame, keyed by peer
    assert sync.stats["malformed"] == 5 and c.policies(0) == [0, []]
    assert not c.broker(0).policies.by_name


def test_dead_letter_race_with_replicated_policies() -> None:
    c = PolicyCluster(3)
    c.cmd(0, "QPOLICY", "CREATE", "dlq")
    c.cmd(0, "QPOLICY", "CREATE", "w", "REDRIVE", "1", "dlq")
    assert c.run_until(lambda: all(c.policies(i)[0] == 2 for i in range(3)), 1000)
    job = c.addjob(1, "w", "x", "500", "REPLICATE", "3")
    c.cmd(1, "GETJOB", "NOHANG", "FROM", "w")
    for i in range(3):
        assert c.cmd(i, "NACK", job) == 0
    c.run_for(2000)
    queued = [(i, jid) for i in range(3) for jid, j in c.broker(i).jobs.items()
              if j.queue == b"dlq" and j.state.value == "queued"]
    assert len(queued) == 1, queued
