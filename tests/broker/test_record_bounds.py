"""``record_problem`` compares each integer field with its bounds written out: they must be
the ones ``_RECORD_INTS`` names in its messages, at both ends of every range."""

from __future__ import annotations

from typing import Any

import pytest

from broker.job import _RECORD_INTS, REC_DELIVERED, REC_STATE, Job, record_problem

NODE = "a" * 40


def _record() -> list[Any]:
    job = Job(b"D-00000000-000000000000000000000000-0001", b"q", b"body", repl=3, ttl=60,
              retry=10, delay=0, ctime=1_700_000_000_000_000_000, delivered=(NODE,))
    job.priority = 5  # 17 fields: every integer field present
    rec = job.to_record()
    assert len(rec) == 17 and record_problem(rec) is None, record_problem(rec)
    return rec


@pytest.mark.parametrize("index", sorted(_RECORD_INTS))
def test_each_bound_is_the_tables(index: int) -> None:
    name, low, high = _RECORD_INTS[index]
    for value, ok in ((low, True), (high, True), (low - 1, False), (high + 1, False),
                      (True, False), (float(low), False), (str(low), False)):
        rec = _record()
        rec[index] = value
        problem = record_problem(rec)
        if ok:
            assert problem is None, (name, value, problem)
        else:
            assert problem == f"job record with {name} {value!r} outside [{low}, {high}]"


def test_a_shorter_record_has_no_dtime_or_priority() -> None:
    rec = _record()[:15]
    assert record_problem(rec) is None
    rec = _record()[:16]
    rec[15] = -1
    assert record_problem(rec) == f"job record with dtime -1 outside [0, {(1 << 63) - 1}]"


def test_the_state_and_the_node_lists() -> None:
    for state in ("active", "queued", "acked", "wait-repl"):
        rec = _record()
        rec[REC_STATE] = state
        assert record_problem(rec) is None
    for state in ("Active", "", b"active", ["active"], {"a": 1}, 1):
        rec = _record()
        rec[REC_STATE] = state
        assert record_problem(rec) is not None and "unknown state" in str(record_problem(rec))
    for nodes in ((NODE,), [NODE, b"x"], [NODE, 1], "abc", None):
        rec = _record()
        rec[REC_DELIVERED] = nodes
        assert record_problem(rec) == "job record whose node lists are not lists of node IDs"
