"""The reactor's round as compiled functions: every connection's turn called directly.

Theory of operation
-------------------
``node/reactor.py`` explains the reactor: one task, a level-triggered epoll, bounded rounds,
the group commit at the end of each round. This module holds what runs for every request of
it: queueing the connections the epoll reports (``poll``), the round itself (``run_round``: one
turn per queued connection within the fairness bounds, then, when its log batch waits for an
fdatasync, one for each that became ready meanwhile), its end (``end_round``: the bus
flushed, the log committed, the held replies written), and the waiting loop's pass between two
of its awaits (``pass_until_await``: polls, links, rounds, the bus written, the sleep in the
reactor's epoll and the looks at trio's run queue; it returns what to await, ``AWAIT_*``, to
the interpreted ``Reactor._run``). trio's runner is passed in untyped (``Any``): this module
imports no trio.

They are functions taking ``ReactorCore`` and ``ConnCore``, not methods, for one reason: the
reactor and the connections the node runs are instances of interpreted subclasses (``Reactor``
and ``Connection`` add their trio tasks), and compiled code calls *any* method of such an
instance through Python's method lookup (mypyc's "shadow vtable" for interpreted subclasses),
however hot, and reads their attributes through Python's getattr when it knows them only by a
``Protocol``. A module function called with the compiled base types is a direct C call, and
the attributes it reads are struct fields; as methods, the turn, the release and the end of the
round each went through ``PyObject_VectorcallMethod`` once per request (or round) in ``perf``. ``ConnCore.release_if_durable`` stays as a method, for
the interpreted task that releases connections after a late commit, and delegates here.

The module imports ``node.conn_core`` and ``node.reactor_core`` (which do not import each other
back at run time) and no trio; ``tools/build_core.py`` compiles it with them.
"""

from __future__ import annotations

import os
import time
from typing import Any, Final, cast

from node.bus_core import read_link, write_pending
from node.conn_core import ConnCore, release_if_durable, turn
from node.conn_state import CLOSED
from node.reactor_core import (
    HANGUP,
    MAX_COMMANDS_PER_ROUND,
    MAX_COMMANDS_PER_TURN,
    MAX_EVENTS,
    MAX_ROUND_S,
    MAX_SLEEP_S,
    MAX_TURNS_PER_ROUND,
    QUANTUM_S,
    ReactorCore,
    Served,
)


def poll(reactor: ReactorCore, timeout: float = 0.0) -> None:
    """Queue the connections the epoll reports ready, waiting up to ``timeout`` seconds for
    one (0: not at all); trio's own epoll reported ready sets ``trio_ready``."""
    runnable = reactor.runnable
    if len(runnable) >= MAX_TURNS_PER_ROUND:
        return  # level-triggered: those not queued now are reported again later
    by_fd = reactor.by_fd
    for fd, flags in reactor.epoll.poll(timeout, MAX_EVENTS):
        found = by_fd.get(fd)
        if found is None:
            link = reactor.links.get(fd)
            if link is not None:
                if not link.ready:
                    link.ready = True
                    reactor.ready_links.append(link)
            elif fd == reactor.wake_fd:
                os.eventfd_read(fd)
            elif fd == reactor.trio_fd:
                reactor.trio_ready = True
            continue
        conn = cast(ConnCore, found)
        conn.readable = True
        if flags & HANGUP:
            conn.hup = True
        if not conn.queued:
            conn.queued = True
            runnable.append(conn)
            if conn.fresh:
                reactor.new_waiting += 1


def serve_links(reactor: ReactorCore) -> None:
    """One read of each bus link the last poll reported, its frames handed to the cores at
    once (``bus_core.read_link``): no round and no task. A link that ended leaves the epoll
    and is closed (its task cleans up)."""
    ready = reactor.ready_links
    reactor.ready_links = []
    bus = ready[0].bus
    # The frames the cores answer with are written once the pass has read every link: one
    # write per link for all of them, not one per read.
    bus.deferring = True
    try:
        for link in ready:
            link.ready = False
            if link.closed or not read_link(link):
                reactor.forget_link(link)
                if not link.closed:
                    link.close()
    finally:
        bus.deferring = False
    write_pending(bus)


def run_round(reactor: ReactorCore) -> None:
    """One turn for each connection queued when the round starts (within the bounds), then,
    while the round's log batch waits for an fdatasync, one for each connection that became
    ready meanwhile, then the end of the round."""
    reactor.rounds += 1
    clock = reactor.clock
    reactor.now = clock.monotonic()
    reactor.now_ms = clock.now_ms()
    append_log = reactor.append_log
    append_log.round_open = True
    runnable = reactor.runnable
    budget = MAX_COMMANDS_PER_ROUND
    perf_counter = time.perf_counter
    deadline = perf_counter() + MAX_ROUND_S
    turns = 0
    try:
        # Those queued when the round starts: a connection re-queued by its budget waits for
        # the next round, behind the others (a pass gathering more for the fdatasync below
        # finds it held and skips it; its release queues it again).
        full = False
        ran = 1  # commands the last pass ran (the first pass always looks for more)
        while True:
            for _ in range(min(len(runnable), MAX_TURNS_PER_ROUND - turns)):
                conn = cast(ConnCore, runnable.popleft())
                if conn.fresh:
                    reactor.first_turn(conn)
                conn.queued = False
                if conn.state is CLOSED:
                    continue
                turns += 1
                try:
                    done = turn(conn, budget if budget < MAX_COMMANDS_PER_TURN
                                else MAX_COMMANDS_PER_TURN)
                    budget -= done
                    ran += done
                except Exception:
                    conn.crashed()
                if budget <= 0 or perf_counter() > deadline:
                    full = True
                    break
            # The round's records will wait for an fdatasync: the clients that became ready
            # meanwhile join the round (one fdatasync for all), within its bounds. A poll that
            # finds no one ends it, and so does a pass that ran nothing (only connections
            # whose replies the round holds, which the epoll reports while they have input).
            if full or not ran or turns >= MAX_TURNS_PER_ROUND or not append_log.sync_due():
                break
            poll(reactor)
            if not runnable:
                break
            ran = 0
    finally:
        reactor.turns += turns
        append_log.round_open = False
        end_round(reactor)


