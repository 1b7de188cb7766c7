"""The reactor: one task serves every client connection that is ready, in rounds.

Theory of operation
-------------------
A trio task per connection costs a trip through trio's scheduler for every request, and every
wait re-arms a one-shot registration in trio's epoll (an ``epoll_ctl``). The reactor replaces
them with one task and one level-triggered ``select.epoll`` holding the client sockets
(registered once per connection): trio waits on that epoll's descriptor (``wait_readable``)
only when no connection has anything to do.

**Rounds.** The loop polls the epoll without waiting, queues the connections it reports
(``runnable``, a FIFO, one entry per connection) and runs a *round*: each queued connection
gets one *turn* (``Served.turn``: one ``recv``, its complete commands executed, its replies
encoded), in queue order, with no task switch in between; the replies are written at the end
of the round, one ``send`` per connection. Work is bounded:
at most ``MAX_TURNS_PER_ROUND`` turns and ``MAX_COMMANDS_PER_ROUND`` commands, no new turn
after ``MAX_ROUND_S``, and in a turn at most ``MAX_COMMANDS_PER_TURN`` commands and about
``MAX_OUTPUT_PER_TURN`` bytes of replies. A connection left with commands in its buffer goes
to the back of the queue and reads nothing more until they have run, so a flooding pipeliner
is served in slices behind the others and never buffered without bound. Rounds follow one
another without a trip through trio's scheduler for a ``QUANTUM_S`` (a client whose next
request is already there is served at once); then the task checkpoints, so the timers, the
bus, the log's writer and the tasks below run.

**Group commit at the end of each round.** The round ends by flushing the cluster bus once
(``flush``: the frames the round's commands queued for other nodes, the cluster cores' timers
told their deadlines may have moved; nothing of it could run before the round ends anyway).
The records the round's commands made are in the append log's open batch; the round then
writes it (``Persistence.commit_now``: one ``write``, and under ``appendfsync always`` one
``fdatasync``, in this task, as Disque's ``beforeSleep`` flushes the AOF before it writes the
replies). Only then are the replies of the round's connections (``held``) written, ``-ERR``
for a command whose write failed, followed by the replies the round's commands made for other
clients (``others``, blocked GETJOBs served). When the log is not written inline (the writer's thread has a batch
in flight, a rewrite is switching files, the disk is slow) the held connections are released
by a task once the log says their batch is durable; they stay in the epoll meanwhile and are
read, but execute nothing.

**Leaving the reactor.** A connection that must wait for something else is *parked*: taken
out of the epoll (its input is not read: a client that stops reading is paused, not buffered)
and handed to a task, which gives it back with ``unpark`` (registered again, and queued if its
buffer still holds commands). Parking happens for replies the socket would not take (a sender
task waits until it is writable), for the two commands only the runtime can finish that wait
(CONFIG SET appendonly/maxclients and SHUTDOWN: the connection's own task), and after QUIT or
a protocol error (until what is unsent is written and it closes). A blocked GETJOB or
synchronous ADDJOB is not parked: it stays in the epoll, its input is read and kept (within
the query buffer limit) so that a disconnect is noticed at once, and it executes nothing until
the ``Reply`` that unblocks it is delivered, which queues it again if commands wait behind it.
A task that makes a connection runnable (``schedule``) wakes the loop if it is waiting, with
a write to an eventfd that is in the epoll.

**Clients that hang up** (``EPOLLRDHUP``) have their whole stream there: a turn reads it to
the end (up to ``MAX_READS_PER_TURN`` reads), runs it, writes the replies and closes, rather
than taking one lap of the queue per read. **New clients** are accepted only while fewer than
``MAX_NEW_WAITING`` new connections with input wait for their first turn: a node that falls
behind a burst of connections leaves the next ones in the kernel's accept queue.

**Idle clients.** A connection's ``last_active`` moves when it sends something and when a
reply from elsewhere is delivered to it; ``close_idle``, called by the server's timer about
once a second, closes those idle longer than ``timeout`` (read at each call: CONFIG SET
applies at once), except blocked, parked or held ones, as Disque's clientsCron does.

An unexpected exception in a turn closes that connection only (``Served.crashed``).
"""

from __future__ import annotations

import os
import select
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from broker.effects import Reply
from node.clock import Clock

