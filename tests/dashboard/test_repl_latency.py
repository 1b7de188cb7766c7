"""The replication latency /metrics reports (``Broker.repl_latency``), on the in-process cluster
harness with a fake clock: a synchronous ADDJOB is timed from its REPLJOBs to its
replication level, with the frames' delays the test sets."""

from __future__ import annotations

from broker.clients import BLOCKED
from cluster.sim import Faults
from tests.cluster.jobsim import JobCluster


def test_a_synchronous_addjob_is_timed_to_its_replication_level() -> None:
    c = JobCluster(3, seed=3)
    for j in (1, 2):
        c.sim.faults[(j, 0)] = Faults(delay_ms=40)  # every GOTJOB takes 40 ms to come back
    h = c.broker(0).repl_latency
    assert h.count == 0
    client = c.client()
    assert c.cmd(0, "ADDJOB", "q", "x", "5000", "REPLICATE", "3", client=client) is BLOCKED
    assert c.run_until(lambda: c.reply_to(0, client) is not None, 1000)
    assert h.count == 1
    assert 0.040 <= h.sum <= 0.060  # 40 ms back, the REPLJOBs' way out is not delayed
    assert dict(h.cumulative())[0.05] == 1 and dict(h.cumulative())[0.02] == 0
    # Asynchronous and single-copy ADDJOBs wait for nobody: nothing to time.
    c.addjob(0, "q", "y", "5000", "REPLICATE", "3", "ASYNC")
    c.addjob(0, "q", "z", "5000", "REPLICATE", "1")
    assert h.count == 1
