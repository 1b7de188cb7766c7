"""Log replay of real records with one mutated: any msgpack value in any field of any record
kind, a field dropped or added, a record under another kind. Replay either applies the record
(it passes ``validate_record``, loads, schedules, survives the timers and a rewrite) or reports
damage at its offset: a torn tail the start cuts (the records before it loaded) or corruption
the start refuses with ``LogCorrupt``. Never another exception."""

from __future__ import annotations

import copy
import os
import random
import tempfile
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker import aof
from broker.clients import Client
from broker.config import Config
from broker.core import Broker
from broker.effects import LogRecord
from cluster.jobs import JobCore
from cluster.membership import Membership
from cluster.wiring import attach
from node import logfile

NOW = 1_795_315_000_000
NODE = "a" * 40
JOB_ID = b"D-aaaaaaaa-%024d-05a1"


def _workload_records() -> list[tuple[str, Any]]:
    """Every record a node writes, made by a broker running the commands that write them."""
    b = Broker(Config(), NODE, b"replayseed", now_ms=NOW, rng=random.Random(0))
    client = Client(1)
    client.authenticated = True
    for argv in (["QPOLICY", "CREATE", "dead"],
                 ["QPOLICY", "SET", "q", "REDRIVE", "1", "dead", "VISIBILITY", "30"],
                 ["ADDJOB", "q", "one", "0", "RETRY", "1"], ["ADDJOB", "q", "two", "0"],
                 ["ADDJOB", "q2", "three", "0", "DELAY", "5", "TTL", "60"],
                 ["GETJOB", "NOHANG", "COUNT", "2", "FROM", "q"],
                 ["TIMER", "ADD", "t", "1000", "q2", "tick", "RETRY", "5"],
                 ["TIMER", "PAUSE", "t"], ["QPOLICY", "DEL", "dead"]):
        b.execute([a.encode() for a in argv], client, NOW)
    records: list[tuple[str, Any]] = []
    for e in b.take_effects():
        if isinstance(e, LogRecord):
            records.append((e.kind, copy.deepcopy(e.payload)))
    jobs = [p[0] for k, p in records if k == "job"]
    records += [("ack", jobs[0]), ("del", jobs[1]), ("flushall", None),
                ("qpolicy", ["origin", JOB_ID % 1, JOB_ID % 2, b"q"]),
                ("qpolicy", ["ctype", JOB_ID % 1, "text/plain"])]
    return records


RECORDS = _workload_records()
KINDS_WRITTEN = {k for k, _ in RECORDS}

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([0, -1, 1, 2**31, 2**32, 2**63 - 1, 2**64 - 1, -(2**63)]),
    st.floats(), st.binary(max_size=48), st.text(max_size=12),
    st.sampled_from(["active", "queued", "acked", "wait-repl", "queue", "origin", "ctype",
                     NODE, JOB_ID % 1, b"q"]),
)
VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=20), inner, max_size=4)),
    max_leaves=12)


def _containers(value: Any) -> list[Any]:
    out, todo = [], [value]
    while todo:
        v = todo.pop()
        if isinstance(v, (dict, list)):
            out.append(v)
            todo.extend(v.values() if isinstance(v, dict) else v)
    return out


@st.composite
def mutated(draw: st.DrawFn) -> tuple[int, str, Any]:
    """(index, kind, data): record ``index`` of RECORDS, changed once or a few times."""
    index = draw(st.integers(0, len(RECORDS) - 1))
    kind, data = copy.deepcopy(RECORDS[index])
    holder = [data]  # so the whole payload can be replaced like any field
    for _ in range(draw(st.integers(1, 3))):
        parent = draw(st.sampled_from(_containers(holder)))
        keys = list(parent) if isinstance(parent, dict) else list(range(len(parent)))
        op = draw(st.sampled_from(["replace", "drop", "add"] if keys else ["add"]))
        if op == "replace":
            parent[draw(st.sampled_from(keys))] = draw(VALUES)
        elif op == "drop" and parent is not holder:
            del parent[draw(st.sampled_from(keys))]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=20))] = draw(VALUES)
        elif parent is not holder:
            parent.insert(draw(st.integers(0, len(parent))), draw(VALUES))
    if draw(st.integers(0, 9)) == 0:
        kind = draw(st.sampled_from(aof.KINDS))  # the payload under another kind
    return index, kind, holder[0]


