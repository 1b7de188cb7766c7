"""Where the idle reactor sleeps (node/reactor.py, "Sleeping"): in its own epoll, trio's epoll
registered in it, when trio's internals are those it knows; through trio otherwise. Either
way trio's timers, worker threads, signals and the reactor's clients still wake it."""

from __future__ import annotations

import signal
import socket
import time

import pytest
import trio

import node.reactor
from node.clock import WallClock
from node.reactor import MAX_SLEEP_S, Reactor, trio_loop
from tests.server.test_inprocess import connect
from tests.server.test_inprocess import node as inprocess_node


class _Log:
    round_open = False
    done_ticket = 0

    def commit_now(self) -> bool:
        return True

    def sync_due(self) -> bool:
        return False


async def _never(tickets: set[int]) -> dict[int, str]:
    raise AssertionError("no connection is held")


def _reactor() -> Reactor:
    return Reactor(WallClock(), _Log(), lambda: None, lambda replies, ticket: None, _never)


async def _woken_in_time() -> None:
    """A worker thread's completion, a signal and a timer reach a task while the reactor is
    idle, each well before the reactor's longest sleep."""
    start = time.monotonic()
    await trio.to_thread.run_sync(time.sleep, 0.01)
    assert time.monotonic() - start < MAX_SLEEP_S / 2
    with trio.open_signal_receiver(signal.SIGUSR1) as signals:
        start = time.monotonic()
        signal.raise_signal(signal.SIGUSR1)
        with trio.fail_after(MAX_SLEEP_S / 2):
            async for signum in signals:
                assert signum == signal.SIGUSR1
                break
    start = time.monotonic()
    await trio.sleep(0.02)
    assert time.monotonic() - start < MAX_SLEEP_S / 2


@pytest.mark.parametrize("own", [True, False])
async def test_an_idle_reactor_lets_threads_signals_and_timers_through(monkeypatch, own) -> None:
    if not own:
        monkeypatch.setattr(node.reactor, "trio_loop", lambda: None)
    reactor = _reactor()
    async with trio.open_nursery() as nursery:
        await nursery.start(reactor.run)
        assert (reactor.trio_fd >= 0) is own
        for _ in range(3):
            await _woken_in_time()
        nursery.cancel_scope.cancel()
    reactor.close_all()


async def test_one_reactor_per_run_sleeps_in_its_own_epoll() -> None:
    """A second reactor in the same run waits through trio: one asleep in its own epoll would
    not see the other's clients."""
    first, second = _reactor(), _reactor()
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        await nursery.start(second.run)
        assert first.trio_fd >= 0
        assert second.trio_fd == -1
        nursery.cancel_scope.cancel()
    first.close_all()
    second.close_all()
    assert trio_loop() is not None  # released when the reactors stopped


async def test_the_autojump_clock_makes_the_reactor_wait_through_trio(autojump_clock) -> None:
    assert trio_loop() is None


@pytest.mark.parametrize("own", [True, False])
async def test_a_node_serves_its_clients_and_times_out_a_getjob(tmp_path, monkeypatch,
                                                                own) -> None:
    if not own:
        monkeypatch.setattr(node.reactor, "trio_loop", lambda: None)
    async with inprocess_node(tmp_path) as (server, port):
        assert (server.reactor.trio_fd >= 0) is own
        c = await connect(port)
        for _ in range(20):
            assert await c.call("PING") == b"PONG"
        start = time.monotonic()
        assert await c.call("GETJOB", "TIMEOUT", 200, "FROM", "empty") is None
        assert 0.15 < time.monotonic() - start < 5
        # A client in a thread, on a blocking socket: only the reactor's epoll sees it.
        def ping() -> bytes:
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64)

        assert await trio.to_thread.run_sync(ping) == b"+PONG\r\n"
