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

After QUIT, a protocol error or CLIENT KILL of itself a connection runs nothing more
(``ending``, parked): its replies are written, then it closes, waiting at most
``CLOSE_FLUSH_TIMEOUT_S`` for a client that does not read them. A client that shut its
sending side has what it sent run and its replies written before the connection closes
(``eof``); a blocked one that goes away is closed at once (the broker forgets its waiter).

Replies from elsewhere (a blocked GETJOB served, a MONITOR line) come through
``send_nowait``: while ``holding`` (replies of this connection wait for the log or are being
built) they queue behind those; while a sender task runs they queue behind its bytes;
otherwise they are sent at once. So replies leave in the order their causes happened. A
blocked command (GETJOB, synchronous ADDJOB) stops the pipeline (``blocked``); commands
behind it stay in the buffer until the ``Reply`` that unblocks it is delivered
(``Server.deliver`` queues the connection again).
"""

from __future__ import annotations

import logging
import socket
from time import perf_counter_ns
from typing import Any, Final, Protocol

import trio

from broker.clients import Client
from broker.config import Config, output_limits
from broker.core import BLOCKED, Broker
from broker.effects import Effect, Reply
from broker.intents import Intent, Quit
from cluster.jobs import JobCore
from node.bus import Bus
from node.clock import Clock
from node.persistence import Persistence
from node.reactor import MAX_OUTPUT_PER_TURN, Reactor
from protocol import errors
from protocol.resp import NEED_DATA, ProtocolError, RequestParser, encode_into

log = logging.getLogger("trisque")

READ_SIZE = 65536
# How long a connection closing after QUIT or a protocol error may take to write the replies
# before it; past that a client that does not read is closed anyway.
CLOSE_FLUSH_TIMEOUT_S = 10.0
# An ADDJOB body this big refreshes the memory sample before it is judged.
_BIG_ARGUMENT = 1 << 20
# Reads a turn makes from a client that hung up (its data is all there), as a connection's own
# loop would; a connection still talking gets one read a turn.
MAX_READS_PER_TURN = 8
# Commands a connection's own task runs after an intent before it gives the connection back to
# the reactor (the rest waits for the reactor's turns).
MAX_TASK_COMMANDS = 256


class _Close:
    __slots__ = ()


#: ``_execute``'s status for "the connection closes after these replies" (QUIT, a protocol
#: error, CLIENT KILL of itself).
CLOSE: Final = _Close()


class _MustWait:
    __slots__ = ()


#: ``Host.carry_out_now``'s answer for an intent that must be awaited (``Host.carry_out``).
MUST_WAIT: Final = _MustWait()


class Host(Protocol):
    """What a connection needs of the node (``node.server.Server``)."""

    config: Config
    clock: Clock
    broker: Broker
    bus: Bus
    jobs: JobCore
    persistence: Persistence
    reactor: Reactor
    nursery: trio.Nursery
    connections: set[Connection]
    monitors: set[Connection]
    cmdstats: dict[bytes, list[int]]
    commands: int
    stats_in: int
    stats_out: int
    stopping: bool

    def route(self, effects: list[Effect], replies: list[Reply]) -> int: ...

    def dispatch(self, replies: list[Reply], ticket: int) -> None: ...

    async def wait_durable(self, tickets: set[int]) -> dict[int, str]: ...

    def carry_out_now(self, conn: Connection, intent: Intent) -> Any: ...

    async def carry_out(self, conn: Connection, intent: Intent) -> Any: ...

    def feed_monitors(self, client: Client, argv: list[bytes]) -> None: ...

    def sample_memory(self) -> None: ...


class Connection:
    """One client connection on a non-blocking socket (see the module docstring)."""

    __slots__ = ("host", "reactor", "sock", "fd", "client", "parser", "out", "logged",
                 "holding", "pending", "sending", "closing", "close_after_reply", "blocked",
                 "soft_since", "queued", "fresh", "readable", "hup", "eof", "ending",
                 "registered", "parks", "backlog", "last_active")

    def __init__(self, host: Host, sock: socket.socket, client: Client) -> None:
        self.host = host
        self.reactor = host.reactor
        self.sock = sock
        self.fd = sock.fileno()
        self.client = client
        self.parser = RequestParser()
        # Replies not yet written, in order, and (first chunk, end, log ticket) of each whose
        # command logged: they leave once that batch of the log is durable.
        self.out: list[bytes] = []
        self.logged: list[tuple[int, int, int]] = []
        self.holding = False
        self.pending: list[bytes] = []  # what the socket did not take; a sender task owns it
        self.sending = False
        self.closing = False
        self.close_after_reply = False  # CLIENT KILL of its own connection
        # A command of this client waits for a Reply effect (ADDJOB replicating; a blocked
        # GETJOB also has client.waiter): its pipelined commands wait behind it.
        self.blocked = False
        self.soft_since = 0.0  # when unsent replies went past the soft output limit
        # The reactor's bookkeeping (node/reactor.py).
        self.queued = False
        self.fresh = True
        self.readable = False
        self.hup = False  # the client shut down its sending side (the epoll said so)
        self.eof = False  # ... and that end was read: nothing more to read, the rest runs
        # Closes once its replies are written, nothing more run: QUIT, a protocol error.
        # Parked meanwhile.
        self.ending = False
        self.registered = False
        self.parks = 0
        self.backlog = False
        self.last_active = host.clock.monotonic()

    # -- the reactor's turn -----------------------------------------------------------------

    def turn(self, budget: int) -> int:
        """Read once if the socket was reported, then run up to ``budget`` commands inline;
        the number run."""
        if self.parks:
            return 0  # paused: its input waits until the task that took it gives it back
        if self.readable:
            self.readable = False
            if not (self.backlog or self.eof) and self._read() < 0:
                return 0
        if self.blocked or self.holding:
            return 0
        self.holding = True
        reactor = self.reactor
        ran = 0
        reads = 1
        while True:
            done, status = self._execute(budget - ran, reactor.now_ms, reactor.others)
            ran += done
            if status is not None or self.backlog or self.blocked or not self.hup or self.eof:
                break
            # The client hung up, so the rest of its stream (or its end) is already here:
            # take it now, as its own loop would, rather than one lap of the queue later.
            if reads == MAX_READS_PER_TURN:
                reactor.schedule(self)
                break
            reads += 1
            got = self._read()
            if got < 0:
                return ran
            if not got and not self.eof:
                break  # nothing after all: the epoll reports the end when it comes
        if status is CLOSE:
            # QUIT, a protocol error, CLIENT KILL of itself: nothing more is read or run; the
            # replies so far are written (after the log, if they wait for it), then it closes.
            self.ending = True
            reactor.park(self)
        elif status is not None:
            self._hand_off(status)
            return ran
        elif self.backlog:
            reactor.schedule(self)  # the rest of its buffer: next round, behind the others
        if self.out or self.logged:
            # Replies are written at the end of the round, all together (after the round's
            # log commit for those that logged): a client that is woken by the first of them
            # finds the others there too, rather than being put to sleep and woken per reply.
            reactor.held.append(self)
            return ran
        self.holding = False
        self._after_turn()
        return ran

    def _after_turn(self) -> None:
        """Close a connection whose last words have run."""
        if self.ending:
            self._close_when_written()
        elif self.eof and not (self.backlog or self.blocked or self.parks):
            self._close_when_written()  # everything it sent has run

    def _read(self) -> int:
        """One ``recv`` into the parser: the bytes read (0 at the end of the stream or when
        there was nothing), -1 when the connection closed."""
        try:
            data = self.sock.recv(READ_SIZE)
        except BlockingIOError:
            return 0
        except OSError:
            self.close()
            return -1
        if not data:
            self._at_end()
            return -1 if self.closing else 0
        host = self.host
        host.stats_in += len(data)
        self.last_active = self.reactor.now
        parser = self.parser
        parser.feed(data)
        held = parser.held
        if held > host.config.client_query_buffer_limit:
            # Redis's rule and wording: a client that sends more than it lets us execute
            # (a blocked GETJOB with a pipeline behind it, one huge command) is closed.
            log.warning("Closing client that reached max query buffer length: id=%d "
                        "addr=%s qbuf=%d", self.client.id, self.client.addr, held)
            self.close()
            return -1
        return len(data)

    def _at_end(self) -> None:
        """The client sent its last byte. A blocked client is gone (the broker forgets its
        waiter) and so is one with nothing left to run; otherwise what it sent still runs and
        its replies are still written (a client may shut down only its sending side), and it
        closes after."""
        if self.blocked or not (self.holding or self.parser.buffered):
            self.close()
            return
        self.eof = True
        self.reactor.stop_reading(self)  # the end stays readable: the epoll would repeat it
        if not self.holding:
            self.reactor.schedule(self)

    def has_input(self) -> bool:
        return bool(self.parser.buffered)

    def ticket(self) -> int:
        return max((ticket for _, _, ticket in self.logged), default=0)

    def crashed(self) -> None:
        # A bug met by one connection must not take the node down: say so loudly, drop
        # that connection, keep serving the others.
        log.exception("Unexpected error serving client %s; connection closed", self.client.addr)
        self.close()

    # -- executing commands -----------------------------------------------------------------

    def _execute(self, budget: int, now: int, others: list[Reply]) -> tuple[int, Any]:
        """Run the complete commands in the buffer, up to ``budget``, encoding each reply into
        ``out``. Returns how many ran and why it stopped: None (no complete command left, the
        budget, a blocked command, shutdown), an ``Intent`` for the runtime, or ``CLOSE``.

        The cluster bus is not flushed here, per command: the reactor flushes it once at the
        end of the round (``Reactor._end_round``), which is the earliest its link writers and
        the cores' timers could run anyway (the round holds the task). Commands that leave
        the reactor (``_after``, the connection's own task) flush it themselves."""
        host = self.host
        broker = host.broker
        client = self.client
        parser = self.parser
        next_command = parser.next
        execute = broker.execute
        cmdstats = host.cmdstats
        route = host.route
        out = self.out
        ran = written = 0
        while not self.blocked and not host.stopping:
            if ran == budget:
                self.backlog = True
                return ran, None
            try:
                argv = next_command()
            except ProtocolError as exc:
                encode_into(errors.protocol_error(str(exc)), out)
                return ran, CLOSE
            if argv is NEED_DATA:
                break
            ran += 1
            host.commands += 1
            name = argv[0].lower()  # type: ignore[index]
            client.last_cmd = name
            if host.monitors:
                host.feed_monitors(client, argv)  # type: ignore[arg-type]
            if len(argv) > 2 and len(argv[2]) >= _BIG_ARGUMENT and name == b"addjob":  # type: ignore[index,arg-type]
                # A big body: judge it against the memory in use now, not a second ago.
                host.sample_memory()
            started = perf_counter_ns()
            reply = execute(argv, client, now)  # type: ignore[arg-type]
            stat = cmdstats.get(name)
            if stat is not None:
                stat[0] += 1
                stat[1] += perf_counter_ns() - started
            if isinstance(reply, Intent):
                # A command only the runtime can finish (broker/intents.py): most are done at
                # once; the few that wait (CONFIG SET appendonly, SHUTDOWN) go to a task.
                intent = reply
                reply = host.carry_out_now(self, intent)
                if reply is MUST_WAIT:
                    return ran, intent
                self._after(reply, others)
                if type(intent) is Quit or self.close_after_reply:
                    return ran, CLOSE
                continue
            # As _after, inline (the bus aside): the path every command takes.
            if broker.outbox:
                ticket = route(broker.take_effects(), others)
                if reply is BLOCKED:
                    self.blocked = True
                    break
                start = len(out)
                encode_into(reply, out, client.protover)
                if ticket:
                    self.logged.append((start, len(out), ticket))
            else:
                if reply is BLOCKED:
                    self.blocked = True
                    break
                start = len(out)
                encode_into(reply, out, client.protover)
            if len(out) - start > 1:  # a bulk or an array: maybe big
                written += sum(map(len, out[start:]))
                if written > MAX_OUTPUT_PER_TURN:
                    # Big replies (QPEEK, GETJOB of large jobs): write these before executing
                    # more, so a client that does not read is paused after about this much.
                    self.backlog = bool(parser.buffered)
                    return ran, None
        self.backlog = False
        return ran, None

    def _after(self, reply: Any, others: list[Reply]) -> None:
        """Route a command's effects, then queue its reply (or note that it blocked)."""
        host = self.host
        broker = host.broker
        ticket = host.route(broker.take_effects(), others) if broker.outbox else 0
        # REPLJOB, SETACK, PAUSE ..., CLUSTER MEET: after the broker's effects, as always.
        host.bus.flush()
        if reply is BLOCKED:
            self.blocked = True
            return
        out = self.out
        start = len(out)
        encode_into(reply, out, self.client.protover)
        if ticket:
            self.logged.append((start, len(out), ticket))

    def release_if_durable(self) -> bool:
        """Write the held replies if every log batch they wait for is finished (True), the
        failed ones turned into errors; False if one is still pending. Called for every
        connection served in a round, so the common case (nothing logged, the socket takes
        everything) is written out here, with one ``send`` and no further calls."""
        logged = self.logged
        if logged:
            persistence = self.host.persistence
            done = persistence.done_ticket
            for _, _, ticket in logged:
                if ticket > done:
                    return False
            self._patch_failures({t: e for _, _, t in logged
                                  if (e := persistence.failure(t)) is not None})
        self.holding = False
        out = self.out
        if out:
            data = out[0] if len(out) == 1 else b"".join(out)
            out.clear()
            if self.sending:
                self.send_nowait(data)  # behind the bytes its sender task has yet to write
            else:
                try:
                    sent = self.sock.send(data)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    self.close()
                    return True
                self.host.stats_out += sent
                if sent != len(data):
                    self._send_later(data[sent:])
        if self.parser.buffered and not (self.blocked or self.ending):
            self.reactor.schedule(self)
        elif self.ending or self.eof:
            self._after_turn()
        return True

    def _patch_failures(self, failures: dict[int, str]) -> None:
        """The log write of these tickets failed and the broker undid those changes: the
        commands that made them must not report success."""
        if failures:
            out = self.out
            for start, end, ticket in self.logged:
                error = failures.get(ticket)
                if error is not None:
                    out[start] = _encode(errors.err(error), self.client.protover)
                    for i in range(start + 1, end):
                        out[i] = b""
        self.logged.clear()

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
                _, status = self._execute(MAX_TASK_COMMANDS, host.clock.now_ms(), others)
                host.bus.flush()  # no reactor round ends for these: their frames go now
            if self.logged:
                failures = await host.wait_durable({t for _, _, t in self.logged})
                self._patch_failures(failures)
            self.holding = False
            if self.out:
                self._write_out()
            if others:
                host.dispatch(others, 0)
            if status is CLOSE:
                await self._drain()
                self.close()
        except Exception:
            self.crashed()
        finally:
            self.holding = False
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
            while self.sending and not self.closing:
                await trio.sleep(0.005)

    # -- output -----------------------------------------------------------------------------

    def _write_out(self) -> None:
        out = self.out
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self.send_nowait(data)

    def send_nowait(self, data: bytes) -> None:
        """Write ``data`` after everything this connection has yet to write, never waiting:
        what the socket does not take is left to a sender task, which parks the connection."""
        if self.closing:
            return
        if self.holding:
            self.out.append(data)  # behind replies waiting for the log
            return
        if self.sending:
            self.pending.append(data)
            unsent = sum(map(len, self.pending))
            if self.over_output_limit(unsent):
                self.close_for_output(unsent)
            return
        sent = self._send_some(data)
        if sent is None or sent == len(data):
            return
        self._send_later(data[sent:])

    def _send_later(self, rest: bytes) -> None:
        """The socket is full: a sender task writes ``rest`` (and what follows it) as the
        socket takes it, the connection parked meanwhile."""
        self.pending.append(rest)
        self.sending = True
        self.reactor.park(self)
        self.host.nursery.start_soon(self._send_pending)

    def _send_some(self, data: bytes | memoryview) -> int | None:
        """Hand ``data`` to the kernel without waiting: the bytes it took (0 when the socket
        is full), or None when the connection is gone (it is then closed)."""
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            return 0
        except OSError:
            self.close()
            return None
        self.host.stats_out += sent
        return sent

    async def _send_pending(self) -> None:
        """The sender task: write ``pending`` as the socket takes it, then give the
        connection back to the reactor."""
        sock = self.sock
        try:
            while self.pending and not self.closing:
                view = memoryview(b"".join(self.pending))
                self.pending.clear()
                while view:
                    sent = self._send_some(view)
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

    def over_output_limit(self, unsent: int) -> bool:
        """Apply ``client-output-buffer-limit`` to ``unsent`` bytes; True when the client must
        be closed (Redis's rule: past the hard limit, or past the soft one for too long)."""
        hard, soft, seconds = output_limits(self.host.config.client_output_buffer_limit)
        if hard and unsent > hard:
            return True
        if soft and unsent > soft:
            now = self.host.clock.monotonic()
            if not self.soft_since:
                self.soft_since = now
            elif now - self.soft_since > seconds:
                return True
        else:
            self.soft_since = 0.0
        return False

    def close_for_output(self, unsent: int) -> None:
        log.warning("Client id=%d addr=%s closed for overcoming of output buffer limits "
                    "(%d bytes unsent).", self.client.id, self.client.addr, unsent)
        self.close()

    # -- the end ----------------------------------------------------------------------------

    def close(self) -> None:
        if self.fd < 0:
            return
        self.closing = True
        host = self.host
        host.broker.client_gone(self.client)
        if host.jobs.outbox:
            host.bus.flush()  # the DELJOBs of an ADDJOB it left waiting
        host.connections.discard(self)
        host.monitors.discard(self)
        self.reactor.forget(self)
        if self.sending:
            trio.lowlevel.notify_closing(self.sock)  # its sender task may be waiting on it
        self.sock.close()
        self.fd = -1
        # Whoever still holds this object (a timer entry of a blocked GETJOB) must not keep
        # the client's buffers alive.
        self.parser.clear()
        self.pending.clear()
        self.out.clear()
        self.logged.clear()


def set_keepalive(sock: socket.socket, interval: int) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, interval)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, interval // 3))
    except OSError:
        pass


def _encode(value: Any, protover: int) -> bytes:
    parts: list[bytes] = []
    encode_into(value, parts, protover)
    return b"".join(parts)


__all__ = ["CLOSE_FLUSH_TIMEOUT_S", "Connection", "Host", "READ_SIZE", "set_keepalive"]
