"""The cluster bus on trio: links to the other nodes, frames in and out, the core's effects.

Theory of operation
-------------------
The cluster core (``cluster/membership.py``) decides everything; this module only moves bytes
and time, following the contract of ``cluster/effects.py``:

* **Listener.** One per client listener address, on the client port + ``BUS_PORT_OFFSET``
  (fixed, as in Disque). The server opens the sockets (so "port in use" stops the start with
  one line) and hands them over. At most ``MAX_INBOUND`` inbound links at once; past that a new
  connection is closed at once (rate-limited log line).
* **Links.** Every link, inbound or outbound, is a ``Link`` with an int ``LinkId`` that is
  never reused in the process. It runs two tasks: a reader that reads the socket directly
  (trio waits only when the kernel has nothing) and hands the complete frames of each read
  to the cores (``bus_core.take_frames``, with the peer's and our own IP and, for an outbound
  link, the table ID it was opened for), and a writer (below). What runs per frame - decode,
  the cores, the flush, encode, the write - is ``node/bus_core.py``, compiled with the core;
  this module adds the tasks. A ``WireError`` (bad magic, version, type, oversized, malformed
  body, bad MAC, a frame cut by EOF) closes the link with one log line per (peer address,
  reason) every ``LOG_EVERY_S``. An inbound peer that sends no complete frame within
  ``first_frame_timeout`` (``min(FIRST_FRAME_TIMEOUT_S, cluster-node-timeout)``) is closed,
  and so is one silent for ``idle_timeout`` (``max(IDLE_TIMEOUT_MIN_S, 4 x node timeout)``:
  a live peer pings far more often) - a peer that vanished without a FIN does not hold a
  descriptor for ever. Both are deadlines that only a complete frame moves, so dribbling a
  byte now and then buys nothing; the ticker checks them every ``TICK_S``. Outbound links
  need no read timeout: the core's PING/PONG watches them and answers with ``CloseLink``.
* **TLS** (``tls-cluster yes``, ``node/bus_tls.py``). A new link's handshake runs first
  (``Bus._handshake``: outbound within the connect timeout, inbound within
  ``first_frame_timeout``); a peer that fails it is closed, counted and logged, and never
  becomes a ``Link``, so none of its bytes reach a decoder. A link then holds a
  ``TlsChannel`` (an ``ssl.SSLObject`` over memory BIOs) and its reads and writes stay
  direct: ``_read`` decrypts (``_take_tls``) what each read brought, ``bus_core.write_tls`` and
  ``_write_all_tls`` turn frames into records, the records the socket did not take waiting in
  the channel for the writer task.
* **Sends never block the node.** ``Send``/``Answer`` encode the frame and append its buffers
  to the link's queue without waiting (``cluster.wire.encode_parts``: a big job's body is a
  buffer of its own, never copied; a frame over ``max_body``, what ``job-max-body-len``
  allows, is not sent and is logged). At the end of the flush that queued them, the small
  frames of each link are joined and written with one ``write`` by the flushing task itself
  (``bus_core.write_pending``: a link's reader, a timer), with no hop to another task; the
  reactor's rounds leave theirs queued until the reactor waits or yields
  (``bus_core.flush_round``), so that a busy quantum's rounds share one write per link.
  The REPLJOBs and GOTJOBs a flush sends one node one after the other are joined into one
  BATCH frame (``cluster.wire.batch_body``; not a REPLJOB of a job with a large value), and
  the receiver hands them to its cores one by one (``cluster.wire.unbatch``), but for a
  batch of GOTJOBs, which the job core takes whole (``JobCore.receive_gotjobs``).
  The writer task takes over the queue only for what that write left (the socket was full),
  for a big frame (written from its own buffer, its MAC computed slice by slice, the other
  tasks let run after every ``WRITE_SLICE`` bytes) and for a frame sent outside a flush;
  until it has emptied the queue, new frames join it (order is kept). The reader reads up to
  ``BIG_READ_SIZE`` at once while a big frame arrives. A link whose
  unsent bytes pass ``SEND_QUEUE_LIMIT`` plus one frame of the largest size, or whose
  peer accepts no byte for ``send_stall_timeout`` (the node timeout, at least 1 s), is closed:
  a peer that stopped reading costs bounded memory and is then handled as a dead link. A
  ``Send`` to a node whose outbound link is not up, or an ``Answer`` on a closed link, is
  dropped and counted (``counters``); the core's timers make up for it.
* **Outbound links are kept up.** ``Connect(node_id, ip, port)`` starts a keeper task that
  connects (timeout ``min(CONNECT_TIMEOUT_S, node timeout / 2)``), reports ``link_up``, runs
  the link, reports ``link_down`` when it closes (or when connecting failed), and tries
  again, each attempt 80 to 100 ms (``RECONNECT_EVERY_S`` less up to 20 % random jitter, so
  that the peers of a restarted node drift apart) after the previous one started, for as
  long as the node is wanted: Disque's clusterCron tries every 100 ms tick. A refused
  connection costs little (about 0.4 ms of CPU), and a peer that comes back must be linked (its PING
  answered) well inside the node timeout, even after several quick restarts; there is no
  backoff. An address that does not answer at all is not retried faster than its connect
  timeout, since one attempt at a time waits for it. ``Connect`` for a node already
  kept at the same address does nothing; at another address the keeper restarts there.
  ``Disconnect`` cancels the keeper and closes its link; no ``link_down`` follows (the core
  asked for it). ``CloseLink`` closes one link; an outbound one is reconnected by its keeper
  if the node is still wanted, after ``link_down``.
* **Several cores, one router.** The membership core, the job core and the
  federation core each say
  which frame types they handle (``HANDLES``); ``Bus.receive`` hands a frame to the one
  core that handles its type (a type nobody handles, such as the reserved NACK, goes to the
  first core, which counts it and drops it). Link events go to the first core (membership
  owns the links), ticks to every core.
* **Effects go through one place.** Every event handed to a core (a frame,
  ``link_up``/``link_down``, a ``tick`` every ``TICK_S``) goes through ``Bus.event``, which
  then flushes (``bus_core.flush``). The job cores' frames of one read are handed over back
  to back and flushed once (``receive_frames``); the server flushes at the end of every
  reactor round, after each command that leaves the reactor and after every timer tick. An
  exception out of a core is logged with its traceback (rate-limited) and the node goes on.
  ``flush`` first calls ``before_flush`` (the server routes the *broker's* effects there, so
  log records reach the append log before any message that depends on them), then takes
  each core's effects and routes each one (``bus_core.route``; all but ``Send``/``Answer``
  in ``Bus.route_other``): links, sends, the nodes file (``save_nodes`` callback), the node
  ID (``new_node_id`` callback) and log lines (at most one per key every ``LOG_EVERY_S``,
  the number suppressed meanwhile added to the next one), then writes the links.
* **GOTJOB and YOURJOBS wait for the log.** A node may promise a copy only once it would
  still have it after kill -9, and may hand an at-most-once job over only once its ``del``
  is durable (else it could come back here while the receiver has it): a ``Send`` of
  GOTJOB or YOURJOBS whose node has log records not yet durable
  (``log_ticket()``, 0 when none) is held (``held``, by ticket) and sent by one task per
  ticket once ``wait_durable(ticket)`` says so, all of them in one flush (joined into BATCH
  frames), and dropped if that write failed (the broker undid the copy). Other sends go at
  once.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from broker.config import Config
from broker.protected import bus_open_to
from cluster.effects import (
    CloseLink,
    ClusterEffect,
    Connect,
    Disconnect,
    LinkId,
    LogLine,
    NewNodeId,
    SaveNodes,
)
from cluster.jobs import JobCore
from cluster.wire import Frame, WireError, mac_state
from node import bus_core
from node.bus_core import (
    BIG_READ_SIZE,
    COALESCE_BYTES,
    READ_SIZE,
    SEND_QUEUE_LIMIT,
    BusCore,
    FrameCore,
    LinkCore,
    MacLater,
)
from node.bus_tls import BusContexts, TlsChannel, describe
from node.clock import Clock
from node.reactor_core import ReactorCore

log = logging.getLogger("trisque.bus")

BUS_PORT_OFFSET = 10000
TICK_S = 0.1
MAX_INBOUND = 256
FIRST_FRAME_TIMEOUT_S = 10.0
IDLE_TIMEOUT_MIN_S = 10.0
CONNECT_TIMEOUT_S = 5.0
RECONNECT_EVERY_S = 0.1
SEND_CHUNK = 256 * 1024
# The writer lets the other tasks (the reactor's clients) run after this many bytes even
# while the kernel takes more: a big frame must not hold the loop for its whole length.
WRITE_SLICE = 1024 * 1024
LOG_EVERY_S = 10.0

_LEVELS = {"debug": logging.DEBUG, "notice": logging.INFO, "warning": logging.WARNING}

__all__ = ["BIG_READ_SIZE", "BUS_PORT_OFFSET", "COALESCE_BYTES", "READ_SIZE",
           "SEND_QUEUE_LIMIT", "Bus", "ClusterCore", "FrameCore", "Link", "LogLimiter"]


class ClusterCore(FrameCore, Protocol):
    """The first core (``cluster.membership.Membership``): it also gets the link events."""

    def link_up(self, node_id: str, link: LinkId, now_ms: int) -> None: ...

    def link_down(self, node_id: str, link: LinkId, now_ms: int) -> None: ...


class LogLimiter:
    """At most one line per key every ``every_s`` seconds; the next line that gets through
    says how many were suppressed."""

    def __init__(self, logger: logging.Logger, clock: Clock, every_s: float = LOG_EVERY_S) -> None:
        self.logger = logger
        self.clock = clock
        self.every_s = every_s
        self._seen: dict[str, list[float]] = {}  # key -> [last time written, suppressed]

    def emit(self, key: str, level: int, text: str, exc_info: bool = False) -> bool:
        now = self.clock.monotonic()
        entry = self._seen.get(key)
        if entry is not None and now - entry[0] < self.every_s:
            entry[1] += 1
            return False
        if len(self._seen) > 4096:  # a flood of distinct keys must not grow this for ever
            self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self.every_s}
        suppressed = int(entry[1]) if entry is not None else 0
        self._seen[key] = [now, 0]
        if suppressed:
            text += f" ({suppressed} similar lines suppressed)"
        self.logger.log(level, text, exc_info=exc_info)
        return True


def _host(addr: Any) -> str:
    host = str(addr[0]) if isinstance(addr, tuple) else str(addr)
    return host[7:] if host.startswith("::ffff:") else host


class Link(LinkCore):
    """One bus connection. ``run`` returns when it is closed, whoever closed it."""

    def __init__(self, bus: Bus, link_id: LinkId, stream: trio.SocketStream,
                 outbound_to: str | None, tls: TlsChannel | None = None) -> None:
        sock = stream.socket
        super().__init__(bus, link_id, sock.fileno(), outbound_to, _host(sock.getpeername()),
                         _host(sock.getsockname()), trio.current_time())
        self.owner = bus
        self.stream = stream
        self.tls = tls
        self._since_yield = 0  # bytes written since the writer last let other tasks run
        self._wakeup = trio.Event()
        self._scope = trio.CancelScope()

    def __repr__(self) -> str:
        way = f"to {self.outbound_to[:8]}" if self.outbound_to else "inbound"
        return f"<bus link {self.id} {way} {self.peer_ip}>"

    def enqueue(self, parts: list[bytes], mac_later: bool = False) -> bool:
        """Queue one frame's buffers (``bus_core.enqueue``)."""
        return bus_core.enqueue(self, parts, mac_later)

    def wake_writer(self) -> None:
        self._wakeup.set()

    def close(self) -> None:
        self.closed = True
        self._scope.cancel()

    async def run(self) -> None:
        reactor = self.owner.reactor if self.tls is None else None
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._guarded, self._write)
                    if reactor is not None:
                        # The reactor reads it (``bus_core.read_link``) until it closes.
                        reactor.add_link(self)
                        await trio.sleep_forever()
                    await self._guarded(self._read)
                    nursery.cancel_scope.cancel()
        finally:
            if reactor is not None:
                reactor.forget_link(self)
            self.close()
            self.queue.clear()
            self.owner.links.pop(self.id, None)
            await trio.aclose_forcefully(self.stream)

    async def _guarded(self, part: Callable[[], Awaitable[None]]) -> None:
        """Run the reader or the writer; whatever ends it closes the link (errors are caught
        here, not raised through the nursery, so they are never wrapped in groups)."""
        try:
            await part()
        except WireError as exc:
            bus_core.bad_frame(self, exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the peer went away: the normal end of a link
        self.close()

    def _deadline(self) -> float:
        bus = self.owner
        return self.last_frame + (bus.idle_timeout if self.spoke else bus.first_frame_timeout)

    async def _read(self) -> None:
        """Read straight from the socket (trio waits only when the kernel has nothing, as
        for client connections: no stream wrapper or cancel scope per read) and hand every
        complete frame of a read to the cores at once (``bus_core.take_frames``: decoded,
        handled, answered and written in this task). A read the kernel did not fill found
        the socket empty: the task waits for it at once (that wait lets the other tasks run,
        as trio's own ``recv`` would), without a checkpoint and a read that would only find
        nothing - each a trip through trio's run loop per frame. The deadlines of inbound
        links are the ticker's (``Bus.close_timed_out``), not a cancel scope per wait.
        Under TLS each read's records are decrypted first (``_take_tls``), starting with what
        arrived with the handshake's last read: the peer may have sent frames right behind it."""
        fd = self.fd
        decoder = self.decoder
        wait_readable = trio.lowlevel.wait_readable
        take = self._take_plain
        if self.tls is not None:
            take = self._take_tls
            if not take(b""):
                return
        while not self.closed:
            size = bus_core.read_size(decoder)
            try:
                data = os.read(fd, size)
            except BlockingIOError:
                await wait_readable(fd)
                continue
            if not data:
                decoder.truncated_at_eof()
                return
            if not take(data):
                return
            if len(data) < size:
                await wait_readable(fd)
            else:
                await trio.lowlevel.checkpoint()

    def _take_plain(self, data: bytes) -> bool:
        """Hand ``data``'s frames over; False when the link ends here."""
        bus_core.take_frames(self, data)
        return not self.closed

    def _take_tls(self, data: bytes) -> bool:
        """Decrypt ``data`` and hand its frames over; False when the link ends here."""
        tls: TlsChannel = self.tls
        try:
            plain = tls.decrypt(data)
        except ssl.SSLError as exc:
            bus = self.owner
            bus.counters["links_dropped_bad_frame"] += 1
            bus.limiter.emit(f"tls-record:{self.peer_ip}", logging.WARNING,
                             f"Cluster bus: dropping link with {self.peer_ip}: TLS error "
                             f"({describe(exc)})")
            return False
        if tls.pending and not self.writing:  # TLS itself answers (a key update)
            bus_core.hand_over(self)
        if plain:
            bus_core.take_frames(self, plain)
        if self.closed:
            return False
        if tls.eof:
            self.decoder.truncated_at_eof()
            return False
        return True

    def _timed_out(self) -> None:
        bus = self.owner
        key = "idle" if self.spoke else "silent"
        bus.counters[f"links_closed_{key}"] += 1
        what = "no frame" if self.spoke else "no complete frame"
        waited_s = trio.current_time() - self.last_frame
        bus.limiter.emit(f"{key}:{self.peer_ip}", logging.WARNING,
                         f"Cluster bus: closing link from {self.peer_ip}: {what} "
                         f"in {waited_s:.1f} s")

    async def _write(self) -> None:
        """Drain the queue when it owns it (``writing``: a direct write the socket did not
        take whole, a big frame, a send outside a flush): the small frames queued since the
        last wake-up joined into one write, a large buffer written from itself, a big frame
        whose MAC is still to compute hashed slice by slice as it is written (``MacLater``);
        straight to the socket, trio waiting only when the kernel takes nothing."""
        queue = self.queue
        tls = self.tls
        while True:
            if tls is not None and tls.pending:  # records the socket did not take yet
                if not await self._write_all(memoryview(b"")):
                    return
                continue
            if not queue:
                self.writing = False
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            self.writing = True
            item = queue.popleft()
            if isinstance(item, MacLater):
                if not await self._write_signed(item):
                    return
                continue
            data = item
            if queue and len(data) < COALESCE_BYTES and len(queue[0]) < COALESCE_BYTES:
                parts = [data]
                size = len(data)
                while queue and size < COALESCE_BYTES and len(queue[0]) < COALESCE_BYTES:
                    part = queue.popleft()
                    assert isinstance(part, bytes)
                    parts.append(part)
                    size += len(part)
                data = b"".join(parts)
            if not await self._write_all(memoryview(data)):
                return

    async def _write_signed(self, frame: MacLater) -> bool:
        """A big frame and its MAC, each slice added to the MAC just before it is written:
        computing the MAC of 40 MB at once would hold the loop for 60-100 ms."""
        assert self.owner.secret is not None
        mac = mac_state(self.owner.secret)
        for part in frame.parts:
            view = memoryview(part)
            for start in range(0, len(view), WRITE_SLICE):
                piece = view[start:start + WRITE_SLICE]
                mac.update(piece)
                if not await self._write_all(piece):
                    return False
        return await self._write_all(memoryview(mac.finalize()))

    async def _write_all(self, view: memoryview) -> bool:
        """Write ``view`` whole. After every ``WRITE_SLICE`` bytes the other tasks run, so a
        big frame never holds the loop for long; a peer that takes no byte for
        ``send_stall_timeout`` gets its link closed (False)."""
        if self.tls is not None:
            return await self._write_all_tls(view)
        fd = self.fd
        progress = trio.current_time()
        while view:
            try:
                sent = os.write(fd, view[:SEND_CHUNK])
            except BlockingIOError:
                sent = 0
            if sent:
                self.unsent -= sent
                view = view[sent:]
                self._since_yield += sent
                if self._since_yield >= WRITE_SLICE:
                    self._since_yield = 0
                    await trio.lowlevel.checkpoint()
                progress = trio.current_time() if view else progress
                continue
            self._since_yield = 0
            if not await self._wait_writable(progress):
                return False
        return True

    async def _wait_writable(self, progress: float) -> bool:
        """Wait until the socket takes bytes again; False (link closed) if the peer took
        none for ``send_stall_timeout`` since ``progress``."""
        bus = self.owner
        with trio.move_on_at(progress + bus.send_stall_timeout) as waited:
            await trio.lowlevel.wait_writable(self.fd)
        if waited.cancelled_caught:
            bus.counters["links_closed_slow"] += 1
            bus.limiter.emit(f"stall:{self.peer_ip}", logging.WARNING,
                             f"Cluster bus: closing link to {self.peer_ip}: peer read "
                             f"nothing for {bus.send_stall_timeout:g} s")
            self.close()
            return False
        return True

    async def _write_all_tls(self, view: memoryview) -> bool:
        """``_write_all`` under TLS: the channel's records first, then ``view`` made records
        ``SEND_CHUNK`` at a time, each written before the next is made (the records waiting
        are at most one chunk's)."""
        tls: TlsChannel = self.tls
        fd = self.fd
        progress = trio.current_time()
        while True:
            if not tls.pending:
                if not view:
                    return True
                piece = view[:SEND_CHUNK]
                view = view[len(piece):]
                tls.encrypt(piece)
                self.unsent -= len(piece)
            before = len(tls.pending)
            tls.write_pending(fd)
            sent = before - len(tls.pending)
            if sent:
                self._since_yield += sent
                if self._since_yield >= WRITE_SLICE:
                    self._since_yield = 0
                    await trio.lowlevel.checkpoint()
                progress = trio.current_time()
                continue
            self._since_yield = 0
            if not await self._wait_writable(progress):
                return False


@dataclass
class _Outbound:
    """An outbound link the core wants kept up."""

    node_id: str
    ip: str
    port: int
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    link: Link | None = None


async def _always_durable(ticket: int) -> bool:
    return True


class Bus(BusCore):
    def __init__(self, core: ClusterCore, config: Config, clock: Clock, node_id: str, *,
                 save_nodes: Callable[[str], None] = lambda content: None,
                 new_node_id: Callable[[str], None] = lambda node_id: None,
                 rng: random.Random | None = None,
                 before_flush: Callable[[], None] = lambda: None,
                 log_ticket: Callable[[], int] = lambda: 0,
                 wait_durable: Callable[[int], Awaitable[bool]] = _always_durable,
                 after_flush: Callable[[], None] = lambda: None,
                 tls: BusContexts | None = None) -> None:
        # Read once: changing the secret of a running node would split it from its cluster.
        super().__init__(core, config, config.cluster_secret.encode() or None, node_id,
                         before_flush, after_flush, log_ticket, clock.now_ms)
        self.membership = core
        self.wait_durable = wait_durable
        self.clock = clock
        self.listeners: list[socket.socket] = []
        self.save_nodes = save_nodes
        self.new_node_id = new_node_id
        self.rng = rng or random.Random()
        self.outbound: dict[str, _Outbound] = {}
        self.inbound = 0
        self._next_link = 0
        self.limiter = LogLimiter(log, clock)
        self._nursery: trio.Nursery | None = None
        # The node's reactor (node/reactor.py), which reads the plain links in its loop;
        # without it (a bus on its own) each link's task reads it.
        self.reactor: ReactorCore | None = None
        # tls-cluster: every link's handshake uses these (``node/bus_tls.py``); CONFIG SET of
        # a tls-* file replaces them for the links opened after it.
        self.tls = tls

    def add_core(self, core: FrameCore) -> None:
        """Route the frames of ``core.HANDLES`` to ``core`` and tick it (the job core)."""
        overlap = self.by_type.keys() & core.HANDLES
        if overlap:
            raise ValueError(f"frame types handled twice: {sorted(t.name for t in overlap)}")
        self.cores.append(core)
        self.sources.append(bus_core.effect_source(core))
        self.by_type.update((t, core) for t in core.HANDLES)
        if isinstance(core, JobCore):
            self.jobs = core

    # -- timeouts (read live: CONFIG SET cluster-node-timeout applies at once) -------------

    @property
    def node_timeout(self) -> float:
        return float(self.config.cluster_node_timeout) / 1000

    @property
    def first_frame_timeout(self) -> float:
        return min(FIRST_FRAME_TIMEOUT_S, self.node_timeout)

    @property
    def idle_timeout(self) -> float:
        return max(IDLE_TIMEOUT_MIN_S, 4 * self.node_timeout)

    @property
    def send_stall_timeout(self) -> float:
        return max(1.0, self.node_timeout)

    @property
    def connect_timeout(self) -> float:
        return max(0.05, min(CONNECT_TIMEOUT_S, self.node_timeout / 2))

    # -- running ---------------------------------------------------------------------------

    async def run(self, listeners: list[socket.socket], *,
                  task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve ``listeners`` (non-blocking sockets on the bus port) until ``stop``."""
        self.listeners = listeners
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for sock in self.listeners:
                    nursery.start_soon(self._accept, trio.socket.from_stdlib_socket(sock))
                nursery.start_soon(self._ticker)
                for ob in self.outbound.values():  # Connects routed before the bus ran
                    nursery.start_soon(self._keep, ob)
                self.flush()  # Connects for the nodes of a table loaded from nodes.conf
                task_status.started(self)
        finally:
            self._nursery = None
            for ls in self.listeners:
                ls.close()

    def stop(self) -> None:
        """Close every link and stop listening (``run`` then returns)."""
        for ob in self.outbound.values():
            ob.scope.cancel()
        self.outbound.clear()
        for link in list(self.links.values()):
            link.close()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _ticker(self) -> None:
        # On a fixed schedule rather than sleep(TICK_S) after each tick, so the time a tick
        # takes does not stretch the period past TICK_S.
        deadline = trio.current_time()
        while True:
            deadline = max(deadline + TICK_S, trio.current_time())
            await trio.sleep_until(deadline)
            self.event(self.tick, self.clock.now_ms())
            self.close_timed_out()

    def close_timed_out(self) -> None:
        """Close the inbound links past their deadline (``Link._deadline``; the core's
        PING/PONG watches outbound links). Checked every tick rather than by each read's
        wait: a link's deadline is seconds away, a tick 0.1 s. A link's ``last_frame`` moves here
        too, to the first tick after its last frame."""
        now = trio.current_time()
        for link in list(self.links.values()):
            if link.heard:  # a frame came since the last tick (``bus_core.take_frames``)
                link.heard = False
                link.last_frame = now
            if (isinstance(link, Link) and link.outbound_to is None and not link.closed
                    and now >= link._deadline()):
                link._timed_out()
                link.close()

    async def _accept(self, listener: trio.socket.SocketType) -> None:
        assert self._nursery is not None
        while True:
            try:
                sock, peer = await listener.accept()
            except OSError as exc:
                self.limiter.emit("accept", logging.WARNING,
                                  f"Cluster bus: accepting a connection: {exc.strerror}")
                await trio.sleep(0.1)
                continue
            if self.inbound >= MAX_INBOUND:
                self.counters["links_refused"] += 1
                self.limiter.emit("inbound-limit", logging.WARNING,
                                  f"Cluster bus: refusing a link from {_host(peer)}: "
                                  f"{MAX_INBOUND} inbound links already open")
                sock.close()
                continue
            if not bus_open_to(_host(peer), self.config.protected_mode,
                               self.config.cluster_secret, self.tls is not None):
                self.counters["links_refused"] += 1
                self.limiter.emit("protected", logging.WARNING,
                                  f"Cluster bus: refusing a link from {_host(peer)}: protected "
                                  "mode accepts loopback peers only without cluster-secret "
                                  "or tls-cluster")
                sock.close()
                continue
            _nodelay(sock)
            self.inbound += 1  # counted here: a burst of accepts must not overshoot the limit
            self._nursery.start_soon(self._serve_inbound, trio.SocketStream(sock))

    async def _serve_inbound(self, stream: trio.SocketStream) -> None:
        try:
            channel = None
            if self.tls is not None:
                channel = await self._handshake(stream, None)
                if channel is None:
                    return
            try:
                link = self._new_link(stream, None, channel)
            except OSError:  # the peer is already gone (getpeername failed)
                await trio.aclose_forcefully(stream)
                return
            await link.run()
        finally:
            self.inbound -= 1

    async def _handshake(self, stream: trio.SocketStream,
                         ob: _Outbound | None) -> TlsChannel | None:
        """The TLS handshake of a new link (``ob``: the outbound link's node, else inbound);
        None if it failed: the stream is closed, the failure counted and logged, and no byte
        of the peer's was read as a frame."""
        assert self.tls is not None
        outbound = ob is not None
        channel = TlsChannel(self.tls.client if outbound else self.tls.server,
                             server_side=not outbound)
        try:
            with trio.fail_after(self.connect_timeout if outbound
                                 else self.first_frame_timeout):
                await channel.handshake(stream.socket)
            return channel
        except (OSError, EOFError, trio.TooSlowError) as exc:  # ssl.SSLError is an OSError
            # TLS refused (a certificate, a protocol) is worth a warning; a peer that went
            # away mid-handshake (a node restarting) is an ordinary failed connection.
            level = (logging.WARNING if isinstance(exc, (ssl.SSLError, trio.TooSlowError))
                     else logging.DEBUG)
            if ob is not None:
                if level == logging.WARNING:
                    self.counters["tls_connect_failures"] += 1
                self.limiter.emit(f"tls-connect:{ob.node_id}:{level}", level,
                                  f"Cluster bus: no TLS link to {ob.ip}:{ob.port} "
                                  f"({ob.node_id[:8]}): {describe(exc)}")
            else:
                peer = _peer_of(stream)
                self.counters["links_refused_tls"] += 1
                self.limiter.emit(f"tls:{peer}:{level}", level,
                                  f"Cluster bus: refusing a link from {peer}: TLS handshake "
                                  f"failed ({describe(exc)})")
            await trio.aclose_forcefully(stream)
            return None

    def _new_link(self, stream: trio.SocketStream, outbound_to: str | None,
                  tls: TlsChannel | None = None) -> Link:
        self._next_link += 1
        link = Link(self, self._next_link, stream, outbound_to, tls)
        self.links[link.id] = link
        return link

    async def _keep(self, ob: _Outbound) -> None:
        """Keep ``ob``'s link up until it is cancelled (Disconnect, a new address, stop)."""
        with ob.scope:
            while True:
                started = trio.current_time()
                try:
                    with trio.fail_after(self.connect_timeout):
                        stream = await _tcp_connect(ob.ip, ob.port)
                except (OSError, trio.TooSlowError) as exc:
                    self.counters["connect_failures"] += 1
                    self._next_link += 1
                    self.limiter.emit(f"connect:{ob.node_id}", logging.DEBUG,
                                      f"Cluster bus: connecting to {ob.ip}:{ob.port} "
                                      f"({ob.node_id[:8]}): {exc or 'timed out'}")
                    self.event(self.membership.link_down, ob.node_id, self._next_link,
                               self.clock.now_ms())
                else:
                    channel = None
                    if self.tls is not None:
                        channel = await self._handshake(stream, ob)
                    if channel is not None or self.tls is None:
                        await self._run_outbound(ob, stream, channel)
                    else:  # reported as a connection that failed
                        self.counters["connect_failures"] += 1
                        self._next_link += 1
                        self.event(self.membership.link_down, ob.node_id, self._next_link,
                                   self.clock.now_ms())
                jitter = 0.2 * self.rng.random()
                await trio.sleep_until(started + RECONNECT_EVERY_S * (1 - jitter))

    async def _run_outbound(self, ob: _Outbound, stream: trio.SocketStream,
                            tls: TlsChannel | None) -> None:
        """Report the link up, run it, report it down (a peer already gone reports nothing:
        the link never was up)."""
        try:
            link = self._new_link(stream, ob.node_id, tls)
        except OSError:
            await trio.aclose_forcefully(stream)
            return
        ob.link = link
        self.up[ob.node_id] = link
        self.event(self.membership.link_up, ob.node_id, link.id, self.clock.now_ms())
        try:
            await link.run()
        finally:
            ob.link = None
            if self.up.get(ob.node_id) is link:
                del self.up[ob.node_id]
        self.event(self.membership.link_down, ob.node_id, link.id, self.clock.now_ms())

    # -- events into the core, effects out ---------------------------------------------

    def receive_frames(self, link: Link, frames: list[Frame]) -> None:
        """The frames of one read, in order (``bus_core.receive_frames``)."""
        bus_core.receive_frames(self, link, frames)

    def receive(self, frame: Frame, link: LinkId, peer_ip: str, local_ip: str,
                outbound_to: str | None, now_ms: int) -> None:
        """The one place a frame is routed by its type."""
        core = self.by_type.get(frame.type, self.core)
        core.receive(frame, link, peer_ip, local_ip, outbound_to, now_ms)

    def tick(self, now_ms: int) -> None:
        for core in self.cores:
            core.tick(now_ms)

    def event(self, handler: Callable[..., None], *args: Any) -> None:
        """Hand one event to the core, then route its effects. A bug met there is logged
        (with its traceback, rate-limited) and the node goes on, as a client connection's
        would: one bad message must not take the node down."""
        try:
            handler(*args)
            if handler != self.flush:
                bus_core.flush(self)
        except Exception:
            self.core_error(handler)

    def membership_event(self, frame: Frame, link: LinkCore, now_ms: int) -> None:
        self.event(self.membership.receive, frame, link.id, link.peer_ip, link.local_ip,
                   link.outbound_to, now_ms)

    def core_error(self, handler: object) -> None:
        self.counters["core_errors"] += 1
        self.limiter.emit(f"core-error:{getattr(handler, '__name__', '?')}", logging.ERROR,
                          "Cluster bus: unexpected error in the cluster core", exc_info=True)

    def log_warning(self, key: str, text: str) -> None:
        self.limiter.emit(key, logging.WARNING, text)

    def flush(self) -> None:
        """After every event: the broker's effects first (``before_flush``), then each core's,
        routed in order, then each link's frames written (``bus_core.flush``)."""
        bus_core.flush(self)

    def route(self, effect: ClusterEffect) -> None:
        """The one place a cluster effect goes where it belongs (``bus_core.route``)."""
        bus_core.route(self, effect)

    def route_other(self, effect: ClusterEffect) -> None:
        t = type(effect)
        if t is Connect:
            assert isinstance(effect, Connect)
            self._connect(effect)
        elif t is Disconnect:
            assert isinstance(effect, Disconnect)
            ob = self.outbound.pop(effect.node_id, None)
            if ob is not None:
                ob.scope.cancel()
                if ob.link is not None:
                    ob.link.close()
        elif t is CloseLink:
            assert isinstance(effect, CloseLink)
            link = self.links.get(effect.link)
            if link is not None:
                link.close()
        elif t is SaveNodes:
            assert isinstance(effect, SaveNodes)
            self.save_nodes(effect.content)
        elif t is NewNodeId:
            assert isinstance(effect, NewNodeId)
            self.node_id = effect.node_id
            self.new_node_id(effect.node_id)
        elif t is LogLine:
            assert isinstance(effect, LogLine)
            self.limiter.emit(f"core:{effect.key or effect.text}",
                              _LEVELS.get(effect.level, logging.INFO), effect.text)
        else:
            raise AssertionError(f"unknown cluster effect {effect!r}")

    def send_when_durable(self, ticket: int) -> bool:
        if self._nursery is None:
            return False
        self._nursery.start_soon(self._send_when_durable, ticket)
        return True

    async def _send_when_durable(self, ticket: int) -> None:
        durable = await self.wait_durable(ticket)
        sends = self.held.pop(ticket, [])
        if not durable:
            self.counters["sends_dropped"] += len(sends)
            return
        self.flushing = True
        try:
            for effect in sends:
                bus_core.send(self, self.up.get(effect.node_id), effect.type, effect.body)
        finally:
            bus_core.end_flush(self)

    def _connect(self, want: Connect) -> None:
        ob = self.outbound.get(want.node_id)
        if ob is not None:
            if (ob.ip, ob.port) == (want.ip, want.bus_port):
                return
            ob.scope.cancel()
            if ob.link is not None:
                ob.link.close()
        ob = _Outbound(want.node_id, want.ip, want.bus_port)
        self.outbound[want.node_id] = ob
        if self._nursery is not None:  # else run() starts it
            self._nursery.start_soon(self._keep, ob)


async def _tcp_connect(ip: str, port: int) -> trio.SocketStream:
    """A TCP connection to a node's numeric address. Not ``trio.open_tcp_stream``: its
    happy-eyeballs nursery costs three times the CPU of a plain connect, and a node that is
    down is tried ten times a second."""
    sock = trio.socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
    try:
        await sock.connect((ip, port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)  # which sets TCP_NODELAY


def _peer_of(stream: trio.SocketStream) -> str:
    try:
        return _host(stream.socket.getpeername())
    except OSError:
        return "?"


def _nodelay(sock: Any) -> None:
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass
