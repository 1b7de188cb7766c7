"""Acknowledgements and their garbage collection: Disque's "Acknowledged jobs
garbage collection state machine" — SETACK, GOTACK into job.confirmed, DELJOB when every
copy confirmed, dummy ACKs, FASTACK, and the GC schedule."""

from __future__ import annotations

from cluster.job_messages import BATCH_OF
from cluster.sim import Faults
from cluster.wire import MessageType as M
from tests.cluster.jobsim import JobCluster

UNKNOWN_ODD = b"D-00000000-000000000000000000000000-05a1"  # at-least-once TTL field
UNKNOWN_EVEN = b"D-00000000-000000000000000000000000-05a0"  # at-most-once


def test_ackjob_on_a_replica_runs_setack_gotack_deljob_and_frees_every_copy() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500")
    assert c.cmd(1, "ACKJOB", job_id) == 1
    c.run_for(50)
    me, others = c.node_id(1), {c.node_id(0), c.node_id(2)}
    assert {(s, d) for s, d in c.messages(M.SETACK, job_id)} == {(me, o) for o in others}
    assert {(s, d) for s, d in c.messages(M.GOTACK, job_id)} == {(o, me) for o in others}
    assert {(s, d) for s, d in c.messages(M.DELJOB, job_id)} == {(me, o) for o in others}
    assert c.holders(job_id) == []
    # SETACK carried how many nodes the acker believes may have a copy.
    assert {b["mayhave"] for _, _, _, t, b in c.trace if t is M.SETACK} == {3}
    # The acked state and the final deletion are in each log.
    assert any(r.kind == "job" and r.payload[3] == "acked" for r in c.logs[1])
    assert any(r.kind == "del" and r.payload == job_id for r in c.logs[1])


def test_acking_again_is_zero_and_an_acked_job_is_never_requeued() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500", "RETRY", "2")
    c.sim.partition({1}, {0, 2})  # 1 keeps its acked copy: it cannot reach the others
    assert c.cmd(1, "ACKJOB", job_id) == 1
    assert c.cmd(1, "ACKJOB", job_id) == 0
    assert c.job(1, job_id).state.value == "acked"
    c.run_for(3000)
    assert c.job(1, job_id) is not None and c.job(1, job_id).state.value == "acked"


def test_ack_during_a_partition_then_heal_removes_every_copy() -> None:
    c = JobCluster(3, node_timeout=1000)
    job_id = c.addjob(0, "q", "x", "500", "RETRY", "2")
    assert c.cmd(0, "GETJOB", "NOHANG", "FROM", "q")[0][1] == job_id
    c.sim.partition({0, 1}, {2})
    assert c.cmd(1, "ACKJOB", job_id) == 1
    c.run_for(4000)
    # 2 did not hear of the ACK and requeued its copy: a duplicate Disque's design allows.
    assert c.queued_on(job_id) == [2]
    assert c.holders(job_id) != []  # 0 and 1 cannot finish GC without 2's GOTACK
    c.sim.heal()
    assert c.run_until(lambda: c.holders(job_id) == [], 20_000)


def test_a_lost_gotack_is_covered_by_the_other_holders_own_gc() -> None:
    c = JobCluster(3, node_timeout=60_000)
    job_id = c.addjob(0, "q", "x", "500")
    c.sim.faults[(2, 1)] = Faults(drop=1.0)  # 2's GOTACKs to the acker are lost
    assert c.cmd(1, "ACKJOB", job_id) == 1
    # 0 and 2 acked on SETACK and run their own GC: one of them collects every GOTACK and
    # sends DELJOB, which 1 (still missing 2's GOTACK) obeys.
    assert c.run_until(lambda: c.holders(job_id) == [], 5000)
    senders = {s for s, _ in c.messages(M.DELJOB, job_id)}
    assert senders and c.node_id(1) not in senders


