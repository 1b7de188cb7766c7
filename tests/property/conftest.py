"""Hypothesis profiles: ``ci`` (the default, a few seconds for the whole package, in `make
test`) and ``fuzz`` (`make fuzz`: 1,000,000 examples per property, for hours). Chosen with
TRISQUE_HYPOTHESIS_PROFILE; TRISQUE_FUZZ_EXAMPLES changes the fuzz profile's count."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=300, deadline=None, derandomize=False, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "fuzz", max_examples=int(os.environ.get("TRISQUE_FUZZ_EXAMPLES", 1_000_000)), deadline=None,
    print_blob=True,
    suppress_health_check=list(HealthCheck),
)
settings.load_profile(os.environ.get("TRISQUE_HYPOTHESIS_PROFILE", "ci"))
