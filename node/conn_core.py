"""One client connection's work that never waits: compiled with mypyc as part of the core.

Theory of operation
-------------------
``node/connection.py`` explains a connection's life in the reactor. This module holds the part
that runs for every request: a reactor turn (``turn``: one ``recv`` into the parser,
the complete commands executed against the broker with the round's ``now_ms``, their effects
routed, their replies encoded into ``out``), the release of the held replies at the end of the
round (``release_if_durable``: after the group commit, ``-ERR`` for a command whose write
failed, one ``send``), the non-waiting send of replies from elsewhere (``send_nowait``) and the
client-output-buffer-limit rule. It imports no trio, so ``tools/build_core.py`` compiles it with
the protocol, broker and cluster modules it calls, which it then calls directly in C.

Pipelined ADDJOBs
-----------------
A synchronous ADDJOB (REPLICATE n > 1, not ASYNC) returns ``BLOCKED`` until n nodes hold a
copy. Rather than stop the client's pipeline there, the connection moves to REPLICATING and
goes on with the next commands as long as the broker says each may pass the waiting ADDJOBs
(``Broker.may_run_ahead``: an ADDJOB whose outcome cannot depend on them) and fewer than
``MAX_ADDJOBS_WAITING`` replies wait. Every reply from the first waiting ADDJOB on goes to
``waiting``, in order: None for an ADDJOB whose ``Reply`` has not come, the encoded reply
(and its log ticket) for one that replied at once. The broker emits a client's ADDJOB
replies in the order they ran (broker/cluster_jobs.py), so each ``Reply`` fills the first
None (``reply_came``), and the complete head of ``waiting`` is written once per batch of
replies dispatched together (``replies_came``, ``flush_waiting``):
replies leave in order, each ADDJOB's only once its job is confirmed or failed. A command
that may not pass (anything but such an ADDJOB, or a protocol error) is kept in
``deferred`` and the connection is BLOCKED until every waiting reply came; it then runs
first. A client using CLIENT REPLY OFF/SKIP blocks at its first waiting ADDJOB, as before.

What needs trio is in the interpreted ``node.connection.Connection``, a subclass: the hooks
this class leaves to it (``_hand_off`` to the connection's own task for an intent that waits,
``_send_later`` to a sender task for what the socket did not take, ``_close_when_written`` and
``_wake_sender``). The per-command loop (``execute_commands``), the ``recv`` (``read_once``)
and the ``send`` (``send_some``) are module functions rather than methods: compiled code calls
a method of an object of an interpreted subclass through Python's method lookup, a function
directly.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any, Final, Protocol, final

from mypy_extensions import mypyc_attr

from broker.clients import REPLY_OFF, Client, reply_wanted
from broker.config import Config, output_limits
from broker.core import BLOCKED, Broker
from broker.effects import Effect, Reply
from broker.intents import Intent, Quit
from cluster.jobs import JobCore
from node.conn_state import (
    CLOSED,
    CLOSING,
    CLOSING_HELD,
    DRAINING,
    DRAINING_HELD,
    HELD,
    OPEN,
    ConnState,
    is_blocked,
    is_draining,
    is_held,
    is_replicating,
    is_waiting,
    next_state,
    to_blocked,
    to_draining,
    to_held,
    to_replicating,
    to_unblocked,
    to_unheld,
)
from node.log_core import LogCore, waiting_ticket
from node.log_core import route as log_route
from node.reactor_core import Clock, ReactorCore
from protocol import errors
from protocol.resp import ProtocolError, RequestParser, encode, encode_into

log = logging.getLogger("trisque")

# Final: compiled, a Final module global is a C static; any other is a dict lookup by name.
READ_SIZE: Final = 65536
# An ADDJOB body this big refreshes the memory sample before it is judged.
_BIG_ARGUMENT: Final = 1 << 20
# The least ``client-query-buffer-limit`` may be (broker/config.py): a read that leaves less
# pending reads no attribute of the (interpreted) Config.
_QUERY_LIMIT_FLOOR: Final = 1024 * 1024
# Reads a turn makes from a client that hung up (its data is all there), as a connection's own
# loop would; a connection still talking gets one read a turn.
MAX_READS_PER_TURN: Final = 8
# A turn stops once its replies pass this many bytes (written before more is executed), so a
# client that pipelines requests for big jobs and does not read is paused with about this much
# unsent, not with every reply its buffer asked for.
MAX_OUTPUT_PER_TURN: Final = 256 * 1024
# Replies a connection may owe behind a synchronous ADDJOB that waits for its copies (the
# waiting ADDJOBs and the replies queued behind them): one more command waits in the buffer
# (docs/limits.md). Each waiting ADDJOB re-sends its REPLJOBs every 50 ms until confirmed.
MAX_ADDJOBS_WAITING: Final = 256


class _Close:
    __slots__ = ()


#: ``execute_commands``'s status for "the connection closes after these replies" (QUIT, a
#: protocol error, CLIENT KILL of itself).
CLOSE: Final = _Close()


class _MustWait:
    __slots__ = ()


#: ``Host.carry_out_now``'s answer for an intent that must be awaited (``Host.carry_out``).
MUST_WAIT: Final = _MustWait()


@final
class NodeCounters:
    """The node's counters and its stopping flag, which the hot path reads or bumps for every
    request: a compiled object whose fields are struct fields, where the same on the
    interpreted ``Server`` would be a dict lookup each (``Server`` shows them as properties)."""

    def __init__(self) -> None:
        self.commands = 0  # commands run (INFO total_commands_processed)
        self.stats_in = 0  # bytes read from clients
        self.stats_out = 0  # bytes written to clients
        self.stopping = False  # the node is shutting down: no command runs any more
        # CLIENT PAUSE: no client's command runs before this time (ms; a task of the server,
        # _resume_clients, gives the paused connections their turn when it passes).
        self.paused_until = 0


class BusFlush(Protocol):
    def flush(self) -> None: ...


class Host(Protocol):
    """What a connection needs of the node (``node.server.Server``)."""

    config: Config
    broker: Broker
    job_core: JobCore
    connections: set[Any]
    monitors: set[Any]
    cmdstats: dict[bytes, list[int]]
    counters: NodeCounters
    command_path: CommandPath

    # Read-only here: the node's own types have more than these protocols ask for.
    @property
    def clock(self) -> Clock: ...

    @property
    def bus(self) -> BusFlush: ...

    @property
    def persistence(self) -> LogCore: ...

    @property
    def reactor(self) -> ReactorCore: ...

    def route(self, effects: list[Effect], replies: list[Reply]) -> int: ...

    def dispatch(self, replies: list[Reply], ticket: int) -> None: ...

    def carry_out_now(self, conn: Any, intent: Intent) -> Any: ...

    def feed_monitors(self, client: Client, argv: list[bytes]) -> None: ...

    def sample_memory(self) -> None: ...


@final
class CommandPath:
    """The one way a client's command runs in this node, whatever brought it (a RESP
    connection, an HTTP request, a dashboard button): counted (INFO's
    total_commands_processed and commandstats, with its time), shown to MONITOR clients, a big
    ADDJOB body judged against fresh memory figures, then ``Broker.execute``. What the caller
    does with the reply (effects, intents, the log's ticket, encoding) is the caller's."""

    def __init__(self, host: Host) -> None:
        self.host = host
        # Taken once (the node never rebinds them): each read of the interpreted Server's
        # attributes would be a dict lookup per command.
        self.broker = host.broker
        self.counters = host.counters
        self.cmdstats = host.cmdstats
        self.monitors = host.monitors

    def run(self, client: Client, argv: list[bytes], now: int) -> Any:
        """Run ``argv`` for ``client`` at ``now_ms``: the broker's reply, ``BLOCKED`` or an
        ``Intent``."""
        self.counters.commands += 1
        name = argv[0].lower()
        client.last_cmd = name
        if self.monitors:
            self.host.feed_monitors(client, argv)
        if len(argv) > 2 and len(argv[2]) >= _BIG_ARGUMENT and name == b"addjob":
            # A big body: judge it against the memory in use now, not a second ago.
            self.host.sample_memory()
        started = perf_counter_ns()
        reply = self.broker.execute(argv, client, now)
        stat = self.cmdstats.get(name)
        if stat is not None:
            stat[0] += 1
            stat[1] += perf_counter_ns() - started
        return reply


class Stream(Protocol):
    """What a connection needs of its socket: a plain non-blocking one, or a TLS layer over
    one with the same calls (``node.tls.TlsStream``)."""

    def fileno(self) -> int: ...

    def recv(self, size: int, /) -> bytes: ...

    def send(self, data: bytes | memoryview, /) -> int: ...

    def close(self) -> None: ...


@mypyc_attr(allow_interpreted_subclasses=True)
class ConnCore:
    """One client connection on a non-blocking socket (see ``node/connection.py``)."""

    def __init__(self, host: Host, sock: Stream, client: Client) -> None:
        self.host = host
        self.reactor = host.reactor
        # What execute_commands reads per request, taken once (the node never rebinds them):
        # each read of the interpreted Server's attributes is a dict lookup.
        self.broker = host.broker
        self.config = host.config
        self.counters = host.counters
        self.command_path = host.command_path
        self.route = host.route
        # The append log's compiled core (``Persistence`` subclasses it): the release reads
        # its finished ticket and its failures as fields, not through Python calls.
        self.append_log = host.persistence
        self.sock = sock
        self.fd = sock.fileno()
        self.client = client
        self.parser = RequestParser()
        # Replies not yet written, in order, and (first chunk, end, log ticket) of each whose
        # command logged: they leave once that batch of the log is durable.
        self.out: list[bytes] = []
        self.logged: list[tuple[int, int, int]] = []
        # Where it is in its life (node/conn_state.py): changed only by transition().
        self.state: ConnState = OPEN
        # Pipelined ADDJOBs (see the module docstring): the replies owed from the first
        # waiting ADDJOB on (None: its Reply has not come; else (reply, log ticket)), how
        # many are None, the newest ticket among those queued since the last release, and
        # the command that waits for them all (argv, or the ProtocolError met).
        self.waiting: list[Any] = []
        self.awaited = 0
        self.behind_ticket = 0
        self.deferred: Any = None
        self.pending: list[bytes] = []  # what the socket did not take; a sender task owns it
        self.sending = False
        self.soft_since = 0.0  # when unsent replies went past the soft output limit
        # The reactor's bookkeeping (node/reactor.py).
        self.queued = False
        self.fresh = True
        self.readable = False
        self.hup = False  # the client shut down its sending side (the epoll said so)
        self.registered = False
        self.parks = 0
        self.backlog = False
        self.last_active = host.clock.monotonic()

    # -- hooks of the trio side (node/connection.py) ----------------------------------------

    def _hand_off(self, intent: Intent) -> None:
        """Park the connection and carry out ``intent`` (one that waits) in its own task."""
        raise NotImplementedError

    def _send_later(self, rest: bytes) -> None:
        """The socket is full: a sender task writes ``rest`` (and what follows) later."""
        raise NotImplementedError

    def _close_when_written(self) -> None:
        """Close once every reply is written (after the sender task, if one runs)."""
        raise NotImplementedError

    def _wake_sender(self) -> None:
        """The connection closes: its sender task, which may wait on the socket, must end."""
        raise NotImplementedError

    # -- the reactor's turn -----------------------------------------------------------------

    def _after_turn(self) -> None:
        """Close a connection whose last words have run."""
        state = self.state
        if state is CLOSING:
            self._close_when_written()
        elif state is DRAINING and not (self.backlog or self.parks):
            self._close_when_written()  # everything it sent has run

    def _at_end(self) -> None:
        """The client sent its last byte. A blocked client is gone (the broker forgets its
        waiter) and so is one with nothing left to run; otherwise what it sent still runs and
        its replies are still written (a client may shut down only its sending side), and it
        closes after."""
        state = self.state
        if is_waiting(state) or not (is_held(state) or self.parser.buffered):
            self.close()
            return
        transition(self, to_draining(state))
        self.reactor.stop_reading(self)  # the end stays readable: the epoll would repeat it
        if not is_held(state):
            self.reactor.schedule(self)

    def has_input(self) -> bool:
        return bool(self.parser.buffered) or self.deferred is not None

    def ticket(self) -> int:
        return max(max((ticket for _, _, ticket in self.logged), default=0), self.behind_ticket)

    def crashed(self) -> None:
        # A bug met by one connection must not take the node down: say so loudly, drop
        # that connection, keep serving the others.
        log.exception("Unexpected error serving client %s; connection closed", self.client.addr)
        self.close()

    def _after(self, reply: Any, others: list[Reply]) -> None:
        """Route a command's effects, then queue its reply (or note that it blocked)."""
        host = self.host
        broker = host.broker
        ticket = 0
        if broker.outbox:
            try:
                ticket = host.route(broker.take_effects(), others)
            except OSError as unencodable:
                reply = undone(reply, unencodable)
        # REPLJOB, SETACK, PAUSE ..., CLUSTER MEET: after the broker's effects, as always.
        host.bus.flush()
        if self.client.reply_flags and not reply_wanted(self.client) and reply is not BLOCKED:
            return  # CLIENT REPLY OFF or SKIP
        if reply is BLOCKED:
            transition(self, to_blocked(self.state))
            return
        out = self.out
        start = len(out)
        encode_into(reply, out, self.client.protover)
        if ticket:
            self.logged.append((start, len(out), ticket))

    # -- the end of the round ---------------------------------------------------------------

    def release_if_durable(self) -> bool:
        """Write the held replies if their log batches are finished (``release_if_durable``,
        the function compiled code calls)."""
        return release_if_durable(self)

    def _patch_failures(self, failures: dict[int, str]) -> None:
        patch_failures(self, failures)

    # -- output -----------------------------------------------------------------------------

    def _write_out(self) -> None:
        out = self.out
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        send_nowait(self, data)

    def send_nowait(self, data: bytes) -> None:
        send_nowait(self, data)

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
        transition(self, CLOSED)
        host = self.host
        host.broker.client_gone(self.client)
        if host.job_core.outbox:
            host.bus.flush()  # the DELJOBs of an ADDJOB it left waiting
        host.connections.discard(self)
        host.monitors.discard(self)
        self.reactor.forget(self)
        if self.sending:
            self._wake_sender()
        self.sock.close()
        self.fd = -1
        # Whoever still holds this object (a timer entry of a blocked GETJOB) must not keep
        # the client's buffers alive.
        self.parser.clear()
        self.pending.clear()
        self.out.clear()
        self.logged.clear()
        self.waiting.clear()
        self.awaited = 0
        self.behind_ticket = 0
        self.deferred = None
        # The client points back at this connection: left as it is, the pair is a cycle that
        # only a full garbage collection frees (rare here, see Server._start), about 2 KB per
        # connection in the meantime. A reply that still comes for it is dropped (dispatch_now).
        self.client.handle = None


# -- the hot path: functions, called directly from compiled code ------------------------------


def transition(conn: ConnCore, new: ConnState) -> None:
    """The one way a connection's state changes: ``ConnStateError`` for a move that is not
    in ``node.conn_state.ALLOWED``."""
    conn.state = next_state(conn.state, new)


def unblock(conn: ConnCore) -> None:
    """The Reply its blocked command waited for came (or will never be written)."""
    state = conn.state
    if is_blocked(state):
        transition(conn, to_unblocked(state))


def turn(conn: ConnCore, budget: int) -> int:
    """Read once if the socket was reported, then run up to ``budget`` commands inline;
    the number run."""
    if conn.parks:
        return 0  # paused: its input waits until the task that took it gives it back
    if conn.readable:
        conn.readable = False
        if not (conn.backlog or is_draining(conn.state)) and read_once(conn) < 0:
            return 0
    # Only an idle connection runs commands: not a blocked one, nor one whose replies are
    # still held (a late commit), nor one that is closing.
    state = conn.state
    if state is OPEN:
        transition(conn, HELD)
    elif state is DRAINING:
        transition(conn, DRAINING_HELD)
    elif is_replicating(state):
        transition(conn, to_held(state))  # the ADDJOBs behind the waiting ones
    else:
        return 0
    reactor = conn.reactor
    ran = 0
    reads = 1
    while True:
        done, status = execute_commands(conn, budget - ran, reactor.now_ms, reactor.others)
        ran += done
        # Not HELD any more: blocked, or its end read (DRAINING_HELD).
        if status is not None or conn.backlog or not conn.hup or conn.state is not HELD:
            break
        # The client hung up, so the rest of its stream (or its end) is already here:
        # take it now, as its own loop would, rather than one lap of the queue later.
        if reads == MAX_READS_PER_TURN:
            reactor.schedule(conn)
            break
        reads += 1
        got = read_once(conn)
        if got < 0:
            return ran
        if not got and conn.state is HELD:
            break  # nothing after all: the epoll reports the end when it comes
    if status is CLOSE:
        # QUIT, a protocol error, CLIENT KILL of itself: nothing more is read or run; the
        # replies so far are written (after the log, if they wait for it), then it closes.
        if conn.state is not CLOSING_HELD:  # CLIENT KILL of itself moved it already
            transition(conn, CLOSING_HELD)
        reactor.park(conn)
    elif isinstance(status, Intent):
        conn._hand_off(status)
        return ran
    elif conn.backlog:
        reactor.schedule(conn)  # the rest of its buffer: next round, behind the others
    if conn.out or conn.logged or conn.behind_ticket:
        # Replies are written at the end of the round, all together (after the round's
        # log commit for those that logged): a client that is woken by the first of them
        # finds the others there too, rather than being put to sleep and woken per reply.
        reactor.held.append(conn)
        return ran
    transition(conn, to_unheld(conn.state))
    conn._after_turn()
    return ran


def release_if_durable(conn: ConnCore) -> bool:
    """Write the held replies if every log batch they wait for is finished (True), the
    failed ones turned into errors; False if one is still pending. Called for every
    connection served in a round, so the common case (nothing logged, the socket takes
    everything) is written out here, with one ``send`` and no further calls."""
    logged = conn.logged
    if conn.behind_ticket:
        if conn.behind_ticket > conn.append_log.done_ticket:
            return False
        settle_behind(conn)
    if logged:
        append_log = conn.append_log
        done = append_log.done_ticket
        for _, _, ticket in logged:
            if ticket > done:
                return False
        failures: dict[int, str] = {}
        failed = append_log.failed  # the recent failed batches: empty unless a write failed
        if failed:
            for _, _, ticket in logged:
                error = failed.get(ticket)
                if error is not None:
                    failures[ticket] = error
        patch_failures(conn, failures)
    transition(conn, to_unheld(conn.state))
    out = conn.out
    if out:
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        if conn.sending:
            send_nowait(conn, data)  # behind the bytes its sender task has yet to write
        else:
            sent = send_some(conn, data)
            if sent is None:
                return True
            if sent != len(data):
                conn._send_later(data[sent:])
    if conn.waiting:
        flush_waiting(conn)
        make_room(conn)
    state = conn.state
    if ((conn.parser.buffered or conn.deferred is not None)
            and (state is OPEN or state is DRAINING or is_replicating(state))):
        conn.reactor.schedule(conn)
    elif state is CLOSING or is_draining(state):
        conn._after_turn()
    return True


def settle_behind(conn: ConnCore) -> None:
    """The log batches of the replies queued in ``waiting`` are finished: those whose write
    failed become ``-ERR`` (as ``patch_failures`` does for ``out``)."""
    failed = conn.append_log.failed
    if failed:
        waiting = conn.waiting
        for i in range(len(waiting)):
            entry = waiting[i]
            if entry is not None and entry[1]:
                error = failed.get(entry[1])
                if error is not None:
                    waiting[i] = (encode(errors.err(error), conn.client.protover), 0)
    conn.behind_ticket = 0


def reply_came(conn: ConnCore, data: bytes) -> None:
    """The ``Reply`` of the first of its waiting ADDJOBs (the broker emits them in order),
    put in its place; ``replies_came`` writes it, once for the replies dispatched together."""
    waiting = conn.waiting
    waiting[waiting.index(None)] = (data, 0)
    conn.awaited -= 1
    if not conn.awaited:
        transition(conn, to_unblocked(conn.state))  # nothing waits: the deferred one may run


def replies_came(conn: ConnCore) -> None:
    """After ``reply_came``: write the replies now complete at the head of ``waiting`` (unless
    the connection's replies are held: the release writes them, after the held ones), and run
    what may run now."""
    if conn.state is CLOSED:
        return
    if not is_held(conn.state):
        flush_waiting(conn)
    make_room(conn)
    state = conn.state
    if is_blocked(state) or is_held(state):
        return
    if conn.parser.buffered or conn.deferred is not None:
        conn.reactor.schedule(conn)
    elif state is DRAINING:
        conn._after_turn()  # its end was read and everything it sent has run: it closes


@final
class BrokerOutlet:
    """Where the broker's effects go when no client's command made them (a bus frame, a tick,
    an undo at the end of a round): ``flush_broker`` and ``dispatch``, compiled since they run
    after every frame a replicated ADDJOB's REPLJOB or GOTJOB brings. ``queued`` is the
    server's queue of replies waiting for their log batch, in order; ``later`` queues more
    (its task writes them once durable)."""

    def __init__(self, broker: Broker, log: LogCore, monotonic: Callable[[], float],
                 queued: deque[tuple[list[Reply], int]],
                 later: Callable[[list[Reply], int], None]) -> None:
        self.broker = broker
        self.log = log
        self.monotonic = monotonic
        self.queued = queued
        self.later = later


def flush_broker(outlet: BrokerOutlet) -> None:
    """Route the broker's effects: records to the log now, replies once durable."""
    broker = outlet.broker
    if broker.outbox:
        replies: list[Reply] = []
        try:
            ticket = log_route(outlet.log, broker.take_effects(), replies)
        except OSError:
            # A body the log holds could not be read back into a record (a timer's requeue
            # of a damaged body): the log core undid the change and the packer logged it;
            # the node goes on.
            return
        if replies:
            dispatch(outlet, replies, ticket)


def dispatch(outlet: BrokerOutlet, replies: list[Reply], ticket: int) -> None:
    """Write ``replies`` to their clients once the log records emitted before them are
    durable (at once if they already are), after every reply dispatched before them: a
    client's pipelined ADDJOBs are answered in the order their replies were made, so replies
    must not pass each other here."""
    waiting = waiting_ticket(outlet.log)
    if waiting > ticket:
        ticket = waiting
    if not ticket and not outlet.queued:
        dispatch_replies(replies, outlet.monotonic)
    else:
        outlet.later(replies, ticket)


def send_nowait(conn: ConnCore, data: bytes) -> None:
    """Write ``data`` after everything ``conn`` has yet to write, never waiting: what the socket
    does not take is left to a sender task, which parks the connection. A function, not the
    method: compiled code calls a method of ``Connection`` (an interpreted subclass) through
    Python's lookup; every replicated ADDJOB's reply comes this way."""
    state = conn.state
    if state is CLOSED:
        return
    if is_held(state):
        conn.out.append(data)  # behind replies waiting for the log
        return
    if conn.sending:
        conn.pending.append(data)
        unsent = sum(map(len, conn.pending))
        if conn.over_output_limit(unsent):
            conn.close_for_output(unsent)
        return
    sent = send_some(conn, data)
    if sent is None or sent == len(data):
        return
    conn._send_later(data[sent:])


def dispatch_replies(replies: list[Reply], monotonic: Callable[[], float]) -> None:
    """Write replies that came from elsewhere (a bus frame, a timer: ``Server.dispatch_now``)
    to their clients, an HTTP request's stand-in included: compiled, as it runs for every
    replicated ADDJOB's reply."""
    replicated: list[ConnCore] = []  # connections with pipelined ADDJOBs answered
    for client, value in replies:
        handle = client.handle
        if handle is None:
            continue
        if not isinstance(handle, ConnCore):  # an HTTP request's stand-in
            if not handle.closing:
                handle.send_nowait(encode(value, client.protover))
            continue
        conn: ConnCore = handle
        if conn.state is CLOSED:
            continue
        if conn.awaited:
            # One of its pipelined ADDJOBs: written in its place, with the others of this
            # batch (one send).
            reply_came(conn, encode(value, client.protover))
            if not replicated or replicated[-1] is not conn:
                replicated.append(conn)
            continue
        if not client.reply_flags & REPLY_OFF:
            send_nowait(conn, encode(value, client.protover))
            conn.last_active = monotonic()  # a reply is an interaction
        # else CLIENT REPLY OFF: a blocked command's late reply is not sent either.
        if client.waiter is None:
            unblock(conn)
        if not is_blocked(conn.state) and conn.parser.buffered:
            # Pipelined commands waited behind the blocked command: their turn.
            conn.reactor.schedule(conn)
    if replicated:
        now = monotonic()
        for conn in replicated:
            replies_came(conn)  # a connection twice in the list writes nothing the 2nd time
            conn.last_active = now


def flush_waiting(conn: ConnCore) -> None:
    """Write the replies at the head of ``waiting`` that are there (durable: their batches
    finished before the release that settled them)."""
    waiting = conn.waiting
    n = 0
    for entry in waiting:
        if entry is None:
            break
        n += 1
    if n == 1:  # the usual case: one connection, one ADDJOB at a time
        data = waiting[0][0]
        del waiting[0]
        send_nowait(conn, data)
    elif n:
        data = b"".join([waiting[i][0] for i in range(n)])
        del waiting[:n]
        send_nowait(conn, data)


def make_room(conn: ConnCore) -> None:
    """A connection BLOCKED by ``MAX_ADDJOBS_WAITING`` (no command deferred) that has room
    again runs its next ADDJOBs."""
    state = conn.state
    if (is_blocked(state) and conn.awaited and conn.deferred is None
            and len(conn.waiting) < MAX_ADDJOBS_WAITING):
        transition(conn, to_replicating(state))


def undone(reply: Any, exc: OSError) -> Any:
    """The reply of a command whose log records could not be encoded (a body the log holds
    could not be read back, node/bodies.py): the log core undid its changes, so it reports an
    error and the connection goes on (a blocked command keeps waiting: it changed nothing)."""
    if reply is BLOCKED:
        return reply
    return errors.err(f"{exc}; the command was undone")


def patch_failures(conn: ConnCore, failures: dict[int, str]) -> None:
    """The log write of these tickets failed and the broker undid those changes: the
    commands that made them must not report success."""
    if failures:
        out = conn.out
        for start, end, ticket in conn.logged:
            error = failures.get(ticket)
            if error is not None:
                out[start] = encode(errors.err(error), conn.client.protover)
                for i in range(start + 1, end):
                    out[i] = b""
    conn.logged.clear()


def read_once(conn: ConnCore) -> int:
    """One ``recv`` into the parser: the bytes read (0 at the end of the stream or when there
    was nothing), -1 when the connection closed."""
    try:
        data = conn.sock.recv(READ_SIZE)
    except BlockingIOError:
        return 0
    except OSError:
        conn.close()
        return -1
    if not data:
        conn._at_end()
        return -1 if conn.state is CLOSED else 0
    conn.counters.stats_in += len(data)
    conn.last_active = conn.reactor.now
    parser = conn.parser
    parser.feed(data)
    held = parser.held
    if held > _QUERY_LIMIT_FLOOR and held > conn.config.client_query_buffer_limit:
        # Redis's rule and wording: a client that sends more than it lets us execute (a
        # blocked GETJOB with a pipeline behind it, one huge command) is closed.
        log.warning("Closing client that reached max query buffer length: id=%d "
                    "addr=%s qbuf=%d", conn.client.id, conn.client.addr, held)
        conn.close()
        return -1
    return len(data)


def execute_commands(conn: ConnCore, budget: int, now: int,
                     others: list[Reply]) -> tuple[int, Any]:
    """Run the complete commands in ``conn``'s buffer, up to ``budget``, encoding each reply
    into ``out``. Returns how many ran and why it stopped: None (no complete command left, the
    budget, a blocked command, shutdown), an ``Intent`` for the runtime, or ``CLOSE``.

    The cluster bus is not flushed here, per command: the reactor flushes it once at the end
    of the round (``round_core.end_round``), which is the earliest its link writers and the
    cores' timers could run anyway (the round holds the task). Commands that leave the reactor
    (``_after``, the connection's own task) flush it themselves."""
    host = conn.host
    broker = conn.broker
    counters = conn.counters
    command_path = conn.command_path
    client = conn.client
    parser = conn.parser
    route = conn.route
    out = conn.out
    waiting = conn.waiting
    ran = written = 0
    while not is_blocked(conn.state) and not counters.stopping and now >= counters.paused_until:
        if ran == budget:
            conn.backlog = True
            return ran, None
        if waiting and len(waiting) >= MAX_ADDJOBS_WAITING:
            transition(conn, to_blocked(conn.state))  # room again once replies leave
            break
        parsed: Any = conn.deferred
        if parsed is None:
            try:
                parsed = parser.next()
            except ProtocolError as exc:
                if not waiting:
                    encode_into(errors.protocol_error(str(exc)), out)
                    return ran, CLOSE
                parsed = exc  # answered in order, after the waiting replies
            else:
                if not isinstance(parsed, list):
                    break  # NEED_DATA
        else:
            conn.deferred = None  # it waited for the ADDJOBs before it: its turn now
            if not waiting and isinstance(parsed, ProtocolError):
                encode_into(errors.protocol_error(str(parsed)), out)
                return ran, CLOSE
        if waiting:
            if isinstance(parsed, ProtocolError) or not broker.may_run_ahead(parsed):
                conn.deferred = parsed
                transition(conn, to_blocked(conn.state))
                break
            ran += 1
            reply = command_path.run(client, parsed, now)
            ticket = 0
            if broker.outbox:
                try:
                    ticket = route(broker.take_effects(), others)
                except OSError as unencodable:
                    reply = undone(reply, unencodable)
            if reply is BLOCKED:
                waiting.append(None)
                conn.awaited += 1
            else:
                waiting.append((encode(reply, client.protover), ticket))
                if ticket > conn.behind_ticket:
                    conn.behind_ticket = ticket
            continue
        argv: list[bytes] = parsed
        ran += 1
        reply = command_path.run(client, argv, now)
        if isinstance(reply, Intent):
            # A command only the runtime can finish (broker/intents.py): most are done at
            # once; the few that wait (CONFIG SET appendonly, SHUTDOWN) go to a task.
            intent = reply
            reply = host.carry_out_now(conn, intent)
            if reply is MUST_WAIT:
                return ran, intent
            conn._after(reply, others)
            if type(intent) is Quit or conn.state is CLOSING_HELD:
                return ran, CLOSE
            continue
        if client.reply_flags and not reply_wanted(client) and reply is not BLOCKED:
            # CLIENT REPLY OFF or SKIP: effects routed, no reply.
            if broker.outbox:
                try:
                    route(broker.take_effects(), others)
                except OSError:
                    pass  # undone, and logged by the packer; nobody to tell
            continue
        # As _after, inline (the bus aside): the path every command takes.
        if broker.outbox:
            try:
                ticket = route(broker.take_effects(), others)
            except OSError as unencodable:
                ticket = 0
                reply = undone(reply, unencodable)
            if reply is BLOCKED:
                if _replicating(conn, client):
                    continue
                break
            start = len(out)
            encode_into(reply, out, client.protover)
            if ticket:
                conn.logged.append((start, len(out), ticket))
        else:
            if reply is BLOCKED:
                if _replicating(conn, client):
                    continue
                break
            start = len(out)
            encode_into(reply, out, client.protover)
        end = len(out)
        if end - start > 1:  # a bulk or an array: maybe big
            for i in range(start, end):  # a loop in C, not sum(map(len, ...)) (3 % of GETJOB)
                written += len(out[i])
            if written > MAX_OUTPUT_PER_TURN:
                # Big replies (QPEEK, GETJOB of large jobs): write these before executing
                # more, so a client that does not read is paused after about this much.
                conn.backlog = bool(parser.buffered)
                return ran, None
    conn.backlog = False
    return ran, None


def _replicating(conn: ConnCore, client: Client) -> bool:
    """The command just run blocked: True if it is a synchronous ADDJOB the next commands
    may pass (REPLICATING), False if the connection is BLOCKED."""
    if client.repl_waits and not client.reply_flags:
        conn.waiting.append(None)
        conn.awaited += 1
        transition(conn, to_replicating(conn.state))
        return True
    transition(conn, to_blocked(conn.state))
    return False


def send_some(conn: ConnCore, data: bytes | memoryview) -> int | None:
    """Hand ``data`` to the kernel without waiting: the bytes it took (0 when the socket is
    full), or None when the connection is gone (it is then closed)."""
    try:
        sent = conn.sock.send(data)
    except BlockingIOError:
        return 0
    except OSError:
        conn.close()
        return None
    conn.counters.stats_out += sent
    return sent
