"""Federation on the in-process harness: NEEDJOBS backoff with exact delays, ad hoc
versus broadcast requests, the unthrottled cases, a lost YOURJOBS, competing consumers,
leaving nodes, malformed and duplicated frames."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from broker.clients import BLOCKED, Client
from cluster.effects import LogLine
from cluster.sim import Faults
from cluster.wire import MessageType
from protocol import errors
from protocol.resp import NULL_ARRAY, Status
from tests.cluster.jobsim import JobCluster

NEED = MessageType.NEEDJOBS
YOURS = MessageType.YOURJOBS


def fed(n: int = 3) -> JobCluster:
    return JobCluster(n, federation=True)


def needjobs(c: JobCluster, src: int, dst: int) -> list[tuple[int, int]]:
    """(time, count) of every NEEDJOBS node ``src`` sent to node ``dst``."""
    a, b = c.node_id(src), c.node_id(dst)
    return [(at, body["count"]) for at, s, d, t, body in c.sends
            if t is NEED and s == a and d == b]


def block(c: JobCluster, i: int, queue: str = "q", timeout: str = "0") -> Client:
    client = c.client()
    assert c.cmd(i, "GETJOB", "TIMEOUT", timeout, "FROM", queue, client=client) is BLOCKED
    c.run_for(0)  # the frames this caused, and their answers, at this same instant
    return client


def local_jobs(c: JobCluster, i: int, n: int, queue: str = "q", retry: str = "300") -> list[bytes]:
    """``n`` jobs queued on node ``i`` only (REPLICATE 1)."""
    return [c.addjob(i, queue, f"body{k}", "0", "REPLICATE", "1", "RETRY", retry)
            for k in range(n)]


def test_broadcast_backoff_doubles_from_2s_to_30s_exactly() -> None:
    c = fed()
    t0 = c.sim.now
    block(c, 1)
    c.run_for(130_000)
    to2 = needjobs(c, 1, 2)
    assert [at - t0 for at, _ in to2] == [0, 4_000, 12_000, 28_000, 58_000, 88_000, 118_000]
    assert {count for _, count in to2} == {1}  # a broadcast asks for one job
    assert needjobs(c, 1, 0) == to2  # the whole cluster
    assert not needjobs(c, 0, 1) and not needjobs(c, 2, 1)  # nobody else waits


def test_adhoc_to_recent_sources_backs_off_from_25ms_to_2s_then_only_broadcasts() -> None:
    c = fed()
    local_jobs(c, 0, 1)
    t0 = c.sim.now
    a = block(c, 1)
    # Broadcast at once -> node 0 answers with its job -> A is served -> the queue is empty
    # again with a positive import rate: node 0, now a source, is asked again at once.
    assert c.reply_to(1, a)[0][2] == b"body0"
    block(c, 1)
    c.run_for(20_000)
    to0 = [at - t0 for at, _ in needjobs(c, 1, 0)]
    bcast = [at - t0 for at, _ in needjobs(c, 1, 2)]
    # A new source reset the broadcast delay to 2 s, doubling from there.
    assert bcast == [0, 2_000, 6_000, 14_000]
    adhoc = sorted((Counter(to0) - Counter(bcast)).elements())  # node 0 gets both kinds
    # At 0 the unthrottled one (A took the last job), then 50 ms doubling from there (the
    # attempt counter was reset by the YOURJOBS and counted that first request), to 1.6 s.
    # The source is forgotten 5 s after its last YOURJOBS: no ad hoc request after that.
    assert adhoc == [0, 50, 150, 350, 750, 1_550, 3_150]


def test_each_delay_is_a_directive() -> None:
    c = fed()
    for i in range(3):
        cfg = c.broker(i).config
        assert (cfg.needjobs_bcast_min_delay, cfg.needjobs_bcast_max_delay,
                cfg.needjobs_adhoc_min_delay, cfg.needjobs_adhoc_max_delay) == (
                    2000, 30000, 25, 2000)
    cfg = c.broker(1).config
    cfg.set("needjobs-bcast-min-delay", ["100"])
    cfg.set("needjobs-bcast-max-delay", ["500"])
    t0 = c.sim.now
    block(c, 1)
    c.run_for(2_000)
    assert [at - t0 for at, _ in needjobs(c, 1, 2)] == [0, 200, 600, 1_100, 1_600]


def test_consuming_the_last_job_with_a_positive_rate_asks_at_once() -> None:
    c = fed()
    local_jobs(c, 0, 10)
    t0 = c.sim.now
    a = block(c, 1)
    assert c.reply_to(1, a) is not None
    # The ad hoc NEEDJOBS that followed asked for 5: two round trips at the rate (20/s, no
    # round trip measured yet: 25 ms each) is 1 job, the least request is 5. Node 0 had 9
    # (< 2 x 5): it sent half, 4, and the fifth at its next tick.
    assert needjobs(c, 1, 0)[-1] == (t0, 5)
    sizes = [len(b["jobs"]) for _, s, _, t, b in c.sends if t is YOURS and s == c.node_id(0)]
    assert sizes == [1, 4, 1]
    assert len(c.broker(1).queues[b"q"]) == 5
    c.run_for(10)
    q = c.broker(1).queues[b"q"]
    # The round trip measured 0 ms, taken as 1: two of them at ~100 jobs/s is 1 job.
    assert (q.fed.rtt, q.low_water) == (0, 1)
    sent_before = len(needjobs(c, 1, 0))
    for _ in range(3):
        assert c.cmd(1, "GETJOB", "NOHANG", "FROM", "q")
    assert len(needjobs(c, 1, 0)) == sent_before  # more than the low water left: no request
    assert c.cmd(1, "GETJOB", "NOHANG", "FROM", "q")  # leaves 1, the low water
    # Unthrottled: 10 ms after the previous ad hoc request, within its 25 ms delay (all
    # it asked for came, so nothing is on its way).
    assert needjobs(c, 1, 0)[-1] == (t0 + 10, 5)
    assert c.cmd(1, "GETJOB", "NOHANG", "FROM", "q")  # the last one: its answer is owed
    assert len(needjobs(c, 1, 0)) == sent_before + 1


def test_an_empty_queue_alone_is_throttled() -> None:
    c = fed()
    local_jobs(c, 0, 1)
    t0 = c.sim.now
    block(c, 1)
    c.run_for(10)
    before = len(needjobs(c, 1, 0))
    assert c.cmd(1, "GETJOB", "NOHANG", "FROM", "q") is not None
    assert len(needjobs(c, 1, 0)) == before  # GETJOB on an empty queue: within the delay
    assert c.sim.now == t0 + 10


def test_a_blocked_client_taking_the_last_job_asks_at_once() -> None:
    c = fed()
    local_jobs(c, 0, 1)
    t0 = c.sim.now
    block(c, 1)  # the broadcast brings it; then 5 more asked for at once: none there
    c.run_for(30)  # past the 25 ms a short source is left to send the rest
    b = block(c, 1)
    before = len(needjobs(c, 1, 0))
    c.addjob(1, "q", "local", "0", "REPLICATE", "1")  # served to the blocked client
    assert c.reply_to(1, b)[0][2] == b"local"
    # At once, within the ad hoc delay (50 ms after the second request).
    assert needjobs(c, 1, 0)[before:] == [(t0 + 30, 5)]


def test_a_source_short_of_jobs_is_not_asked_again_while_it_owes_some() -> None:
    c = fed()
    local_jobs(c, 0, 1)
    t0 = c.sim.now
    block(c, 1)  # the broadcast brings the one job; asked for 5 more, none there
    assert needjobs(c, 1, 0) == [(t0, 1), (t0, 5)]
    for _ in range(4):
        # Each job added on node 0 goes at once (the ask kept there) and is taken at once:
        # its last job each time, yet node 1 does not ask again, it waits for the rest.
        c.run_for(5)
        b = block(c, 1)
        local_jobs(c, 0, 1)
        c.run_for(0)
        assert c.reply_to(1, b)[0][2] == b"body0"
    assert needjobs(c, 1, 0) == [(t0, 1), (t0, 5)]
    c.run_for(5)
    b = block(c, 1)
    local_jobs(c, 0, 1)
    c.run_for(0)
    assert c.reply_to(1, b) is not None
    # The fifth came: all it asked for, so its client taking it asks again at once.
    assert needjobs(c, 1, 0)[2:] == [(t0 + 25, 5)]


def test_no_import_rate_no_request_when_the_last_job_goes() -> None:
    c = fed()
    local_jobs(c, 1, 1)
    assert c.cmd(1, "GETJOB", "NOHANG", "FROM", "q")
    assert not needjobs(c, 1, 0) and not needjobs(c, 1, 2)


def test_qstat_and_info_after_a_federated_getjob_match_the_reference_shape() -> None:
    c = fed()
    [job_id] = local_jobs(c, 2, 1, queue="fedq2", retry="0")
    a = block(c, 0, "fedq2", "3000")
    assert c.reply_to(0, a) == [[b"fedq2", job_id, b"body0"]]
    assert c.cmd(0, "QSTAT", "fedq2") == [
        b"name", b"fedq2", b"len", 0, b"age", 0, b"idle", 0, b"blocked", 0,
        b"import-from", [c.node_id(2).encode()], b"import-rate", 20,
        b"jobs-in", 1, b"jobs-out", 1, b"pause", b"none"]
    assert c.cmd(0, "QSCAN", "IMPORTRATE", "20")[1] == [b"fedq2"]
    assert c.cmd(0, "INFO", "federation") == (
        b"# Federation\r\njobs_imported:1\r\njobs_exported:0\r\nneedjobs_sent:3\r\n"
        b"yourjobs_sent:0\r\n")
    assert "yourjobs_sent:1\r\n" in c.cmd(2, "INFO", "federation").decode()
    assert "jobs_exported:1\r\n" in c.cmd(2, "INFO", "all").decode()
    # INFO jobs stays Disque's, byte for byte.
    assert c.cmd(0, "INFO", "jobs") == b"# Jobs\r\nregistered_jobs:1\r\n"
    # At most once: moved, not copied.
    assert c.holders(job_id) == [0]
    c.run_for(6_000)
    assert c.cmd(0, "QSTAT", "fedq2")[13] == 0  # no import for 5 s: rate 0


def test_a_lost_yourjobs_is_recovered_by_the_retry() -> None:
    c = fed()
    [job_id] = local_jobs(c, 0, 1, retry="5")
    c.sim.faults[(0, 1)] = Faults(drop=1.0)
    a = block(c, 1)
    c.sim.faults.clear()
    assert c.reply_to(1, a) is None
    assert len(c.sent(YOURS, src=0)) == 1
    assert c.job(0, job_id).state.value == "active"  # out of the queue, still here
    # Node 0 requeues it after RETRY; the next broadcast (at 4 s, then 12 s) finds it.
    assert c.run_until(lambda: c.reply_to(1, a) is not None, 20_000)
    assert c.reply_to(1, a) == [[b"q", job_id, b"body0"]]


def test_a_lost_at_most_once_job_is_gone_never_doubled() -> None:
    c = fed()
    [job_id] = local_jobs(c, 0, 1, retry="0")
    c.sim.faults[(0, 1)] = Faults(drop=1.0)
    a = block(c, 1)
    c.sim.faults.clear()
    c.run_for(40_000)
    assert c.reply_to(1, a) is None and c.holders(job_id) == []


def _consume(c: JobCluster, consumers: list[int], total: int, max_ms: int) -> list[bytes]:
    """Blocking consumers on ``consumers``; each job received is acked and another GETJOB
    issued. Returns the IDs delivered, in order, duplicates included."""
    got: list[bytes] = []

    def getjob(i: int) -> Client:
        while True:  # jobs imported earlier may be queued here already
            client = c.client()
            reply = c.cmd(i, "GETJOB", "TIMEOUT", "0", "FROM", "q", client=client)
            if reply is BLOCKED:
                return client
            got.append(reply[0][1])
            assert c.cmd(i, "ACKJOB", reply[0][1]) == 1

    waiting: dict[int, Client] = {i: getjob(i) for i in consumers}
    seen_replies = {i: 0 for i in consumers}
    deadline = c.sim.now + max_ms
    while c.sim.now < deadline and len(set(got)) < total:
        c.run_for(5)
        for i in consumers:
            replies = c.blocked_replies.get(i, [])
            while seen_replies[i] < len(replies):
                client, value = replies[seen_replies[i]]
                seen_replies[i] += 1
                if client is not waiting[i]:
                    continue
                assert isinstance(value, list) and value, value
                job_id = value[0][1]
                got.append(job_id)
                assert c.cmd(i, "ACKJOB", job_id) == 1
                waiting[i] = getjob(i)
    return got


@pytest.mark.parametrize("replicate", ["1", "3"])
def test_two_consumers_on_two_nodes_compete_for_one_producers_jobs(replicate: str) -> None:
    c = fed()
    ids = {c.addjob(0, "q", f"j{k}", "0", "REPLICATE", replicate) for k in range(200)}
    got = _consume(c, [1, 2], len(ids), 60_000)
    assert len(got) == len(set(got)), "a job was delivered twice"
    assert set(got) == ids, "a job was lost"
    by_node = {i: c.broker(i).federation.info() for i in range(3)}  # type: ignore[union-attr]
    assert dict(by_node[0])["jobs_exported"] == 200
    assert dict(by_node[1])["jobs_imported"] > 0 and dict(by_node[2])["jobs_imported"] > 0


def test_a_leaving_node_never_asks_and_still_answers() -> None:
    c = fed()
    local_jobs(c, 0, 4)
    for i in (0, 1):
        assert c.cmd(i, "CLUSTER", "LEAVING", "yes") == Status("OK")
    c.run_for(100)
    assert c.cmd(1, "GETJOB", "NOHANG", "FROM", "q") is NULL_ARRAY
    assert c.cmd(1, "GETJOB", "FROM", "q") == errors.LEAVING
    c.run_for(40_000)
    assert not needjobs(c, 1, 0) and not needjobs(c, 1, 2)
    # Node 0 is leaving too, and still answers node 2's broadcast NEEDJOBS (count 1: one
    # job, as 4 >= 2 x 1); then node 2 asks its new source for more at once.
    a = block(c, 2)
    assert c.reply_to(2, a) is not None
    # The ad hoc NEEDJOBS asked for 5: node 0 had 3, gave half (1) and the rest at its
    # next tick.
    assert (len(c.broker(0).queues[b"q"]), len(c.broker(2).queues[b"q"])) == (0, 3)
    assert dict(c.broker(0).federation.info())["jobs_exported"] == 4  # type: ignore[union-attr]


def test_malformed_bodies_are_logged_and_dropped() -> None:
    c = fed()
    local_jobs(c, 0, 2)
    good = c.broker(0).jobs[next(iter(c.broker(0).jobs))].to_record()
    queued = list(good)
    bad_state = list(good)
    bad_state[3] = "queued"
    no_holders = list(good)
    no_holders[3], no_holders[12] = "active", []
    bodies: list[tuple[MessageType, Any]] = [
        (NEED, {"queue": 5, "count": 1}), (NEED, {"queue": b"q", "count": 0}),
        (NEED, {"queue": b"q", "count": 1001}), (NEED, {"queue": b"", "count": 1}),
        (NEED, {"queue": b"q", "count": True}), (NEED, [b"q", 1]), (NEED, {"queue": b"q"}),
        (YOURS, {"jobs": []}), (YOURS, {"jobs": [[1, 2]]}), (YOURS, {"jobs": [bad_state]}),
        (YOURS, {"jobs": [no_holders]}), (YOURS, {"jobs": "x"}), (YOURS, None),
        (YOURS, {"jobs": [queued] * 101}),
    ]
    for kind, body in bodies:
        c.deliver(0, 1, kind, body)
        c.deliver(1, 0, kind, body)
    fed0 = c.broker(0).federation
    assert fed0 is not None and fed0.stats["malformed"] == len(bodies)  # type: ignore[attr-defined]
    assert len(c.broker(0).queues[b"q"]) == 2 and not c.sent(YOURS)
    logs = [e for e in c.sim.nodes[0].logs if isinstance(e, LogLine)]
    assert sum(e.key.startswith("malformed-fed:") for e in logs) == len(bodies)
    assert not c.broker(1).jobs


def test_frames_from_unknown_nodes_are_ignored() -> None:
    c = fed()
    local_jobs(c, 0, 2)
    c.deliver(0, "ab" * 20, NEED, {"queue": b"q", "count": 1})
    assert len(c.broker(0).queues[b"q"]) == 2


def test_duplicated_and_reordered_frames_deliver_no_job_twice() -> None:
    c = fed()
    ids = set(local_jobs(c, 0, 60)) | set(local_jobs(c, 0, 60, retry="0"))
    for a, b in [(0, 1), (1, 0), (0, 2), (2, 0)]:
        c.sim.faults[(a, b)] = Faults(duplicate=1.0, jitter_ms=30)
    got = _consume(c, [1, 2], len(ids), 60_000)
    assert len(got) == len(set(got)), "a job was delivered twice"
    assert set(got) == ids


def test_a_duplicated_yourjobs_of_a_delivered_job_is_not_queued_again() -> None:
    c = fed()
    [j1] = local_jobs(c, 0, 1)
    [j0] = local_jobs(c, 0, 1, retry="0")
    records = [c.broker(0).jobs[j].to_record() for j in (j1, j0)]
    for r in records:
        r[3] = "active"
    for _ in range(2):
        c.deliver(1, 0, YOURS, {"jobs": records})
    assert len(c.broker(1).queues[b"q"]) == 2  # the second copy is a duplicate
    assert len(c.cmd(1, "GETJOB", "COUNT", "5", "NOHANG", "FROM", "q")) == 2
    c.deliver(1, 0, YOURS, {"jobs": records})
    assert c.cmd(1, "GETJOB", "NOHANG", "FROM", "q") is NULL_ARRAY


def test_requests_stop_when_no_client_waits_any_more() -> None:
    c = fed()
    t0 = c.sim.now
    a = block(c, 1)
    block(c, 1, "other", "5000")  # times out at 5 s
    c.run_for(3_000)
    c.broker(1).client_gone(a)
    c.run_for(60_000)
    sent = [(at - t0, body["queue"]) for at, s, d, t, body in c.sends
            if t is NEED and s == c.node_id(1) and d == c.node_id(2)]
    # "q": at once only (its client left before the 4 s one); "other": at once and at 4 s.
    assert sent == [(0, b"q"), (0, b"other"), (4_000, b"other")]
    assert c.broker(1).federation.next_deadline() is None  # type: ignore[union-attr]


def test_waiting_clients_are_asked_for_at_once_by_their_count_until_served() -> None:
    c = fed()
    local_jobs(c, 0, 300)
    t0 = c.sim.now
    clients = []
    for _ in range(3):
        client = c.client()
        assert c.cmd(1, "GETJOB", "TIMEOUT", "0", "COUNT", "30", "FROM", "q",
                     client=client) is BLOCKED
        clients.append(client)
    c.run_for(0)
    # The broadcast brought one job (one client served); the two still waiting asked their
    # only source again at once, for what they want (2 x 30), not at the 25 ms ad hoc delay.
    asked = needjobs(c, 1, 0)
    assert asked[:2] == [(t0, 1), (t0, 60)]
    assert all(c.reply_to(1, client) for client in clients)
    assert c.sim.now == t0
    # Served: no client waits, so no further request was made at once.
    assert len(asked) == 2


def test_a_source_with_nothing_left_ends_the_chain_of_requests() -> None:
    c = fed()
    local_jobs(c, 0, 2)
    t0 = c.sim.now
    for _ in range(3):
        assert c.cmd(1, "GETJOB", "TIMEOUT", "0", "COUNT", "10", "FROM", "q",
                     client=c.client()) is BLOCKED
    c.run_for(0)
    # One job for the broadcast, then a request at once for the two clients still waiting
    # (2 x COUNT 10), answered with the last job; the source then owes 19 and holds
    # nothing, so the third client waits for the ad hoc backoff, not a loop of requests.
    at_t0 = [n for at, n in needjobs(c, 1, 0) if at == t0]
    assert at_t0 == [1, 20]
    assert c.cmd(0, "QLEN", "q") == 0
    c.run_for(1000)
    later = [at - t0 for at, _ in needjobs(c, 1, 0)][2:]
    assert later == [25, 75, 175, 375, 775]


def test_a_request_over_100_jobs_is_answered_in_frames_of_100() -> None:
    c = fed()
    local_jobs(c, 0, 700)
    t0 = c.sim.now
    for _ in range(2):
        assert c.cmd(1, "GETJOB", "TIMEOUT", "0", "COUNT", "150", "FROM", "q",
                     client=c.client()) is BLOCKED
    c.run_for(0)
    # One job from the broadcast, then one request for the waiting client's 150.
    assert needjobs(c, 1, 0)[:2] == [(t0, 1), (t0, 150)]
    sizes = [len(b["jobs"]) for _, s, _, t, b in c.sends if t is YOURS and s == c.node_id(0)]
    assert sizes[:3] == [1, 100, 50]


def test_jobs_queued_after_a_short_answer_go_to_the_asker_at_once() -> None:
    c = fed()
    t0 = c.sim.now
    a = block(c, 1)  # its broadcast finds node 0 without the queue: an ask kept there
    c.run_for(300)
    local_jobs(c, 0, 1)
    c.run_for(0)
    # Not at the next broadcast, 4 s later: node 0 answered the kept ask when the job came.
    assert c.reply_to(1, a)[0][2] == b"body0"
    assert c.sim.now == t0 + 300
    assert [at - t0 for at, _ in needjobs(c, 1, 0)][:1] == [0]
    assert c.cmd(0, "QLEN", "q") == 0


def test_a_kept_ask_lasts_the_ad_hoc_max_delay() -> None:
    c = fed()
    t0 = c.sim.now
    a = block(c, 1)
    c.run_for(2_001)  # needjobs-adhoc-max-delay (2 s) after the broadcast: forgotten
    local_jobs(c, 0, 1)
    c.run_for(0)
    assert c.reply_to(1, a) is None
    assert c.cmd(0, "QLEN", "q") == 1
    c.run_for(4_000)  # the next broadcast, 4 s after the first, fetches it
    assert c.reply_to(1, a)[0][2] == b"body0"
    assert needjobs(c, 1, 0)[1][0] == t0 + 4_000


def test_a_kept_ask_gets_only_what_it_still_lacks_and_its_share() -> None:
    c = fed()
    block(c, 1)  # asks for 1 by broadcast
    c.run_for(10)
    t1 = c.sim.now
    local_jobs(c, 0, 3)
    c.run_for(0)
    # One job answers the kept ask in full; then node 1's client took its last job with a
    # positive rate, so it asked for 5 at once, and got half of the two left, and the other
    # at node 0's next tick (kept asks are answered with all the queue holds).
    sizes = [len(b["jobs"]) for at, s, _, t, b in c.sends
             if t is YOURS and s == c.node_id(0) and at == t1]
    assert sizes == [1, 1, 1]
    assert needjobs(c, 1, 0)[-1] == (t1, 5)
    assert (c.cmd(0, "QLEN", "q"), c.cmd(1, "QLEN", "q")) == (0, 2)


def test_an_importing_node_keeps_no_ask() -> None:
    c = fed()
    local_jobs(c, 0, 1)
    block(c, 1)  # node 1 imports the job from node 0: its import rate is positive
    c.run_for(10)
    # Node 2 asks node 1, which is importing that queue: no answer, no ask kept.
    block(c, 2)
    local_jobs(c, 1, 1)
    c.run_for(0)
    assert c.cmd(1, "QLEN", "q") == 1


def test_jobs_added_on_one_node_reach_consumers_on_another_once_each() -> None:
    c = fed()
    ids: list[bytes] = []
    consumers = [c.client() for _ in range(3)]
    waiting = {cl: True for cl in consumers}
    got: list[bytes] = []

    def getjob(client: Client) -> None:
        reply = c.cmd(1, "GETJOB", "TIMEOUT", "0", "FROM", "q", client=client)
        if reply is BLOCKED:
            waiting[client] = True
        else:
            take(reply[0][1])
            getjob(client)

    def take(job_id: bytes) -> None:
        got.append(job_id)
        assert c.cmd(1, "ACKJOB", job_id) == 1

    seen = 0
    added: dict[bytes, int] = {}
    for cl in consumers:
        getjob(cl)
    def serve() -> None:
        nonlocal seen
        replies = c.blocked_replies.get(1, [])
        while seen < len(replies):
            client, value = replies[seen]
            seen += 1
            take(value[0][1])
            getjob(client)

    for k in range(300):
        # Bursts of 1 to 4 jobs, 0 to 60 ms apart: the producer node is now empty, now not.
        for _ in range(1 + k % 4):
            ids.extend(local_jobs(c, 0, 1))
            added[ids[-1]] = c.sim.now
        c.run_for((k * 37) % 61)
        serve()
    deadline = c.sim.now + 30_000
    while len(got) < len(ids) and c.sim.now < deadline:
        c.run_for(10)
        serve()
    assert len(got) == len(set(got)), "a job was delivered twice"
    assert set(got) == set(ids), "a job was lost"
    info = [dict(c.broker(i).federation.info()) for i in range(3)]  # type: ignore[union-attr]
    assert info[0]["jobs_exported"] == info[1]["jobs_imported"] == len(ids)
    assert info[1]["jobs_exported"] == info[2]["jobs_imported"] == 0  # none moved back
    # Each job left node 0 the instant it was added (node 1's clients keep an ask there), not
    # at node 1's next request, 25 ms to 2 s later.
    left = {rec[0]: at for at, s, _, t, b in c.sends if t is YOURS and s == c.node_id(0)
            for rec in b["jobs"]}
    held = [left[i] - added[i] for i in ids]
    assert max(held) == 0, sorted(held)[len(held) // 2:]
    c.run_for(5_000)  # the acks reached the source: nothing left anywhere
    assert [len(c.broker(i).jobs) for i in range(3)] == [0, 0, 0]


def test_a_steady_consumer_is_asked_for_ahead_and_never_runs_dry() -> None:
    c = fed()
    for pair in ((0, 1), (1, 0)):
        c.sim.faults[pair] = Faults(delay_ms=5)  # a 10 ms round trip
    local_jobs(c, 0, 3000, retry="0")
    t0 = c.sim.now
    block(c, 1)
    c.run_for(20)
    dry, most = 0, 0
    for k in range(2000):  # a job a millisecond
        c.run_for(1)
        if c.cmd(1, "GETJOB", "NOHANG", "FROM", "q") is NULL_ARRAY and k >= 200:
            dry += 1
        if k >= 500:
            most = max(most, c.cmd(1, "QLEN", "q"))
    q = c.broker(1).queues[b"q"]
    # 2 x 1000/s x 10 ms, the rate ~1005/s; the deviation of a steady link decayed to 0.
    assert (q.fed.rtt, q.fed.rttvar, q.low_water) == (10, 0, 21)
    # Asked for when 21 jobs were left, not when none: never dry once the rate is known.
    assert dry == 0
    # Two low waters a request (not a second's worth, 1,000): at most ~60 jobs wait here.
    assert {n for at, n in needjobs(c, 1, 0) if at - t0 >= 500} == {40}
    assert most <= 60


def test_a_source_late_now_and_then_is_asked_for_earlier() -> None:
    """A 2 ms round trip, but 20 ms for the frames sent in the first 10 ms of every 100 (a
    loaded source's process waits for the CPU): the low water covers the round trip's
    deviation too, so the late answers still come before the queue runs dry."""
    c = fed()
    fast, slow = Faults(delay_ms=1), Faults(delay_ms=10)
    for pair in ((0, 1), (1, 0)):
        c.sim.faults[pair] = fast
    local_jobs(c, 0, 3000, retry="0")
    block(c, 1)
    c.run_for(20)
    dry = 0
    for k in range(2000):  # a job a millisecond
        for pair in ((0, 1), (1, 0)):
            c.sim.faults[pair] = slow if k % 100 < 10 else fast
        c.run_for(1)
        if c.cmd(1, "GETJOB", "NOHANG", "FROM", "q") is NULL_ARRAY and k >= 200:
            dry += 1
    q = c.broker(1).queues[b"q"]
    assert q.fed.rttvar > 0
    assert q.low_water > -(-2 * 1000 * q.fed.rtt // 1000)  # more than two round trips' worth
    assert dry == 0


def test_a_job_imported_then_acked_arms_one_timer_entry_at_each_step() -> None:
    # Each timer move leaves a stale entry behind until the wheel compacts: an import and an
    # ACKJOB each arm the job once (enqueue_job, then the GC attempt).
    c = fed()
    [job_id] = local_jobs(c, 0, 1)
    wheel = c.broker(1).timers
    stale = wheel._stale
    a = block(c, 1)
    assert c.reply_to(1, a) == [[b"q", job_id, b"body0"]]
    assert wheel._stale == stale
    assert c.cmd(1, "ACKJOB", job_id) == 1
    assert wheel._stale == stale + 1  # moved once, from its requeue time to its GC attempt
    assert c.run_until(lambda: c.holders(job_id) == [], 1000)
