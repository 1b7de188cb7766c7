"""The shortcuts taken on the ADDJOB and GETJOB path for speed (docs/benchmarks.md, "What the
compiled path is worth") give what the general code they replace gives: the same numbers from
the same random source, the same state names, the same integers, the same jobs and log
records."""

from __future__ import annotations

import random
import re

from hypothesis import given
from hypothesis import strategies as st

from broker import cluster_jobs
from broker.clients import Client
from broker.config import Config
from broker.core import REQUEUE_JITTER_MS, Broker, requeue_jitter
from broker.effects import LogRecord
from broker.job import FLAG_REPLICA, Job, JobState, state_name
from cluster.jobs import JobCore
from cluster.membership import Membership
from cluster.wiring import attach
from protocol.commands import AddJob, parse_addjob, parse_int
from protocol.jobid import IDS_PER_BLOCK, IdGenerator, is_valid, ttl_field

NOW = 1_700_000_000_000
NODE = "ab" * 20


def test_requeue_jitter_draws_what_randrange_draws() -> None:
    ours, reference = random.Random(7), random.Random(7)
    for _ in range(5000):
        expected = reference.randrange(REQUEUE_JITTER_MS) - REQUEUE_JITTER_MS // 2
        assert requeue_jitter(ours) == expected
    assert ours.getstate() == reference.getstate()  # not a draw more or less


def test_gc_jitter_draws_what_randrange_draws() -> None:
    ours, reference = random.Random(11), random.Random(11)
    err = cluster_jobs.TIME_ERR_MS
    for _ in range(5000):
        assert cluster_jobs.gc_jitter(ours) == reference.randrange(err) - err // 2
    assert ours.getstate() == reference.getstate()


def test_merge_delivered_adds_only_new_nodes_in_order() -> None:
    job = Job(b"D" + b"0" * 39, b"q", b"", repl=2, ttl=60, retry=30, delay=0,
              ctime=NOW * 1_000_000, delivered=("a", "b"))
    assert not cluster_jobs.merge_delivered(job, ("b", "a"))
    assert job.delivered == ("a", "b")
    assert cluster_jobs.merge_delivered(job, ["b", "c", "d", "c"])
    assert job.delivered == ("a", "b", "c", "d")


def test_state_name_is_the_enum_value() -> None:
    for state in JobState:
        assert state_name(state) == state.value


_INT = re.compile(rb"-?(0|[1-9][0-9]*)")


def _reference_parse_int(raw: bytes) -> int | None:
    """Redis's string2ll as a rule: an optional minus, digits with no leading zero, no "-0",
    at most 20 characters, within 64 bits."""
    if len(raw) > 20 or not _INT.fullmatch(raw) or raw == b"-0":
        return None
    value = int(raw)
    return value if -(1 << 63) <= value <= (1 << 63) - 1 else None


_NUMBERISH = st.one_of(
    st.integers(min_value=-(1 << 70), max_value=1 << 70).map(lambda n: str(n).encode()),
    st.binary(max_size=22),
    st.text(alphabet="-+0123456789 x", max_size=22).map(str.encode),
    st.sampled_from([b"", b"-", b"0", b"-0", b"00", b"01", b"+1", b" 1", b"1 ",
                     b"9223372036854775807", b"9223372036854775808",
                     b"-9223372036854775808", b"-9223372036854775809", b"1_000"]),
)


@given(_NUMBERISH)
def test_parse_int_follows_string2ll(raw: bytes) -> None:
    assert parse_int(raw) == _reference_parse_int(raw)