def test_gc_of_a_job_whose_holder_is_down_retries_with_exponential_backoff() -> None:
    c = JobCluster(3, node_timeout=60_000)
    job_id = c.addjob(0, "q", "x", "500")
    c.sim.kill(2)
    t0 = c.sim.now
    assert c.cmd(1, "ACKJOB", job_id) == 1
    c.run_for(20_000)
    tries = [at - t0 for at, _, dst in c.sent(M.SETACK, job_id, src=1) if dst == c.node_id(2)]
    gaps = [b - a for a, b in zip(tries, tries[1:], strict=False)]
    # 1 s, 2 s, 4 s, 8 s (+-250 ms) between attempts: Disque's schedule.
    assert len(gaps) >= 4
    for k, gap in enumerate(gaps[:4]):
        assert abs(gap - 1000 * 2**k) <= 300, gaps
    assert sorted(c.holders(job_id)) == [0, 1]  # acked, waiting for 2
    c.sim.restart(2)
    assert c.run_until(lambda: c.holders(job_id) == [], 60_000)


def test_a_dummy_ack_is_broadcast_as_setack_zero_and_collected() -> None:
    c = JobCluster(3)
    assert c.cmd(0, "ACKJOB", UNKNOWN_ODD) == 0
    dummy = c.job(0, UNKNOWN_ODD)
    assert dummy is not None and dummy.state.value == "acked" and dummy.delivered == ()
    c.run_for(50)
    assert {b["mayhave"] for _, _, _, t, b in c.trace if t is M.SETACK} == {0}
    assert len(c.messages(M.SETACK, UNKNOWN_ODD)) == 2
    assert {b["known"] for _, _, _, t, b in c.trace if t is M.GOTACK} == {False}
    assert c.holders(UNKNOWN_ODD) == []  # nobody knows it: dropped


def test_no_dummy_ack_for_at_most_once_ids_nor_on_a_leaving_node() -> None:
    c = JobCluster(3)
    assert c.cmd(0, "ACKJOB", UNKNOWN_EVEN) == 0
    assert c.holders(UNKNOWN_EVEN) == [] and c.sends == []
    c.broker(1).set_leaving(True)
    assert c.cmd(1, "ACKJOB", UNKNOWN_ODD) == 0
    assert c.holders(UNKNOWN_ODD) == [] and c.sends == []


def test_a_dummy_ack_on_a_node_without_the_job_acks_the_copies_elsewhere() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500", "REPLICATE", "2")
    outsider = next(i for i in range(3) if i not in c.holders(job_id))
    assert c.cmd(outsider, "ACKJOB", job_id) == 0
    assert c.run_until(lambda: c.holders(job_id) == [], 5000)
    assert c.queued_on(job_id) == []


def test_fastack_deletes_every_copy_best_effort_and_broadcasts_unknown_ids() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500")
    assert c.cmd(2, "FASTACK", job_id) == 1
    c.run_for(20)
    assert c.holders(job_id) == []
    assert len(c.messages(M.DELJOB, job_id)) == 2
    assert c.cmd(2, "FASTACK", UNKNOWN_ODD) == 0
    c.run_for(20)
    assert len(c.messages(M.DELJOB, UNKNOWN_ODD)) == 2


def test_deljob_command_is_local_only() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500")
    assert c.cmd(0, "DELJOB", job_id) == 1
    c.run_for(20)
    assert sorted(c.holders(job_id)) == [1, 2]
    assert c.messages(M.DELJOB) == []


def test_setack_while_replicating_answers_the_client_then_acks() -> None:
    c = JobCluster(3)
    c.sim.faults[(1, 0)] = Faults(drop=1.0)  # 1's GOTJOB never arrives
    c.sim.faults[(2, 0)] = Faults(drop=1.0)
    client = c.client()
    c.cmd(0, "ADDJOB", "q", "x", "0", client=client)
    job_id = next(iter(c.broker(0).jobs))
    c.deliver(0, 1, M.SETACK, {"id": job_id, "mayhave": 3})
    assert c.reply_to(0, client) == job_id.decode()
    assert c.job(0, job_id).state.value == "acked"


