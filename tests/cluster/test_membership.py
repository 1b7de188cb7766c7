"""Membership on the in-process harness (cluster/sim.py): fake clock, in-memory bus.

Each test states what an operator would see in CLUSTER NODES / INFO / HELLO."""

from __future__ import annotations

from cluster.sim import Faults, Sim, SimNode
from cluster.wire import Frame, MessageType

TIMEOUT = 2000  # cluster-node-timeout of every simulated node


def cluster(n: int, seed: int = 0, **kw: object) -> Sim:
    sim = Sim(seed)
    for _ in range(n):
        sim.add_node(node_timeout=TIMEOUT, **kw)  # type: ignore[arg-type]
    return sim


def flags(sim: Sim, viewer: int, about: SimNode | str) -> set[str] | None:
    """The flags node ``viewer`` shows for ``about`` in CLUSTER NODES (None: not listed)."""
    node_id = about if isinstance(about, str) else about.node_id
    text = sim.command(viewer, "NODES").decode()
    for line in text.splitlines():
        fields = line.split()
        if fields[0] == node_id:
            return set(fields[2].split(","))
    return None


def full_mesh(sim: Sim, members: list[int] | None = None) -> bool:
    members = list(range(len(sim.nodes))) if members is None else members
    for i in members:
        m = sim.nodes[i].membership
        ids = {sim.nodes[j].node_id for j in members}
        if set(m.nodes) != ids or m.reachable_nodes() != len(members) - 1:
            return False
    return True


def joined(n: int, seed: int = 0) -> Sim:
    sim = cluster(n, seed)
    sim.meet_all()
    assert sim.run_until(lambda: full_mesh(sim), 30_000)
    return sim


def test_a_chain_of_meets_among_seven_nodes_gives_a_full_mesh() -> None:
    sim = cluster(7, seed=3)
    sim.meet_all(chain=True)  # 0 meets 1, 1 meets 2, ... : nobody meets everyone
    assert sim.run_until(lambda: full_mesh(sim), 30_000)
    for i in range(7):
        lines = sim.command(i, "NODES").decode().splitlines()
        assert len(lines) == 7
        assert all(line.endswith(" connected") for line in lines)
        assert not any("handshake" in line for line in lines)
        assert "cluster_known_nodes:7\r\ncluster_reachable_nodes:6\r\ncluster_size:7" in \
            sim.command(i, "INFO").decode()
    # And it stays that way: no false failure while everyone answers.
    sim.run_for(5 * TIMEOUT)
    assert full_mesh(sim)


def test_meet_to_a_port_with_nothing_leaves_a_handshake_that_expires() -> None:
    sim = cluster(1)
    assert sim.command(0, "MEET", "127.0.0.1", "9999") == "OK"
    sim.run_for(500)
    lines = sim.command(0, "NODES").decode().splitlines()
    assert len(lines) == 2 and " 127.0.0.1:9999 handshake " in lines[1]
    assert "cluster_known_nodes:2\r\ncluster_reachable_nodes:0\r\ncluster_size:1" in \
        sim.command(0, "INFO").decode()
    sim.run_for(TIMEOUT + 200)  # handshake timeout = max(node_timeout, 1000)
    assert len(sim.command(0, "NODES").decode().splitlines()) == 1
    assert "127.0.0.1:9999" not in (sim.nodes[0].saved or "")


def test_forget_blacklists_for_sixty_seconds_then_gossip_brings_it_back() -> None:
    sim = joined(3)
    a, c = sim.nodes[0], sim.nodes[2]
    assert sim.command(0, "FORGET", c.node_id) == "OK"
    assert flags(sim, 0, c) is None
    # Node 1 still gossips about C, and C still pings A: neither brings it back.
    sim.run_for(55_000)
    assert flags(sim, 0, c) is None
    assert any(line.key == f"forgotten:{c.node_id}" for line in a.logs)
    assert c.node_id not in (a.saved or "")
    # After the blacklist's 60 s, gossip re-learns it.
    assert sim.run_until(lambda: full_mesh(sim), 30_000)


def test_forget_errors_are_disques() -> None:
    sim = joined(2)
    assert str(sim.command(0, "FORGET", "abc")) == "ERR Invalid node identifier"
    assert str(sim.command(0, "FORGET", "f" * 40)) == f"ERR Unknown node {'f' * 40}"
    assert str(sim.command(0, "FORGET", sim.nodes[0].node_id)) == \
        "ERR I tried hard but I can't forget myself..."


