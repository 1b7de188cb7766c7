"""``Histogram.observe`` puts a value in the bucket of the first bound at or above it (the
last bucket: above every bound), as ``bisect_left`` on the bounds finds it."""

from __future__ import annotations

import random
from bisect import bisect_left

from broker.stats import MS_LATENCY_BUCKETS, Histogram


def test_observe_counts_as_bisect_left_finds() -> None:
    h = Histogram(MS_LATENCY_BUCKETS)
    expected = [0] * (len(MS_LATENCY_BUCKETS) + 1)
    rng = random.Random(7)
    values = [*MS_LATENCY_BUCKETS, 0.0, -1.0, 20.0, float("inf")]
    values += [rng.uniform(0, 12) for _ in range(500)] + [rng.uniform(0, 0.01) for _ in range(500)]
    for value in values:
        h.observe(value)
        expected[bisect_left(MS_LATENCY_BUCKETS, value)] += 1
    assert h.counts == expected
    assert h.count == len(values) and h.cumulative()[-1] == (float("inf"), len(values))
