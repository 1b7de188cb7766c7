"""The membership core as the broker sees it (ClusterView): reply shapes against the recorded
replies of Disque on three nodes, and the broker's CLUSTER/HELLO going through it."""

from __future__ import annotations

import random
import re

from broker.config import Config
from cluster.effects import Connect, SaveNodes
from cluster.membership import Membership
from cluster.nodes_file import parse
from cluster.wiring import attach
from protocol.resp import Error
from tests.broker.harness import Node
from tests.cluster.test_membership import TIMEOUT, full_mesh, joined

# Disque on three nodes (tests/fixtures/disque-reference-replies.md, "Three nodes"):
#   f408... 127.0.0.1:27712 myself 0 0 connected
#   4008... 127.0.0.1:27714 noflags 0 1795315898269 connected
MYSELF_LINE = re.compile(r"^[0-9a-f]{40} 127\.0\.0\.1:\d+ myself 0 0 connected$")
OTHER_LINE = re.compile(r"^[0-9a-f]{40} 127\.0\.0\.1:\d+ noflags 0 \d{13} connected$")


def test_cluster_nodes_has_disques_shape_field_for_field() -> None:
    sim = joined(3)
    sim.run_for(3000)
    text = sim.command(0, "NODES").decode()
    assert text.endswith("\n")
    lines = text.splitlines()
    assert MYSELF_LINE.match(lines[0]) and lines[0].startswith(sim.nodes[0].node_id)
    assert all(OTHER_LINE.match(line) for line in lines[1:]), lines
    # pong_received is the time of the last PONG, in ms, as in Disque
    assert all(0 <= sim.now - int(line.split()[4]) <= TIMEOUT for line in lines[1:])


def test_cluster_info_has_disques_fields_and_real_message_counts() -> None:
    sim = joined(3)
    info = sim.command(1, "INFO").decode()
    assert re.fullmatch(
        r"cluster_state:ok\r\ncluster_known_nodes:3\r\ncluster_reachable_nodes:2\r\n"
        r"cluster_size:3\r\ncluster_stats_messages_sent:(\d+)\r\n"
        r"cluster_stats_messages_received:(\d+)\r\n", info)
    m = sim.nodes[1].membership
    sent, received = m.messages_sent, m.messages_received
    assert sent > 0 and received > 0
    sim.run_for(5000)
    assert m.messages_sent > sent and m.messages_received > received


def test_hello_lists_myself_first_then_every_node_as_bytes() -> None:
    sim = joined(3)
    hello = sim.nodes[1].membership.hello_nodes()
    assert hello[0] == [sim.nodes[1].node_id.encode(), b"127.0.0.1",
                        str(sim.nodes[1].port).encode(), b"1"]
    assert sorted(row[0] for row in hello) == sorted(n.node_id.encode() for n in sim.nodes)
    assert all(row[1:] == [b"127.0.0.1", str(sim.nodes[[n.node_id.encode() for n in
               sim.nodes].index(row[0])].port).encode(), b"1"] for row in hello)


def test_cluster_myid_and_bad_subcommands() -> None:
    sim = joined(2)
    assert sim.command(0, "MYID") == sim.nodes[0].node_id.encode()
    assert str(sim.command(0, "NODES", "x")) == "ERR Wrong CLUSTER subcommand or number of arguments"
    assert str(sim.command(0, "BOGUS")) == "ERR Wrong CLUSTER subcommand or number of arguments"
    assert str(sim.command(0, "MEET", "127.0.0.1", "x")) == "ERR Invalid TCP port specified: x"
    assert str(sim.command(0, "MEET", "nohost", "7711")) == \
        "ERR Invalid node address specified: nohost:7711"
    assert str(sim.command(0, "MEET", "127.0.0.1", "60000")) == \
        "ERR Invalid node address specified: 127.0.0.1:60000"
    assert sim.command(0, "SAVECONFIG") == "OK"


