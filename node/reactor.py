"""The reactor: one task serves every client connection that is ready, in rounds.

Theory of operation
-------------------
A trio task per connection costs a trip through trio's scheduler for every request, and every
wait re-arms a one-shot registration in trio's epoll (an ``epoll_ctl``). The reactor replaces
them with one task and one level-triggered ``select.epoll`` holding the client sockets and
the cluster bus's plain links (registered once each), in which the task itself sleeps when
nothing is ready (below, "Sleeping").

**Rounds.** The loop polls the epoll without waiting, queues the connections it reports
(``runnable``, a FIFO, one entry per connection) and runs a *round*: each queued connection
gets one *turn* (``conn_core.turn``: one ``recv``, its complete commands executed, its replies
encoded), in queue order, with no task switch in between; the replies are written at the end
of the round, one ``send`` per connection. Work is bounded:
at most ``MAX_TURNS_PER_ROUND`` turns and ``MAX_COMMANDS_PER_ROUND`` commands, no new turn
after ``MAX_ROUND_S``, and in a turn at most ``MAX_COMMANDS_PER_TURN`` commands and about
``MAX_OUTPUT_PER_TURN`` bytes of replies. A connection left with commands in its buffer goes
to the back of the queue and reads nothing more until they have run, so a flooding pipeliner
is served in slices behind the others and never buffered without bound. Rounds follow one
another without a trip through trio's scheduler for a ``QUANTUM_S`` (a client whose next
request is already there is served at once); then the task writes the bus and, if trio has
anything to run (its epoll ready, a task scheduled, a deadline passed), checkpoints, so the
timers, the links' writers, the log's writer and the tasks below run.

**Group commit at the end of each round.** The round ends by flushing the cluster bus once
(``flush_bus``: the frames the round's commands queued for other nodes, the cluster cores' timers
told their deadlines may have moved; nothing of it could run before the round ends anyway).
The records the round's commands made are in the append log's open batch. If that batch
will be fdatasynced (``sync_due``), the round first polls again and gives a turn to the clients
that became ready while it ran (within its bounds, until a poll finds none or a pass runs
nothing), so that they share
the fdatasync rather than wait a whole one more; Disque's loop commits what one ``epoll_wait``
returned. The round then writes it (``Persistence.commit_now``: one ``write``, and under ``appendfsync always`` one
``fdatasync``, in this task, as Disque's ``beforeSleep`` flushes the AOF before it writes the
replies). Only then are the replies of the round's connections (``held``) written, ``-ERR``
for a command whose write failed, followed by the replies the round's commands made for other
clients (``others``, blocked GETJOBs served). When the log is not written inline (the writer's thread has a batch
in flight, a rewrite is switching files, the disk is slow) the held connections are released
by a task once the log says their batch is durable; they stay in the epoll meanwhile and are
read, but execute nothing.

**The cluster bus's frames** that the rounds' commands send (a replicated ADDJOB's REPLJOBs)
are queued by ``flush_bus`` at the end of each round and written when the loop waits or lets
the other tasks run (``write_bus``): at once after a lone request, once per quantum for all
the rounds of a busy one (one write per link, as a link's own writer task would).

**Sleeping.** When no connection has anything to do and trio has no task to run, the
reactor sleeps in its own epoll (``poll`` with a timeout), trio's own epoll descriptor being
registered in it, for at most the time to trio's next deadline: a client, a bus link, or
anything trio waits for (a socket of a task, a worker thread's completion, a signal: they
reach trio through descriptors in its epoll) wakes it, and it hands over to trio (one
checkpoint) only when trio's epoll is ready or a deadline passed. Waking and sleeping again
is then one ``epoll_wait``, with no trip through trio's run loop and no ``epoll_ctl``. While
trio has tasks to run (a link's writer woken, tasks left in the batch the reactor was
resumed in: ``round_core.trio_idle``) it checkpoints instead. This reads trio's internals
(``trio_loop``: its epoll, run queue, tasks and deadlines, as in trio 0.35); with another trio
version, another clock (the tests' autojump clock), in guest mode or for a second reactor in
the same run (only one may sleep outside trio: it would not see the other's epoll) the
reactor waits on its epoll's descriptor through trio (``wait_readable``), as before.

**The cluster bus's plain links** (``node/bus.py``) are read here too: a link the epoll
reports is read once per pass of the loop, before its round (``serve_links``:
``bus_core.read_link``, its frames handed to the cores at once, the answers of the pass
written with one write per link), not by a task of its own and not in a round. A link under
TLS keeps its reader task, and every link its writer
task for what must wait for the socket.

**Leaving the reactor.** A connection that must wait for something else is *parked*: taken
out of the epoll (its input is not read: a client that stops reading is paused, not buffered)
and handed to a task, which gives it back with ``unpark`` (registered again, and queued if its
buffer still holds commands). Parking happens for replies the socket would not take (a sender
task waits until it is writable), for the two commands only the runtime can finish that wait
(CONFIG SET appendonly/maxclients and SHUTDOWN: the connection's own task), and after QUIT or
a protocol error (until what is unsent is written and it closes). A blocked GETJOB is not
parked: it stays in the epoll, its input is read and kept (within the query buffer limit) so
that a disconnect is noticed at once, and it executes nothing until the ``Reply`` that
unblocks it is dispatched, which queues it again if commands wait behind it. A synchronous
ADDJOB waiting for its copies stays in the epoll the same way, but its connection
(REPLICATING) keeps getting turns for the ADDJOBs behind it, up to ``MAX_ADDJOBS_WAITING``
replies owed; the first command that may not pass them waits as behind a GETJOB
(``node/conn_core.py``, "Pipelined ADDJOBs").
A task that makes a connection runnable (``schedule``) wakes the loop if it is waiting, with
a write to an eventfd that is in the epoll.

**Clients that hang up** (``EPOLLRDHUP``) have their whole stream there: a turn reads it to
the end (up to ``MAX_READS_PER_TURN`` reads), runs it, writes the replies and closes, rather
than taking one lap of the queue per read. **New clients** are accepted only while fewer than
``MAX_NEW_WAITING`` new connections with input wait for their first turn: a node that falls
behind a burst of connections leaves the next ones in the kernel's accept queue.

**Idle clients.** A connection's ``last_active`` moves when it sends something and when a
reply from elsewhere is dispatched to it; ``close_idle``, called by the server's ticker about
once a second, closes those idle longer than ``timeout`` (read at each call: CONFIG SET
applies at once), except blocked, parked or held ones, as Disque's clientsCron does.

An unexpected exception in a turn closes that connection only (``Served.crashed``).

**Compiled.** Everything above that never waits is compiled with mypyc as part of the core
(``make build``) and imports no trio: the state and the epoll bookkeeping are ``ReactorCore`` in
``node/reactor_core.py``, and the round (``poll``, ``run_round``, ``end_round``) is functions in
``node/round_core.py``, which call each connection's turn directly in C. So is the loop's pass
between two awaits (``pass_until_await``: the polls, the links, the rounds, the bus written,
the sleep in the reactor's epoll and the looks at trio's run queue and deadlines, trio's runner
passed in untyped), which returns what to await. This module adds what needs trio: those
awaits (``_run``: a checkpoint, ``wait_readable``, the tests' ``waiting_for_idle`` sleep), the
accept loop's wait for room (``room_for_new``) and the task that releases held connections
when the log was not committed inline (``release_later``).
"""

