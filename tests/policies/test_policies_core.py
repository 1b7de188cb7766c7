"""Queue policies in the broker core (broker/policies.py), on a fake clock."""

from __future__ import annotations

from broker.policy_table import Policy, dead_letter_id, validate_record
from protocol.commands import INT32_MAX
from protocol.jobid import is_valid
from protocol.resp import Error
from tests.broker.harness import T0, Node


def as_dict(reply: list) -> dict:
    return dict(zip(reply[::2], reply[1::2], strict=True))


def test_create_get_list_delete() -> None:
    n = Node()
    assert n("QPOLICY", "GET", "q") is None
    got = as_dict(n("QPOLICY", "CREATE", "q", "RETENTION", 600, "DEDUP", "yes"))
    assert got[b"retention-timeout"] == 600
    assert got[b"visibility-timeout"] == 60  # Disque's default RETRY for a TTL of 600
    assert got[b"message-delay"] == 0 and got[b"message-deduplication"] == 1
    assert got[b"redrive-max-receives"] is None and got[b"dead-letter-queue"] is None
    assert as_dict(n("QPOLICY", "GET", "q")) == got
    assert str(n("QPOLICY", "CREATE", "q")).startswith("EXISTS")
    assert str(n("QPOLICY", "UPDATE", "nope", "DELAY", 1)).startswith("NOQUEUE")
    n("QPOLICY", "CREATE", "a")
    total, items = n("QPOLICY", "LIST", "OFFSET", 1, "LIMIT", 5)
    assert total == 2 and [as_dict(i)[b"name"] for i in items] == [b"q"]
    assert n("QPOLICY", "DEL", "q") == 1
    assert n("QPOLICY", "GET", "q") is None
    assert str(n("QPOLICY", "DEL", "q")).startswith("NOQUEUE")
    assert n("QPOLICY", "LIST")[0] == 1


def test_validation_follows_mqs() -> None:
    n = Node()
    for args in (("RETENTION", 0), ("RETENTION", INT32_MAX + 1), ("VISIBILITY", -1),
                 ("VISIBILITY", INT32_MAX + 1), ("DELAY", -1), ("DELAY", INT32_MAX + 1),
                 ("REDRIVE", 0, "dlq"), ("REDRIVE", INT32_MAX + 1, "dlq"), ("DEDUP", "maybe"),
                 ("RETENTION", "x"), ("BOGUS", 1), ("RETENTION",)):
        r = n("QPOLICY", "CREATE", "q", *args)
        assert isinstance(r, Error), args
    assert n("QPOLICY", "GET", "q") is None
    # Bounds themselves are accepted.
    assert not isinstance(n("QPOLICY", "CREATE", "q", "RETENTION", INT32_MAX,
                            "VISIBILITY", 0, "DELAY", INT32_MAX - 1), Error)
    # The dead-letter queue must exist.
    assert "dead letter queue does not exist" in str(
        n("QPOLICY", "CREATE", "w", "REDRIVE", 3, "dlq"))
    n("QPOLICY", "CREATE", "dlq")
    assert not isinstance(n("QPOLICY", "CREATE", "w", "REDRIVE", 3, "dlq"), Error)
    assert str(n("QPOLICY", "FROB", "q")).startswith("ERR Unknown QPOLICY subcommand")
    assert isinstance(n("QPOLICY", "ORIGIN", "not-an-id"), Error)


def test_deleting_a_dead_letter_queue_clears_the_redrive_policy() -> None:
    n = Node()
    n("QPOLICY", "CREATE", "dlq")
    n("QPOLICY", "CREATE", "w", "REDRIVE", 2, "dlq", "RETENTION", 100)
    n("QPOLICY", "DEL", "dlq")
    got = as_dict(n("QPOLICY", "GET", "w"))
    assert got[b"redrive-max-receives"] is None and got[b"dead-letter-queue"] is None
    assert got[b"retention-timeout"] == 100


