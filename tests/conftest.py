"""Fixtures shared by the whole suite. Keep it small: helpers live in tests/support/."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
