"""Helpers for the dashboard and metrics tests: a real node with the HTTP port on, /metrics
parsed by prometheus-client's own parser."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

# One node with the HTTP port on per module, as the HTTP API's tests have it.
from tests.http.conftest import node  # noqa: F401


def scrape(base: str, **kwargs: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``GET /metrics``, keyed by (sample name, sorted labels)."""
    r = httpx.get(base + "/metrics", timeout=10, **kwargs)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"{name}{labels} not in /metrics: " + ", ".join(
        sorted({n for n, _ in samples}))
    return samples[key]
