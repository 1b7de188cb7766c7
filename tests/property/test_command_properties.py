"""Every command on any arguments: the parser gives a command object or an error reply from
the error table, and the broker core executing it never raises and never puts a record in the
append log that replay would refuse."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from broker.clients import Client
from broker.command_table import ROWS, parse
from broker.config import Config
from broker.core import BLOCKED, Broker
from broker.effects import LogRecord
from broker.intents import Intent
from protocol.commands import MAX_JOB_SECONDS, AddJob
from protocol.resp import Error, encode

# Codes an error reply may start with (protocol/errors.py).
CODES = {"ERR", "BADID", "NOJOB", "NOREPL", "PAUSED", "MAXLEN", "LEAVING", "TOOLATE", "NOAUTH",
         "WRONGPASS", "NOPROTO", "OOM", "LOADING"}
# DEBUG FLUSHALL would only make the sequences shorter.
SKIPPED = {b"debug"}

_NUMBERS = st.one_of(
    st.integers(min_value=-5, max_value=70_000),
    st.sampled_from([MAX_JOB_SECONDS, MAX_JOB_SECONDS + 1, 2**63 - 1, 2**63, -(2**63), 10**30]),
).map(lambda n: str(n).encode())
_WORDS = st.sampled_from([
    b"REPLICATE", b"DELAY", b"RETRY", b"TTL", b"MAXLEN", b"ASYNC", b"NOHANG", b"TIMEOUT",
    b"COUNT", b"WITHCOUNTERS", b"FROM", b"q", b"q2", b"BUSYLOOP", b"MINLEN", b"IMPORTRATE",
    b"QUEUE", b"STATE", b"REPLY", b"all", b"id", b"queued", b"in", b"out", b"bcast", b"none",
    b"D-00000000-000000000000000000000000-05a1", b"GET", b"SET", b"maxmemory", b"*",
    b"hz", b"LEAVING", b"yes", b"no", b"INFO", b"MYID", b"NODES", b"SETNAME", b"LIST", b"3",
    b"ADD", b"DEL", b"PAUSE", b"RESUME", b"FIRE", b"START", b"REPLACE", b"HELP", b"60", b"t",
    # JOBRUN's: the first run token of a node "abab...", and the states END takes.
    b"STATUS", b"APPEND", b"END", b"OUTPUT", b"RUNNING", b"abababab-1", b"done", b"failed",
    # The job-semantics extensions: ADDJOB's PRIORITY and AFTER, QPOLICY's BACKOFF,
    # MAXINFLIGHT, RATE and DEDUP (RESOLVE and WAITJOB are rows of the table).
    b"PRIORITY", b"AFTER", b"BACKOFF", b"MAXINFLIGHT", b"RATE", b"DEDUP", b"REDRIVE",
    b"VISIBILITY", b"CREATE", b"PARK",
])
_ARG = st.one_of(_NUMBERS, _WORDS, st.binary(max_size=10))
_NAMES = st.sampled_from(sorted(row.name for row in ROWS))


@given(_NAMES, st.lists(_ARG, max_size=10))
def test_parse_gives_a_command_or_a_table_error(name: bytes, args: list[bytes]) -> None:
    result = parse([name, *args])
    if isinstance(result, Error):
        assert result.code in CODES, result
        return
    if isinstance(result, AddJob):
        assert 0 <= result.delay <= MAX_JOB_SECONDS
        for value in (result.retry, result.ttl):
            assert value is None or 0 <= value <= MAX_JOB_SECONDS
        assert result.replicate is None or 1 <= result.replicate <= 65535


_STEP = st.tuples(_NAMES.filter(lambda n: n not in SKIPPED), st.lists(_ARG, max_size=8),
                  st.integers(min_value=0, max_value=400_000))


@given(st.lists(_STEP, min_size=1, max_size=25))
def test_the_core_survives_any_command_sequence(steps) -> None:
    now = 1_700_000_000_000
    b = Broker(Config(), "ab" * 20, b"seed", now_ms=now, rng=random.Random(0))
    client = Client(1)
    for name, args, advance in steps:
        reply = b.execute([name, *args], client, now)
        if reply is not BLOCKED and not isinstance(reply, Intent):  # intents: the runtime's
            encode(reply, 2)  # every reply is encodable
            encode(reply, 3)
        now += advance
        b.tick(now)
        for effect in b.take_effects():
            if isinstance(effect, LogRecord):
                assert Broker.validate_record(effect.kind, effect.payload) is None, effect