def test_reset_hard_gives_a_new_id_that_the_others_learn_after_a_meet() -> None:
    sim = joined(3)
    c = sim.nodes[2]
    old = c.node_id
    assert sim.command(2, "RESET", "HARD") == "OK"
    assert c.node_id != old and c.new_ids == [c.node_id]
    assert sim.command(2, "NODES").decode().splitlines() == [
        f"{c.node_id} 127.0.0.1:{c.port} myself 0 0 connected"]
    assert c.node_id in (c.saved or "") and old not in (c.saved or "")
    sim.command(0, "MEET", c.ip, str(c.port))
    new = c.node_id
    assert sim.run_until(lambda: all(new in n.membership.nodes and
                                     n.membership.reachable_nodes() == 2
                                     for n in sim.nodes), 30_000)
    # The old ID's address now answers as someone else: it is kept without an address, as
    # Disque does, until an operator forgets it.
    assert flags(sim, 1, old) in (None, {"noaddr"})


def test_reset_soft_keeps_the_id_and_forgets_everyone() -> None:
    sim = joined(3)
    b = sim.nodes[1]
    old = b.node_id
    assert sim.command(1, "RESET") == "OK"
    assert sim.command(1, "RESET", "SOFT") == "OK"
    assert b.node_id == old and b.new_ids == []
    assert sim.command(1, "NODES").decode().count("\n") == 1
    assert str(sim.command(1, "RESET", "MEDIUM")) == "ERR syntax error"


def test_a_killed_node_becomes_fail_on_the_majority_and_clears_when_restarted() -> None:
    sim = joined(5)
    dead = sim.nodes[4]
    killed_at = sim.now
    sim.kill(4)
    assert sim.run_until(lambda: all(flags(sim, i, dead) == {"fail"} for i in range(4)),
                         2 * TIMEOUT)
    assert sim.now - killed_at <= 2 * TIMEOUT
    hello = sim.nodes[0].membership.hello_nodes()
    # Disque's priorities: a failed node is 100 (10 is only for a suspected one).
    assert [dead.node_id.encode(), b"127.0.0.1", str(dead.port).encode(), b"100"] in hello
    assert "cluster_reachable_nodes:3\r\ncluster_size:5" in sim.command(0, "INFO").decode()
    # Restarted from its nodes.conf: same ID, no new MEET, and every flag clears.
    sim.restart(4)
    assert dead.node_id == [line.split()[0] for line in (dead.saved or "").splitlines()
                            if "myself" in line][0]
    assert sim.run_until(lambda: full_mesh(sim), 4 * TIMEOUT)
    assert all(flags(sim, i, dead) == {"noflags"} for i in range(4))


def test_a_minority_partition_does_not_mark_the_majority_failed() -> None:
    sim = joined(5)
    minority, majority = [0, 1], [2, 3, 4]
    sim.partition(minority, majority)
    sim.run_for(5 * TIMEOUT)
    for i in majority:  # the majority agrees the minority is gone
        assert all(flags(sim, i, sim.nodes[j]) == {"fail"} for j in minority)
    for i in minority:  # the minority only suspects the majority
        assert all(flags(sim, i, sim.nodes[j]) == {"fail?"} for j in majority)
    # Healed: every flag clears everywhere.
    sim.heal()
    assert sim.run_until(lambda: full_mesh(sim), 4 * TIMEOUT)
    for i in range(5):
        assert "fail" not in sim.command(i, "NODES").decode()


def test_leaving_spreads_to_every_node() -> None:
    sim = joined(3)
    a = sim.nodes[0]
    row = [a.node_id.encode(), b"127.0.0.1", str(a.port).encode()]
    sim.set_leaving(0, True)
    assert sim.run_until(lambda: all(row + [b"100"] in n.membership.hello_nodes()
                                     for n in sim.nodes), TIMEOUT)
    assert sim.nodes[0].membership.hello_nodes()[0] == row + [b"100"]  # myself first
    assert flags(sim, 1, a) == {"leaving"}
    assert sim.nodes[1].membership.reachable_nodes() == 1
    sim.set_leaving(0, False)
    assert sim.run_until(lambda: all(row + [b"1"] in n.membership.hello_nodes()
                                     for n in sim.nodes), TIMEOUT)


