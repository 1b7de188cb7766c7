"""The first delivery of a job is logged (its record with ``dtime``), so the append log says how
long jobs waited before a consumer got them (trisque-pipeline report, issue 11)."""

from __future__ import annotations

import io

from broker.clients import Client
from broker.core import Broker
from broker.job import Job, validate_record
from tests.broker.harness import T0, Node


def _job_records(node: Node) -> list[list[object]]:
    recs = [r.payload for r in node.log if r.kind == "job"]
    node.log.clear()
    return recs


def test_first_getjob_logs_the_record_with_the_delivery_time() -> None:
    n = Node()
    job_id = n.add("q", "b", "RETRY", 60)
    (created,) = _job_records(n)
    assert created[15] == 0  # not delivered yet
    n.now = T0 + 1234
    assert n("GETJOB", "FROM", "q")[0][1] == job_id
    (delivered,) = _job_records(n)
    assert delivered[0] == job_id and delivered[3] == "active" and delivered[15] == T0 + 1234
    assert validate_record("job", delivered) is None


def test_later_deliveries_are_not_logged_again() -> None:
    n = Node()
    job_id = n.add("q", "b", "RETRY", 60)
    n("GETJOB", "FROM", "q")
    n("NACK", job_id)
    _job_records(n)
    n.now = T0 + 5000
    assert n("GETJOB", "FROM", "q")[0][1] == job_id
    assert _job_records(n) == []  # the NACK's record already has dtime; the wait was T0
    assert Job.from_record(n.b.jobs[job_id].to_record()).dtime == T0


def test_a_blocked_client_served_by_addjob_one_record_with_the_delivery() -> None:
    n = Node()
    assert n("GETJOB", "TIMEOUT", 0, "FROM", "q") is not None  # BLOCKED
    n.now = T0 + 7
    job_id = n.add("q", "b")
    # ADDJOB's own record carries the delivery; a second record would make the undo of a
    # failed write put the job back after ADDJOB replied an error.
    assert [(r.payload[0], r.payload[15]) for r in n.log if r.kind == "job"] == [(job_id, T0 + 7)]
    (entry,) = n.log
    n.b.undo_entry(entry, n.now)
    assert job_id not in n.b.jobs


def test_a_blocked_client_served_when_output_resumes_logs_the_delivery() -> None:
    n = Node()
    job_id = n.add("q", "b")
    n("PAUSE", "q", "out")
    n("GETJOB", "TIMEOUT", 0, "FROM", "q", client=Client(2))
    n.log.clear()
    n.now = T0 + 9
    n("PAUSE", "q", "none")
    assert [(r.payload[0], r.payload[15]) for r in n.log if r.kind == "job"] == [(job_id, T0 + 9)]


def test_failed_write_of_the_delivery_undoes_it_the_job_is_queued_again() -> None:
    n = Node()
    job_id = n.add("q", "b", "RETRY", 60)
    n.log.clear()
    n("GETJOB", "FROM", "q")
    (entry,) = n.log
    n.b.undo_entry(entry, n.now)
    assert n.qlen("q") == 1 and n.b.jobs[job_id].dtime == 0


def test_records_written_before_dtime_still_load() -> None:
    n = Node()
    job_id = n.add("q", "b", "RETRY", 60)
    old = n.b.jobs[job_id].to_record()[:15]  # what a log from before this change holds
    assert validate_record("job", old) is None
    assert Job.from_record(old).dtime == 0
    b = Broker(n.b.config, "cd" * 20, b"seed" * 5, now_ms=T0)
    b.load_record(("job", old), T0)
    assert b.jobs[job_id].dtime == 0


def test_a_bad_dtime_is_damage() -> None:
    n = Node()
    rec = n.b.jobs[n.add("q", "b")].to_record()
    rec[15] = -1
    assert "dtime" in (validate_record("job", rec) or "")
    assert validate_record("job", rec + [0]) is not None  # 17 fields


def test_a_log_mixing_old_and_new_records_reads_clean_and_replays() -> None:
    from broker.aof import ReadEnd, encode_header, encode_records, read_records

    n = Node()
    old_id, new_id = n.add("q", "old", "RETRY", 60), n.add("q", "new", "RETRY", 60)
    n("GETJOB", "COUNT", 2, "FROM", "q")
    old = n.b.jobs[old_id].to_record()[:15]  # as a node before dtime wrote it
    new = n.b.jobs[new_id].to_record()
    data = encode_header() + encode_records([("job", old), ("job", new)])
    end = ReadEnd()
    records = list(read_records(io.BytesIO(data), "mixed.aof", end, validate_record))
    assert end.state == "clean" and [r[1][0] for r in records] == [old_id, new_id]
    b = Broker(n.b.config, "cd" * 20, b"seed" * 5, now_ms=T0)
    for record in records:
        b.load_record(record, T0)
    assert (b.jobs[old_id].dtime, b.jobs[new_id].dtime) == (0, T0)
