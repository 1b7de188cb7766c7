"""The first delivery of a job is logged as an advisory ``dlv`` record ([job ID, time]), so the
append log says how long jobs waited before a consumer got them (trisque-pipeline report, issue
11) without a GETJOB writing the job's full record or waiting for the disk."""

from __future__ import annotations

import io

from broker.aof import ADVISORY_KINDS, ReadEnd, encode_header, encode_records, read_records
from broker.clients import Client
from broker.core import Broker
from broker.job import Job, validate_record
from tests.broker.harness import T0, Node


def _records(node: Node) -> list[tuple[str, object]]:
    recs = [(r.kind, r.payload) for r in node.log]
    node.log.clear()
    return recs


def _fresh(n: Node) -> Broker:
    return Broker(n.b.config, "cd" * 20, b"seed" * 5, now_ms=T0)


def test_first_getjob_emits_one_compact_delivery_record() -> None:
    n = Node()
    job_id = n.add("q", "b" * 1000, "RETRY", 60)
    ((kind, created),) = _records(n)
    assert kind == "job" and created[15] == 0  # not delivered yet
    n.now = T0 + 1234
    assert n("GETJOB", "FROM", "q")[0][1] == job_id
    assert _records(n) == [("dlv", [job_id, T0 + 1234])]  # no body, no full record
    assert "dlv" in ADVISORY_KINDS
    assert validate_record("dlv", [job_id, T0 + 1234]) is None
    assert n.b.jobs[job_id].dtime == T0 + 1234


def test_later_deliveries_emit_nothing() -> None:
    n = Node()
    job_id = n.add("q", "b", "RETRY", 60)
    n("GETJOB", "FROM", "q")
    n("NACK", job_id)
    nack = _records(n)[-1]
    assert nack[0] == "job" and nack[1][15] == T0  # the NACK's record keeps dtime
    n.now = T0 + 5000
    assert n("GETJOB", "FROM", "q")[0][1] == job_id
    assert _records(n) == []
    assert Job.from_record(n.b.jobs[job_id].to_record()).dtime == T0


def test_a_blocked_client_served_by_addjob_emits_the_delivery_too() -> None:
    n = Node()
    assert n("GETJOB", "TIMEOUT", 0, "FROM", "q") is not None  # BLOCKED
    n.now = T0 + 7
    job_id = n.add("q", "b")
    # The same advisory record as a GETJOB's, then ADDJOB's own record (dtime set as well).
    recs = _records(n)
    assert recs[0] == ("dlv", [job_id, T0 + 7])
    assert recs[1][0] == "job" and recs[1][1][15] == T0 + 7 and len(recs) == 2


def test_a_blocked_client_served_when_output_resumes_emits_the_delivery() -> None:
    n = Node()
    job_id = n.add("q", "b")
    n("PAUSE", "q", "out")
    n("GETJOB", "TIMEOUT", 0, "FROM", "q", client=Client(2))
    n.log.clear()
    n.now = T0 + 9
    n("PAUSE", "q", "none")
    assert _records(n) == [("dlv", [job_id, T0 + 9])]


def test_records_written_before_dtime_still_load() -> None:
    n = Node()
    job_id = n.add("q", "b", "RETRY", 60)
    old = n.b.jobs[job_id].to_record()[:15]  # what a log from before dtime holds
    assert validate_record("job", old) is None
    assert Job.from_record(old).dtime == 0
    b = _fresh(n)
    b.load_record(("job", old), T0)
    assert b.jobs[job_id].dtime == 0


def test_a_bad_dtime_or_dlv_is_damage() -> None:
    n = Node()
    job_id = n.add("q", "b")
    rec = n.b.jobs[job_id].to_record()
    rec[15] = -1
    assert "dtime" in (validate_record("job", rec) or "")
    assert validate_record("job", rec + [0]) is not None  # 17 fields
    for bad in ([job_id, 0], [job_id, -5], [job_id, 1 << 63], [job_id, "1"], [job_id],
                [b"D-nope", T0], job_id, [job_id, T0, 0], None):
        assert validate_record("dlv", bad) is not None, bad


