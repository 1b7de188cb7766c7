"""Fixtures shared by the whole suite. Keep it small: helpers live in tests/support/."""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.support import server as server_support
from tests.support.server import ServerProcess

# Hypothesis profiles, for every property test: ``ci`` (the default, in `make test`: 300
# examples each, the same ones every run, so a failure replays and runs are comparable) and
# ``fuzz`` (`make fuzz`: 1,000,000 random examples per property, for hours). Chosen with
# TRISQUE_HYPOTHESIS_PROFILE; TRISQUE_FUZZ_EXAMPLES changes the fuzz profile's count.
settings.register_profile(
    "ci", max_examples=300, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "fuzz", max_examples=int(os.environ.get("TRISQUE_FUZZ_EXAMPLES", 1_000_000)), deadline=None,
    print_blob=True,
    suppress_health_check=list(HealthCheck),
)
settings.load_profile(os.environ.get("TRISQUE_HYPOTHESIS_PROFILE", "ci"))


def pytest_report_header() -> str:
    """Which core the suite runs on (make test runs it on both; protocol/core_build.py)."""
    from protocol import core_build

    return f"trisque {core_build.describe()}"


# What a test module that starts real processes (nodes, workers, the CLI, Spark's JVM) holds
# at module level: it imports one of these to do so (the fuzzers start their own nodes).
_PROCESS_NAMES = frozenset(("ServerProcess", "LocalCluster", "local_cluster", "WorkerProcess",
                            "subprocess", "repo_env", "pexpect", "fuzz_resp", "fuzz_bus"))
_PROCESS_FIXTURES = frozenset(("server", "local_cluster"))
# Or a helper of these modules (tests/http/conftest.py's start a node with its HTTP port).
_PROCESS_HELPERS = frozenset(("tests.http.conftest",))


def _starts_processes(module: ModuleType | None) -> bool:
    return module is not None and (
        not _PROCESS_NAMES.isdisjoint(vars(module))
        or any(getattr(v, "__module__", None) in _PROCESS_HELPERS for v in vars(module).values()))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``process`` every test that runs real processes (make test runs those once, on the
    compiled core, and the in-process tests on both cores)."""
    for item in items:
        if _starts_processes(getattr(item, "module", None)) \
                or not _PROCESS_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.process)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_rank)


# Work units of pytest-xdist for make test (``--dist loadfile --no-loadscope-reorder``): one
# per module, so that a module's nodes start once, but one for all of tests/pipeline/, so
# that one worker runs the Spark tests with one SparkSession (one JVM: several at once starve
# a 2-core machine). Units go out in the order of their first test: the Spark unit first,
# then the modules with a slow test, then the rest that starts processes, so that no long
# unit starts last. (xdist's own loadgroup does not group under pytest 9.2.)
SPARK_UNIT = "tests/pipeline/"


def _unit(nodeid: str) -> str:
    module = nodeid.split("::")[0]
    return SPARK_UNIT if module.startswith(SPARK_UNIT) else module


def _rank(item: pytest.Item) -> int:
    if _unit(item.nodeid) == SPARK_UNIT:
        return 0
    if item.get_closest_marker("slow"):
        return 1
    return 2 if item.get_closest_marker("process") else 3


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Units(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return Units(config, log)


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
