"""Fixtures shared by the whole suite. Keep it small: helpers live in tests/support/."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import server as server_support
from tests.support.server import ServerProcess


def pytest_report_header() -> str:
    """Which core the suite runs on (make test runs it on both; protocol/core_build.py)."""
    from protocol import core_build

    return f"trisque {core_build.describe()}"


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    """A fresh single ``trisque-server`` on a free loopback port, stopped after the test."""
    with ServerProcess() as proc:
        yield proc


@pytest.fixture(autouse=True)
def _no_unexpected_cluster_errors() -> Iterator[None]:
    """Fail a test whose real nodes caught an exception in a cluster core (INFO's
    ``cluster_unexpected_errors``, the bus's "unexpected error" log line): the audit runs
    when a node stops (tests/support/server.py), before this fixture's teardown, which comes
    after the test's own fixtures have stopped their nodes."""
    before = len(server_support.FINDINGS)
    yield
    found = server_support.FINDINGS[before:]
    del server_support.FINDINGS[before:]
    if found:
        pytest.fail("a node caught an unexpected error in its cluster core:\n"
                    + "\n".join(found), pytrace=False)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Nodes stopped outside any test (a module's fixture) are audited too."""
    if server_support.FINDINGS:
        print("\n".join(["", "unexpected errors in cluster cores:", *server_support.FINDINGS]))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
