"""Bad input and faults for the job messages: nothing raises, no acknowledged job
is lost, duplicates stay within Disque's design."""

from __future__ import annotations

import random

from broker.clients import BLOCKED, Client
from cluster.sim import Faults
from cluster.wire import MessageType as M
from tests.cluster.jobsim import JobCluster

UNKNOWN = b"D-00000000-000000000000000000000000-05a1"


def test_repljob_for_a_job_that_exists_merges_holders_and_answers_gotjob_again() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500", "REPLICATE", "2")
    holder = next(i for i in c.holders(job_id) if i != 0)
    record = c.job(0, job_id).to_record()
    record[3] = "active"
    record[12] = [c.node_id(0), c.node_id(holder), "f" * 40]
    records_before = len(c.logs[holder])
    gotjob_before = len(c.messages(M.GOTJOB, job_id))
    c.deliver(holder, 0, M.REPLJOB, {"job": record, "noreply": False})
    c.run_for(10)
    assert "f" * 40 in c.job(holder, job_id).delivered
    assert len(c.messages(M.GOTJOB, job_id)) == gotjob_before + 1
    assert len(c.logs[holder]) == records_before  # not created twice


def test_every_job_message_about_an_unknown_job_is_harmless() -> None:
    c = JobCluster(3)
    bodies = {
        M.GOTJOB: {"id": UNKNOWN}, M.WILLQUEUE: {"id": UNKNOWN}, M.DELJOB: {"id": UNKNOWN},
        M.WORKING: {"id": UNKNOWN}, M.ENQUEUE: {"id": UNKNOWN, "delay": 0},
        M.QUEUED: {"id": UNKNOWN, "nack": True, "deliv": False},
        M.GOTACK: {"id": UNKNOWN, "known": True}, M.SETACK: {"id": UNKNOWN, "mayhave": 2},
    }
    for kind, body in bodies.items():
        c.deliver(0, 1, kind, body)
    c.run_for(10)
    assert c.broker(0).jobs == {}
    # Only SETACK is answered: GOTACK(known=false), so the sender's GC can finish.
    assert [(t, b) for _, s, _, t, b in c.sends if s == c.node_id(0)] == [
        (M.GOTACK, {"id": UNKNOWN, "known": False})]


def _waiting_for_copies() -> tuple[JobCluster, Client, bytes]:
    """Node 0 blocked on an ADDJOB REPLICATE 2 whose GOTJOBs never come back by themselves."""
    c = JobCluster(3)
    for j in (1, 2):
        c.sim.faults[(j, 0)] = Faults(drop=1.0)
    client = c.client()
    assert c.cmd(0, "ADDJOB", "q", "x", "0", "REPLICATE", "2", client=client) is BLOCKED
    return c, client, next(iter(c.broker(0).jobs))


def test_gotjob_from_a_node_not_asked_does_not_count() -> None:
    c, client, job_id = _waiting_for_copies()
    asked = [i for i in (1, 2) if c.node_id(i) in c.job(0, job_id).delivered]
    other = next(i for i in (1, 2) if i not in asked)
    c.deliver(0, other, M.GOTJOB, {"id": job_id})
    assert c.reply_to(0, client) is None
    c.deliver(0, asked[0], M.GOTJOB, {"id": job_id})
    assert c.reply_to(0, client) == job_id.decode()


def test_a_gotjob_from_a_stranger_or_malformed_is_counted_and_never_confirms() -> None:
    c, client, job_id = _waiting_for_copies()
    asked = next(i for i in (1, 2) if c.node_id(i) in c.job(0, job_id).delivered)
    stats = c.jn(0).core.stats
    malformed, received = stats["malformed"], stats["received"]
    for body in ({"id": job_id.decode()}, {"id": job_id[:-1]}, {"ID": job_id}):
        c.deliver(0, asked, M.GOTJOB, body)
    c.deliver(0, "e" * 40, M.GOTJOB, {"id": job_id})  # not a member
    assert c.reply_to(0, client) is None
    assert (stats["malformed"], stats["received"]) == (malformed + 3, received)
    c.deliver(0, asked, M.GOTJOB, {"id": job_id})
    assert stats["received"] == received + 1
    assert c.reply_to(0, client) == job_id.decode()


def test_a_node_dying_between_repljob_and_gotjob_is_replaced_by_another() -> None:
    c = JobCluster(4, seed=5)
    for j in (1, 2, 3):
        c.sim.faults[(j, 0)] = Faults(delay_ms=30)
    client = c.client()
    assert c.cmd(0, "ADDJOB", "q", "x", "2000", "REPLICATE", "3", client=client) is BLOCKED
    job_id = next(iter(c.broker(0).jobs))
    victim = next(i for i in (1, 2, 3) if c.node_id(i) in c.job(0, job_id).delivered)
    c.run_for(5)
    c.sim.kill(victim)  # it has the copy; its GOTJOB dies with its link
    assert c.run_until(lambda: c.reply_to(0, client) is not None, 1000)
    assert c.reply_to(0, client) == job_id.decode()
    live = [i for i in c.holders(job_id) if i != victim]
    assert len(live) == 3


