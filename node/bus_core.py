"""The cluster bus's per-frame path, without trio: compiled with mypyc.

Theory of operation
-------------------
``node/bus.py`` explains the bus (links, their tasks, the keepers, the log's wait). This module
holds what runs for every frame: the complete frames of a link's read decoded and handed to
the cores (``take_frames``, ``receive_frames``), the flush that routes the cores' effects
(``flush``, ``route``, ``send``: each frame encoded into its link's queue, the REPLJOBs and
GOTJOBs for one node joined into BATCH frames) and the write that ends it (``write_pending``,
``write_now``: a link's frames joined into one ``write`` by the flushing task itself, with no
hop to the link's writer task). The state is ``LinkCore`` and ``BusCore``; the interpreted
``Link`` and ``Bus`` add the trio tasks and the rare effects, through a few hooks
(``wake_writer``, ``close``, ``membership_event``, ``send_when_durable``, ``route_other``,
``core_error``, ``log_warning``).

As in ``node/round_core.py``, the hot path is module functions taking the compiled base types,
not methods: compiled code calls a method of an interpreted subclass's instance through
Python's method lookup; a module function is a direct C call.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol

from mypy_extensions import mypyc_attr

from cluster.effects import Answer, ClusterEffect, EffectQueue, Send
from cluster.jobs import JobCore
from cluster.wire import (
    BATCH_MAX,
    BATCHABLE,
    BIG_VALUE,
    MAC_SIZE,
    Frame,
    FrameDecoder,
    MessageType,
    Oversized,
    WireError,
    batch_body,
    batch_of,
    encode_parts,
    max_body_for,
    new_frame,
)

READ_SIZE: Final = 65536
# The most one read takes while a large frame arrives (the decoder says how much is missing).
BIG_READ_SIZE: Final = 1024 * 1024
# Unsent bytes a link may hold beyond one frame of the largest size (``BusCore.max_body``):
# room for a few ordinary frames behind a big one, not for an unbounded backlog.
SEND_QUEUE_LIMIT: Final = 64 * 1024 * 1024
# Small frames queued together are joined into one write up to this size; a larger buffer
# (a big job's body) is written from itself, never copied.
COALESCE_BYTES: Final = 256 * 1024

# Sends that promise a state only the log keeps after kill -9: a replica's copy (GOTJOB), the
# deletion here of an at-most-once job that moved to the receiver (YOURJOBS).
WAIT_FOR_LOG: Final = frozenset({MessageType.GOTJOB, MessageType.YOURJOBS})

_GOTJOB: Final = MessageType.GOTJOB
_BATCH: Final = MessageType.BATCH


class FrameCore(Protocol):
    """What the bus needs of a core that handles frames (``cluster.jobs.JobCore``); its
    effects it takes from the core's base class, ``cluster.effects.EffectQueue``."""

    HANDLES: frozenset[MessageType]

    def receive(self, frame: Frame, link: int, peer_ip: str, local_ip: str,
                outbound_to: str | None, now_ms: int) -> None: ...

    def tick(self, now_ms: int) -> None: ...


def effect_source(core: FrameCore) -> EffectQueue:
    if not isinstance(core, EffectQueue):
        raise TypeError(f"{type(core).__name__} is not a cluster.effects.EffectQueue")
    return core


class MacLater:
    """A big frame queued without its MAC (``encode_parts(defer_mac=True)``): the writer
    computes the MAC as it writes the parts. Its length is the frame's, so it is never joined
    with small frames."""

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts
        self.size = sum(len(p) for p in parts) + MAC_SIZE

    def __len__(self) -> int:
        return self.size