def test_setack_from_a_node_that_knows_fewer_holders_gets_no_gotack_but_starts_our_gc() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500")  # delivered: all three
    c.sim.partition({0}, {1, 2})  # keep the answers and the GC on node 0 observable
    before = len(c.sends)
    c.deliver(0, 1, M.SETACK, {"id": job_id, "mayhave": 2})
    out = [(t, d, b) for _, s, d, t, b in c.sends[before:] if s == c.node_id(0)]
    assert c.job(0, job_id).state.value == "acked"
    # No GOTACK (we know more holders than the sender): our own GC sends SETACK(3).
    assert {t for t, _, _ in out} == {M.SETACK}
    assert {b["mayhave"] for _, _, b in out} == {3}


def test_setack_zero_about_a_known_job_is_answered_gotack_known_and_starts_our_gc() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500")
    c.sim.partition({0}, {1, 2})
    before = len(c.sends)
    c.deliver(0, 1, M.SETACK, {"id": job_id, "mayhave": 0})
    out = [(t, d, b) for _, s, d, t, b in c.sends[before:] if s == c.node_id(0)]
    assert (M.GOTACK, c.node_id(1), {"id": job_id, "known": True}) in out
    assert any(t is M.SETACK for t, _, _ in out)


def test_gotack_rules_of_the_readme() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500", "REPLICATE", "2")
    holder = next(i for i in c.holders(job_id) if i != 0)
    outsider = next(i for i in range(3) if i not in c.holders(job_id))
    c.sim.partition({0}, {1, 2})
    c.cmd(0, "ACKJOB", job_id)
    job = c.job(0, job_id)
    assert job is not None and job.confirmed == (c.node_id(0),)
    # known=false from a node not in delivered: not counted.
    c.deliver(0, outsider, M.GOTACK, {"id": job_id, "known": False})
    assert c.node_id(outsider) not in job.confirmed
    # known=true from it: it has a copy after all, so it joins delivered and confirmed.
    c.deliver(0, outsider, M.GOTACK, {"id": job_id, "known": True})
    assert c.node_id(outsider) in job.delivered and c.node_id(outsider) in job.confirmed
    assert c.job(0, job_id) is job  # the holder still has to confirm
    c.deliver(0, holder, M.GOTACK, {"id": job_id, "known": True})
    assert c.job(0, job_id) is None  # every copy confirmed: DELJOB to all, freed
    dels = {d for _, s, d, t, _ in c.sends if t is M.DELJOB and s == c.node_id(0)}
    assert dels == {c.node_id(holder), c.node_id(outsider)}


def test_a_dummy_ack_is_dropped_as_soon_as_a_node_that_knows_the_job_answers() -> None:
    c = JobCluster(3)
    c.sim.partition({0}, {1, 2})
    odd = b"D-00000000-000000000000000000000000-05a1"
    c.cmd(0, "ACKJOB", odd)
    assert c.job(0, odd) is not None
    c.deliver(0, 1, M.GOTACK, {"id": odd, "known": True})
    assert c.job(0, odd) is None


def test_ackjob_of_a_job_only_this_node_holds_is_collected_at_once_with_one_ack_record() -> None:
    # REPLICATE 1: nobody else has a copy, so no SETACK round and no acked record with the
    # body in the log, just the single-node "ack" record.
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500", "REPLICATE", "1")
    before = len(c.logs[0])
    assert c.cmd(0, "ACKJOB", job_id) == 1
    assert c.job(0, job_id) is None
    c.run_for(2000)
    assert c.messages(M.SETACK, job_id) == [] and c.messages(M.DELJOB, job_id) == []
    assert [(r.kind, r.payload) for r in c.logs[0][before:]] == [("ack", job_id)]
    assert c.cmd(0, "ACKJOB", job_id) == 0  # known no more: a dummy ACK, counted 0 as Disque


