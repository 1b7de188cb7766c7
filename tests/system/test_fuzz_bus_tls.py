"""The cluster bus under ``tls-cluster yes``, on real nodes (``tools/fuzz_bus.py --tls``): three
joined TLS nodes; 600 links to node 1's bus port that must be refused before a frame is read
(garbage, cut and doubled ClientHellos, plaintext frames, no client certificate, another CA's
certificate), then 20,000 mutated frames as node 0 over TLS with the cluster's client
certificate, some records damaged or sent a few bytes at a time. Every refused link is counted
refused and none of its frames counted received; node 1 answers PING throughout, the cluster
replicates again within 30 s, no node logs or counts an unexpected error and node 1's
descriptors come back. A fixed seed, so a failure replays (``python -m tools.fuzz_bus --tls
--seed 33 --count 20000 --refused 600``); ``make fuzz`` runs 1,000,000 frames from a random
seed."""

from __future__ import annotations

import pytest

from tests.support import fuzz
from tools import fuzz_bus


@pytest.mark.slow
def test_a_tls_bus_refuses_bad_handshakes_and_survives_damaged_records(capsys) -> None:
    code = fuzz_bus.main(["--tls", "--count", "20000", "--seed", "33", "--seconds", "60",
                          "--refused", "600", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, fuzz.report(out)
    lines = out.strip().splitlines()
    last = lines[-1]
    assert last.startswith("20000 frames") and last.endswith("0 problems"), last
    tls = lines[-2]
    assert tls.startswith("600 links refused by TLS") and "0 counted received" in tls, tls
    damaged = int(tls.split("client certificate ")[1].split()[0])
    assert damaged > 100, f"too few links ended by damaged records: {tls}"
