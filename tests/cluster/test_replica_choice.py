"""The job core picks an ADDJOB's replicas with its own compiled shuffle: the same draws as
``random.Random.shuffle``, so a seeded harness picks the same nodes as before."""

from __future__ import annotations

import random

import pytest

from cluster.jobs import shuffle


@pytest.mark.parametrize("size", range(9))
def test_shuffle_swaps_as_random_shuffle_does(size: int) -> None:
    for seed in range(100):
        ours, theirs = random.Random(seed), random.Random(seed)
        picked = [f"node{i}" for i in range(size)]
        expected = list(picked)
        shuffle(ours, picked)
        theirs.shuffle(expected)
        assert picked == expected
        assert ours.random() == theirs.random()  # the same number of draws taken
