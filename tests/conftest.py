"""Fixtures shared by the whole suite. Keep it small: helpers live in tests/support/."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.support.server import ServerProcess


def pytest_report_header() -> str:
    """Which core the suite runs on (make test runs it on both; protocol/core_build.py)."""
    from protocol import core_build

    return f"trisque {core_build.describe()}"


# What a test module that starts real processes (nodes, workers, the CLI, Spark's JVM) holds
# at module level: it imports one of these to do so.
_PROCESS_NAMES = frozenset(("ServerProcess", "LocalCluster", "local_cluster", "WorkerProcess",
                            "subprocess", "repo_env", "pexpect"))
_PROCESS_FIXTURES = frozenset(("server", "local_cluster"))


def _starts_processes(module: ModuleType | None) -> bool:
    return module is not None and not _PROCESS_NAMES.isdisjoint(vars(module))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``process`` every test that runs real processes (make test runs those once, on the
    compiled core, and the in-process tests on both cores)."""
    for item in items:
        if _starts_processes(getattr(item, "module", None)) \
                or not _PROCESS_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.process)


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    """A fresh single ``trisque-server`` on a free loopback port, stopped after the test."""
    with ServerProcess() as proc:
        yield proc