def _replay(frames: list[bytes]) -> tuple[Broker, aof.ReadEnd | aof.LogCorrupt, int]:
    """Replay a log of ``frames`` into a fresh broker as a node's start does; the broker,
    how it ended (or the LogCorrupt that stops the start), the records loaded."""
    fd, path = tempfile.mkstemp(prefix="trisque-replay-", suffix=".aof")
    with os.fdopen(fd, "wb") as f:
        f.write(aof.encode_header() + b"".join(frames))
    b = Broker(Config(), NODE, b"replayed", now_ms=NOW + 1000, rng=random.Random(1))
    # As a node replays: its cluster view and job core set first (an acked replica goes
    # back to ack GC through them).
    membership = Membership(b.config, NODE, random.Random(2), NOW)
    attach(b, membership=membership, jobs=JobCore(b, membership, random.Random(3)))
    counted = _Counting(b)
    try:
        outcome: aof.ReadEnd | aof.LogCorrupt = logfile.load_into(path, counted, NOW + 1000)
    except aof.LogCorrupt as exc:
        outcome = exc
    finally:
        os.unlink(path)
    return b, outcome, counted.loaded


class _Counting:
    """The broker as replay sees it, counting the records applied (a compiled Broker's
    methods cannot be replaced)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.loaded = 0
        self.validate_record = broker.validate_record

    def load_record(self, record: tuple[Any, ...], now_ms: int) -> None:
        self.broker.load_record(record, now_ms)
        self.loaded += 1


def _frame(kind: str, data: Any) -> bytes | None:
    try:
        return aof.encode_frame(kind, data)
    except (OverflowError, ValueError, TypeError):
        return None  # msgpack cannot hold it: no log can contain it


def test_the_workload_writes_every_kind_of_record() -> None:
    assert KINDS_WRITTEN >= {"job", "ack", "del", "flushall", "dlv", "qpolicy", "timer"}
    _, outcome, loaded = _replay([aof.encode_frame(k, d) for k, d in RECORDS])
    assert isinstance(outcome, aof.ReadEnd) and outcome.state == "clean"
    assert loaded == len(RECORDS)


@given(mutated(), st.booleans(), st.booleans())
def test_replay_applies_a_mutated_record_or_reports_damage_at_its_offset(
        change: tuple[int, str, Any], at_tail: bool, enqueue_once: bool) -> None:
    index, kind, data = change
    bad = _frame(kind, data)
    if bad is None:
        return
    frames = [aof.encode_frame(k, d) for k, d in RECORDS]
    if at_tail:
        frames = frames[: index] + frames[index + 1:] + [bad]
        position = len(frames) - 1
    else:
        frames[index] = bad
        position = index
    offset = aof.HEADER_SIZE + sum(len(f) for f in frames[:position])
    problem = Broker.validate_record(kind, data)
    # A list where the body goes reads as a split record (format 3): the reader validates it
    # with its reference in the body's place, so its reason may name another field.
    split = (kind == "job" and isinstance(data, list) and len(data) > 2
             and isinstance(data[2], list))
    if split and Broker.validate_record(kind, [*data[:2], b"", *data[3:]]) is None:
        return  # a well-formed split record: tests/aof/test_split_records.py
    b, outcome, loaded = _replay(frames)
    if problem is None:
        assert isinstance(outcome, aof.ReadEnd) and outcome.state == "clean", outcome
        assert loaded == len(frames)
        # Applied for good: scheduled, its timers run, and a rewrite writes it back.
        b.finish_load(NOW + 1000, enqueue_once)  # once: a SHUTDOWN REWRITE-AOF log
        for later in (NOW + 2000, NOW + 10**7, NOW + 10**10):
            b.tick(later)
        aof.encode_records(list(b.snapshot()))
        return
    if position == len(frames) - 1:  # at the tail: torn, cut there; the rest loaded
        assert isinstance(outcome, aof.ReadEnd), outcome
        assert (outcome.state, outcome.offset) == ("torn", offset), (outcome, problem)
    else:  # in the middle: the start is refused, naming the offset
        assert isinstance(outcome, aof.LogCorrupt), outcome
        assert outcome.offset == offset and (split or problem in outcome.reason), (
            outcome.reason, problem)
        assert f"at offset {offset}" in str(outcome)
    assert loaded == position


@pytest.mark.parametrize("state", [{"a": 1}, ["queued"], 3.5, None, b"active"])
def test_a_job_state_of_any_type_is_damage(state: Any) -> None:
    """The shape that once raised TypeError (unhashable) out of the record check."""
    job = next(d for k, d in RECORDS if k == "job")
    rec = copy.deepcopy(job)
    rec[3] = state
    frames = [aof.encode_frame("job", rec), aof.encode_frame("job", job)]
    _, outcome, loaded = _replay(frames)
    assert isinstance(outcome, aof.LogCorrupt) and outcome.offset == aof.HEADER_SIZE
    assert "unknown state" in outcome.reason and loaded == 0
