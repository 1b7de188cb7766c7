"""The client port's survival test: 200,000 fuzzed RESP inputs over many connections to a node with
``appendfsync always``; afterwards it answers PING, holds every sentinel job added before, and
restarts from its log with them (tools/fuzz_resp.py). The seed is fixed so that a failure
replays; TRISQUE_FUZZ_SEED picks another."""

from __future__ import annotations

import os

import pytest

from tests.support import fuzz
from tools import fuzz_resp

SEED = 20261126


@pytest.mark.slow
def test_a_node_survives_200000_fuzzed_inputs(capsys) -> None:
    seed = int(os.environ.get("TRISQUE_FUZZ_SEED", SEED))
    code = fuzz_resp.main(["--count", "200000", "--seed", str(seed), "--seconds", "240"])
    out = capsys.readouterr().out
    assert code == 0, f"seed {seed}:\n{fuzz.report(out)}"
    last = out.strip().splitlines()[-1]
    inputs, executed = int(last.split()[0]), int(last.split()[2])
    assert inputs == 200_000, last
    assert executed > 100_000, f"seed {seed}: the node executed too little: {last}"
