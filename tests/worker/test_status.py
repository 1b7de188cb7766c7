"""The status pipe's grammar and a run's verdict (cli/worker/status.py), without processes."""

from __future__ import annotations

import signal

import pytest

from cli.worker.status import (
    ACK,
    FAIL,
    MAX_LINE_BYTES,
    NACK,
    RESEND,
    Line,
    Outcome,
    StatusReader,
    Violation,
    decide,
    parse_line,
)


def test_each_verb_parses() -> None:
    assert parse_line(b"run 3 of 10") == Line("run", "3 of 10", "run 3 of 10")
    assert parse_line(b"done") == Line("done", "", "done")
    assert parse_line(b"err db down") == Line("err", "db down", "err db down")
    assert parse_line(b"resend 300-memcached away") == Line(
        "resend", "memcached away", "resend 300-memcached away", 300)
    assert parse_line(b"resend 5") == Line("resend", "", "resend 5", 5)
    assert parse_line(b"dup 0-X-other") == Line("dup", "0-X-other", "dup 0-X-other", 0, b"other")
    assert parse_line(b"dup 10-X-a-b").queue == b"a-b"  # a queue name may hold dashes


@pytest.mark.parametrize("raw, why", [
    (b"", "empty status line"),
    (b"progress 50%", "unknown status line 'progress 50%'"),
    (b"DONE ok", "unknown status line 'DONE ok'"),
    (b"resend soon-x", "resend needs 'resend <seconds>-<text>'"),
    (b"resend -5-x", "resend needs"),
    (b"resend 99999999999-x", "resend needs"),
    (b"dup 0-Y-q", "dup needs 'dup <seconds>-X-<queue>'"),
    (b"dup 0-X-", "dup needs"),
    (b"dup q", "dup needs"),
])
def test_malformed_lines_are_violations(raw: bytes, why: str) -> None:
    got = parse_line(raw)
    assert isinstance(got, Violation) and why in got.reason


def test_the_reader_splits_across_reads_and_keeps_an_unterminated_last_line() -> None:
    r = StatusReader()
    assert r.feed(b"run a") == []
    assert r.feed(b"b\r\nrun c\nrun") == [Line("run", "ab", "run ab"), Line("run", "c", "run c")]
    assert r.feed(b" d") == []
    assert r.end() == [Line("run", "d", "run d")]
    assert r.end() == []


def test_a_huge_line_is_a_violation_before_its_end_arrives() -> None:
    r = StatusReader()
    out = r.feed(b"run " + b"x" * MAX_LINE_BYTES)
    assert out == [Violation(f"status line longer than {MAX_LINE_BYTES} bytes")]
    assert StatusReader().feed(b"run " + b"x" * (MAX_LINE_BYTES - 4) + b"\n")[0] == Line(
        "run", "x" * (MAX_LINE_BYTES - 4), "run " + "x" * (MAX_LINE_BYTES - 4))


DONE = Line("done", "ok", "done ok")
ERR = Line("err", "bad", "err bad")
RESENT = Line("resend", "later", "resend 30-later", 30)


@pytest.mark.parametrize("outcome, state, action, reason", [
    (Outcome(DONE, 0), "done", ACK, "done: ok"),
    (Outcome(DONE, 3), "failed", FAIL, "exit status 3 after 'done: ok'"),
    (Outcome(ERR, 0), "failed", FAIL, "err: bad (exit status 0)"),
    (Outcome(RESENT, 1), "resent", RESEND, "resend in 30 s: later"),
    (Outcome(None, 0), "failed", FAIL, "exit status 0 without a 'done' line on fd 3"),
    (Outcome(None, 2), "failed", FAIL, "exit status 2"),
    (Outcome(None, -signal.SIGSEGV), "failed", FAIL, "killed by SIGSEGV"),
    (Outcome(spawn_error="cannot execute the command: Permission denied (EACCES)"), "failed",
     FAIL,
     "cannot execute the command: Permission denied (EACCES)"),
    (Outcome(DONE, -signal.SIGTERM, violation="unknown status line 'x'", signalled=True),
     "failed", FAIL, "unknown status line 'x'; the script was stopped (killed by SIGTERM)"),
    (Outcome(None, 0, violation="empty status line"), "failed", FAIL,
     "empty status line (exit status 0)"),
    (Outcome(DONE, -signal.SIGKILL, timed_out_after=2.5, signalled=True), "timeout", FAIL,
     "time limit of 2.5 s reached; the script was stopped (killed by SIGKILL)"),
    (Outcome(None, -signal.SIGTERM, stopped="the worker stopped"), "stopped", NACK,
     "the worker stopped (killed by SIGTERM)"),
    (Outcome(DONE, 0, notes=("processes it left in its group were killed",)), "done", ACK,
     "done: ok; processes it left in its group were killed"),
])
def test_the_verdict(outcome: Outcome, state: str, action: str, reason: str) -> None:
    v = decide(outcome)
    assert (v.state, v.action, v.reason) == (state, action, reason)
    if action == RESEND:
        assert v.seconds == 30