def test_lost_repljobs_are_sent_again_until_replicated() -> None:
    c = JobCluster(3, seed=2, node_timeout=60_000)
    for j in (1, 2):
        c.sim.faults[(0, j)] = Faults(drop=0.6)
    job_id = c.addjob(0, "q", "x", "5000", "REPLICATE", "3", settle_ms=5000)
    assert sorted(c.holders(job_id)) == [0, 1, 2]
    assert len(c.sent(M.REPLJOB, job_id)) > 2


def test_malformed_job_bodies_are_logged_and_dropped() -> None:
    c = JobCluster(2)
    rng = random.Random(4)
    values = [None, 1, -1, True, "s", b"b", [], {}, [1, 2], UNKNOWN, b"D-bad", 2**40,
              {"id": UNKNOWN}]
    keys = ["id", "delay", "nack", "deliv", "mayhave", "known", "job", "noreply", "queue",
            "flags"]
    kinds = [M.REPLJOB, M.GOTJOB, M.ENQUEUE, M.WILLQUEUE, M.QUEUED, M.SETACK, M.GOTACK,
             M.DELJOB, M.WORKING, M.PAUSE]
    for _ in range(2000):
        body: object = {k: rng.choice(values) for k in rng.sample(keys, rng.randint(0, 4))}
        if rng.random() < 0.05:
            body = rng.choice(values)
        c.deliver(0, 1, rng.choice(kinds), body)
    assert c.jn(0).core.stats["malformed"] > 1000
    assert any(line.key.startswith("malformed-job:") for line in c.sim.nodes[0].logs)


def test_frames_from_a_node_not_in_the_table_are_ignored() -> None:
    c = JobCluster(2)
    job_id = c.addjob(0, "q", "x", "500")
    c.deliver(1, "e" * 40, M.DELJOB, {"id": job_id})
    assert job_id in c.broker(1).jobs


def test_duplicated_delayed_and_reordered_messages_lose_no_job() -> None:
    c = JobCluster(3, seed=11, node_timeout=60_000)
    for a in range(3):
        for b in range(3):
            if a != b:
                c.sim.faults[(a, b)] = Faults(delay_ms=5, jitter_ms=120, duplicate=0.5)
    rng = random.Random(3)
    jobs = [c.addjob(rng.randrange(3), "q", f"b{k}", "5000", "RETRY", "2", settle_ms=5000)
            for k in range(12)]
    acked: set[bytes] = set()
    deliveries: dict[bytes, int] = {}
    for _ in range(60):
        node = rng.randrange(3)
        reply = c.cmd(node, "GETJOB", "NOHANG", "FROM", "q")
        if isinstance(reply, list):
            job_id = reply[0][1]
            deliveries[job_id] = deliveries.get(job_id, 0) + 1
            verb = rng.choice(["ACKJOB", "ACKJOB", "NACK", "WORKING", "nothing"])
            if verb == "ACKJOB":
                acked.add(job_id)
            if verb != "nothing":
                c.cmd(rng.randrange(3), verb, job_id)
        c.run_for(rng.randrange(50, 400))
    c.run_for(5000)
    for job_id in jobs:
        if job_id in acked:
            assert c.holders(job_id) == [], job_id
        else:
            assert c.holders(job_id), f"{job_id!r} was lost"


def test_cluster_info_counts_job_messages_sent_and_received() -> None:
    c = JobCluster(3)

    def counters(i: int) -> tuple[int, int]:
        m = c.sim.nodes[i].membership
        return m.messages_sent, m.messages_received

    sent0, received0 = counters(0)
    c.addjob(0, "q", "x", "500")  # two REPLJOB out, two GOTJOB in (plus pings meanwhile)
    sent1, received1 = counters(0)
    assert sent1 - sent0 >= 2 and received1 - received0 >= 2
    assert c.jn(0).core.stats["sent"] == 2 and c.jn(0).core.stats["received"] == 2
    info = c.sim.command(0, "INFO")
    assert f"cluster_stats_messages_sent:{c.sim.nodes[0].membership.messages_sent}" in (
        info.decode())


def test_a_leaving_node_or_a_queue_paused_in_input_takes_no_replica() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500", "REPLICATE", "1")
    record = c.job(0, job_id).to_record()
    record[3] = "active"
    c.broker(1).set_leaving(True)
    c.deliver(1, 0, M.REPLJOB, {"job": record, "noreply": False})
    assert job_id not in c.broker(1).jobs
    assert c.cmd(2, "PAUSE", "q", "in") == "in"
    c.deliver(2, 0, M.REPLJOB, {"job": record, "noreply": False})
    assert job_id not in c.broker(2).jobs
    assert c.sent(M.GOTJOB, job_id) == []