def test_acking_many_jobs_at_once_sends_one_frame_of_each_kind_per_node() -> None:
    c = JobCluster(3)
    ids = [c.addjob(0, "q", f"x{i}", "500") for i in range(50)]
    c.trace.clear()
    assert c.cmd(1, "ACKJOB", *ids) == 50
    c.run_for(50)
    assert all(c.holders(job_id) == [] for job_id in ids)
    me, others = c.node_id(1), {c.node_id(0), c.node_id(2)}
    for kind in (M.SETACK, M.GOTACK, M.DELJOB):
        # Every job's message still went to (or came from) each other node ...
        pairs = c.messages(kind)
        assert len(pairs) == 100
        # ... packed into one frame per node.
        frames = [(s, d) for _, s, d, t, _ in c.trace if t in (kind, BATCH_OF[kind])]
        assert sorted(frames) == sorted(
            (me, o) if kind is not M.GOTACK else (o, me) for o in others)


def test_fastack_of_many_jobs_sends_one_deljob_frame_per_node() -> None:
    c = JobCluster(3)
    ids = [c.addjob(0, "q", f"x{i}", "500") for i in range(30)]
    c.trace.clear()
    assert c.cmd(2, "FASTACK", *ids) == 30
    c.run_for(50)
    assert all(c.holders(job_id) == [] for job_id in ids)
    frames = [(t, len(b["items"])) for _, s, _, t, b in c.trace if s == c.node_id(2)]
    assert frames == [(M.DELJOB_BATCH, 30), (M.DELJOB_BATCH, 30)]


def test_a_batch_never_moves_a_message_past_another_sent_to_the_same_node() -> None:
    c = JobCluster(3)
    ids = [c.addjob(0, "q", f"x{i}", "500") for i in range(3)]
    core = c.jn(0).core
    core.take_effects()
    a, b = c.node_id(1), c.node_id(2)
    core.deljob(ids[0], (a, b))
    core.deljob(ids[1], (a, b))
    core.pause(b"q", 1)  # to every other node: ends both runs
    core.deljob(ids[2], (a,))
    sent = [(e.node_id, e.type, e.body.get("items", e.body.get("id")))
            for e in core.take_effects()]
    assert sent == [(a, M.DELJOB_BATCH, [ids[0], ids[1]]), (b, M.DELJOB_BATCH, [ids[0], ids[1]]),
                    (a, M.PAUSE, None), (b, M.PAUSE, None), (a, M.DELJOB, ids[2])]


def test_a_deljob_batch_with_one_bad_entry_or_from_a_stranger_frees_nothing() -> None:
    c = JobCluster(3)
    ids = [c.addjob(0, "q", f"x{i}", "500") for i in range(3)]
    stats = c.jn(1).core.stats
    malformed, received = stats["malformed"], stats["received"]
    for body in ({"items": [ids[0], ids[1][:-1]]}, {"items": [ids[0], ids[1].decode()]},
                 {"items": [ids[0]]}, {"items": ids[0]}):
        c.deliver(1, 0, M.DELJOB_BATCH, body)
    c.deliver(1, "e" * 40, M.DELJOB_BATCH, {"items": ids})  # not a member
    assert all(c.job(1, job_id) is not None for job_id in ids)
    assert (stats["malformed"], stats["received"]) == (malformed + 4, received)
    c.deliver(1, 0, M.DELJOB_BATCH, {"items": [ids[0], ids[2], UNKNOWN_ODD]})
    assert stats["received"] == received + 1
    assert [c.job(1, job_id) is None for job_id in ids] == [True, False, True]
    assert [r.payload for r in c.logs[1] if r.kind == "del"] == [ids[0], ids[2]]


