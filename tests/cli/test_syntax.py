"""The prompt's knowledge of the commands (cli/syntax.py over cli/help_table.py): every command
the node knows has an entry, and the hint and Tab candidates for lines a user types."""

from __future__ import annotations

import pytest

from broker.command_table import ROWS
from cli import help_table
from cli.prompt import completions
from cli.syntax import analyse


def test_every_node_command_has_help_hints_and_completion() -> None:
    names = {c.name for c in help_table.COMMANDS}
    assert {row.name.decode().upper() for row in ROWS} <= names
    assert len(names) == len(help_table.COMMANDS)


@pytest.mark.parametrize(("line", "hint"), [
    ("GETJOB ", "[NOHANG] [TIMEOUT ms] [COUNT count] [WITHCOUNTERS] FROM queue [queue ...]"),
    ("getjob TIMEOUT 10 ", "[NOHANG] [COUNT count] [WITHCOUNTERS] FROM queue [queue ...]"),
    ("GETJOB FROM q1 ", "[queue ...]"),
    ("QPEEK q", " count"),
    ('ADDJOB q "a body with spaces" ', "ms-timeout [REPLICATE count] [DELAY sec] [RETRY sec] "
                                       "[TTL sec] [MAXLEN count] [ASYNC] [PRIORITY 0-9] [AFTER id ...]"),
    ('ADDJOB q "an open quote ', " ms-timeout [REPLICATE count] [DELAY sec] [RETRY sec] "
                                 "[TTL sec] [MAXLEN count] [ASYNC] [PRIORITY 0-9] [AFTER id ...]"),
    ("QPEEK q 1 ", ""),
    ("CLUSTER MEET", " ip port"),
    ("CLUSTER MEET 127.0.0.1 ", "port"),
    ("JSCAN 0 STATE queued active ", "[COUNT count] [BUSYLOOP] [QUEUE queue] [STATE state ...] "
                                      "[REPLY all|id]"),
    ("QPOLICY CREATE q RETENTION ", "sec [REDRIVE max-receives dead-letter-queue] [NOREDRIVE] "
                                   "[VISIBILITY sec] [DELAY sec] [DEDUP yes|no] "
                                   "[BACKOFF base-sec max-sec] [MAXINFLIGHT n] [RATE per-sec]"),
])
def test_hint_is_the_syntax_still_to_type(line: str, hint: str) -> None:
    analysis = analyse(line)
    assert analysis is not None and analysis.hint == hint


@pytest.mark.parametrize("line", ["NOSUCH ", "QLEN a b ", "", "CLUSTER BOGUS "])
def test_no_hint_past_or_outside_the_syntax(line: str) -> None:
    analysis = analyse(line)
    assert analysis is None or analysis.hint == ""


@pytest.mark.parametrize(("line", "words"), [
    ("getj", ["GETJOB"]),
    ("qu", ["QUIT"]),
    ("CONFIG ", ["GET", "SET", "REWRITE", "RESETSTAT"]),
    ("PAUSE jobs ", ["in", "out", "all", "none", "state"]),
    ("PAUSE jobs in ", ["BCAST"]),
    ("GETJOB NOHANG F", ["FROM"]),
    ("QPOLICY REDRIVE d", ["dlq"]),
    ("ADDJOB ", ["dlq", "jobs"]),
])
def test_tab_candidates(line: str, words: list[str]) -> None:
    assert [w for w, _ in completions(line, lambda: ["dlq", "jobs"])] == words