def test_defaults_apply_and_explicit_options_win() -> None:
    n = Node()
    n("QPOLICY", "CREATE", "q", "RETENTION", 3600, "VISIBILITY", 30, "DELAY", 5)
    plain = n.show(n.add("q"))
    assert plain is not None
    assert (plain[b"ttl"], plain[b"retry"], plain[b"delay"]) == (3600, 30, 5)
    assert n.qlen("q") == 0  # delayed 5 s
    explicit = n.show(n.add("q", "b", "TTL", 100, "RETRY", 7, "DELAY", 0))
    assert explicit is not None
    assert (explicit[b"ttl"], explicit[b"retry"], explicit[b"delay"]) == (100, 7, 0)
    assert n.qlen("q") == 1  # DELAY 0 given explicitly beats the policy's 5
    # A queue without a policy keeps Disque's defaults.
    other = n.show(n.add("other"))
    assert other is not None and (other[b"ttl"], other[b"retry"]) == (86400, 300)
    # The policy's DELAY against an explicit TTL is checked as ADDJOB checks it.
    assert "DELAY is greater than TTL" in str(n("ADDJOB", "q", "x", 0, "TTL", 5))


def test_existing_jobs_keep_their_parameters() -> None:
    n = Node()
    n("QPOLICY", "CREATE", "q", "VISIBILITY", 30)
    job = n.add("q")
    n("QPOLICY", "UPDATE", "q", "VISIBILITY", 90)
    shown = n.show(job)
    assert shown is not None and shown[b"retry"] == 30


def test_deduplication_per_node() -> None:
    n = Node()
    first = n.add("q", "same")
    n("QPOLICY", "CREATE", "q", "DEDUP", "yes")
    # Jobs already in the queue when deduplication is turned on are not considered (mqs).
    second = n.add("q", "same")
    assert second != first
    assert n.add("q", "same") == second
    assert n.b.policies.last_duplicate
    assert n.add("q", "other") != second
    assert n.add("q2", "same") != second  # another queue
    assert n.qlen("q") == 3
    # Once the job is acked it is no longer present: the body is accepted again.
    n("ACKJOB", second)
    third = n.add("q", "same")
    assert third != second and not n.b.policies.last_duplicate
    # Turned off: duplicates are created.
    n("QPOLICY", "UPDATE", "q", "DEDUP", "no")
    assert n.add("q", "same") != third


def _receive(n: Node, queue: str = "w") -> bytes:
    reply = n("GETJOB", "NOHANG", "FROM", queue)
    assert reply and reply[0][0] == queue.encode(), reply
    return reply[0][1]


