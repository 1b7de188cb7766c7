"""The reactor's state and its epoll bookkeeping, without trio: compiled with mypyc.

Theory of operation
-------------------
``node/reactor.py`` explains the reactor (one task, a level-triggered epoll, bounded rounds, the
group commit at the end of each round). This module holds its state (the epoll, the table of
connections by descriptor, the ``runnable`` queue, the round's ``held`` connections and
``others`` replies) and the bookkeeping that never waits (``add``, ``forget``, ``park``,
``unpark``, ``schedule``, ``close_idle``). The round itself, which runs per request, is
functions in ``node/round_core.py`` (``poll``, ``run_round``, ``end_round``) rather than methods
here: see that module for why. It imports no trio, so ``tools/build_core.py`` compiles it with
the core; the two things that need trio are hooks the interpreted ``Reactor`` subclass provides:
``_room_freed`` (wake the accept loop) and ``release_later`` (a task that releases held
connections once the log catches up). The waiting loop's pass between two awaits is
``round_core.pass_until_await``; the awaits themselves (``Reactor._run``) stay in
``node/reactor.py``.
"""

from __future__ import annotations

import os
import select
import time
from collections import deque
from collections.abc import Callable
from typing import Final, Protocol

from mypy_extensions import mypyc_attr

from broker.effects import Reply
from node.bus_core import LinkCore
from node.conn_state import CLOSED, ConnState, is_draining, is_held, is_waiting

# Fairness bounds of one round (see node/reactor.py). A turn of an unpipelined client runs one
# command; these only bite for pipelines and floods.
MAX_TURNS_PER_ROUND: Final = 512
MAX_COMMANDS_PER_TURN: Final = 256
MAX_COMMANDS_PER_ROUND: Final = 2048
# ... and a round starts no new turn after this long: commands as slow as CLIENT LIST or INFO
# with thousands of clients must not keep the timers, the bus and the log's worker-thread
# completions (a rewrite, a slow disk's fdatasync) waiting for hundreds of milliseconds.
MAX_ROUND_S: Final = 0.01
# The accept loop takes no new client while this many new connections with input wait for
# their first turn (see node/reactor.py).
MAX_NEW_WAITING: Final = 64
# Sockets reported per poll: more than one round serves, so the queue never runs dry early.
MAX_EVENTS: Final = 1024
# Rounds follow one another without a trip through trio's scheduler for up to this long (a
# client whose next request is already there is served at once, as a connection's own loop
# would); then the other tasks (timers, the bus, the log's writer) get their turn.
QUANTUM_S: Final = 0.001
# The longest the reactor sleeps in its own epoll without a look at trio's deadlines (they
# are read before each sleep; this only bounds a clock that jumps).
MAX_SLEEP_S: Final = 1.0

# Readable, and the peer's end of the stream (EPOLLRDHUP): a connection whose client hung up
# is closed in the turn that ran its last commands, not one lap of the queue later.
_EVENTS = select.EPOLLIN | select.EPOLLRDHUP
HANGUP: Final = select.EPOLLRDHUP | select.EPOLLHUP


class Served(Protocol):
    """What the reactor needs of a connection (``node.conn_core.ConnCore``)."""

    fd: int
    state: ConnState  # node/conn_state.py
    queued: bool  # in ``runnable``
    fresh: bool  # accepted, not served yet
    readable: bool  # the epoll reported it since its last turn
    hup: bool  # the peer closed its sending side (EPOLLRDHUP)
    registered: bool  # in the epoll
    parks: int  # tasks holding it out of the epoll
    last_active: float

    def release_if_durable(self) -> bool: ...

    def ticket(self) -> int: ...

    def has_input(self) -> bool: ...

    def crashed(self) -> None: ...

    def close(self) -> None: ...


class AppendLog(Protocol):
    """What the reactor needs of the append log (``node.persistence.Persistence``)."""

    round_open: bool

    @property
    def done_ticket(self) -> int: ...

    def commit_now(self) -> bool: ...

    def sync_due(self) -> bool: ...


class Clock(Protocol):
    """What the reactor needs of the clock (``node.clock``)."""

    def now_ms(self) -> int: ...

    def monotonic(self) -> float: ...


def _nothing() -> None:
    """No cluster bus."""


def wall_ms() -> int:
    """Unix time in milliseconds, ``node.clock.WallClock.now_ms``: a compiled function, as it
    is read for every round of the reactor and every read of a bus link."""
    return time.time_ns() // 1_000_000


