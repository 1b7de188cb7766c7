"""One client connection: its buffers, its commands, its replies, and who owns it when.

Theory of operation
-------------------
A connection lives in the reactor (``node/reactor.py``) and is served there inline: a
``turn`` reads once, feeds the ``RequestParser``, executes the complete commands (at most the
budget it is given) against the broker with the round's ``now_ms``, and routes each command's
effects at once (``Host.route``: log records to the append log's open batch, replies for other
clients to the round's ``others``). Replies are encoded into ``out`` in order. A turn that made
replies is *held* until the end of the round (``release_if_durable``), which writes ``out``
with one ``send``: after the round's group commit for commands that logged, the replies of
commands whose write failed replaced by ``-ERR <error>`` (nothing is replied before its record
is durable), and for every connection together with the others, so that a client woken by the
first reply of a round finds the next ones there instead of being put to sleep and woken once
per reply (that wake-up was about 29% of the node's CPU under 50 unpipelined clients). Commands only the runtime can finish (intents, ``broker/intents.py``)
are carried out inline too (``Host.carry_out_now``: QUIT, BGREWRITEAOF, CLIENT KILL, MONITOR,
CONFIG REWRITE/RESETSTAT), except the two that wait.

What must wait happens in a task, the connection *parked* meanwhile (out of the epoll, its
input unread):

* replies the socket would not take whole: the rest waits in ``pending`` and a sender task
  (``_send_pending``) writes it when the socket is writable; a client over the
  ``client-output-buffer-limit`` is closed;
* CONFIG SET appendonly/maxclients and SHUTDOWN (``Host.carry_out``): the connection's own
  task (``_finish_in_task``) carries them out, runs the rest of the pipeline, waits for the
  log, writes, and gives the connection back.

A connection is in one ``ConnState`` (``node/conn_state.py``: OPEN, DRAINING, CLOSING,
CLOSED, and their HELD and BLOCKED variants), changed only by ``conn_core.transition``. After
QUIT, a protocol error or CLIENT KILL of itself a connection runs nothing more (CLOSING,
parked): its replies are written, then it closes, waiting at most ``CLOSE_FLUSH_TIMEOUT_S``
for a client that does not read them. A client that shut its sending side has what it sent
run and its replies written before the connection closes (DRAINING); a blocked one that goes
away is closed at once (the broker forgets its waiter).

Replies from elsewhere (a blocked GETJOB served, a MONITOR line) come through
``send_nowait``: while HELD (replies of this connection wait for the log or are being built)
they queue behind those; while a sender task runs they queue behind its bytes;
otherwise they are sent at once. So replies leave in the order their causes happened. A
blocked GETJOB stops the pipeline (BLOCKED); commands behind it stay in the buffer until
the ``Reply`` that unblocks it is dispatched (``Server.dispatch_now`` queues the connection
again). A synchronous ADDJOB that waits for its copies lets the ADDJOBs behind it run
(REPLICATING), their replies queued in order behind its own, and stops the pipeline at the
first command that may not pass it (``node/conn_core.py``, "Pipelined ADDJOBs").

**Compiled.** What runs for every request and never waits (the turn, the per-command loop,
the release at the end of the round, the non-waiting send) is ``ConnCore`` in
``node/conn_core.py``, which imports no trio and is compiled with mypyc as part of the core
(``make build``); ``Connection`` subclasses it with what needs trio: the connection's own task,
the sender task, the bounded wait before closing.
"""

from __future__ import annotations

import socket
from typing import Any, Protocol

import trio

from broker.effects import Reply
from broker.intents import Intent
from node.conn_core import (
    CLOSE,
    MUST_WAIT,
    READ_SIZE,
    ConnCore,
    execute_commands,
    flush_waiting,
    make_room,
    send_some,
    settle_behind,
    transition,
)
from node.conn_core import Host as CoreHost
from node.conn_state import CLOSED, is_held, to_unheld

# How long a connection closing after QUIT or a protocol error may take to write the replies
# before it; past that a client that does not read is closed anyway.
CLOSE_FLUSH_TIMEOUT_S = 10.0
# Commands a connection's own task runs after an intent before it gives the connection back to
# the reactor (the rest waits for the reactor's turns).
MAX_TASK_COMMANDS = 256


