"""bench/waitjob.py on a real three-node cluster: every round trip gets its own result."""

from __future__ import annotations

import pytest

from bench import waitjob

pytestmark = pytest.mark.cluster_processes


def test_a_short_waitjob_run_measures_every_round_trip() -> None:
    # Enough trips for the nodes' CPU to show in /proc's 10 ms ticks: 20 took 17 ms.
    result = waitjob.run(count=300, seconds=30.0, replicate=2)
    assert result.count == 300
    assert 0 < result.leg_p50_ms <= result.leg_p99_ms
    assert result.leg_p99_ms <= result.p99_ms and result.p50_ms <= result.p99_ms
    assert result.rate > 0 and result.cpu_ms_per_trip > 0
    assert "WAITJOB round trip, 3 nodes: 300 jobs" in result.line()