from __future__ import annotations

import select
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from broker.effects import Reply
from node.clock import Clock
from node.conn_core import MAX_OUTPUT_PER_TURN
from node.conn_state import CLOSED
from node.reactor_core import (
    MAX_COMMANDS_PER_ROUND,
    MAX_COMMANDS_PER_TURN,
    MAX_EVENTS,
    MAX_NEW_WAITING,
    MAX_ROUND_S,
    MAX_SLEEP_S,
    MAX_TURNS_PER_ROUND,
    QUANTUM_S,
    AppendLog,
    ReactorCore,
    Served,
)
from node.round_core import (
    AWAIT_IDLE_SLEEP,
    AWAIT_READABLE,
    pass_until_await,
    trio_idle,
    trio_timeout,
)

MIN_IDLE_SLEEP_S = 0.001


class TrioLoop:
    """What the reactor reads of trio's run loop to sleep in its own epoll: internals of trio
    0.35 (``trio_loop`` checks they are there)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.fd: int = runner.io_manager._epoll.fileno()


# The run loops in which a reactor sleeps in its own epoll: one per loop, since a reactor
# asleep there is blind to another's epoll (the others wait through trio, whose epoll the
# sleeping one watches).
_claimed: weakref.WeakSet[Any] = weakref.WeakSet()


def trio_loop() -> TrioLoop | None:
    """trio's run loop as ``TrioLoop``, claimed for the calling reactor, or None where the
    reactor waits through trio: another trio version, a clock other than the system's (the
    tests' autojump clock), guest mode, another reactor in the same run (tests)."""
    if not trio.__version__.startswith("0.35."):
        return None
    try:
        from trio._core import _run

        runner = _run.GLOBAL_RUN_CONTEXT.runner
        if (runner.is_guest or type(runner.clock) is not _run.SystemClock
                or runner in _claimed):
            return None
        loop = TrioLoop(runner)
        trio_timeout(runner)  # what the compiled loop reads of it is there
        trio_idle(runner, False)
    except (ImportError, AttributeError, TypeError, OSError):
        return None
    _claimed.add(runner)
    return loop