def test_a_record_s_64_bit_bounds_hold_past_machine_integers() -> None:
    """The 64-bit bounds are checked apart from the small ones (compiled, a bound past 2**62 is
    an object): each still holds on both sides of 2**62 and 2**63."""
    n = Node()
    rec = n.b.jobs[n.add("q", "b")].to_record()
    for index in (8, 9, 15):  # ctime, qtime, dtime
        for good in (0, (1 << 62) - 1, 1 << 62, (1 << 63) - 1):
            assert validate_record("job", rec[:index] + [good] + rec[index + 1:]) is None
        for bad in (-1, 1 << 63, 1 << 70):
            assert validate_record("job", rec[:index] + [bad] + rec[index + 1:]) is not None
    for bad in (256, 1 << 62, 1 << 63):  # flags, at most 255
        assert validate_record("job", rec[:14] + [bad] + rec[15:]) is not None


def test_replay_of_a_log_mixing_old_and_new_records() -> None:
    """15-field records (before dtime), 16-field ones, dlv records for known jobs with and
    without a dtime, for a job whose record comes later, and for acked/deleted jobs."""
    n = Node()
    old_id, new_id, late_id, acked_id, gone_id, kept_id = (
        n.add("q", name, "RETRY", 60) for name in ("old", "new", "late", "acked", "gone", "kept"))
    old = n.b.jobs[old_id].to_record()[:15]  # as a node before dtime wrote it
    new = n.b.jobs[new_id].to_record()
    kept = n.b.jobs[kept_id].to_record()
    kept[15] = T0 + 1  # delivered already (e.g. a record written by 3420014's nodes)
    log = [
        ("job", old), ("job", new), ("job", kept),
        ("job", n.b.jobs[acked_id].to_record()), ("job", n.b.jobs[gone_id].to_record()),
        ("dlv", [old_id, T0 + 10]),   # an old record's job delivered by a new node
        ("dlv", [new_id, T0 + 20]),
        ("dlv", [kept_id, T0 + 30]),  # has a dtime: the first delivery stays
        ("dlv", [late_id, T0 + 40]),  # ADDJOB served a waiter: dlv before the job's record
        ("job", [*n.b.jobs[late_id].to_record()[:15], T0 + 40]),
        ("dlv", [acked_id, T0 + 50]), ("ack", acked_id),
        ("del", gone_id), ("dlv", [gone_id, T0 + 60]),  # unknown by now: ignored
    ]
    data = encode_header() + encode_records(log)
    end = ReadEnd()
    records = list(read_records(io.BytesIO(data), "mixed.aof", end, validate_record))
    assert end.state == "clean" and end.counts["dlv"] == 6 and end.counts["job"] == 6
    b = _fresh(n)
    for record in records:
        b.load_record(record, T0)
    assert {j: b.jobs[j].dtime for j in (old_id, new_id, kept_id, late_id)} == {
        old_id: T0 + 10, new_id: T0 + 20, kept_id: T0 + 1, late_id: T0 + 40}
    assert acked_id not in b.jobs and gone_id not in b.jobs
    # A rewrite keeps dtime in the job records and writes no dlv.
    snap = list(b.snapshot())
    assert {k for k, _ in snap} == {"job"}
    assert {r[0]: r[15] for _, r in snap}[old_id] == T0 + 10


def test_a_malformed_dlv_in_a_log_is_corruption_at_its_offset() -> None:
    n = Node()
    job_id = n.add("q", "b")
    good = encode_header() + encode_records([("job", n.b.jobs[job_id].to_record())])
    data = good + encode_records([("dlv", [job_id, -1]), ("del", job_id)])
    end = ReadEnd()
    list(read_records(io.BytesIO(data), "bad.aof", end, validate_record))
    assert (end.state, end.offset) == ("corrupt", len(good)) and "dlv" in end.reason


def test_an_undo_that_serves_a_blocked_client_emits_the_delivery() -> None:
    # DELJOB of a queued job whose write fails: the undo puts the job back in its queue, where
    # a client blocked meanwhile gets it; that first delivery is logged like any other.
    n = Node()
    job_id = n.add("q", "b")
    n.log.clear()
    n("DELJOB", job_id)
    (deleted,) = n.log
    n.log.clear()
    waiter = Client(2)
    n("GETJOB", "TIMEOUT", 0, "FROM", "q", client=waiter)
    n.now = T0 + 3
    n.b.undo_entry(deleted, n.now)
    assert _records(n) == [("dlv", [job_id, T0 + 3])]
    assert [r.client for r in n.replies] == [waiter]
