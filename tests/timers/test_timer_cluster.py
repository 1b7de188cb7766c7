"""Periodic timers on the in-process cluster (cluster/sim.py, fake clock): one fire per due
time across owner changes, failures, partitions and restarts."""

from __future__ import annotations

from itertools import pairwise

import pytest

from tests.timers.timersim import TimerCluster

PERIOD_MS = 10_000


def add_timer(c: TimerCluster, i: int = 0, name: str = "t", *extra: str) -> int:
    """TIMER ADD on node ``i`` (period 10 s, first due time now); returns the first due."""
    start = c.sim.now
    assert c.cmd(i, "TIMER", "ADD", name, str(PERIOD_MS // 1000), "jobs", "tick",
                 *extra) == "OK"
    return start


def assert_once_each(dues: list[int]) -> None:
    assert len(dues) == len(set(dues)), f"a due time fired twice: {dues}"
    assert dues == sorted(dues)


def test_every_due_time_fires_once_on_the_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    c = TimerCluster(monkeypatch)
    start = add_timer(c, 0)
    assert c.run_until(lambda: len(c.dues()) == 7, 7 * PERIOD_MS)
    c.run_for(PERIOD_MS - 100)  # the 8th due time has not come yet
    assert c.dues() == [start + k * PERIOD_MS for k in range(7)]
    owners = {c.owner(i) for i in range(3)}
    assert len(owners) == 1, "the nodes disagree about the owner"
    # The first fire may come from node 0 (it held the baton before handing it over);
    # every later one comes from the owner, at its due time (ticks are 20 ms).
    for at, node, _, due, reply in c.fires[1:]:
        assert node in owners and 0 <= at - due <= 20 and reply.startswith("D-")
    # The jobs are ordinary jobs: replicated, one per due time, all in the queue.
    ids = {reply.encode() for *_, reply in c.fires}
    assert len(ids) == 7
    for job_id in ids:
        assert len(c.holders(job_id)) >= 2 and len(c.queued_on(job_id)) == 1
    # Every node sees the same progress.
    assert len({c.info(i)[b"last-fired-due"] for i in range(3)}) == 1


def test_owner_killed_another_node_takes_over_without_firing_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = TimerCluster(monkeypatch)
    start = add_timer(c, 1)
    assert c.run_until(lambda: len(c.dues()) == 3, 3 * PERIOD_MS)
    owner = c.owner(0)
    c.run_for(PERIOD_MS // 2)
    killed_at = c.sim.now
    c.sim.kill(owner)
    c.run_for(6 * PERIOD_MS)
    dues = c.dues()
    assert_once_each(dues)
    after = [(node, due) for at, node, _, due, _ in c.fires if at > killed_at]
    assert after and all(node != owner for node, _ in after)
    # At most one due time is missed (the one in the takeover window, node timeout 2 s
    # < period); from then on every due time fires.
    expected = [start + k * PERIOD_MS for k in range(len(dues) + 1)
                if start + k * PERIOD_MS <= c.sim.now]
    missed = set(expected) - set(dues)
    assert len(missed) <= 1, missed
    gaps = [b - a for a, b in pairwise(dues)]
    assert max(gaps) <= 2 * PERIOD_MS


def test_owner_dies_right_after_firing_with_its_announcement_lost(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fire is in the owner's log and nowhere else: the next owner does not fire that
    due time again (it skips what the dead one may have fired), and a restart of the dead one
    keeps its job."""
    from cluster.sim import Faults

    c = TimerCluster(monkeypatch)
    start = add_timer(c, 0, "t", "REPLICATE", "1")
    assert c.run_until(lambda: len(c.dues()) == 2, 2 * PERIOD_MS)
    owner = c.owner(0)
    c.run_for(start + 2 * PERIOD_MS - 30 - c.sim.now)
    for other in range(3):
        if other != owner:  # from now on nothing the owner sends arrives
            c.sim.faults[(owner, other)] = Faults(drop=1.0)
    assert c.run_until(lambda: len(c.dues()) == 3, 100)
    assert c.fires[-1][1] == owner
    lost_due = c.dues()[-1]
    c.sim.kill(owner)
    c.sim.faults.clear()
    c.run_for(3 * PERIOD_MS)
    assert_once_each(c.dues())
    assert lost_due in c.dues() and c.dues().count(lost_due) == 1
    c.sim.restart(owner)
    assert c.run_until(c.meshed, 10_000)
    c.run_for(2 * PERIOD_MS)
    assert_once_each(c.dues())
    lost_job = next(r for *_, due, r in c.fires if due == lost_due).encode()
    assert c.holders(lost_job) == [owner]  # it came back from the log, once


def test_partition_minority_stops_majority_takes_over(monkeypatch: pytest.MonkeyPatch) -> None:
    c = TimerCluster(monkeypatch)
    add_timer(c, 0)
    assert c.run_until(lambda: len(c.dues()) == 2, 2 * PERIOD_MS)
    owner = c.owner(0)
    others = [i for i in range(3) if i != owner]
    c.run_for(PERIOD_MS // 3)
    cut_at = c.sim.now
    c.sim.partition({owner}, set(others))
    c.run_for(5 * PERIOD_MS)
    assert_once_each(c.dues())
    minority = [due for at, node, _, due, _ in c.fires if node == owner and at > cut_at + 2000]
    assert minority == [], "the minority side kept firing"
    majority = [due for at, node, _, due, _ in c.fires if node in others and at > cut_at]
    assert len(majority) >= 3
    c.sim.heal()
    assert c.run_until(c.meshed, 20_000)
    c.run_for(4 * PERIOD_MS)
    assert_once_each(c.dues())
    assert len({c.owner(i) for i in range(3)}) == 1
    assert len({c.info(i)[b"last-fired-due"] for i in range(3)}) == 1


def test_two_nodes_one_dies_the_survivor_has_no_majority(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = TimerCluster(monkeypatch, n=2)
    add_timer(c, 0)
    assert c.run_until(lambda: len(c.dues()) == 2, 2 * PERIOD_MS)
    owner = c.owner(0)
    c.sim.kill(owner)
    survivor = 1 - owner
    c.run_for(3 * PERIOD_MS)
    assert [n for _, n, *_ in c.fires[2:]] == []
    # Forgetting the dead node makes the survivor a cluster of one: it fires again.
    c.sim.command(survivor, "FORGET", c.node_id(owner))
    assert c.run_until(lambda: len(c.dues()) >= 3, 2 * PERIOD_MS)
    assert_once_each(c.dues())


def test_restart_after_several_periods_fires_once_for_the_missed_due_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = TimerCluster(monkeypatch, n=1)
    start = add_timer(c, 0)
    assert c.run_until(lambda: len(c.dues()) == 2, 2 * PERIOD_MS)
    c.sim.kill(0)
    c.run_for(5 * PERIOD_MS + PERIOD_MS // 2)
    down_until = c.sim.now
    c.sim.restart(0)
    assert c.run_until(lambda: len(c.dues()) == 3, 1000)
    latest = start + (down_until - start) // PERIOD_MS * PERIOD_MS
    assert c.dues()[2] == latest  # once, for the latest due time, not five times
    assert c.run_until(lambda: len(c.dues()) == 4, PERIOD_MS)
    assert c.dues()[3] == latest + PERIOD_MS


def test_a_node_joining_takes_its_timers_by_hand_over(monkeypatch: pytest.MonkeyPatch) -> None:
    c = TimerCluster(monkeypatch, n=2)
    for k in range(12):
        add_timer(c, 0, f"t{k}")
    c.run_for(3 * PERIOD_MS)
    c.sim.add_node(node_timeout=2000)
    c.sim.command(0, "MEET", c.sim.nodes[2].ip, str(c.sim.nodes[2].port))
    assert c.run_until(c.meshed, 10_000)
    c.run_for(4 * PERIOD_MS)
    moved = [k for k in range(12) if c.owner(0, f"t{k}".encode()) == 2]
    assert moved, "rendezvous hashing gave the new node no timer (seed-dependent)"
    for k in range(12):
        name = f"t{k}".encode()
        dues = c.dues(name)
        assert_once_each(dues)
        gaps = [b - a for a, b in pairwise(dues)]
        assert gaps and max(gaps) == PERIOD_MS, (k, gaps)  # nothing missed either
    late = [n for at, n, name, *_ in c.fires if at > c.sim.now - 2 * PERIOD_MS
            and int(name[1:]) in moved]
    assert set(late) == {2}


def test_a_leaving_node_hands_its_timers_over(monkeypatch: pytest.MonkeyPatch) -> None:
    c = TimerCluster(monkeypatch)
    add_timer(c, 0)
    assert c.run_until(lambda: len(c.dues()) == 2, 2 * PERIOD_MS)
    owner = c.owner(0)
    c.sim.set_leaving(owner, True)
    c.run_for(4 * PERIOD_MS)
    dues = c.dues()
    assert_once_each(dues)
    assert max(b - a for a, b in pairwise(dues)) == PERIOD_MS
    assert all(n != owner for _, n, *_ in c.fires[-3:])


def test_pause_resume_delete_reach_every_node(monkeypatch: pytest.MonkeyPatch) -> None:
    c = TimerCluster(monkeypatch)
    start = add_timer(c, 0)
    assert c.run_until(lambda: len(c.dues()) == 1, 1000)
    assert c.cmd(1, "TIMER", "PAUSE", "t") == "OK"
    c.run_for(3 * PERIOD_MS + 3000)
    assert len(c.dues()) == 1 and all(c.info(i)[b"paused"] == 1 for i in range(3))
    resumed = c.sim.now
    assert c.cmd(2, "TIMER", "RESUME", "t") == "OK"
    assert c.run_until(lambda: len(c.dues()) == 2, 2 * PERIOD_MS)
    # The due times that passed while paused are skipped: the next one is after RESUME.
    assert c.dues()[1] == start + ((resumed - start) // PERIOD_MS + 1) * PERIOD_MS
    assert c.cmd(0, "TIMER", "DEL", "t") == 1
    assert c.run_until(lambda: all(c.cmd(i, "TIMER", "GET", "t") is None for i in range(3)),
                       1000)
    c.run_for(3 * PERIOD_MS)
    assert len(c.dues()) == 2


def test_table_survives_restart_and_reaches_a_late_node(monkeypatch: pytest.MonkeyPatch) -> None:
    c = TimerCluster(monkeypatch)
    add_timer(c, 0, "a", "RETRY", "30")
    add_timer(c, 1, "b", "TTL", "600")
    assert c.run_until(lambda: all(len(c.cmd(i, "TIMER", "LIST")) == 2 for i in range(3)), 1000)
    c.sim.kill(2)
    assert c.cmd(0, "TIMER", "DEL", "b") == 1
    c.cmd(0, "TIMER", "ADD", "c", "20", "jobs", "x")
    c.sim.restart(2)
    assert c.run_until(lambda: c.meshed() and [e[1] for e in c.cmd(2, "TIMER", "LIST")]
                       == [b"a", b"c"], 20_000)
    assert c.info(2, "a")[b"params"] == [b"RETRY", b"30"]


def test_an_owner_waits_for_a_holder_only_it_sees_failing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Views that disagree for good: B and X cannot talk, A talks to both. For this timer X
    is the owner in A's and X's views, B in its own (it suspects X). B does not take the
    baton from X, which the cluster does not agree has failed: X keeps firing alone, once per
    due time."""
    from cluster.sim import Faults

    c = TimerCluster(monkeypatch)
    a, b, x = 0, 1, 2
    ids = [c.node_id(i) for i in range(3)]
    name = next(f"t{k}" for k in range(200)
                if max(ids, key=lambda n: _score(f"t{k}", n)) == ids[x]
                and max(ids[:2], key=lambda n: _score(f"t{k}", n)) == ids[b])
    add_timer(c, a, name)
    assert c.run_until(lambda: len(c.dues(name.encode())) == 1, 1000)
    c.sim.faults[(b, x)] = Faults(drop=1.0)
    c.sim.faults[(x, b)] = Faults(drop=1.0)
    assert c.run_until(lambda: c.owner(b, name.encode()) == b, 10_000)
    c.run_for(5 * PERIOD_MS)
    dues = c.dues(name.encode())
    assert_once_each(dues)
    assert max(y - z for z, y in pairwise(dues)) == PERIOD_MS
    assert {n for _, n, *_ in c.fires[1:]} == {x}
    assert c.syncs[b].counters["taken_over"] == 0 and c.owner(a, name.encode()) == x


def _score(name: str, node_id: str) -> bytes:
    import hashlib

    return hashlib.sha1(name.encode() + b"\0" + node_id.encode()).digest()


def test_malformed_timer_frames_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from cluster.wire import Frame, MessageType

    c = TimerCluster(monkeypatch, n=2)
    add_timer(c, 1, "t")
    assert c.run_until(lambda: c.cmd(0, "TIMER", "GET", "t") is not None, 1000)
    before = c.cmd(0, "TIMER", "LIST")
    sync = c.syncs[0]
    sync.take_effects()
    good = c.broker(1).periodic.entries[b"t"].to_record()
    newer = [good[0], good[1], good[2] + 10, good[3], [good[4][0] + 1, *good[4][1:]]]
    frames = [
        {"timers": "x"}, {"nope": 1}, {"timers": [["t"]]}, {"timers": [good], "full": 1},
        # the right shape, newer, but with ADDJOB options no node accepts: that record only
        {"timers": [[newer[0], {**newer[1], "params": [b"RETRY"]}, *newer[2:]]]},
        {"timers": [[b"u", {**newer[1], "period_ms": 0}, *newer[2:]]]},
    ]
    for body in frames:
        sync.receive(Frame(MessageType.TIMER, c.node_id(1), body), 0, "127.0.0.1",
                     "127.0.0.1", None, c.sim.now)
    # From a node not in the table: ignored whatever it says.
    sync.receive(Frame(MessageType.TIMER, "f" * 40, {"timers": [newer]}), 0, "127.0.0.1",
                 "127.0.0.1", None, c.sim.now)
    logged = [e for e in sync.take_effects() if getattr(e, "key", "").startswith("malformed-")]
    assert len(logged) == 6 and sync.stats["malformed"] == 6
    assert c.cmd(0, "TIMER", "LIST") == before
    assert b"u" not in c.broker(0).periodic.entries
    # The same newer record, well formed, is taken.
    sync.receive(Frame(MessageType.TIMER, c.node_id(1), {"timers": [newer]}), 0, "127.0.0.1",
                 "127.0.0.1", None, c.sim.now)
    assert c.broker(0).periodic.entries[b"t"].stamp == (newer[2], newer[3])