class Reactor(ReactorCore):
    """The reactor: ``ReactorCore``'s rounds driven by a trio task (see the module docstring)."""

    def __init__(self, clock: Clock, append_log: AppendLog, flush_broker: Callable[[], None],
                 dispatch: Callable[[list[Reply], int], None],
                 wait_durable: Callable[[set[int]], Awaitable[dict[int, str]]],
                 flush_bus: Callable[[], None] = lambda: None) -> None:
        super().__init__(clock, append_log, flush_broker, dispatch, flush_bus)
        self.wait_durable = wait_durable
        self._nursery: trio.Nursery | None = None
        # The event the accept loop waits on while too many new connections wait for their
        # first turn (see room_for_new).
        self._room = trio.Event()
        self._room.set()

    async def room_for_new(self) -> None:
        """Wait, before accepting another client, until fewer than ``MAX_NEW_WAITING`` new
        connections wait for their first turn."""
        while self.new_waiting >= MAX_NEW_WAITING:
            self._room = trio.Event()
            await self._room.wait()

    def _room_freed(self) -> None:
        self._room.set()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        loop = trio_loop()
        if loop is not None:
            # Registered before anything waits on this epoll through trio: trio keeps a
            # descriptor it waited on in its epoll, and epolls may not hold each other.
            self.epoll.register(loop.fd, select.EPOLLIN)
            self.trio_fd = loop.fd
        try:
            await self._run(loop, task_status)
        finally:
            if loop is not None:
                _claimed.discard(loop.runner)

    async def _run(self, loop: TrioLoop | None, task_status: Any) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            runner: Any = None if loop is None else loop.runner
            self.quantum_end = time.perf_counter() + QUANTUM_S
            while True:
                # Everything that does not await, compiled: see "Compiled" above.
                awaited = pass_until_await(self, runner)
                if awaited == AWAIT_READABLE:
                    try:
                        await trio.lowlevel.wait_readable(self.epoll)
                    finally:
                        self.waiting = self.woken = False
                elif awaited == AWAIT_IDLE_SLEEP:
                    # A test waits for every task to block: trio must see none runnable for
                    # its cushion.
                    await trio.sleep(max(2 * runner.waiting_for_idle.keys()[0][0],
                                         MIN_IDLE_SLEEP_S))
                else:
                    await trio.lowlevel.checkpoint()

    def release_later(self, held: list[Served]) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._release_when_durable, held)

    async def _release_when_durable(self, held: list[Served]) -> None:
        """The commit could not be done inline: release ``held`` once the log has finished
        the newest batch any of them waits for (batches finish in ticket order)."""
        await self.wait_durable({max(conn.ticket() for conn in held)})
        for conn in held:
            if conn.state is CLOSED:
                continue
            try:
                released = conn.release_if_durable()
            except Exception:
                conn.crashed()
                continue
            # Nothing it waited for can still be pending, and a held connection makes no
            # new records.
            assert released, "a held connection's batch is still pending"


__all__ = ["MAX_COMMANDS_PER_ROUND", "MAX_COMMANDS_PER_TURN", "MAX_EVENTS", "MAX_NEW_WAITING",
           "MAX_OUTPUT_PER_TURN", "MAX_ROUND_S", "MAX_SLEEP_S", "MAX_TURNS_PER_ROUND", "QUANTUM_S", "Reactor",
           "Served"]
