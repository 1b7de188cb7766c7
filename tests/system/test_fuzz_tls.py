"""The TLS client port's survival test: 50,000 fuzzed RESP inputs over TLS to a node with
``appendfsync always``, with damaged records (cut, split and sent slowly, flipped, plaintext
after the handshake, a second ClientHello) and garbage handshakes; afterwards it answers PING
over plain and TLS connections, holds every sentinel, closed every connection and restarts
from its log (tools/fuzz_resp.py --tls). The seed is fixed so that a failure replays;
TRISQUE_FUZZ_SEED picks another."""

from __future__ import annotations

import os

import pytest

from tests.support import fuzz
from tools import fuzz_resp

SEED = 20261127


@pytest.mark.slow
def test_a_node_survives_50000_fuzzed_inputs_over_tls(capsys) -> None:
    seed = int(os.environ.get("TRISQUE_FUZZ_SEED", SEED))
    code = fuzz_resp.main(["--tls", "--count", "50000", "--seed", str(seed), "--seconds",
                           "240"])
    out = capsys.readouterr().out
    assert code == 0, f"seed {seed}:\n{fuzz.report(out)}"
    lines = out.strip().splitlines()
    last = lines[-1]
    inputs, executed = int(last.split()[0]), int(last.split()[2])
    assert inputs == 50_000, last
    assert executed > 25_000, f"seed {seed}: the node executed too little: {last}"
    damaged = int(lines[-2].split(", ")[2].split()[0])
    assert damaged > 100, f"seed {seed}: too few connections with damaged records: {lines[-2]}"