@mypyc_attr(allow_interpreted_subclasses=True)
class LinkCore:
    """One bus connection's state; ``node.bus.Link`` adds its tasks."""

    def __init__(self, bus: BusCore, link_id: int, fd: int, outbound_to: str | None,
                 peer_ip: str, local_ip: str, now: float) -> None:
        self.bus = bus
        self.id = link_id
        self.fd = fd
        self.outbound_to = outbound_to
        self.peer_ip = peer_ip
        self.local_ip = local_ip
        self.queue: deque[bytes | MacLater] = deque()
        self.unsent = 0  # bytes queued or being written
        # The writer task owns the queue (it holds bytes taken from it, or the socket took
        # only part of a direct write): until it empties it, frames only join the queue.
        self.writing = False
        self.dirty = False  # in ``bus.dirty``: frames queued during this flush
        # Messages of one ``BATCHABLE`` type sent during this flush, not encoded yet: joined
        # into one BATCH frame when the flush ends or a message of another type follows.
        self.batch: list[dict[str, Any]] = []
        self.batch_type = MessageType.GOTJOB
        self.decoder = FrameDecoder(bus.secret, limit=lambda: max_body(bus))
        # Moved only by complete frames: a peer dribbling a byte now and then does not keep
        # a link open any longer than a silent one.
        self.spoke = False
        self.last_frame = now
        # A complete frame came since the bus's last tick, which then moves ``last_frame``:
        # no clock read per read (the deadlines are seconds; the tick is 0.1 s).
        self.heard = False
        self.closed = False
        # In the reactor's ``ready_links`` (a plain link the reactor reads: ``read_link``).
        self.ready = False
        # Under tls-cluster, the link's ``node.bus_tls.TlsChannel``: the bytes on the socket
        # are its records (``write_tls``; the reader decrypts).
        self.tls: Any = None

    # -- hooks of the trio side (node/bus.py) -----------------------------------------------

    def wake_writer(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


@mypyc_attr(allow_interpreted_subclasses=True)
class BusCore:
    """The bus's routing state; ``node.bus.Bus`` adds the listeners, keepers and timers."""

    def __init__(self, core: FrameCore, config: Any, secret: bytes | None, node_id: str,
                 before_flush: Callable[[], None], after_flush: Callable[[], None],
                 log_ticket: Callable[[], int], now_ms: Callable[[], int]) -> None:
        self.core = core  # the membership core: link events, and frames nobody else handles
        self.cores: list[FrameCore] = [core]
        # The same cores, typed by their base class: a flush looks at each one's ``outbox``.
        self.sources: list[EffectQueue] = [effect_source(core)]
        self.by_type: dict[MessageType, FrameCore] = {
            t: core for t in getattr(core, "HANDLES", ())}
        # The job core once added (``Bus.add_core``): a read's BATCH of GOTJOBs goes to it
        # whole (``receive_frames``), no frame or call per message.
        self.jobs: JobCore | None = None
        self.config = config  # broker.config.Config
        self.secret = secret
        self.node_id = node_id
        self.before_flush = before_flush
        self.after_flush = after_flush
        self.log_ticket = log_ticket
        self.now_ms = now_ms
        self.links: dict[int, LinkCore] = {}
        # node ID -> its outbound link while it is up: where a ``Send`` goes.
        self.up: dict[str, LinkCore] = {}
        self.counters: dict[str, int] = dict.fromkeys((
            "frames_received", "frames_sent", "sends_dropped", "links_refused",
            "links_dropped_bad_frame", "links_closed_silent", "links_closed_idle",
            "links_closed_slow", "connect_failures", "core_errors", "sends_oversized",
            "links_refused_tls", "tls_connect_failures"), 0)
        # Frames by message type, for /metrics (node/metrics.py).
        self.received_by_type: dict[MessageType, int] = {}
        self.sent_by_type: dict[MessageType, int] = {}
        # Frames queued during a flush are written at its end, one write per link.
        self.flushing = False
        self.dirty: list[LinkCore] = []
        # The reactor's rounds leave their frames queued (``flush_round``) until it waits or
        # lets the other tasks run (``write_pending``): one write per link for all the rounds
        # of a quantum, as a link's writer task did.
        self.deferring = False
        # Sends waiting for a log batch to be durable (GOTJOB, YOURJOBS), by its ticket: one
        # task per batch sends them all, in one flush (``send_when_durable``).
        self.held: dict[int, list[Send]] = {}
        # The last batch ``close_batch`` encoded in this write, and its frame: the next link
        # whose batch holds the same bodies (a REPLJOB's two replicas) takes the same bytes.
        self.shared_batch: list[dict[str, Any]] = []
        self.shared_type = MessageType.GOTJOB
        self.shared_frame = b""
        # ``log_ticket()`` as read once in this flush (-1: not yet): no log record is routed
        # between the cores' effects, so one read serves every GOTJOB of the flush (each read
        # is a call into the interpreted server).
        self.flush_ticket = -1

    @property
    def max_body(self) -> int:
        return max_body(self)

    # -- hooks of the trio side (node/bus.py) -----------------------------------------------

    def membership_event(self, frame: Frame, link: LinkCore, now_ms: int) -> None:
        """A frame for the membership core: an event of its own (``Bus.event``)."""
        raise NotImplementedError

    def core_error(self, handler: object) -> None:
        raise NotImplementedError

    def send_when_durable(self, ticket: int) -> bool:
        """Send ``held[ticket]`` once the log batch ``ticket`` is durable (False: no task
        can wait for it)."""
        raise NotImplementedError

    def route_other(self, effect: ClusterEffect) -> None:
        """Every effect but ``Send`` and ``Answer``."""
        raise NotImplementedError

    def log_warning(self, key: str, text: str) -> None:
        raise NotImplementedError


class DeadlineCore(Protocol):
    """A core ticked at its own deadline (``AlarmCore``)."""

    def next_deadline(self) -> int | None: ...


@mypyc_attr(allow_interpreted_subclasses=True)
class AlarmCore:
    """The state of a task that ticks one core at its ``next_deadline()``
    (``node.server.CoreAlarm`` adds the task): ``armed``, the deadline the task sleeps until,
    and ``wake``, the event that wakes it early. Every flush checks each alarm
    (``deadlines_moved``): any event may move a core's deadline earlier."""

    def __init__(self, core: DeadlineCore, wake: Any) -> None:
        self.core = core
        self.armed: int | None = None
        self.wake = wake  # a trio.Event


def deadlines_moved(alarms: list[AlarmCore]) -> None:
    """After every flush: wake each alarm whose core's deadline came earlier (compiled: it runs
    after every frame)."""
    for alarm in alarms:
        due = alarm.core.next_deadline()
        if due is not None:
            armed = alarm.armed
            if armed is None or due < armed:
                alarm.wake.set()


def max_body(bus: BusCore) -> int:
    """The largest frame body sent or accepted (``cluster.wire.max_body_for``; read live:
    CONFIG SET job-max-body-len). A function: the property of ``Bus``, an interpreted
    subclass, is reached from compiled code through Python's lookup, once per read."""
    return max_body_for(int(bus.config.job_max_body_len))


# -- in: a link's bytes to the cores ------------------------------------------------------


def bad_frame(link: LinkCore, exc: WireError) -> None:
    bus = link.bus
    bus.counters["links_dropped_bad_frame"] += 1
    reason = type(exc).__name__
    bus.log_warning(f"wire:{link.peer_ip}:{reason}",
                    f"Cluster bus: dropping link with {link.peer_ip}: {reason} ({exc})")


def read_size(decoder: FrameDecoder) -> int:
    """How much one read of a link asks for: at least ``READ_SIZE``, the rest of a big frame
    being received up to ``BIG_READ_SIZE``."""
    return min(max(decoder.missing(), READ_SIZE), BIG_READ_SIZE)


def read_link(link: LinkCore) -> bool:
    """One read of a plain link the reactor serves (its epoll reported it readable), its
    complete frames handed to the cores at once; False when the link ends here (the peer
    closed it, a bad frame, an error)."""
    size = read_size(link.decoder)
    try:
        data = os.read(link.fd, size)
    except BlockingIOError:
        return True
    except OSError:
        return False
    try:
        if not data:
            link.decoder.truncated_at_eof()
            return False
        take_frames(link, data)
    except WireError as exc:
        bad_frame(link, exc)
        return False
    except Exception:  # the reactor calls this: one link's bug must not stop the node
        link.bus.core_error(read_link)
        return False
    return not link.closed


def take_frames(link: LinkCore, data: bytes) -> None:
    """Feed ``data`` to the decoder and hand every complete frame to the bus at once."""
    bus = link.bus
    decoder = link.decoder
    decoder.feed(data)
    frames: list[Frame] = []
    try:
        while True:
            frame = decoder.next()
            if frame is None:
                break
            if frame.type is MessageType.BATCH:
                kind, bodies = batch_of(frame)
                if kind is _GOTJOB and bus.jobs is not None:
                    frames.append(frame)  # whole, to the job core (``receive_frames``)
                else:
                    sender = frame.sender
                    for item in bodies:
                        frames.append(new_frame(kind, sender, item))
            else:
                frames.append(frame)
    finally:  # the frames before a bad one still count, as they arrived
        if frames:
            link.spoke = link.heard = True
            receive_frames(bus, link, frames)


def receive_frames(bus: BusCore, link: LinkCore, frames: list[Frame]) -> None:
    """The frames of one read, in order. Consecutive frames for the cores that only send
    (the job cores) are handed over one after the other and flushed once: one
    ``before_flush`` and one write per link for all of
    them (their records still reach the log before any message routed after them). A frame
    for the membership core is an event of its own (its ``CloseLink`` must take effect
    before the next frame of that link)."""
    now_ms = bus.now_ms()
    membership = bus.core
    by_core = bus.by_type
    by_type = bus.received_by_type
    counters = bus.counters
    pending = False
    for frame in frames:
        if link.closed:
            return
        mtype = frame.type
        if mtype is _BATCH:  # GOTJOBs for the job core (``take_frames``)
            jobs = bus.jobs
            assert jobs is not None
            bodies: list[dict[str, Any]] = frame.body["bodies"]
            n = len(bodies)
            counters["frames_received"] += n
            by_type[_GOTJOB] = by_type.get(_GOTJOB, 0) + n
            try:
                jobs.receive_gotjobs(frame, bodies, link.id, link.peer_ip, link.local_ip,
                                     link.outbound_to, now_ms)
            except Exception:
                bus.core_error(jobs.receive_gotjobs)
            pending = True
            continue
        counters["frames_received"] += 1
        by_type[mtype] = by_type.get(mtype, 0) + 1
        core = by_core.get(mtype, membership)
        if core is membership:
            if pending:
                flush_guarded(bus)
                pending = False
            bus.membership_event(frame, link, now_ms)
            continue
        try:
            core.receive(frame, link.id, link.peer_ip, link.local_ip, link.outbound_to, now_ms)
        except Exception:
            bus.core_error(core.receive)
        pending = True
    if pending:
        flush_guarded(bus)


# -- out: the cores' effects to the links -------------------------------------------------


def flush_guarded(bus: BusCore) -> None:
    try:
        flush(bus)
    except Exception:
        bus.core_error(flush)


def flush(bus: BusCore) -> None:
    """After every event: the broker's effects first (``before_flush``), then each core's,
    routed in order; then each link's frames written, one write per link."""
    outer = not bus.flushing
    bus.flushing = True
    try:
        bus.before_flush()
        bus.flush_ticket = -1  # the broker's records were just routed: read it anew
        for source in bus.sources:
            if source.outbox:
                for effect in source.take_effects():
                    route(bus, effect)
        bus.after_flush()
    finally:
        bus.flush_ticket = -1  # nothing outside a flush (or after a nested one) reuses it
        if outer:
            end_flush(bus)


def flush_round(bus: BusCore) -> None:
    """The flush at the end of a reactor round: like ``flush``, but the links are written
    when the reactor waits or lets the other tasks run (``write_pending``), so the rounds of
    a busy quantum share one write (and one BATCH frame) per link."""
    bus.deferring = True
    try:
        flush(bus)
    finally:
        bus.deferring = False


def end_flush(bus: BusCore) -> None:
    bus.flushing = False
    if not bus.deferring:
        write_pending(bus)


def write_pending(bus: BusCore) -> None:
    """Each link's frames queued since its last write: its batch encoded, then one write
    (``write_now``)."""
    dirty = bus.dirty
    if dirty:
        bus.dirty = []
        for link in dirty:
            try:
                if link.batch:
                    close_batch(bus, link)
                write_now(link)
            except Exception:  # the reactor calls this: one link's bug must not stop it
                bus.core_error(write_now)
        bus.shared_batch = []  # nor its bodies kept alive


def route(bus: BusCore, effect: ClusterEffect) -> None:
    """The one place a cluster effect goes where it belongs."""
    t = type(effect)
    if t is Send:
        assert isinstance(effect, Send)
        if effect.type in WAIT_FOR_LOG:
            ticket = bus.flush_ticket
            if ticket < 0 or not bus.flushing:
                ticket = bus.log_ticket()
                if bus.flushing:
                    bus.flush_ticket = ticket
            if ticket:
                waiting = bus.held.get(ticket)
                if waiting is not None:
                    waiting.append(effect)
                    return
                if bus.send_when_durable(ticket):
                    bus.held[ticket] = [effect]
                    return
        send(bus, bus.up.get(effect.node_id), effect.type, effect.body)
    elif t is Answer:
        assert isinstance(effect, Answer)
        send(bus, bus.links.get(effect.link), effect.type, effect.body)
    else:
        bus.route_other(effect)


def send(bus: BusCore, link: LinkCore | None, mtype: MessageType, body: dict[str, Any]) -> None:
    if link is None or link.closed:
        bus.counters["sends_dropped"] += 1
        return
    if bus.flushing and mtype in BATCHABLE and small(mtype, body):
        # Joined with the link's other messages of this type in the flush (one frame, one
        # header, one decode at the receiver), in order with the link's other frames.
        batch = link.batch
        if batch and (link.batch_type is not mtype or len(batch) >= BATCH_MAX):
            close_batch(bus, link)
        batch.append(body)
        link.batch_type = mtype
        if not link.dirty:
            link.dirty = True
            bus.dirty.append(link)
        return  # counted as sent by ``close_batch``, once for the batch
    if link.batch:
        close_batch(bus, link)
    encode_frame(bus, link, mtype, body)


def small(mtype: MessageType, body: dict[str, Any]) -> bool:
    """Whether a message may join a batch: a GOTJOB always, a REPLJOB unless its job holds a
    value as large as the wire sends from its own buffer (``BIG_VALUE``: a big job's body goes
    in a frame of its own, never copied)."""
    if mtype is not MessageType.REPLJOB:
        return True
    record = body.get("job")
    if not isinstance(record, list):
        return False
    for value in record:
        if isinstance(value, bytes) and len(value) >= BIG_VALUE // 4:
            return False
    return True


def close_batch(bus: BusCore, link: LinkCore) -> None:
    """Encode the link's pending messages, counted as sent here (once per batch, not per
    message): one alone as itself, several as a BATCH frame. The same bodies as the last
    batch encoded (the same objects, still held, so unchanged: the cores build each body once
    and send it to every replica) take its frame as it is."""
    batch = link.batch
    link.batch = []
    mtype = link.batch_type
    n = len(batch)
    bus.counters["frames_sent"] += n
    sent = bus.sent_by_type
    sent[mtype] = sent.get(mtype, 0) + n
    if mtype is bus.shared_type and same_bodies(batch, bus.shared_batch):
        if not enqueue(link, [bus.shared_frame]):
            bus.counters["sends_dropped"] += 1
        return
    if n == 1:  # ``small`` already: it joined a batch
        parts = encode_frame(bus, link, mtype, batch[0], counted=True, small=True)
    else:
        parts = encode_frame(bus, link, MessageType.BATCH, batch_body(mtype, batch),
                             counted=True)
    if len(parts) == 1:  # whole, its MAC included
        bus.shared_batch = batch
        bus.shared_type = mtype
        bus.shared_frame = parts[0]


def same_bodies(batch: list[dict[str, Any]], shared: list[dict[str, Any]]) -> bool:
    n = len(batch)
    if n != len(shared):
        return False
    for i in range(n):
        if batch[i] is not shared[i]:
            return False
    return True


def encode_frame(bus: BusCore, link: LinkCore, mtype: MessageType, body: dict[str, Any],
                 counted: bool = False, small: bool = False) -> list[bytes]:
    """One frame into the link's queue (``counted``: its messages were counted as sent;
    ``small``: its body holds no big value): its buffers, or none if it could not be sent."""
    secret = bus.secret
    try:
        parts = encode_parts(mtype, bus.node_id, body, secret, max_body(bus),
                             defer_mac=secret is not None, small=small)
    except Oversized as exc:
        # The cores cut their batches and ADDJOB refuses a body over job-max-body-len, so
        # this is a job kept from before the limit was lowered: never silently.
        bus.counters["sends_dropped"] += 1
        bus.counters["sends_oversized"] += 1
        bus.log_warning(f"oversized:{mtype.name}",
                        f"Cluster bus: not sending a {mtype.name} message to "
                        f"{link.peer_ip}: its {exc}, over what job-max-body-len allows")
        return []
    except (WireError, ValueError, TypeError) as exc:
        bus.counters["sends_dropped"] += 1
        bus.log_warning(f"encode:{mtype.name}",
                        f"Cluster bus: cannot encode a {mtype.name} message: {exc}")
        return []
    # A small frame comes whole, MAC included; a big one without it (see MacLater).
    if enqueue(link, parts, secret is not None and len(parts) > 1):
        if not counted:
            bus.counters["frames_sent"] += 1
            sent = bus.sent_by_type
            sent[mtype] = sent.get(mtype, 0) + 1
        return parts
    bus.counters["sends_dropped"] += 1
    return []


def enqueue(link: LinkCore, parts: list[bytes], mac_later: bool = False) -> bool:
    """Queue one frame's buffers (``cluster.wire.encode_parts``); ``mac_later``: its MAC is
    still to compute, by the writer. During a flush the link is written at its end
    (``write_now``); otherwise, or while the writer owns the queue, the writer is woken."""
    if link.closed:
        return False
    later = MacLater(parts) if mac_later else None
    if later is not None:
        size = later.size
    elif len(parts) == 1:
        size = len(parts[0])
    else:
        size = sum(len(p) for p in parts)
    bus = link.bus
    if (link.unsent + size > SEND_QUEUE_LIMIT
            and link.unsent + size > (limit := SEND_QUEUE_LIMIT + max_body(bus))):
        bus.counters["links_closed_slow"] += 1
        bus.log_warning(f"slow:{link.peer_ip}",
                        f"Cluster bus: closing link to {link.peer_ip}: more than "
                        f"{limit} bytes unsent (peer not reading)")
        link.close()
        return False
    if later is not None:
        link.queue.append(later)
    else:
        link.queue.extend(parts)
    link.unsent += size
    if link.writing or not (bus.flushing or link.dirty):
        link.wake_writer()
    elif not link.dirty:  # written at the end of the flush, with the others
        link.dirty = True
        bus.dirty.append(link)
    return True


def write_now(link: LinkCore) -> None:
    """Write what the flushes queued, small frames joined into one ``write``, from the
    calling task (a link's reader, the reactor, a timer): no hop to the writer task. What the socket does
    not take, and a big frame, is left to the writer task."""
    link.dirty = False
    queue = link.queue
    if link.closed or link.writing or not queue:
        return
    parts: list[bytes] = []
    for item in queue:
        if not isinstance(item, bytes) or len(item) >= COALESCE_BYTES:
            hand_over(link)
            return
        parts.append(item)
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    queue.clear()
    if link.tls is not None:
        write_tls(link, data)
        return
    try:
        sent = os.write(link.fd, data)
    except BlockingIOError:
        sent = 0
    except OSError:
        link.close()
        return
    link.unsent -= sent
    if sent < len(data):
        queue.append(data[sent:])
        hand_over(link)


def write_tls(link: LinkCore, data: bytes) -> None:
    """``write_now`` under TLS: ``data`` becomes records at once (so it leaves the queue's
    count), written as far as the socket takes them; the rest waits in the channel for the
    writer task, before anything newer."""
    tls = link.tls
    try:
        tls.encrypt(data)
        done = tls.write_pending(link.fd)
    except OSError:  # the peer is gone (ssl.SSLError is one too)
        link.close()
        return
    link.unsent -= len(data)
    if not done:
        hand_over(link)


def hand_over(link: LinkCore) -> None:
    """The writer task takes the queue until it has emptied it."""
    link.writing = True
    link.wake_writer()
