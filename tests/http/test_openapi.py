"""schemathesis against ``/openapi.json`` of a real node (bounded examples): the document
matches what is served, and no input makes a route answer 5xx.

The 503 the document lists (a log write that failed) is tested in test_http_api.py; here the
node is healthy, so any 5xx is a failure."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import checks

from tests.http.conftest import start


@pytest.fixture(scope="module")
def api_schema() -> Iterator[object]:
    srv, base = start()
    try:
        with httpx.Client(base_url=base, timeout=5) as c:
            # Queues for the generated requests to hit beside the unknown ones.
            for name in ("a", "b", "0"):
                c.put(f"/queues/{name}", json={})
                c.post(f"/messages/{name}", content=b"m")
        yield schemathesis.openapi.from_url(base + "/openapi.json")
    finally:
        srv.stop()


CHECKS = [checks.not_a_server_error, checks.status_code_conformance,
          checks.content_type_conformance, checks.response_schema_conformance,
          checks.response_headers_conformance]
# Invalid input (wrong types, out-of-range numbers, bad JSON): a documented 4xx, never a 5xx.
NEGATIVE_CHECKS = [checks.not_a_server_error, checks.status_code_conformance,
                   checks.content_type_conformance]


@pytest.mark.slow
def test_api_conforms_to_its_openapi_document(api_schema: object) -> None:
    # schemathesis's pytest plugin does not load under this pytest: the operations are driven
    # with Hypothesis directly, each with a bounded number of examples.
    operations = [r.ok() for r in api_schema.get_all_operations()]  # type: ignore[attr-defined]
    assert len(operations) >= 13
    for op in operations:
        for mode, to_check in ((schemathesis.GenerationMode.POSITIVE, CHECKS),
                               (schemathesis.GenerationMode.NEGATIVE, NEGATIVE_CHECKS)):

            _run(op, mode, to_check)


def _run(op: Any, mode: Any, to_check: list[Any]) -> None:
    @settings(max_examples=25, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(mode))
    def run(case: schemathesis.Case) -> None:
        case.call_and_validate(checks=to_check, timeout=20)

    try:
        run()
    except Unsatisfiable:
        # An operation whose every input accepts anything has no invalid request to make.
        assert mode is schemathesis.GenerationMode.NEGATIVE, op.label