def test_setack_and_gotack_batches_with_one_bad_entry_or_from_a_stranger_ack_nothing() -> None:
    c = JobCluster(3)
    ids = [c.addjob(0, "q", f"x{i}", "500") for i in range(3)]
    stats = c.jn(1).core.stats
    malformed, received = stats["malformed"], stats["received"]
    for kind, good in ((M.SETACK_BATCH, 3), (M.GOTACK_BATCH, True)):
        for items in ([[ids[0], good], [ids[1][:-1], good]], [[ids[0], good], [ids[1]]],
                      [[ids[0], good], [ids[1], "x"]], [[ids[0], good]]):
            c.deliver(1, 0, kind, {"items": items})
        c.deliver(1, "e" * 40, kind, {"items": [[i, good] for i in ids]})  # not a member
    assert all(c.job(1, job_id).state.value == "active" for job_id in ids)
    assert (stats["malformed"], stats["received"]) == (malformed + 8, received)
    # A good SETACK batch acks each job it names (and answers with one GOTACK frame).
    c.trace.clear()
    c.deliver(1, 0, M.SETACK_BATCH, {"items": [[ids[0], 3], [ids[2], 3]]})
    assert stats["received"] == received + 1
    assert [c.job(1, job_id).state.value for job_id in ids] == ["acked", "active", "acked"]
    c.sim.run_for(1)
    assert [(t, len(b["items"])) for _, s, _, t, b in c.trace
            if s == c.node_id(1)] == [(M.GOTACK_BATCH, 2)]


def test_fastack_without_a_log_frees_every_copy_and_builds_no_record() -> None:
    c = JobCluster(3)
    ids = [c.addjob(0, "q", f"x{i}", "500") for i in range(5)]
    for i in range(3):
        c.broker(i).log_wanted = False  # what the node sets while appendonly is off
    logged = {i: len(c.logs[i]) for i in range(3)}
    assert c.cmd(2, "FASTACK", *ids) == 5
    c.run_for(50)
    assert all(c.holders(job_id) == [] for job_id in ids)
    assert {i: len(c.logs[i]) for i in range(3)} == logged


def test_a_job_of_two_holders_is_freed_by_setack_and_gotack_without_deljob() -> None:
    c = JobCluster(3, node_timeout=60_000)
    job_id = c.addjob(0, "q", "x", "500", "REPLICATE", "2", "RETRY", "2")
    other = next(i for i in c.holders(job_id) if i != 0)
    c.sim.faults[(0, other)] = Faults(drop=1.0)  # hold 0's GOTACK back for a while
    assert c.cmd(other, "ACKJOB", job_id) == 1
    c.run_for(50)
    # 0 got the SETACK of the only other holder: its copy went at once, acked then deleted
    # in its log, while the acker still waits for the GOTACK.
    assert c.holders(job_id) == [other]
    kinds = [(r.kind, r.payload[3] if r.kind == "job" else None) for r in c.logs[0]
             if (r.payload[0] if r.kind == "job" else r.payload) == job_id]
    assert kinds[-2:] == [("job", "acked"), ("del", None)]
    c.sim.faults.clear()
    # The acker's GC retries; 0 no longer knows the job and says so, which completes it.
    assert c.run_until(lambda: c.holders(job_id) == [], 5000)
    assert c.messages(M.DELJOB, job_id) == []
    c.run_for(5000)  # past RETRY: no copy was left to come back
    assert c.holders(job_id) == [] and c.messages(M.QUEUED, job_id) == []


def test_a_third_holder_still_gets_its_deljob() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500", "REPLICATE", "3")
    assert c.cmd(1, "ACKJOB", job_id) == 1
    c.run_for(50)
    assert c.holders(job_id) == []
    # Each of 0 and 2 knows another holder besides the acker: they keep an acked copy until
    # the acker's DELJOB.
    assert {d for _, d in c.messages(M.DELJOB, job_id)} == {c.node_id(0), c.node_id(2)}


def test_a_gotack_from_the_only_other_holder_frees_the_job_without_deljob() -> None:
    c = JobCluster(3)
    job_id = c.addjob(0, "q", "x", "500", "REPLICATE", "2")
    holder = next(i for i in c.holders(job_id) if i != 0)
    c.sim.partition({0}, {1, 2})
    c.cmd(0, "ACKJOB", job_id)
    c.deliver(0, holder, M.GOTACK, {"id": job_id, "known": True})
    assert c.job(0, job_id) is None
    assert not [s for _, s, _, t, _ in c.sends if t is M.DELJOB and s == c.node_id(0)]
