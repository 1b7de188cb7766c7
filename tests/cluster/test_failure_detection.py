"""The failure rule on one core, driven by hand: who answers, what gossip says, and when.

Three nodes (me, B, C): size 3, so FAIL needs myself plus one report (3 // 2 + 1 = 2)."""

from __future__ import annotations

import random

from broker.config import Config
from cluster.effects import CloseLink, Send
from cluster.membership import Membership
from cluster.messages import Gossip, Ping, Pong
from cluster.nodes_file import parse
from cluster.wire import Frame, MessageType

ME, B, C = "a" * 40, "b" * 40, "c" * 40
T0 = 1_000_000
TIMEOUT = 2000
LINK = {B: 1, C: 2}


def core() -> Membership:
    config = Config()
    config.set("cluster-node-timeout", [str(TIMEOUT)])
    saved = parse(f"{ME} 10.0.0.1:7711 myself 0 0 connected\n"
                  f"{B} 10.0.0.2:7712 noflags 0 1 connected\n"
                  f"{C} 10.0.0.3:7713 noflags 0 1 connected\n")
    m = Membership(config, ME, random.Random(0), T0, saved)
    for node_id, link in LINK.items():
        m.link_up(node_id, link, T0)
    return m


def pong(m: Membership, node_id: str, now: int, link: int | None = None) -> None:
    body = Pong(7712, frozenset()).to_body()
    m.receive(Frame(MessageType.PONG, node_id, body), link or LINK[node_id], "10.0.0.9",
              "10.0.0.1", node_id, now)


def drive(m: Membership, start: int, end: int, answering: set[str]) -> None:
    """Tick every 100 ms; the nodes in ``answering`` answer every PING at once."""
    for now in range(start, end, 100):
        m.tick(now)
        for effect in m.take_effects():
            if isinstance(effect, Send) and effect.type is MessageType.PING \
                    and effect.node_id in answering:
                pong(m, effect.node_id, now)


def report_from_b(m: Membership, now: int, flags: frozenset[str]) -> None:
    gossip = (Gossip(C, "10.0.0.3", 7713, flags, 0, 0),)
    body = Ping(7712, frozenset(), gossip).to_body()
    m.receive(Frame(MessageType.PING, B, body), 50, "10.0.0.2", "10.0.0.1", None, now)


def test_pfail_alone_is_not_fail_and_one_report_makes_the_majority() -> None:
    m = core()
    drive(m, T0, T0 + 3 * TIMEOUT, answering={B})
    assert m.nodes[C].flags == {"pfail"}  # no PONG within the timeout, nobody agrees yet
    report_from_b(m, T0 + 3 * TIMEOUT, frozenset({"pfail"}))
    assert m.nodes[C].flags == {"fail"}
    fails = [e for e in m.take_effects() if isinstance(e, Send) and e.type is MessageType.FAIL]
    assert [e.node_id for e in fails] == [B] and fails[0].body == {"node": C}
    pong(m, C, T0 + 3 * TIMEOUT + 1)  # it answers again: FAIL clears at once
    assert m.nodes[C].flags == set()


def test_a_failure_report_older_than_twice_the_timeout_does_not_count() -> None:
    m = core()
    report_from_b(m, T0, frozenset({"pfail"}))
    drive(m, T0, T0 + 2500, answering={B, C})  # C still answers: the report is B's view only
    drive(m, T0 + 2500, T0 + 2500 + 2 * TIMEOUT, answering={B})
    assert m.nodes[C].flags == {"pfail"}  # B's report is more than 2 x timeout old
    report_from_b(m, T0 + 7000, frozenset({"fail"}))
    assert m.nodes[C].flags == {"fail"}


def test_a_report_withdrawn_by_gossip_no_longer_counts() -> None:
    m = core()
    report_from_b(m, T0, frozenset({"pfail"}))
    report_from_b(m, T0 + 1, frozenset())  # B sees C fine again
    drive(m, T0, T0 + 3 * TIMEOUT, answering={B})
    assert m.nodes[C].flags == {"pfail"}


def test_gossip_carries_a_tenth_of_the_table_and_failing_nodes_first() -> None:
    config = Config()
    lines = [f"{ME} 10.0.0.1:7711 myself 0 0 connected"]
    others = [f"{i:040x}" for i in range(1, 40)]
    lines += [f"{o} 10.0.1.{i}:7711 {'fail' if i == 7 else 'noflags'} 0 1 connected"
              for i, o in enumerate(others)]
    m = Membership(config, ME, random.Random(0), T0, parse("\n".join(lines)))
    m.take_effects()
    m.link_up(others[0], 1, T0)
    (ping,) = [e for e in m.take_effects() if isinstance(e, Send)]
    gossip = ping.body["gossip"]
    assert len(gossip) == 4  # 40 nodes / 10
    assert gossip[0]["id"] == others[7] and gossip[0]["flags"] == ["fail"]
    assert others[0] not in [g["id"] for g in gossip]  # never the recipient


def test_an_unreachable_node_goes_pfail_without_any_link() -> None:
    m = core()
    m.link_down(C, LINK[C], T0 + 10)  # connect refused, over and over
    drive(m, T0 + 10, T0 + 10 + TIMEOUT + 200, answering={B})
    assert m.nodes[C].flags == {"pfail"} and m.nodes[B].flags == set()
    assert m.reachable_nodes() == 1