def test_nodes_with_different_secrets_never_join() -> None:
    sim = Sim(0)
    sim.add_node(node_timeout=TIMEOUT, secret=b"one")
    sim.add_node(node_timeout=TIMEOUT, secret=b"two")
    sim.add_node(node_timeout=TIMEOUT)  # and one without a secret
    sim.command(0, "MEET", "127.0.0.1", str(sim.nodes[1].port))
    sim.command(2, "MEET", "127.0.0.1", str(sim.nodes[0].port))
    sim.run_for(3 * TIMEOUT)
    for i in range(3):
        assert len(sim.command(i, "NODES").decode().splitlines()) == 1
    assert any("BadMac" in e for e in sim.nodes[1].wire_errors)
    assert any("BadMac" in e for e in sim.nodes[0].wire_errors)


def test_nodes_with_the_same_secret_join() -> None:
    sim = cluster(3, secret=b"s3cret")
    sim.meet_all()
    assert sim.run_until(lambda: full_mesh(sim), 30_000)


def test_a_node_claiming_anothers_id_from_elsewhere_is_dropped() -> None:
    sim = joined(3)
    b = sim.nodes[1]
    ping = Frame(MessageType.PING, b.node_id, {"port": 7999, "flags": [], "gossip": []})
    sim.inject(0, ping, peer_ip="10.6.6.6")
    assert any(line.key == f"id-clash:{b.node_id}" for line in sim.nodes[0].logs)
    assert not sim.outside  # no PONG to the impostor
    assert flags(sim, 0, b) == {"noflags"}
    assert f"{b.node_id} 127.0.0.1:{b.port} " in sim.command(0, "NODES").decode()


def test_a_ping_from_an_unknown_node_is_answered_but_not_added() -> None:
    sim = joined(2)
    ping = Frame(MessageType.PING, "e" * 40, {"port": 7999, "flags": [], "gossip": []})
    sim.inject(0, ping)
    assert [f.type for _, f in sim.outside] == [MessageType.PONG]
    sim.run_for(100)
    assert len(sim.command(0, "NODES").decode().splitlines()) == 2


def test_a_meet_from_an_unknown_node_starts_a_handshake_with_it() -> None:
    sim = joined(2)
    meet = Frame(MessageType.MEET, "e" * 40, {"port": 7999, "flags": [], "gossip": []})
    sim.inject(0, meet, peer_ip="10.7.7.7")
    assert " 10.7.7.7:7999 handshake " in sim.command(0, "NODES").decode()
    sim.run_for(TIMEOUT + 200)  # nothing listens there: it expires
    assert "10.7.7.7" not in sim.command(0, "NODES").decode()


def _gossip(node_id: str, ip: str, port: int) -> dict[str, object]:
    return {"id": node_id, "ip": ip, "port": port, "flags": [], "ping_sent": 0,
            "pong_received": 0}


def test_gossip_and_meets_start_no_handshake_with_an_address_disque_would_not_dial() -> None:
    """Disque's clusterStartHandshake checks: an IP literal (a name is never resolved) and a
    port whose bus port exists. Also for a failing node said to have moved."""
    sim = joined(3)
    a, b, c = sim.nodes
    sim.kill(2)
    sim.run_for(3 * TIMEOUT)
    assert flags(sim, 0, c) is not None and "fail" in flags(sim, 0, c)  # type: ignore[operator]
    gossip = [_gossip("1" * 40, "evil.example", 7000), _gossip("2" * 40, "10.1.1.1", 60000),
              _gossip("3" * 40, "10.1.1.1", 7000),  # a good address: the control
              _gossip(c.node_id, "127.0.0.1", 0), _gossip(c.node_id, "localhost", 7100)]
    for g in gossip:  # one entry per PING: the same node twice in one would be odd
        sim.inject(0, Frame(MessageType.PING, b.node_id,
                            {"port": b.port, "flags": [], "gossip": [g]}), peer_ip=b.ip)
    meet = Frame(MessageType.MEET, "e" * 40, {"port": 60000, "flags": [], "gossip": []})
    sim.inject(0, meet, peer_ip="10.7.7.7")
    handshakes = [line.split()[1] for line in sim.command(0, "NODES").decode().splitlines()
                  if "handshake" in line.split()[2]]
    assert handshakes == ["10.1.1.1:7000"]
    assert not [addr for addr in a.wanted.values()
                if addr[0] in ("evil.example", "localhost") or addr[1] in (10000, 70000)]