# Fairness bounds of one round (see the module docstring). A turn of an unpipelined client
# runs one command; these only bite for pipelines and floods.
MAX_TURNS_PER_ROUND = 512
MAX_COMMANDS_PER_TURN = 256
MAX_COMMANDS_PER_ROUND = 2048
# ... and a round starts no new turn after this long: commands as slow as CLIENT LIST or INFO
# with thousands of clients must not keep the timers, the bus and the log's worker-thread
# completions (a rewrite, a slow disk's fdatasync) waiting for hundreds of milliseconds.
MAX_ROUND_S = 0.01
# A turn also stops once its replies pass this many bytes (written before more is executed),
# so a client that pipelines requests for big jobs and does not read is paused with about
# this much unsent, not with every reply its buffer asked for.
MAX_OUTPUT_PER_TURN = 256 * 1024
# Rounds follow one another without a trip through trio's scheduler for up to this long (a
# client whose next request is already there is served at once, as a connection's own loop
# would); then the other tasks (timers, the bus, the log's writer) get their turn.
QUANTUM_S = 0.001
# The accept loop takes no new client while this many new connections with input wait for
# their first turn: a node that is behind leaves the next ones in the kernel's accept queue
# (tcp-backlog) until it gets to them, so its client table (CLIENT LIST, INFO) holds the
# clients it serves, not every one that connected during a burst.
MAX_NEW_WAITING = 64
# Sockets reported per poll: more than one round serves, so the queue never runs dry early.
MAX_EVENTS = 1024


# Readable, and the peer's end of the stream (EPOLLRDHUP): a connection whose client hung up
# is closed in the turn that ran its last commands, not one lap of the queue later.
_EVENTS = select.EPOLLIN | select.EPOLLRDHUP
_HANGUP = select.EPOLLRDHUP | select.EPOLLHUP


class Served(Protocol):
    """What the reactor needs of a connection (``node.connection.Connection``)."""

    fd: int
    closing: bool
    queued: bool  # in ``runnable``
    fresh: bool  # accepted, not served yet
    readable: bool  # the epoll reported it since its last turn
    hup: bool  # the peer closed its sending side (EPOLLRDHUP)
    eof: bool  # ... and its end was read (no longer in the epoll)
    registered: bool  # in the epoll
    parks: int  # tasks holding it out of the epoll
    blocked: bool
    holding: bool  # replies waiting for the log (or being built by its own task)
    last_active: float

    def turn(self, budget: int) -> int: ...

    def release_if_durable(self) -> bool: ...

    def ticket(self) -> int: ...

    def has_input(self) -> bool: ...

    def crashed(self) -> None: ...

    def close(self) -> None: ...


class Log(Protocol):
    """What the reactor needs of the append log (``node.persistence.Persistence``)."""

    round_open: bool

    @property
    def done_ticket(self) -> int: ...

    def commit_now(self) -> bool: ...