def end_round(reactor: ReactorCore) -> None:
    """Route what the round left for the cluster bus, commit the round's log records, then
    write the replies that waited for them, then those for other clients."""
    reactor.flush_bus()
    reactor.append_log.commit_now()
    reactor.flush_broker()
    if reactor.held:
        held = reactor.held
        reactor.held = []
        later: list[Served] = []
        for served in held:
            conn = cast(ConnCore, served)
            if conn.state is CLOSED:
                continue
            try:
                if not release_if_durable(conn):
                    later.append(conn)
            except Exception:
                conn.crashed()
        if later:
            reactor.release_later(later)
    if reactor.others:
        others = reactor.others
        reactor.others = []
        reactor.dispatch(others, 0)


# What pass_until_await returns: what the interpreted loop awaits before calling it again.
AWAIT_READABLE: Final = 1  # the reactor's epoll through trio (no sleeping outside trio)
AWAIT_IDLE_CHECKPOINT: Final = 2  # a checkpoint: trio's epoll ready or a deadline passed
AWAIT_CHECKPOINT: Final = 3  # a checkpoint: trio has tasks to run
AWAIT_IDLE_SLEEP: Final = 4  # a test waits for every task to block (trio.sleep)
AWAIT_QUANTUM_CHECKPOINT: Final = 5  # a checkpoint: the other tasks waited a quantum


def trio_idle(runner: Any, settled: bool) -> bool:
    """trio has no task scheduled: none in the run queue, none left in the batch being run (a
    scheduled task holds the value it will be resumed with until it is stepped: looked for
    unless ``settled``, no other task having run since the last look), and no test waits for
    all tasks to block. Reads trio 0.35's runner (``node.reactor.trio_loop`` checks it)."""
    if runner.runq or runner.waiting_for_idle:
        return False
    if settled:
        return True
    for task in runner.tasks:
        if task._next_send_fn is not None:
            return False
    return True


def trio_timeout(runner: Any) -> float:
    """Seconds to trio's next deadline (a timer, a timeout; inf if none)."""
    return float(runner.deadlines.next_deadline() - runner.current_time())


def pass_until_await(reactor: ReactorCore, runner: Any) -> int:
    """The reactor's loop (``node/reactor.py``) up to its next await: poll, serve the links,
    run rounds, write the bus, sleep in the epoll while trio is idle (``runner``: trio's run
    loop, None when the reactor waits through trio). Returns the ``AWAIT_*`` the caller awaits
    before calling again; the loop's state in between is kept in ``reactor``."""
    clock = time.perf_counter
    awaited = reactor.awaited
    if awaited:
        # Back from the await: trio ran its tasks (a checkpoint in the reactor's own epoll
        # also saw trio's epoll, consumed now).
        reactor.awaited = 0
        if awaited == AWAIT_IDLE_CHECKPOINT or awaited == AWAIT_QUANTUM_CHECKPOINT:
            reactor.trio_ready = False
        reactor.settled = False
        reactor.quantum_end = clock() + QUANTUM_S
    polled = reactor.polled
    settled = reactor.settled
    wake_at = reactor.wake_at
    quantum_end = reactor.quantum_end
    result = 0
    while True:
        if not polled:
            poll(reactor)
        polled = False
        if reactor.ready_links:
            serve_links(reactor)
        if not reactor.runnable:
            reactor.write_bus()
            if runner is None:
                # Nothing to do: trio runs the others and wakes us when a socket in the epoll
                # is ready (or schedule() writes to the wake-up descriptor).
                reactor.waiting = True
                result = AWAIT_READABLE
                break
            if trio_idle(runner, settled):
                # trio has nothing to run either: sleep here until a socket, trio's own epoll
                # or trio's next deadline (node/reactor.py, "Sleeping"). Its deadlines are read
                # once per hand-over: only its tasks change them.
                if not settled:
                    settled = True
                    wake_at = clock() + trio_timeout(runner)
                timeout = wake_at - clock()
                if timeout > 0:
                    reactor.trio_ready = False
                    poll(reactor, min(timeout, MAX_SLEEP_S))
                    polled = True
                    if not reactor.trio_ready and (reactor.runnable or clock() < wake_at):
                        quantum_end = clock() + QUANTUM_S
                        continue
                result = AWAIT_IDLE_CHECKPOINT
            elif runner.waiting_for_idle:
                result = AWAIT_IDLE_SLEEP
            else:
                result = AWAIT_CHECKPOINT  # others to run: their turn
            break
        run_round(reactor)
        if reactor.runnable:
            poll(reactor)  # the newly ready join the queue behind those left
        # else the next wait's poll is this one (one epoll_wait per round less)
        polled = True
        if reactor.runnable and clock() > quantum_end:
            quantum_end = clock() + QUANTUM_S
            reactor.write_bus()
            if (runner is None or reactor.trio_ready or not trio_idle(runner, False)
                    or trio_timeout(runner) <= 0):
                # More to do, and the other tasks have waited a quantum: let them run (one trip
                # through trio's scheduler then, not one per round).
                result = AWAIT_QUANTUM_CHECKPOINT
                break
    reactor.polled = polled
    reactor.settled = settled
    reactor.wake_at = wake_at
    reactor.quantum_end = quantum_end
    reactor.awaited = result
    return result