# -- a link that dies ------------------------------------------------------------------------
# B answered on its link, then its process died (the link closed). The transport tries again
# every 100 ms: refused while nothing listens (link_down with a new link ID each time).

def answered_then_killed(m: Membership, killed_at: int) -> None:
    drive(m, T0, killed_at, answering={B, C})
    m.link_down(B, LINK[B], killed_at)


def refused(m: Membership, start: int, end: int) -> None:
    for n, now in enumerate(range(start, end, 100)):
        m.link_down(B, 100 + n, now)
        drive(m, now, now + 100, answering={C})


def test_a_node_killed_is_pfail_after_the_node_timeout_not_sooner_nor_later() -> None:
    m = core()
    answered_then_killed(m, T0 + 500)
    refused(m, T0 + 500, T0 + 500 + TIMEOUT)
    assert m.nodes[B].flags == set()
    refused(m, T0 + 500 + TIMEOUT, T0 + 500 + TIMEOUT + 200)
    assert m.nodes[B].flags == {"pfail"}


def test_a_peer_killed_before_answering_after_its_restart_gets_a_fresh_node_timeout() -> None:
    m = core()
    answered_then_killed(m, T0 + 500)
    refused(m, T0 + 500, T0 + 1800)
    m.link_up(B, 200, T0 + 1800)  # it listens again: our PING goes out on the new link...
    m.link_down(B, 200, T0 + 1850)  # ...and it is killed before it answers
    refused(m, T0 + 1850, T0 + 1800 + TIMEOUT)
    # A PING from before the restart alone (sent 2 s before the restart, here) is no reason:
    # nothing has failed to answer on the new link for node_timeout yet.
    assert m.nodes[B].flags == set()
    refused(m, T0 + 1800 + TIMEOUT, T0 + 1800 + TIMEOUT + 200)
    assert m.nodes[B].flags == {"pfail"}


def test_a_new_link_that_answers_clears_the_pending_ping_at_once() -> None:
    m = core()
    answered_then_killed(m, T0 + 500)
    refused(m, T0 + 500, T0 + 1800)
    assert m.nodes[B].ping_sent == T0 + 500
    m.link_up(B, 200, T0 + 1800)
    pong(m, B, T0 + 1801, link=200)
    assert m.nodes[B].ping_sent == 0 and m.nodes[B].pong_received == T0 + 1801


def test_a_peer_that_accepts_links_but_never_answers_gets_no_fresh_clock_per_link() -> None:
    m = core()
    answered_then_killed(m, T0 + 500)
    first_link_at = T0 + 600
    for n, now in enumerate(range(first_link_at, first_link_at + 2 * TIMEOUT, 100)):
        m.link_up(B, 300 + n, now)
        m.link_down(B, 300 + n, now + 10)
        drive(m, now + 10, now + 100, answering={C})
        if now < first_link_at + TIMEOUT:
            assert m.nodes[B].flags == set(), now - first_link_at
    assert m.nodes[B].flags == {"pfail"}  # one node_timeout after the first new link's PING


def test_a_hung_peer_is_pfail_after_the_node_timeout_though_its_link_is_replaced() -> None:
    """B stops answering but its kernel still accepts links: the core closes the silent link
    (Disque's "reconnect the link" rule), the transport opens another at once."""
    m = core()
    drive(m, T0, T0 + 3 * TIMEOUT, answering={B, C})  # links older than node_timeout
    pinged = None
    next_link = 400
    for now in range(T0 + 3 * TIMEOUT, T0 + 6 * TIMEOUT, 100):
        m.tick(now)
        for effect in m.take_effects():
            if isinstance(effect, Send) and effect.type is MessageType.PING:
                if effect.node_id == C:
                    pong(m, C, now)
                elif pinged is None:
                    pinged = now
            if isinstance(effect, CloseLink):
                m.link_down(B, effect.link, now)
                next_link += 1
                m.link_up(B, next_link, now)
        if "pfail" in m.nodes[B].flags:
            break
    assert pinged is not None and m.nodes[B].flags == {"pfail"}
    assert pinged + TIMEOUT < now <= pinged + TIMEOUT + 100


def ping_from(m: Membership, node_id: str, now: int) -> None:
    """A PING from ``node_id`` on a link it opened (inbound: no outbound_to)."""
    body = Ping(7713, frozenset()).to_body()
    m.receive(Frame(MessageType.PING, node_id, body), 60, "10.0.0.3", "10.0.0.1", None, now)


def test_a_node_heard_on_its_own_link_is_not_pfail_while_our_ping_waits() -> None:
    # C restarted and linked to us first: our outbound link to it is still down, so our PING
    # from before the restart waits, but its PING says it is alive.
    m = core()
    m.link_down(C, LINK[C], T0 + 100)
    ping_from(m, C, T0 + TIMEOUT)
    drive(m, T0 + 200, T0 + 2 * TIMEOUT + 1, answering={B})
    assert 0 < m.nodes[C].ping_sent <= T0 + 100  # our own PING is still unanswered
    assert m.nodes[C].flags == set()
    # Silent for the node timeout since then: pfail, counted from what was last heard.
    drive(m, T0 + 2 * TIMEOUT + 1, T0 + 2 * TIMEOUT + 201, answering={B})
    assert m.nodes[C].flags == {"pfail"}
    assert [e for e in m.take_effects() if isinstance(e, CloseLink)] == []
