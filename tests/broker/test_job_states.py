"""The job state machine, table-driven: every allowed transition succeeds, every other one
raises (h11's test_state.py style). Disque's states: wait-repl, active, queued, acked."""

from __future__ import annotations

import itertools

import pytest

from broker.job import Job, JobState

W, A, Q, K = JobState.WAIT_REPL, JobState.ACTIVE, JobState.QUEUED, JobState.ACKED
ALLOWED = {
    (W, A),  # replicated, not queued yet (delayed, or a replica)
    (W, Q),  # replicated and queued at once
    (A, Q),  # delay over, retry time, ENQUEUE, NACK
    (Q, A),  # delivered (GETJOB), DEQUEUE, WORKING
    (W, K), (A, K), (Q, K),  # ACKJOB / SETACK from any live state
}


def _job(state: JobState) -> Job:
    return Job(b"D-00000000-000000000000000000000000-05a1", b"q", b"b", repl=1, ttl=60,
               retry=5, delay=0, ctime=1, delivered=(), state=state)


@pytest.mark.parametrize("old, new", sorted(ALLOWED, key=str))
def test_allowed(old: JobState, new: JobState) -> None:
    job = _job(old)
    job.transition(new)
    assert job.state is new


REFUSED = sorted(set(itertools.product(JobState, JobState)) - ALLOWED, key=str)


@pytest.mark.parametrize("old, new", REFUSED)
def test_refused(old: JobState, new: JobState) -> None:
    job = _job(old)
    with pytest.raises(ValueError, match=f"{old.value} -> {new.value} is not allowed"):
        job.transition(new)
    assert job.state is old


def test_no_state_is_assigned_outside_the_transition_function() -> None:
    """Every change of state goes through Job.transition (the constructor sets the first)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    offenders = []
    paths = list((root / "broker").glob("*.py")) + list((root / "cluster").glob("*.py"))
    for path in paths:
        if path.name == "aof.py":
            continue  # its ``end.state`` is how a log file ends, not a job's state
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Attribute) and t.attr == "state" and not (
                            isinstance(t.value, ast.Name) and t.value.id == "self"):
                        offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, offenders
