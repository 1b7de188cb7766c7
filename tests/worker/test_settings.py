"""`trisque worker`'s --retries and --backoff: what is accepted, and the backoff's schedule."""

from __future__ import annotations

import pytest

from cli.worker.settings import UsageError, parse


def test_retries_per_queue_and_the_backoff_schedule() -> None:
    s = parse(["-q", "a", "-q", "b", "--retries", "3", "--retries", "b=0", "--backoff", "2:10",
               "--", "/bin/true"])
    assert (s.retries_for("a"), s.retries_for("b")) == (3, 0)
    assert [s.backoff_after(k) for k in (1, 2, 3, 4, 100)] == [2, 4, 8, 10, 10]
    default = parse(["-q", "a", "--", "/bin/true"])
    assert default.retries_for("a") == 0 and default.backoff == (5.0, 300.0)  # as RQ: none
    assert parse(["-q", "a", "--backoff", "0.5", "--", "/bin/true"]).backoff == (0.5, 300.0)


@pytest.mark.parametrize("options, message", [
    (["--retries", "-1"], "--retries -1: the count must be a whole number"),
    (["--retries", "x=2"], "'x' is not one of the --queue names"),
    (["--backoff", "5:1"], "MAX must not be less than BASE"),
    (["--backoff", "soon"], "--backoff BASE must be a number of seconds"),
])
def test_bad_values_are_refused(options: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse(["-q", "a", *options, "--", "/bin/true"])