def test_a_new_node_saves_its_id_at_once_and_a_saved_one_reconnects() -> None:
    m = Membership(Config(), "a" * 40, random.Random(1), 1000)
    effects = m.take_effects()
    assert [type(e) for e in effects] == [SaveNodes]
    assert parse(effects[0].content).myself_id == "a" * 40  # type: ignore[union-attr]
    saved = parse(f"{'a' * 40} 10.0.0.1:7711 myself 0 0 connected\n"
                  f"{'b' * 40} 10.0.0.2:7712 noflags 0 5 connected\n"
                  f"{'c' * 40} :0 noaddr 0 0 disconnected\n")
    m = Membership(Config(), "a" * 40, random.Random(1), 1000, saved)
    effects = m.take_effects()
    assert effects[0] == Connect("b" * 40, "10.0.0.2", 17712)
    assert isinstance(effects[1], SaveNodes) and len(effects) == 2
    assert m.myself.ip == "10.0.0.1"


def test_config_set_cluster_node_timeout_applies_at_once() -> None:
    sim = joined(3)
    dead = sim.nodes[2]
    for n in sim.nodes:
        assert n.config.config_set("cluster-node-timeout", "10000") is None
    sim.kill(2)
    sim.run_for(3 * TIMEOUT)  # the old timeout would have failed it by now
    assert all("fail" not in sim.command(i, "NODES").decode() for i in range(2))
    assert sim.run_until(lambda: all(dead.node_id.encode() + b" 127.0.0.1:7713 fail"
                                     in sim.command(i, "NODES") for i in range(2)), 15_000)


def test_the_broker_answers_cluster_and_hello_through_the_membership_core() -> None:
    sim = joined(3)
    n = Node(now=sim.now)
    attach(n.b, membership=sim.nodes[0].membership)
    n.b.node_id = sim.nodes[0].node_id
    hello = n("HELLO")
    assert hello[:2] == [1, sim.nodes[0].node_id.encode()] and len(hello) == 5
    assert n("CLUSTER", "NODES") == sim.command(0, "NODES")
    assert n("CLUSTER", "LEAVING", "yes") == "OK"
    assert sim.nodes[0].membership.leaving and n("CLUSTER", "LEAVING") == "yes"
    assert n.b.reachable_nodes() == 2
    assert n("CLUSTER", "LEAVING", "no") == "OK" and not sim.nodes[0].membership.leaving
    job = n.add("q", "body", "REPLICATE", 1)
    assert n("CLUSTER", "RESET", "HARD") == "OK"
    assert n("SHOW", job) is None  # Disque's reset flushes the jobs
    assert isinstance(n("CLUSTER", "FORGET", "x"), Error)


def test_the_solo_cluster_keeps_single_node_replies() -> None:
    n = Node()
    assert n("CLUSTER", "NODES") == f"{n.b.node_id} :7711 myself 0 0 connected\n".encode()
    assert str(n("CLUSTER", "MEET", "127.0.0.1", "7712")).startswith("ERR CLUSTER MEET needs")
    assert n("HELLO")[2] == [n.b.node_id.encode(), b"", b"7711", b"1"]
    n("CLUSTER", "LEAVING", "yes")
    assert n("HELLO")[2][3] == b"100"


def test_a_restarted_node_rejoins_without_a_meet() -> None:
    sim = joined(4)
    sim.kill(1)
    sim.kill(2)
    sim.run_for(3 * TIMEOUT)
    sim.restart(1)
    sim.restart(2)
    assert sim.run_until(lambda: full_mesh(sim), 4 * TIMEOUT)


def test_hello_priorities_are_disques() -> None:
    # Disque's helloCommand: 1 linked, 5 no link, 10 suspected (pfail), 100 failed or leaving;
    # a worse state wins over a better one, and myself needs no link.
    from cluster.table import Node, hello_priority

    def node(flags: set[str], link: int | None) -> Node:
        return Node("a" * 40, "127.0.0.1", 7711, flags, ctime=0, link=link)

    assert hello_priority(node(set(), 3), False) == 1
    assert hello_priority(node(set(), None), False) == 5
    assert hello_priority(node({"myself"}, None), True) == 1
    assert hello_priority(node({"pfail"}, None), False) == 10
    assert hello_priority(node({"fail"}, 3), False) == 100
    assert hello_priority(node({"leaving", "pfail"}, 3), False) == 100