@mypyc_attr(allow_interpreted_subclasses=True)
class ReactorCore:
    """The reactor's state and its rounds; ``node.reactor.Reactor`` adds the trio loop."""

    def __init__(self, clock: Clock, append_log: AppendLog, flush_broker: Callable[[], None],
                 dispatch: Callable[[list[Reply], int], None],
                 flush_bus: Callable[[], None]) -> None:
        self.clock = clock
        self.append_log = append_log
        # Routes what the round's commands left for the cluster bus (the server's Bus.flush:
        # the broker's effects first, then each cluster core's, then the cores' timers are
        # told their deadlines may have moved), once per round rather than once per command.
        self.flush_bus = flush_bus
        self.flush_broker = flush_broker  # the broker's effects from outside a command (an undo)
        self.dispatch = dispatch
        self.epoll = select.epoll()
        self.by_fd: dict[int, Served] = {}
        self.runnable: deque[Served] = deque()
        # The round being run: its time, the connections whose replies wait for its end (a
        # turn appends itself to ``held``), the replies its commands made for other clients.
        self.now = clock.monotonic()
        self.now_ms = clock.now_ms()
        self.held: list[Served] = []
        self.others: list[Reply] = []
        self.rounds = 0
        self.turns = 0
        # schedule() from another task while the loop waits: a write to this descriptor,
        # which is in the epoll, wakes it (cheaper than cancelling the wait).
        self.wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.epoll.register(self.wake_fd, select.EPOLLIN)
        self.waiting = False
        self.woken = False
        # trio's own epoll, when the reactor sleeps in its epoll rather than through trio
        # (node/reactor.py, "Sleeping"): reported ready, trio has something to run.
        self.trio_fd = -1
        self.trio_ready = False
        # The waiting loop's state between two of its awaits (``round_core.pass_until_await``):
        # the last poll's events are queued already, trio's run queue was seen empty since the
        # last hand-over (and its next deadline then, ``wake_at``), the end of the quantum,
        # and what the loop last awaited (``AWAIT_*`` in round_core; 0: nothing yet).
        self.polled = False
        self.settled = False
        self.wake_at = 0.0
        self.quantum_end = 0.0
        self.awaited = 0
        # The cluster bus's plain links, by descriptor: read in the reactor's loop, not by a
        # task each (node/bus.py), the ones the last poll reported in ``ready_links``.
        self.links: dict[int, LinkCore] = {}
        self.ready_links: list[LinkCore] = []
        # New connections with input that have not had their first turn yet (the accept
        # loop waits while there are MAX_NEW_WAITING).
        self.new_waiting = 0
        # Writes what the rounds queued for the cluster bus's links
        # (``node.bus_core.write_pending``): called when the loop waits or lets the other
        # tasks run, not after every round.
        self.write_bus: Callable[[], None] = _nothing

    # -- hooks of the trio side (node/reactor.py) --------------------------------------------

    def _room_freed(self) -> None:
        """Fewer than ``MAX_NEW_WAITING`` new connections wait now: wake the accept loop."""
        raise NotImplementedError

    def release_later(self, held: list[Served]) -> None:
        """The round's commit was not done inline: release ``held`` from a task, later."""
        raise NotImplementedError

    # -- membership -------------------------------------------------------------------------

    def add(self, conn: Served) -> None:
        self.epoll.register(conn.fd, _EVENTS)
        conn.registered = True
        self.by_fd[conn.fd] = conn

    def forget(self, conn: Served) -> None:
        """The connection is closing: out of the epoll and the table (before its socket is
        closed, so its descriptor number can be reused at once)."""
        if conn.registered:
            conn.registered = False
            try:
                self.epoll.unregister(conn.fd)
            except (OSError, ValueError):
                pass
        if self.by_fd.get(conn.fd) is conn:
            del self.by_fd[conn.fd]
        if conn.fresh:
            self.first_turn(conn)

    def add_link(self, link: LinkCore) -> None:
        """Read a bus link in the loop from now on (level-triggered, registered once)."""
        self.epoll.register(link.fd, select.EPOLLIN)
        self.links[link.fd] = link

    def forget_link(self, link: LinkCore) -> None:
        """The link is closing: out of the epoll (before its socket is closed)."""
        if self.links.get(link.fd) is link:
            del self.links[link.fd]
            try:
                self.epoll.unregister(link.fd)
            except (OSError, ValueError):
                pass

    def stop_reading(self, conn: Served) -> None:
        """Its client sent its last byte: out of the epoll, turns only when scheduled."""
        if conn.registered:
            conn.registered = False
            self.epoll.unregister(conn.fd)

    def park(self, conn: Served) -> None:
        """A task takes the connection: its input is no longer read or executed."""
        conn.parks += 1
        if conn.registered:
            conn.registered = False
            self.epoll.unregister(conn.fd)

    def unpark(self, conn: Served) -> None:
        """A task gives the connection back (the last one, if several held it)."""
        conn.parks -= 1
        state = conn.state
        if conn.parks or state is CLOSED:
            return
        if not (conn.registered or is_draining(state)):
            self.epoll.register(conn.fd, _EVENTS)
            conn.registered = True
        conn.last_active = self.clock.monotonic()
        if conn.has_input() or is_draining(state):
            self.schedule(conn)

    def first_turn(self, conn: Served) -> None:
        conn.fresh = False
        if conn.queued:
            self.new_waiting -= 1
            if self.new_waiting < MAX_NEW_WAITING:
                self._room_freed()

    def schedule(self, conn: Served) -> None:
        """Give ``conn`` a turn even though its socket may have nothing new (its buffer holds
        commands: unblocked, unparked, released, or cut short by the budget)."""
        if not conn.queued and conn.state is not CLOSED:
            conn.queued = True
            self.runnable.append(conn)
        if self.waiting and not self.woken:
            self.woken = True
            os.eventfd_write(self.wake_fd, 1)

    # -- idle clients -----------------------------------------------------------------------

    def close_idle(self, timeout: int) -> int:
        """Close the connections idle for more than ``timeout`` seconds (0: never); how many."""
        if not timeout:
            return 0
        now = self.clock.monotonic()
        idle = [c for c in self.by_fd.values()
                if not (c.parks or is_waiting(c.state) or is_held(c.state)) and now - c.last_active > timeout]
        for conn in idle:
            conn.close()
        return len(idle)

    def close_all(self) -> None:
        for conn in list(self.by_fd.values()):
            conn.close()
        if not self.epoll.closed:
            self.epoll.close()
            os.close(self.wake_fd)