def test_job_ids_keep_disques_shape_and_are_unique_across_blocks() -> None:
    ids = IdGenerator(NODE, b"seed" * 5)
    made = []
    for i in range(IDS_PER_BLOCK * 5 + 3):
        ttl, retry = (86400, 300) if i % 3 else (3600, 0)
        job_id = ids.next_id(ttl, retry)
        assert is_valid(job_id)
        assert re.fullmatch(rb"D-abababab-[A-Za-z0-9+/]{24}-[0-9a-f]{4}", job_id), job_id
        assert int(job_id[-4:], 16) == ttl_field(ttl, retry)  # each ID its own TTL field
        made.append(job_id)
    assert len(set(made)) == len(made)
    assert len({m[11:35] for m in made}) == len(made)  # the random part alone is unique
    # Same seed, same IDs (a seeded broker is repeatable); another seed, others.
    assert IdGenerator(NODE, b"seed" * 5).next_id(3600, 0) == made[0]
    assert IdGenerator(NODE, b"other").next_id(3600, 0)[:35] != made[0][:35]


def _cluster_broker() -> Broker:
    """A broker with the job core, as every node with a cluster bus runs (one node here)."""
    config = Config()
    broker = Broker(config, NODE, b"seed" * 5, now_ms=NOW, rng=random.Random(1))
    membership = Membership(config, NODE, random.Random(2), NOW, None)
    attach(broker, membership=membership, jobs=JobCore(broker, membership, random.Random(3)))
    return broker


def _state(b: Broker) -> tuple:
    return ([j.to_record() for j in b.jobs.values()],
            [[j.id for j in q] for q in b.queues.values()],
            [(e.kind, e.payload, e.undo) for e in b.outbox if type(e) is LogRecord],
            sorted((key, item.id) for key, item in b.timers.entries()))  # type: ignore[attr-defined]


def test_single_copy_addjob_on_a_cluster_node_is_what_cluster_jobs_addjob_does() -> None:
    """Broker.addjob_without_policy keeps ADDJOB with one copy here (REPLICATE 1, or a cluster
    of one) to itself; cluster_jobs.addjob, which it used to call for it, must leave the same
    state."""
    for argv in ([b"ADDJOB", b"q", b"body", b"0"],
                 [b"ADDJOB", b"q", b"body", b"0", b"DELAY", b"5"],
                 [b"ADDJOB", b"q", b"body", b"0", b"RETRY", b"0", b"TTL", b"600"],
                 [b"ADDJOB", b"q", b"body", b"0", b"ASYNC", b"REPLICATE", b"1"]):
        fast, general = _cluster_broker(), _cluster_broker()
        reply = fast.execute(argv, Client(1), NOW)
        cmd = parse_addjob(argv)
        assert isinstance(cmd, AddJob)
        ttl = cmd.ttl or 86400
        retry = cmd.retry if cmd.retry is not None else max(1, min(300, ttl // 10))
        job_id = general.ids.next_id(ttl, retry)
        assert str(reply).encode() == job_id
        general_reply = cluster_jobs.addjob(general, cmd, Client(1), NOW, 1, False, ttl, retry,
                                            cmd.queue, job_id)
        assert general_reply == reply
        assert _state(fast) == _state(general), argv
        job = fast.jobs[job_id]
        assert job.flags & FLAG_REPLICA  # its ACK takes part in the cluster's ack GC


def test_without_a_log_addjob_and_getjob_build_no_records_and_change_the_same_state():
    """log_wanted False (the node's append log is off): ADDJOB and GETJOB emit no job or dlv
    record, and leave the jobs exactly as a broker that logs does."""
    from tests.broker.harness import Node

    logged, unlogged = Node(), Node()
    unlogged.b.log_wanted = False
    for n in (logged, unlogged):
        n.add("q", "one")
        n.add("q", "two")
        n("GETJOB", "NOHANG", "FROM", "q")
    assert {r.kind for r in logged.log} == {"job", "dlv"}
    assert unlogged.log == []
    assert ([j.to_record() for j in logged.b.jobs.values()]
            == [j.to_record() for j in unlogged.b.jobs.values()])
    delivered = [j for j in unlogged.b.jobs.values() if j.dtime]
    assert len(delivered) == 1  # the first delivery's time is kept in memory all the same
