"""A real node with the HTTP API on (``http-port``) for the HTTP tests."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.server import ServerProcess, free_port


def free_http_port() -> int:
    """A free port from this test process's block (tests/support/server.py)."""
    return free_port()


def wait_http(srv: ServerProcess, base: str, verify: ssl.SSLContext | bool = True) -> None:
    """Until the node's HTTP API at ``base`` answers (it starts after the RESP port); the node
    is stopped if it never does."""
    deadline = time.monotonic() + 15
    while True:
        try:
            httpx.get(base + "/openapi.json", timeout=2, verify=verify)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                srv.stop()
                raise
            time.sleep(0.05)


def start(**directives: object) -> tuple[ServerProcess, str]:
    http_port = free_http_port()
    srv = ServerProcess(http_port=http_port, appendonly="yes", **directives).start()
    base = f"http://127.0.0.1:{http_port}"
    wait_http(srv, base)
    return srv, base


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[ServerProcess, str]]:
    srv, base = start()
    try:
        yield srv, base
    finally:
        srv.stop()


@pytest.fixture
def http(node: tuple[ServerProcess, str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=node[1], timeout=10) as client:
        yield client