def test_dead_letter_after_max_receives_by_nack() -> None:
    n = Node()
    n("QPOLICY", "CREATE", "dlq", "RETENTION", 7200)
    n("QPOLICY", "CREATE", "w", "REDRIVE", 2, "dlq")
    job = n.add("w", "payload")
    assert _receive(n) == job  # delivery 1
    assert n("NACK", job) == 1
    assert _receive(n) == job  # delivery 2
    assert n("NACK", job) == 0  # a third delivery would exceed 2: dead-lettered instead
    assert n.show(job) is None and n.qlen("w") == 0
    reply = n("GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "dlq")
    (queue, dl_id, body, _, nacks, _, deliveries), = reply
    assert (queue, body, nacks, deliveries) == (b"dlq", b"payload", 2, 0)
    assert dl_id == dead_letter_id(job, 7200, 720) and is_valid(dl_id)
    assert n("QPOLICY", "ORIGIN", dl_id) == [job, b"w"]
    shown = n.show(dl_id)
    assert shown is not None and shown[b"ttl"] == 7200
    # A dead letter is never dead-lettered again.
    n("QPOLICY", "UPDATE", "dlq", "REDRIVE", 1, "w")
    assert n("NACK", dl_id) == 1
    assert _receive(n, "dlq") == dl_id


def test_dead_letter_after_retry_timeouts() -> None:
    n = Node()
    n("QPOLICY", "CREATE", "dlq")
    n("QPOLICY", "CREATE", "w", "REDRIVE", 1, "dlq", "VISIBILITY", 10)
    job = n.add("w")
    _receive(n)
    n.run_until(T0 + 11_000)  # the retry would deliver it a second time
    assert n.show(job) is None
    assert n.qlen("dlq") == 1 and n.qlen("w") == 0
    assert not any(r.kind == "job" and r.payload[0] == job for r in n.log[-3:])


def test_without_policies_counters_and_replies_are_disques() -> None:
    n = Node()
    job = n.add("w")
    for _ in range(3):
        _receive(n)
        assert n("NACK", job) == 1
    shown = n.show(job)
    assert shown is not None and shown[b"nacks"] == 3
    assert not any(r.kind == "qpolicy" for r in n.log)


def test_records_round_trip_and_replay() -> None:
    n = Node()
    n("QPOLICY", "CREATE", "dlq")
    n("QPOLICY", "CREATE", "w", "REDRIVE", 1, "dlq", "DEDUP", "yes", "DELAY", 3)
    job = n.add("w")
    n.run_until(T0 + 4000)
    _receive(n)
    n("NACK", job)
    records = [(r.kind, r.payload) for r in n.log]
    for kind, payload in records:
        assert n.b.validate_record(kind, payload) is None, (kind, payload)
    fresh = Node()
    for rec in records:
        fresh.b.load_record(rec, fresh.now)
    fresh.b.finish_load(fresh.now, False)
    assert fresh.b.policies.policies() == n.b.policies.policies()
    assert fresh.b.policies.origins == n.b.policies.origins
    snap = list(n.b.snapshot())
    again = Node()
    for rec in snap:
        again.b.load_record(rec, again.now)
    assert again.b.policies.policies() == n.b.policies.policies()
    assert again.b.policies.origins == n.b.policies.origins
    assert validate_record(["queue", b"x", {"bad": 1}, 1, "n"]) is not None
    assert validate_record(["origin", b"x", b"y", b"z"]) is not None


def test_a_replayed_content_type_that_is_no_header_value_is_dropped() -> None:
    # Logs written before the HTTP API refused them may hold one: sent back with its
    # message it broke the answer.
    n = Node()
    job = n.add("q")
    n.b.load_record(("qpolicy", ["ctype", job, "text/plain\rx: 1"]), n.now)
    assert job not in n.b.policies.content_types
    n.b.load_record(("qpolicy", ["ctype", job, "text/plain; charset=\xe9"]), n.now)
    assert n.b.policies.content_types[job] == "text/plain; charset=\xe9"


def test_undo_of_a_failed_policy_write() -> None:
    n = Node()
    n("QPOLICY", "CREATE", "q", "RETENTION", 100)
    n("QPOLICY", "UPDATE", "q", "RETENTION", 200)
    rec = n.log[-1]
    n.b.undo_entry((rec.kind, rec.payload, rec.undo), n.now)
    assert as_dict(n("QPOLICY", "GET", "q"))[b"retention-timeout"] == 100
    first = n.log[0]
    n.b.undo_entry((first.kind, first.payload, first.undo), n.now)
    assert n("QPOLICY", "GET", "q") is None and n.b.policies.live == 0


def test_merge_keeps_the_newest_stamp() -> None:
    n = Node()
    t = n.b.policies
    assert t.merge(Policy(b"q", retention_timeout=5, stamp=(10, "b")))
    assert not t.merge(Policy(b"q", retention_timeout=6, stamp=(10, "a")))
    assert t.merge(Policy(b"q", stamp=(11, "a"), deleted=True))
    assert t.get(b"q") is None and t.live == 0


def test_a_change_made_here_wins_over_a_peer_version_stamped_ahead() -> None:
    n = Node()
    t = n.b.policies
    # A peer whose clock is an hour ahead deleted the queue.
    t.merge(Policy(b"q", stamp=(n.now + 3_600_000, "z" * 40), deleted=True))
    n("QPOLICY", "CREATE", "q", "RETENTION", 50)
    mine = t.by_name[b"q"]
    assert not mine.deleted and mine.stamp > (n.now + 3_600_000, "z" * 40)