class Host(CoreHost, Protocol):
    """What a connection needs of the node (``node.server.Server``): the core's needs, and
    the tasks' (``node.conn_core.Host``)."""

    nursery: trio.Nursery

    async def wait_durable(self, tickets: set[int]) -> dict[int, str]: ...

    async def carry_out(self, conn: Connection, intent: Intent) -> Any: ...


class Connection(ConnCore):
    """One client connection: ``ConnCore``'s inline work, and the tasks it hands off to (see
    the module docstring)."""

    __slots__ = ()

    host: Host

    # -- work that waits: the connection's own task -----------------------------------------

    def _hand_off(self, intent: Intent) -> None:
        self.reactor.park(self)
        self.host.nursery.start_soon(self._finish_in_task, intent)

    async def _finish_in_task(self, intent: Intent) -> None:
        """Carry out an intent that waits (``Host.carry_out``), run the rest of the pipeline,
        wait for the log, write, then give the connection back (or close it)."""
        host = self.host
        others: list[Reply] = []
        status: Any = intent
        try:
            while isinstance(status, Intent):
                reply = await host.carry_out(self, status)
                self._after(reply, others)
                _, status = execute_commands(self, MAX_TASK_COMMANDS, host.clock.now_ms(),
                                             others)
                host.bus.flush()  # no reactor round ends for these: their frames go now
            if self.logged or self.behind_ticket:
                tickets = {t for _, _, t in self.logged}
                if self.behind_ticket:
                    tickets.add(self.behind_ticket)
                failures = await host.wait_durable(tickets)
                self._patch_failures(failures)
                if self.behind_ticket:
                    settle_behind(self)
            transition(self, to_unheld(self.state))
            if self.out:
                self._write_out()
            if self.waiting:  # pipelined ADDJOBs (node/conn_core.py)
                flush_waiting(self)
                make_room(self)
            if others:
                host.dispatch(others, 0)
            if status is CLOSE:
                await self._drain()
                self.close()
        except Exception:
            self.crashed()
        finally:
            if is_held(self.state):  # an error on the way
                transition(self, to_unheld(self.state))
            self.reactor.unpark(self)

    def _close_when_written(self) -> None:
        if self.sending:
            self.host.nursery.start_soon(self._drain_and_close)
        else:
            self.close()

    async def _drain_and_close(self) -> None:
        await self._drain()
        self.close()

    async def _drain(self) -> None:
        """Before closing after QUIT or a protocol error, let the sender task write every
        reply that came before it (an unblocked GETJOB's job included: cutting it off would
        lose a job counted as delivered). Bounded: a client that stops reading is closed after
        CLOSE_FLUSH_TIMEOUT_S all the same."""
        with trio.move_on_after(CLOSE_FLUSH_TIMEOUT_S):
            while self.sending and self.state is not CLOSED:
                await trio.sleep(0.005)

    # -- output that waits: the sender task -------------------------------------------------

    def _send_later(self, rest: bytes) -> None:
        """The socket is full: a sender task writes ``rest`` (and what follows it) as the
        socket takes it, the connection parked meanwhile."""
        self.pending.append(rest)
        self.sending = True
        self.reactor.park(self)
        self.host.nursery.start_soon(self._send_pending)

    async def _send_pending(self) -> None:
        """The sender task: write ``pending`` as the socket takes it, then give the
        connection back to the reactor."""
        sock = self.sock
        try:
            while self.pending and self.state is not CLOSED:
                view = memoryview(b"".join(self.pending))
                self.pending.clear()
                while view:
                    sent = send_some(self, view)
                    if sent is None:
                        return
                    if sent:
                        self.last_active = self.host.clock.monotonic()
                    view = view[sent:]
                    if view:
                        unsent = len(view) + sum(map(len, self.pending))
                        if self.over_output_limit(unsent):
                            self.close_for_output(unsent)
                            return
                        try:
                            await trio.lowlevel.wait_writable(sock)
                        except trio.ClosedResourceError:  # closed by another task meanwhile
                            return
        finally:
            self.sending = False
            self.reactor.unpark(self)

    def _wake_sender(self) -> None:
        trio.lowlevel.notify_closing(self.sock)  # its sender task may be waiting on it


def set_keepalive(sock: socket.socket, interval: int) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, interval)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, interval // 3))
    except OSError:
        pass


__all__ = ["CLOSE", "CLOSE_FLUSH_TIMEOUT_S", "Connection", "Host", "MUST_WAIT", "READ_SIZE",
           "set_keepalive"]