def test_malformed_bodies_and_garbage_are_dropped_with_a_log_line() -> None:
    sim = joined(2)
    bad = [
        {"port": "7711", "flags": [], "gossip": []},
        {"port": 7711, "flags": "leaving", "gossip": []},
        {"port": 7711, "flags": [], "gossip": [{"id": "zz"}]},
        {"port": 7711, "flags": [], "gossip": "many"},
        {"port": 0, "flags": [], "gossip": []},
        {"port": True, "flags": [], "gossip": []},
        {},
    ]
    for body in bad:
        sim.inject(0, Frame(MessageType.PING, "e" * 40, body))
    sim.inject(0, Frame(MessageType.FAIL, sim.nodes[1].node_id, {"node": 5}))
    sim.inject(0, b"GET / HTTP/1.1\r\n\r\n")  # a port scanner: refused by the decoder
    keys = [line.key for line in sim.nodes[0].logs if line.key.startswith("malformed:")]
    assert len(keys) == len(bad) + 1
    assert any("BadMagic" in e for e in sim.nodes[0].wire_errors)
    assert not sim.outside
    sim.run_for(2 * TIMEOUT)
    assert full_mesh(sim)  # and the cluster did not notice


def test_join_survives_reordered_and_duplicated_frames() -> None:
    sim = cluster(4, seed=7)
    for a in range(4):
        for b in range(4):
            sim.faults[(a, b)] = Faults(delay_ms=5, jitter_ms=80, duplicate=0.3)
    sim.meet_all()
    assert sim.run_until(lambda: full_mesh(sim), 30_000)


def test_a_lossy_bus_heals_once_the_losses_stop() -> None:
    sim = joined(4, seed=5)
    for a in range(4):
        for b in range(4):
            sim.faults[(a, b)] = Faults(drop=0.3, jitter_ms=30)
    sim.run_for(10 * TIMEOUT)
    sim.faults.clear()
    assert sim.run_until(lambda: full_mesh(sim), 5 * TIMEOUT)


def test_meet_to_myself_is_dropped_at_once() -> None:
    sim = cluster(2)
    sim.command(0, "MEET", "127.0.0.1", str(sim.nodes[0].port))
    sim.run_for(200)
    assert len(sim.command(0, "NODES").decode().splitlines()) == 1
    assert any(line.key.startswith("self-meet:") for line in sim.nodes[0].logs)


def test_a_multi_homed_node_pinging_from_another_interface_is_not_an_impostor() -> None:
    sim = joined(2)
    b = sim.nodes[1]
    ping = Frame(MessageType.PING, b.node_id, {"port": b.port, "flags": [], "gossip": []})
    sim.inject(0, ping, peer_ip="192.168.1.2")
    assert [f.type for _, f in sim.outside] == [MessageType.PONG]
    assert f"{b.node_id} 127.0.0.1:{b.port} " in sim.command(0, "NODES").decode()


def test_random_bodies_never_raise_out_of_the_core() -> None:
    import random as _random

    rng = _random.Random(42)
    sim = joined(3)
    m = sim.nodes[0].membership
    known = [n.node_id for n in sim.nodes] + ["d" * 40]
    values: list[object] = [None, True, -1, 0, 1, 7711, 2**70, "x", "", "1.2.3.4", [], {},
                            ["leaving", "pfail"], "f" * 40]
    for _ in range(3000):
        gossip = [{k: rng.choice(values + known) for k in rng.sample(
            ["id", "ip", "port", "flags", "ping_sent", "pong_received"], rng.randint(0, 6))}
            for _ in range(rng.randint(0, 3))]
        body = {k: rng.choice(values + [gossip]) for k in rng.sample(
            ["port", "flags", "gossip", "node"], rng.randint(0, 4))}
        kind = rng.choice([MessageType.PING, MessageType.PONG, MessageType.MEET,
                           MessageType.FAIL])
        m.receive(Frame(kind, rng.choice(known), body), 999_999, "10.1.1.1", "127.0.0.1",
                  rng.choice([None, known[1]]), sim.now)
        m.take_effects()
    assert m.myself_id == sim.nodes[0].node_id


def test_the_harness_knobs_drop_and_delay_do_what_they_say() -> None:
    sim = cluster(2)
    sim.faults[(0, 1)] = Faults(drop=1.0)  # every frame from 0 to 1 is lost
    sim.command(0, "MEET", "127.0.0.1", str(sim.nodes[1].port))
    sim.run_for(3 * TIMEOUT)
    assert all(len(sim.command(i, "NODES").decode().splitlines()) == 1 for i in range(2))
    slow = cluster(2)
    slow.faults[(0, 1)] = slow.faults[(1, 0)] = Faults(delay_ms=300)
    start = slow.now
    slow.meet_all()
    assert slow.run_until(lambda: full_mesh(slow), 10_000)
    assert slow.now - start >= 3 * 300  # MEET to B, B's PING back, A's PONG: three trips
