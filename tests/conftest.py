"""Fixtures shared by the whole suite. Keep it small: helpers live in tests/support/."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.server import ServerProcess


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    """A fresh single ``trisque-server`` on a free loopback port, stopped after the test."""
    with ServerProcess() as proc:
        yield proc
