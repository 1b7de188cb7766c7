"""Histograms the node's ``/metrics`` reads (node/metrics.py), cheap enough for hot paths.

Theory of operation
-------------------
A ``Histogram`` has fixed upper bounds chosen where it is created; ``observe(value)`` finds
the first bound at or above the value (a scan from the lowest) and adds to that bucket, the sum and
the count. Nothing else happens on the hot path: the Prometheus collector turns the buckets
into cumulative counts (Prometheus's ``le`` buckets) only when it is scraped. Plain ints and
floats, no locks: the node updates and reads them on its one event-loop thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

# Typed tuple[float, ...], not a tuple of 16 floats: compiled with mypyc, a Final fixed-size
# tuple of floats read from another module raises NameError (a mypyc limitation).
#: Seconds: 100 us .. 10 s, for fsync latency (measured with perf_counter).
LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0)
#: Seconds: 1 ms .. 10 s, for what the sans-IO cores time with their ``now_ms`` (millisecond
#: resolution: a round trip within the same millisecond counts as 0).
MS_LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


class Histogram:
    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError("histogram bounds must be distinct and increasing")
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        # ``bisect_left(self.bounds, value)`` as a compiled loop: a dozen bounds, the value
        # usually below the first few, and a call to ``bisect`` is a Python-level call.
        bounds = self.bounds
        n = len(bounds)
        i = 0
        while i < n and bounds[i] < value:
            i += 1
        self.counts[i] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), ending with (inf, count)."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out
