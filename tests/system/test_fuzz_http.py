"""The HTTP port's survival test: 30,000 mutated HTTP/1.1 requests, pipelined over many
connections, plain and over HTTPS; afterwards the node answers a request of each kind on a
fresh connection, holds every sentinel job, logged no caught exception, answered no 5xx,
closed every connection and kept its memory within a bound (tools/fuzz_http.py). The seed
is fixed so that a failure replays; TRISQUE_FUZZ_SEED picks another."""

from __future__ import annotations

import os

import pytest

from tests.support import fuzz
from tools import fuzz_http

SEED = 20261127


@pytest.mark.slow
@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_a_node_survives_30000_fuzzed_http_requests(capsys, tls: bool) -> None:
    seed = int(os.environ.get("TRISQUE_FUZZ_SEED", SEED))
    argv = ["--count", "30000", "--seed", str(seed), "--seconds", "240"]
    code = fuzz_http.main(argv + (["--tls"] if tls else []))
    out = capsys.readouterr().out
    assert code == 0, f"seed {seed}:\n{fuzz.report(out)}"
    last = out.strip().splitlines()[-1]
    words = last.split()
    requests, executed, answers = int(words[0]), int(words[2]), int(words[8])
    assert requests == 30_000, last
    # Most routes run a command; bad requests end their connection, and the requests
    # pipelined behind them are never answered.
    assert answers > 9_000, f"seed {seed}: too few answers: {last}"
    assert executed > 3_000, f"seed {seed}: the node executed too little: {last}"