class Reactor:
    def __init__(self, clock: Clock, log: Log, settle: Callable[[], None],
                 dispatch: Callable[[list[Reply], int], None],
                 wait_durable: Callable[[set[int]], Awaitable[dict[int, str]]],
                 flush: Callable[[], None] = lambda: None) -> None:
        self.clock = clock
        self.log = log
        # Routes what the round's commands left for the cluster bus (the server's Bus.flush:
        # the broker's effects first, then each cluster core's, then the cores' timers are
        # told their deadlines may have moved), once per round rather than once per command.
        self.flush = flush
        self.settle = settle  # routes what the broker emitted outside a command (an undo's)
        self.dispatch = dispatch
        self.wait_durable = wait_durable
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
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.epoll.register(self._wake_fd, select.EPOLLIN)
        self._waiting = False
        self._woken = False
        self._nursery: trio.Nursery | None = None
        # New connections with input that have not had their first turn yet, and the event
        # the accept loop waits on while there are too many (see room_for_new).
        self.new_waiting = 0
        self._room = trio.Event()
        self._room.set()

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
            self._first_turn(conn)

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
        if conn.parks or conn.closing:
            return
        if not (conn.registered or conn.eof):
            self.epoll.register(conn.fd, _EVENTS)
            conn.registered = True
        conn.last_active = self.clock.monotonic()
        if conn.has_input() or conn.eof:
            self.schedule(conn)

    async def room_for_new(self) -> None:
        """Wait, before accepting another client, until fewer than ``MAX_NEW_WAITING`` new
        connections wait for their first turn."""
        while self.new_waiting >= MAX_NEW_WAITING:
            self._room = trio.Event()
            await self._room.wait()

    def _first_turn(self, conn: Served) -> None:
        conn.fresh = False
        if conn.queued:
            self.new_waiting -= 1
            if self.new_waiting < MAX_NEW_WAITING:
                self._room.set()

    def schedule(self, conn: Served) -> None:
        """Give ``conn`` a turn even though its socket may have nothing new (its buffer holds
        commands: unblocked, unparked, released, or cut short by the budget)."""
        if not conn.queued and not conn.closing:
            conn.queued = True
            self.runnable.append(conn)
        if self._waiting and not self._woken:
            self._woken = True
            os.eventfd_write(self._wake_fd, 1)

    # -- the loop ---------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            polled = False
            clock = time.perf_counter
            quantum_end = clock() + QUANTUM_S
            while True:
                if not polled:
                    self._poll()
                polled = False
                if not self.runnable:
                    # Nothing to do: trio runs the others and wakes us when a socket in the
                    # epoll is ready (or schedule() writes to the wake-up descriptor).
                    self._waiting = True
                    try:
                        await trio.lowlevel.wait_readable(self.epoll)
                    finally:
                        self._waiting = self._woken = False
                    quantum_end = clock() + QUANTUM_S
                    continue
                self._round()
                self._poll()
                polled = True
                if self.runnable and clock() > quantum_end:
                    # More to do, and the other tasks have waited a quantum: let them run
                    # (one trip through trio's scheduler then, not one per round).
                    await trio.lowlevel.checkpoint()
                    quantum_end = clock() + QUANTUM_S

    def _poll(self) -> None:
        """Queue the connections the epoll reports ready (without waiting)."""
        runnable = self.runnable
        if len(runnable) >= MAX_TURNS_PER_ROUND:
            return  # level-triggered: those not queued now are reported again later
        by_fd = self.by_fd
        for fd, flags in self.epoll.poll(0, MAX_EVENTS):
            conn = by_fd.get(fd)
            if conn is None:
                if fd == self._wake_fd:
                    os.eventfd_read(fd)
                continue
            conn.readable = True
            if flags & _HANGUP:
                conn.hup = True
            if not conn.queued:
                conn.queued = True
                runnable.append(conn)
                if conn.fresh:
                    self.new_waiting += 1

    def _round(self) -> None:
        self.rounds += 1
        self.now = self.clock.monotonic()
        self.now_ms = self.clock.now_ms()
        self.log.round_open = True
        runnable = self.runnable
        popleft = runnable.popleft
        budget = MAX_COMMANDS_PER_ROUND
        clock = time.perf_counter
        deadline = clock() + MAX_ROUND_S
        turns = 0
        try:
            # Those queued when the round starts: a connection re-queued by its budget waits
            # for the next round, behind the others.
            for _ in range(min(len(runnable), MAX_TURNS_PER_ROUND)):
                conn = popleft()
                if conn.fresh:
                    self._first_turn(conn)
                conn.queued = False
                if conn.closing:
                    continue
                turns += 1
                try:
                    budget -= conn.turn(budget if budget < MAX_COMMANDS_PER_TURN
                                        else MAX_COMMANDS_PER_TURN)
                except Exception:
                    conn.crashed()
                if budget <= 0 or clock() > deadline:
                    break
        finally:
            self.turns += turns
            self.log.round_open = False
            self._end_round()

    def _end_round(self) -> None:
        """Route what the round left for the cluster bus, commit the round's log records, then
        release the replies that waited for them, then those for other clients."""
        self.flush()
        self.log.commit_now()
        self.settle()
        if self.held:
            held, self.held = self.held, []
            later = None
            for conn in held:
                if conn.closing:
                    continue
                try:
                    if not conn.release_if_durable():
                        if later is None:
                            later = [conn]
                        else:
                            later.append(conn)
                except Exception:
                    conn.crashed()
            if later:
                assert self._nursery is not None
                self._nursery.start_soon(self._release_later, later)
        if self.others:
            others, self.others = self.others, []
            self.dispatch(others, 0)

    async def _release_later(self, held: list[Served]) -> None:
        """The commit could not be done inline: release ``held`` once the log has finished
        the newest batch any of them waits for (batches finish in ticket order)."""
        await self.wait_durable({max(conn.ticket() for conn in held)})
        for conn in held:
            if conn.closing:
                continue
            try:
                released = conn.release_if_durable()
            except Exception:
                conn.crashed()
                continue
            # Nothing it waited for can still be pending, and a held connection makes no
            # new records.
            assert released, "a held connection's batch is still pending"

    # -- idle clients -----------------------------------------------------------------------

    def close_idle(self, timeout: int) -> int:
        """Close the connections idle for more than ``timeout`` seconds (0: never); how many."""
        if not timeout:
            return 0
        now = self.clock.monotonic()
        idle = [c for c in self.by_fd.values()
                if not (c.blocked or c.parks or c.holding) and now - c.last_active > timeout]
        for conn in idle:
            conn.close()
        return len(idle)

    def close_all(self) -> None:
        for conn in list(self.by_fd.values()):
            conn.close()
        if not self.epoll.closed:
            self.epoll.close()
            os.close(self._wake_fd)
