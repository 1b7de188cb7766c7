"""A node's client server on trio: the reactor, timers, the cluster bus, runtime intents.

Theory of operation
-------------------
The broker core decides; this module only moves bytes and time. Client connections are
served by one task, the reactor (``node/reactor.py``): it polls a level-triggered epoll that
holds the client sockets and gives each ready connection (``node/connection.py``) a turn -
one ``recv``, the complete commands executed against the broker with the round's ``now_ms``,
one ``send`` - with no task switch, a bounded number of turns and commands per round. After
each command the broker's effects (``broker/effects.py``) are routed in one place
(``Server.route``): log records go to the append log's open batch, replies to other clients
to the round's list. A round ends with the group commit (``Persistence.commit_now``: one
write, and under ``appendfsync always`` one fdatasync, in the reactor's task), then the
replies that waited for it are written, then those for the clients the round unblocked.
Whatever must wait - a full socket, a command only the runtime can finish (an intent from
``broker/intents.py``, carried out through ``INTENTS``), closing after QUIT - is done by a
task that takes the connection out of the reactor meanwhile and gives it back after. A
client blocked in GETJOB stays in the reactor, which reads its input (so a disconnect is
noticed and the broker forgets the waiter) and keeps its pipelined commands until it is
answered. The ticker task calls ``broker.tick`` at the broker's next deadline, at least ``hz``
times a second, and closes idle clients (``timeout``) about once a second.

The cluster: the node's ID and its peers come from ``cluster-config-file`` (``node/nodes_store``;
a missing file is a new node, written at once; a corrupt one stops the start). The membership
core (``cluster.membership.Membership``) is the broker's ``cluster`` view, and ``node/bus.py``
runs its links and timers. The job core (``cluster.jobs.JobCore``) is built right
after it, before the append log is replayed; the bus routes it the frames of its
``HANDLES``. Once every core is built, ``cluster.wiring.attach`` plugs them into the broker
(its ``cluster`` view, ``replication``, ``federation``, the policy and timer tables' hooks),
in one call, before the log is replayed. After every event - a bus frame, a tick, a reactor
round's client commands (each command's broker effects are routed as it runs, the bus is
flushed once at the end of the round) - the broker's effects are routed before the cluster
cores' (``Bus.flush`` calls
``Server.flush_broker`` first): a replica's log record reaches the log before its GOTJOB
is sent, and the bus holds a GOTJOB until the log says it is durable. The federation core
(``cluster.federation.FederationCore``) is built next to the job core; its effects follow
the job core's after every event (client commands included: GETJOB and ADDJOB emit
NEEDJOBS), the bus holds a YOURJOBS like a GOTJOB (the ``del`` of an at-most-once job that
left must be durable first), and a ``CoreAlarm`` ticks it at its ``next_deadline()``,
re-read after every flush. The periodic timer core (``cluster.periodic_sync.PeriodicSync``)
comes last: it holds the timer table's replication and fires each due time this node owns,
from its own ``CoreAlarm`` (exactly at the due time) and the bus's 100 ms tick (hand-overs,
take-overs).

A synchronous ADDJOB (``REPLICATE`` > 1) returns ``BLOCKED`` like a GETJOB with nothing to
deliver: the connection stops executing its pipeline (a BLOCKED ``ConnState``) until the
``Reply`` effect that answers it (GOTJOBs reached the level, or ``-NOREPL``) is dispatched.
Every ``Reply`` routed outside the client's own batch (a bus frame, a tick, another client's
command) is written only once the log records emitted before it are durable, ``-ERR`` with
the error if that write failed (``Server.dispatch``).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import inspect
import logging
import os
import random
import resource
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, cast

import trio

from broker.clients import Client
from broker.command_table import ROWS
from broker.config import Config
from broker.core import VERSION, Broker
from broker.effects import Effect, Reply
from broker.intents import (
    AclLoad,
    AclSave,
    ConfigApplied,
    Intent,
    KillClients,
    Monitor,
    PauseClients,
    Quit,
    ResetStats,
    RewriteConfig,
    RewriteLog,
    Shutdown,
)
from broker.protected import is_loopback
from cluster.dedup_sync import DedupSync
from cluster.federation import FederationCore
from cluster.jobs import JobCore
from cluster.membership import Membership
from cluster.periodic_sync import PeriodicSync
from cluster.policy_sync import PolicySync
from cluster.results import ResultCore
from cluster.user_sync import UserSync
from cluster.wiring import attach
from node import acl_file, bus_core, client_info, config_file, conn_core, memory_use, nodes_store
from node.bus import BUS_PORT_OFFSET, Bus, LogLimiter
from node.clock import Clock, WallClock
from node.conn_core import (
    BrokerOutlet,
    CommandPath,
    NodeCounters,
    dispatch_replies,
    transition,
)
from node.conn_state import CLOSED, CLOSING_HELD, is_blocked
from node.connection import MUST_WAIT, Connection, set_keepalive
from node.log_core import waiting_ticket
from node.nodes_store import NodesFileWriter, NodesStoreError
from node.persistence import Persistence, PersistenceError
from node.reactor import Reactor
from node.tls import TlsConfigError, TlsFront, bus_contexts, http_context
from protocol import core_build, errors
from protocol.resp import OK, Status

log = logging.getLogger("trisque")

# How often the ticker looks for idle clients (``timeout``), as Disque's clientsCron.
IDLE_CHECK_S = 1.0


#: What serves the HTTP API (``node.http_front.serve``: started with the node's task status,
#: given the server) when ``http-port`` is set. The caller passes it in (cli/server.py):
#: node/http_front.py and http_api.py type the server it serves as ``Server``, so this module does not import
#: it (tests/test_layering.py refuses the cycle, typing imports included).
HttpService = Callable[..., Awaitable[None]]


class ServerError(Exception):
    """A start-up problem worth one clear line (bad directive, port in use, ...)."""


_REPR_ESCAPES = {0x5C: b"\\\\", 0x22: b'\\"', 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t",
                 0x07: b"\\a", 0x08: b"\\b"}


def _repr_arg(arg: bytes) -> bytes:
    """An argument quoted as Redis's sdscatrepr does (MONITOR's format)."""
    out = bytearray(b'"')
    for c in arg:
        escape = _REPR_ESCAPES.get(c)
        if escape is not None:
            out += escape
        elif 0x20 <= c < 0x7F:
            out.append(c)
        else:
            out += b"\\x%02x" % c
    out += b'"'
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# The node


class Server:
    def __init__(self, config: Config, clock: Clock | None = None,
                 http: HttpService | None = None) -> None:
        self.config = config
        self.http = http
        # commands, stats_in, stats_out and stopping live here (properties below), where the
        # compiled hot path counts them without a dict lookup per request.
        self.counters = NodeCounters()
        self.clock: Clock = clock or WallClock()
        now_ms = self.clock.now_ms()
        # The node's identity and its peers: nodes.conf, or a new node if there is none.
        nodes_path = os.path.join(config.dir, config.cluster_config_file)
        try:
            saved = nodes_store.load(nodes_path)
        except NodesStoreError as exc:
            raise ServerError(str(exc)) from None
        self.node_id = saved.myself_id if saved is not None else os.urandom(20).hex()
        self.broker = Broker(config, self.node_id, os.urandom(20), now_ms=now_ms)
        self.aclfile = ""
        if config.aclfile:  # the users survive a restart in the aclfile (node/acl_file.py)
            self.aclfile = acl_file.path_of(config.dir, config.aclfile)
            try:
                self.broker.acl.replace_all(acl_file.read(self.aclfile), None)
            except acl_file.AclFileError as exc:
                raise ServerError(str(exc)) from None
            acl_file.keep_saved(self.aclfile, self.broker.acl)
        self.cluster = Membership(config, self.node_id, random.Random(os.urandom(16)), now_ms,
                                  saved)
        if self.cluster.leaving:  # CLUSTER LEAVING yes survives a restart, as in Disque
            self.broker.set_leaving(True)
        self.nodes_file = NodesFileWriter(nodes_path)
        # Before the bus: its first flush routes whatever the broker emitted so far.
        self.persistence = Persistence(config, self.broker, log,
                                       clock=lambda: self.clock.now_ms() / 1000)
        # The one place the broker's effects go where they belong: log records to the append
        # log's open batch (dropped there when it is off), replies to other clients into
        # ``replies`` for the caller to dispatch; the log ticket to wait for, or 0. The
        # compiled log core's own (node/log_core.py): an interpreted method in between cost
        # about 1 us per command that logs.
        self.route: Callable[[list[Effect], list[Reply]], int] = self.persistence.route
        # Replies waiting for the log, in order, and whether the task that writes them runs.
        self.durable_replies: deque[tuple[list[Reply], int]] = deque()
        self.dispatching = False
        # The broker's effects from outside a client's command (a bus frame, a tick): routed
        # and dispatched by compiled code, called directly by the bus's and the reactor's
        # flushes (node/conn_core.py).
        self.outlet = BrokerOutlet(self.broker, self.persistence, self.clock.monotonic,
                                   self.durable_replies, self._dispatch_later)
        broker_flush = functools.partial(conn_core.flush_broker, self.outlet)
        try:  # a certificate that cannot be used stops the start, named
            bus_tls = bus_contexts(config) if config.tls_cluster else None
            # http-tls: the HTTPS API's (node/http_front.py), replaced by a reload.
            self.http_tls = (http_context(config) if config.http_tls and config.http_port
                             else None)
        except TlsConfigError as exc:
            raise ServerError(f"Failed to configure TLS: {exc}") from None
        self.bus = Bus(self.cluster, config, self.clock, self.node_id,
                       save_nodes=self.nodes_file.submit, new_node_id=self._new_node_id,
                       before_flush=broker_flush,
                       log_ticket=functools.partial(waiting_ticket, self.persistence),
                       wait_durable=self.durable,
                       tls=bus_tls)
        # The broker's warnings (an ADDJOB body over job-max-body-len), rate-limited per key.
        self._warnings = LogLimiter(log, self.clock)
        self.broker.warn = self._warn
        # Replicated jobs: built (and attached below) before the log is replayed (run() loads
        # it), since replay keeps acked cluster jobs only when broker.replication is set.
        # Job outcomes (WAITJOB, RESOLVE) learned from and told to other nodes; its effects
        # are taken before the job core's, so RESOLVE's RESULT leaves before its SETACKs.
        self.result_core = ResultCore(self.broker, self.cluster)
        self.bus.add_core(self.result_core)
        self.job_core = JobCore(self.broker, self.cluster, random.Random(os.urandom(16)))
        self.bus.add_core(self.job_core)
        # Federation: NEEDJOBS/YOURJOBS; ticked at its own next deadline
        # (a CoreAlarm), which any command or frame may move (a GETJOB blocking).
        self.federation = FederationCore(self.broker, self.cluster)
        self.bus.add_core(self.federation)
        # Queue policies, replicated to every node (cluster/policy_sync.py).
        self.policy_sync = PolicySync(self.broker, self.cluster, random.Random(os.urandom(16)),
                                      now_ms)
        self.bus.add_core(self.policy_sync)
        # Periodic timers: the table replicated, and the due times this node owns
        # fired at their time (a CoreAlarm) or at the bus tick after a take-over.
        self.periodic_sync = PeriodicSync(self.broker, self.cluster,
                                          random.Random(os.urandom(16)), now_ms)
        self.bus.add_core(self.periodic_sync)
        # ACL users, replicated to every node (cluster/user_sync.py).
        self.user_sync = UserSync(self.broker, self.cluster, random.Random(os.urandom(16)),
                                  now_ms)
        self.bus.add_core(self.user_sync)
        # The deduplication index of every node (DEDUP queues), replicated.
        self.dedup_sync = DedupSync(self.broker, self.cluster, random.Random(os.urandom(16)),
                                    now_ms)
        self.bus.add_core(self.dedup_sync)
        attach(self.broker, membership=self.cluster, jobs=self.job_core,
               federation=self.federation, policies=self.policy_sync, timers=self.periodic_sync,
               results=self.result_core, dedup=self.dedup_sync, users=self.user_sync)
        self.core_alarms = [CoreAlarm(self, self.federation), CoreAlarm(self, self.periodic_sync)]
        self.bus.after_flush = functools.partial(
            bus_core.deadlines_moved, cast(list[bus_core.AlarmCore], self.core_alarms))
        self.bus.flush()  # the table's first SaveNodes, and a Connect per known node
        if saved is None:
            try:
                self.nodes_file.write_now()  # a new node's ID is durable before it is used
            except OSError as exc:
                raise ServerError(f"Can't write the cluster config file {nodes_path}: "
                                  f"{exc.strerror}") from None
        self.connections: set[Connection] = set()
        # Serves every client connection (node/reactor.py); the round's group commit writes
        # the log, the replies for other clients go through dispatch.
        self.reactor = Reactor(self.clock, self.persistence, broker_flush,
                               functools.partial(conn_core.dispatch, self.outlet),
                               self.wait_durable,
                               flush_bus=functools.partial(bus_core.flush_round, self.bus))
        # The frames the rounds send are written when the reactor waits or yields (one write
        # per link for the rounds of a quantum).
        self.reactor.write_bus = functools.partial(bus_core.write_pending, self.bus)
        self.bus.reactor = self.reactor  # its loop reads the bus's plain links
        self.nursery: trio.Nursery  # run() sets it; connections start their tasks there
        self.next_client_id = 0
        self.start_time = time.time()
        self.run_id = os.urandom(20).hex()  # new at every start, as Redis's run_id
        self.build_id = hashlib.sha1(f"trisque {VERSION} {sys.version}".encode()).hexdigest()[:15]
        self.connections_received = 0
        self.rejected = 0
        # Open HTTP API connections (node/http_front.py): they hold descriptors too, so they
        # count against maxclients with the RESP clients.
        self.http_connections = 0
        self._ops_sample = (self.clock.monotonic(), 0)
        self.ops_per_sec = 0
        self.memory = memory_use.MemoryReport()  # before any data: the startup footprint
        self.shutdown_event = trio.Event()
        self.shutdown_rewrite = False
        self.listening: list[tuple[str, int]] = []
        self._accept_error_logged = 0.0
        # The client port's TLS (node/tls.py), made at start when tls-port is set.
        self.tls: TlsFront | None = None
        self._idle_checked = self.clock.monotonic()
        # INFO commandstats: [calls, nanoseconds] per command the node knows.
        self.cmdstats: dict[bytes, list[int]] = {row.name: [0, 0] for row in ROWS}
        self.monitors: set[Connection] = set()
        # Every client command runs through it: RESP connections, the HTTP API, the dashboard.
        self.command_path = CommandPath(self)
        self._install_info()

    def _warn(self, key: str, text: str) -> None:
        self._warnings.emit(key, logging.WARNING, text)

    # The counters the hot path keeps in NodeCounters, under the names INFO, /metrics and the
    # tests read them by. ``stopping``: set when the node starts shutting down; no command
    # runs after it, so the final snapshot is the state the clients were last told about.
    @property
    def commands(self) -> int:
        return self.counters.commands

    @commands.setter
    def commands(self, value: int) -> None:
        self.counters.commands = value

    @property
    def stats_in(self) -> int:
        return self.counters.stats_in

    @property
    def stats_out(self) -> int:
        return self.counters.stats_out

    @property
    def stopping(self) -> bool:
        return self.counters.stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self.counters.stopping = value

    def _new_node_id(self, node_id: str) -> None:
        """CLUSTER RESET HARD gave this node a new ID: new jobs carry it."""
        log.warning("Cluster: this node's ID is now %s", node_id)
        self.node_id = node_id
        self.broker.set_node_id(node_id, os.urandom(20))

    # -- durability and replies -----------------------------------------------------------

    async def wait_durable(self, tickets: set[int]) -> dict[int, str]:
        """Wait for each log batch; the error text of those whose write failed."""
        failures: dict[int, str] = {}
        for ticket in sorted(tickets):
            try:
                await self.persistence.wait_durable(ticket)
            except PersistenceError as exc:
                failures[ticket] = str(exc)
        return failures

    def dispatch_now(self, replies: list[Reply]) -> None:
        """Write replies to clients that were blocked (an HTTP request's stand-in included)."""
        dispatch_replies(replies, self.clock.monotonic)

    def sample_memory(self) -> None:
        """What the runtime holds, for ``used_memory`` (node/memory_use.py)."""
        b = self.broker
        b.runtime_bytes = (memory_use.client_bytes(self.connections)
                           + memory_use.log_bytes(self.persistence))
        self.memory.note(b.used_memory)

    def flush_broker(self) -> None:
        """Route the broker's effects left by an event that was not a client's own batch (a
        bus frame, a tick, before a flush): records to the log now, replies once durable
        (``conn_core.flush_broker``)."""
        conn_core.flush_broker(self.outlet)

    def dispatch(self, replies: list[Reply], ticket: int) -> None:
        """Write ``replies`` to their clients once the log records emitted before them are
        durable, after every reply dispatched before them (``conn_core.dispatch``)."""
        conn_core.dispatch(self.outlet, replies, ticket)

    def _dispatch_later(self, replies: list[Reply], ticket: int) -> None:
        """Queue ``replies`` behind those waiting for the log (``conn_core.dispatch``)."""
        self.durable_replies.append((replies, ticket))
        if not self.dispatching:
            self.dispatching = True
            self.nursery.start_soon(self._dispatch_when_durable)

    async def _dispatch_when_durable(self) -> None:
        """One task writes the queued replies in order, each batch once its log batch is
        durable (batches finish in ticket order, so waiting for each in turn costs nothing):
        tasks of their own could wake in any order."""
        queue = self.durable_replies
        try:
            while queue:
                replies, ticket = queue[0]
                failures = await self.wait_durable({ticket}) if ticket else {}
                queue.popleft()
                if ticket in failures:
                    replies = [Reply(client, errors.err(failures[ticket]))
                               for client, _ in replies]
                self.dispatch_now(replies)
        finally:
            self.dispatching = False

    async def durable(self, ticket: int) -> bool:
        return not await self.wait_durable({ticket})

    # -- intents: commands only the runtime can finish ------------------------------------

    def carry_out_now(self, conn: Connection, intent: Intent) -> Any:
        """The reply to a command whose checks the broker made and whose work is ours, done
        at once (``INTENTS``); ``MUST_WAIT`` for those that wait (``carry_out``)."""
        kind = type(intent)
        if kind in AWAITED:
            return MUST_WAIT
        return INTENTS[kind](self, conn, intent)

    async def carry_out(self, conn: Connection, intent: Intent) -> Any:
        """The reply to an intent that waits (in the connection's own task)."""
        kind = type(intent)
        if kind in AWAITED:
            return await INTENTS[kind](self, conn, intent)
        return INTENTS[kind](self, conn, intent)

    async def config_applied(self, intent: ConfigApplied) -> Any:
        if intent.name.startswith("tls-"):
            return self.tls_changed(intent)
        if intent.name == "maxclients" and not fit_open_files_limit(self.config.maxclients):
            # Redis's answer when the kernel cannot give the descriptors the value needs.
            wanted, self.config.maxclients = self.config.maxclients, int(intent.previous)  # type: ignore[call-overload]
            return errors.err("The operating system is not able to handle the specified "
                              f"number of clients, try with {max_clients_for_limit()} "
                              f"(asked for {wanted})")
        error = await self.persistence.config_changed(intent.name)
        return errors.err(error) if error is not None else OK

    def pause_clients(self, until_ms: int) -> None:
        """Disque's pauseClients: a pause ends at the latest time asked while it lasts."""
        counters = self.counters
        if until_ms <= counters.paused_until and counters.paused_until > self.clock.now_ms():
            return
        counters.paused_until = until_ms
        self.nursery.start_soon(self._resume_clients, until_ms)

    async def _resume_clients(self, until_ms: int) -> None:
        """When the pause is over, the commands that arrived meanwhile run."""
        while (wait := self.counters.paused_until - self.clock.now_ms()) > 0:
            await trio.sleep(wait / 1000)
        if self.counters.paused_until != until_ms:
            return  # extended: the later task resumes them
        # In the order the clients connected, as Disque's client list.
        for conn in sorted(self.connections, key=lambda c: c.client.id):
            if conn.has_input() and not is_blocked(conn.state):
                self.reactor.schedule(conn)

    def kill(self, conn: Connection, kill: KillClients) -> Any:
        victims = [c for c in self.connections
                   if kill.normal_only
                   and (kill.addr is None or c.client.addr == kill.addr)
                   and (kill.client_id is None or c.client.id == kill.client_id)
                   and not (kill.skip_me and c is conn)]
        for victim in victims:
            log.info("Client id=%d addr=%s killed by CLIENT KILL from id=%d",
                     victim.client.id, victim.client.addr, conn.client.id)
            if victim is conn:
                transition(conn, CLOSING_HELD)  # its own connection: closed after the reply
            else:
                victim.close()
        if kill.old_form:
            return OK if victims else errors.NO_SUCH_CLIENT
        return len(victims)

    def feed_monitors(self, client: Client, argv: list[bytes]) -> None:
        """Redis's MONITOR line for a command about to run. AUTH, HELLO and ACL are not shown:
        they may carry a password (ACL SETUSER >password)."""
        name = argv[0].lower()
        if name in (b"auth", b"hello", b"acl"):
            return
        now = self.clock.now_ms() / 1000
        line = (f"+{now:.6f} [0 {client.addr}] ".encode()
                + b" ".join(_repr_arg(a) for a in argv) + b"\r\n")
        for monitor in list(self.monitors):
            if monitor.state is CLOSED:
                self.monitors.discard(monitor)
            elif monitor.client is not client:
                monitor.send_nowait(line)

    # -- INFO -------------------------------------------------------------------------------

    def _install_info(self) -> None:
        b = self.broker
        b.info_sources["server"] = self._info_server
        b.info_sources["clients"] = lambda: [
            ("connected_clients", len(self.connections)),
            ("client_longest_output_list", 0),
            ("client_biggest_input_buf", max((c.parser.buffered for c in self.connections), default=0)),
            ("blocked_clients", b.blocked_clients),
        ]
        b.info_sources["memory"] = self._info_memory
        b.info_sources["persistence"] = lambda: list(self.persistence.info())
        b.info_sources["stats"] = lambda: [
            ("total_connections_received", self.connections_received),
            ("total_commands_processed", self.commands),
            ("instantaneous_ops_per_sec", self.ops_per_sec),
            ("total_net_input_bytes", self.stats_in),
            ("total_net_output_bytes", self.stats_out),
            ("instantaneous_input_kbps", "0.00"),
            ("instantaneous_output_kbps", "0.00"),
            ("rejected_connections", self.rejected),
            ("latest_fork_usec", 0),
            # trisque's own: exceptions a cluster core raised on a frame or an event, which
            # the bus caught and logged; anything but 0 is a bug (tests fail on it).
            ("cluster_unexpected_errors", self.bus.counters["core_errors"]),
        ]
        b.info_sources["cpu"] = self._info_cpu
        # Not Disque's (INFO all or INFO allocations only): what a leak would grow, counted
        # exactly where RSS only moves by pages (tests/memory/ reads it).
        b.info_sources["allocations"] = lambda: [
            ("allocated_blocks", sys.getallocatedblocks()),
            ("registered_jobs", len(b.jobs)),
            ("timer_entries", len(b.timers)),
        ]
        b.info_sources["commandstats"] = lambda: [
            (f"cmdstat_{name.decode()}",
             f"calls={calls},usec={ns // 1000},usec_per_call={ns / 1000 / calls:.2f}")
            for name, (calls, ns) in sorted(self.cmdstats.items()) if calls
        ]
        b.info_sources["__client_list__"] = lambda: [
            ("", client_info.line(c, self.clock.now_ms(), self.clock.monotonic(), c in self.monitors))
            for c in sorted(self.connections, key=lambda c: c.client.id)
        ]

    def _info_server(self) -> list[tuple[str, Any]]:
        """Disque's fields in Disque's order (tools parse them), then trisque's own."""
        uptime = int(time.time() - self.start_time)
        uname = os.uname()
        return [
            ("disque_version", VERSION), ("disque_git_sha1", "00000000"),
            ("disque_git_dirty", 0), ("disque_build_id", self.build_id),
            ("os", f"{uname.sysname} {uname.release} {uname.machine}"),
            ("arch_bits", 64), ("multiplexing_api", "epoll"),
            ("gcc_version", "0.0.0"),  # not a C build; see python_version
            ("process_id", os.getpid()), ("run_id", self.run_id),
            ("tcp_port", self.config.port), ("uptime_in_seconds", uptime),
            ("uptime_in_days", uptime // 86400), ("hz", self.config.hz),
            ("executable", os.path.abspath(sys.argv[0])),
            ("config_file", self.config.config_file or ""),
            ("trisque_version", VERSION), ("python_version", sys.version.split()[0]),
            ("node_id", self.node_id),
            ("trisque_core", core_build.kind()),  # compiled | pure (protocol/core_build.py)
        ]

    def _info_memory(self) -> list[tuple[str, Any]]:
        self.sample_memory()
        return self.memory.fields(self.broker.used_memory, self.config.maxmemory)

    def _info_cpu(self) -> list[tuple[str, Any]]:
        t = os.times()
        return [("used_cpu_sys", f"{t.system:.2f}"), ("used_cpu_user", f"{t.user:.2f}"),
                ("used_cpu_sys_children", f"{t.children_system:.2f}"),
                ("used_cpu_user_children", f"{t.children_user:.2f}")]

    # -- tasks ------------------------------------------------------------------------------

    async def accept(self, listener: socket.socket, tls: bool = False) -> None:
        while True:
            await self.reactor.room_for_new()
            try:
                sock, peer = listener.accept()
            except BlockingIOError:
                await trio.lowlevel.wait_readable(listener)
                continue
            except OSError as exc:
                # Out of file descriptors and the like: back off and keep serving; say so once
                # per episode, not ten times a second.
                now = self.clock.monotonic()
                if now - self._accept_error_logged > 10:
                    self._accept_error_logged = now
                    log.warning("Accepting client connection: %s (maxclients %d, open files "
                                "limit %d)", exc.strerror, self.config.maxclients,
                                open_files_limit())
                await trio.sleep(0.1)
                continue
            self.adopt(sock, peer, tls)

    def adopt(self, sock: socket.socket, peer: Any, tls: bool = False) -> None:
        """A new client: refused past ``maxclients``, else handed to the reactor (through a
        TLS layer when it came to ``tls-port``)."""
        self.connections_received += 1
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if len(self.connections) + self.http_connections >= self.config.maxclients:
            self._refuse(sock, b"-ERR max number of clients reached\r\n", tls)
            return
        if (self.config.protected_mode and isinstance(peer, tuple)
                and not is_loopback(peer[0]) and not self.broker.acl.has_password()):
            self._refuse(sock, b"-" + errors.DENIED.encode() + b"\r\n", tls)
            return
        if self.config.tcp_keepalive:
            set_keepalive(sock, self.config.tcp_keepalive)
        self.next_client_id += 1
        host = peer[0] if isinstance(peer, tuple) else str(peer)
        if host.startswith("::ffff:"):  # an IPv4 client of the dual-stack listener
            host = host[7:]
        addr = f"{host}:{peer[1]}" if isinstance(peer, tuple) else host
        client = Client(self.next_client_id, addr, self.clock.now_ms(), None,
                        self.broker.acl.default)
        if tls and self.tls is not None:
            stream = self.tls.wrap(sock, addr)
            conn = Connection(self, stream, client)
            self.tls.started(stream, conn)
        else:
            conn = Connection(self, sock, client)
        client.handle = conn
        self.connections.add(conn)
        self.reactor.add(conn)

    def _refuse(self, sock: socket.socket, line: bytes, tls: bool) -> None:
        """Close a client that may not be served, saying why in plaintext (a TLS client gets
        no plaintext: it is closed before its handshake)."""
        self.rejected += 1
        if not tls:
            try:
                sock.send(line)
            except OSError:
                pass
        sock.close()

    async def ticker(self) -> None:
        broker = self.broker
        interval = 1000 // max(1, self.config.hz)
        while True:
            now = self.clock.now_ms()
            deadline = broker.next_deadline()
            wait = interval if deadline is None else max(0, min(deadline - now, interval))
            await trio.sleep(wait / 1000)
            now = self.clock.now_ms()
            self._sample(now)
            mono = self.clock.monotonic()
            if mono - self._idle_checked >= IDLE_CHECK_S:
                self._idle_checked = mono
                self.reactor.close_idle(self.config.timeout)
                if self.tls is not None:
                    self.tls.sweep()
            broker.tick(now)
            # Requeues and expiries hand their records to the log and move on (a slow disk
            # never delays timers); a reply they make (a GETJOB served by a requeue, a NOREPL)
            # waits for its records; WILLQUEUE, QUEUED, SETACK... go out after them.
            self.bus.flush()

    def _sample(self, now: int) -> None:
        t, n = self._ops_sample
        mono = self.clock.monotonic()
        if mono - t >= 1.0:
            self.ops_per_sec = int((self.commands - n) / (mono - t))
            self._ops_sample = (mono, self.commands)
            self.sample_memory()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self._start(task_status)
        finally:
            self.reactor.close_all()  # its epoll and the clients left (in-process runs)

    async def _start(self, task_status: Any) -> None:
        cfg = self.config
        if cfg.http_port and self.http is None:
            raise ServerError("http-port is set, but this node was built without the HTTP API "
                              "(Server's http argument)")
        self._start_tls()
        self.persistence.load(self.clock.now_ms())
        # Every job is an object the cyclic garbage collector tracks, and jobs never form
        # cycles. With the default thresholds a node holding a million jobs stops for a full
        # collection every few seconds (100-200 ms measured); collecting young objects less
        # often and moving what was loaded out of the collector's sight removes most of that.
        gc.set_threshold(50_000, 20, 100)
        gc.freeze()
        listeners = open_listeners(cfg) if cfg.port else []
        tls_listeners: list[socket.socket] = []
        try:
            if cfg.tls_port:
                tls_listeners = open_listeners(cfg, cfg.tls_port)
            try:
                bus_listeners = open_listeners(cfg, cfg.client_port + BUS_PORT_OFFSET)
            except ServerError as exc:
                raise ServerError(f"{exc} (the cluster bus port)") from None
        except ServerError:
            for ls in listeners + tls_listeners:
                ls.close()
            raise
        self.listening = [ls.getsockname()[:2] for ls in listeners + tls_listeners]
        await self._serve(listeners, tls_listeners, bus_listeners, task_status)

    def _start_tls(self) -> None:
        """The client port's TLS context, before anything else starts: a missing file or a
        key that does not match its certificate stops the node with the file's name."""
        cfg = self.config
        if not (cfg.port or cfg.tls_port):
            raise ServerError("port 0 needs tls-port: the node would listen for no client")
        if cfg.tls_port == cfg.port:
            raise ServerError(f"port and tls-port are both {cfg.port}")
        if cfg.tls_port:
            try:
                self.tls = TlsFront(cfg, self.clock, self._warnings)
            except TlsConfigError as exc:
                raise ServerError(f"Failed to configure TLS: {exc}") from None

    def tls_changed(self, intent: ConfigApplied) -> Any:
        """CONFIG SET of a tls-* directive: new contexts for what uses TLS (the client port,
        the bus, HTTPS) for their new connections and links, those already open going on
        with theirs; or, if any cannot be built, the error and the old value and contexts."""
        try:
            client = self.tls.build() if self.tls is not None else None
            bus = bus_contexts(self.config) if self.bus.tls is not None else None
            http = http_context(self.config) if self.http_tls is not None else None
        except TlsConfigError as exc:
            setattr(self.config, intent.name.replace("-", "_"), intent.previous)
            log.warning("Unable to update TLS configuration: %s", exc)
            return errors.err(f"Unable to update TLS configuration: {exc}")
        if self.tls is not None and client is not None:
            self.tls.context = client
        if bus is not None:
            self.bus.tls = bus
        if http is not None:
            self.http_tls = http
        if client is not None or bus is not None or http is not None:
            log.info("TLS configuration reloaded (CONFIG SET %s): new connections and links "
                     "use it", intent.name)
        return OK

    async def _serve(self, listeners: list[socket.socket], tls_listeners: list[socket.socket],
                     bus_listeners: list[socket.socket], task_status: Any) -> None:
        cfg = self.config
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            await nursery.start(self.persistence.run)
            await nursery.start(self.reactor.run)
            await nursery.start(self.nodes_file.run)
            await nursery.start(self.bus.run, bus_listeners)
            nursery.start_soon(self.ticker)
            for core_alarm in self.core_alarms:
                nursery.start_soon(core_alarm.run)
            if cfg.http_port and self.http is not None:  # the HTTP API, off by default
                try:
                    await nursery.start(self.http, self)
                except OSError as exc:
                    raise ServerError(f"Can't listen for HTTP on port {cfg.http_port}: "
                                      f"{exc.strerror or exc}") from None
            for listener in listeners:
                nursery.start_soon(self.accept, listener)
            for listener in tls_listeners:
                nursery.start_soon(self.accept, listener, True)
            nursery.start_soon(self._signals)
            log.info("trisque %s node %s ready to accept connections on %s, data in %s",
                     VERSION, self.node_id,
                     ", ".join(f"{h}:{p}" for h, p in self.listening), os.path.abspath(cfg.dir))
            task_status.started(self)
            await self.shutdown_event.wait()
            await self._finish()
            nursery.cancel_scope.cancel()

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.warning("Received %s scheduling shutdown...", signal.Signals(signum).name)
                cfg = self.config
                self.shutdown_rewrite = bool(cfg.appendonly and cfg.aof_rewrite_on_shutdown)
                self.shutdown_event.set()
                return

    async def _finish(self) -> None:
        self.stopping = True
        self.bus.stop()
        self.cluster.save()  # the table as it is now (link states included), as Disque does
        self.bus.flush()
        try:
            # No timeout: a write in a worker thread cannot be interrupted anyway.
            await self.nodes_file.flush()
        except OSError as exc:
            log.error("Error while saving the cluster config file: %s", exc)
        try:
            with trio.fail_after(60):
                await self.persistence.shutdown(self.shutdown_rewrite)
        except Exception as exc:
            log.error("Error while closing the append log: %s", exc)
        log.warning("trisque is now ready to exit, bye bye...")


class CoreAlarm(bus_core.AlarmCore):
    """Ticks one cluster core exactly at its ``next_deadline()``: the federation core (its ad
    hoc NEEDJOBS backs off from 25 ms: the bus's 100 ms tick alone would make it late) and
    the periodic timer core (a due time fires at its millisecond, not up to 100 ms after).
    Any event may move the deadline earlier (a GETJOB blocking, a TIMER ADD): every flush
    checks (``bus_core.deadlines_moved``, one comparison per alarm) and sets ``wake``."""

    def __init__(self, server: Server, core: Any) -> None:
        super().__init__(core, trio.Event())
        self.server = server

    async def run(self) -> None:
        core: Any = self.core
        clock = self.server.clock
        while True:
            self.wake = trio.Event()
            due = self.armed = core.next_deadline()
            if due is None:
                await self.wake.wait()
            else:
                wait = (due - clock.now_ms()) / 1000
                if wait > 0:
                    with trio.move_on_after(wait):
                        await self.wake.wait()
            self.armed = None
            now = clock.now_ms()
            due = core.next_deadline()
            if due is not None and due <= now:
                self.server.bus.event(core.tick, now)


# ---------------------------------------------------------------------------------------------
# Helpers


# -- intents: how the node carries out each one (broker/intents.py) ---------------------------
# One function per intent type, ``(server, connection, intent) -> reply``; an ``async`` one
# waits, in the connection's own task (``Server.carry_out``).


def _quit(server: Server, conn: Connection, intent: Quit) -> Any:
    return OK  # the connection closes once it is written


def _rewrite_log(server: Server, conn: Connection, intent: RewriteLog) -> Any:
    try:
        return Status(server.persistence.start_rewrite())
    except Exception as exc:  # noqa: BLE001 - PersistenceError and friends: the text
        return errors.err(str(exc))


def _rewrite_config(server: Server, conn: Connection, intent: RewriteConfig) -> Any:
    error = config_file.rewrite(server.config)
    return errors.err(error) if error else OK


def _reset_stats(server: Server, conn: Connection, intent: ResetStats) -> Any:
    for stat in server.cmdstats.values():
        stat[0] = stat[1] = 0
    return OK


def _monitor(server: Server, conn: Connection, intent: Monitor) -> Any:
    server.monitors.add(conn)
    return OK


def _kill_clients(server: Server, conn: Connection, intent: KillClients) -> Any:
    return server.kill(conn, intent)


def _pause_clients(server: Server, conn: Connection, intent: PauseClients) -> Any:
    server.pause_clients(intent.until_ms)
    return OK


async def _shutdown(server: Server, conn: Connection, intent: Shutdown) -> Any:
    server.shutdown_rewrite = intent.rewrite
    log.warning("User requested shutdown...")
    server.shutdown_event.set()
    await trio.sleep_forever()  # the nursery is cancelled; no reply, as in Disque


async def _config_applied(server: Server, conn: Connection, intent: ConfigApplied) -> Any:
    return await server.config_applied(intent)


def _acl_save(server: Server, conn: Connection, intent: AclSave) -> Any:
    try:
        acl_file.write(server.aclfile, server.broker.acl)
    except acl_file.AclFileError as exc:
        return errors.err(str(exc))
    return OK


def _acl_load(server: Server, conn: Connection, intent: AclLoad) -> Any:
    try:
        users = acl_file.read(server.aclfile)
    except acl_file.AclFileError as exc:
        return errors.err(str(exc))
    server.broker.acl.replace_all(users, server.clock.now_ms())
    return OK


INTENTS: dict[type[Intent], Callable[[Server, Connection, Any], Any]] = {
    AclSave: _acl_save,
    AclLoad: _acl_load,
    Quit: _quit,
    RewriteLog: _rewrite_log,
    RewriteConfig: _rewrite_config,
    ResetStats: _reset_stats,
    Monitor: _monitor,
    KillClients: _kill_clients,
    PauseClients: _pause_clients,
    Shutdown: _shutdown,
    ConfigApplied: _config_applied,
}
AWAITED: frozenset[type[Intent]] = frozenset(
    kind for kind, run in INTENTS.items() if inspect.iscoroutinefunction(run))


def open_listeners(cfg: Config, port: int | None = None) -> list[socket.socket]:
    """Listening sockets for ``bind`` (all interfaces when empty), non-blocking, on ``port``
    (the client port unless given: the cluster bus listens on the same addresses)."""
    port = cfg.port if port is None else port
    listeners = []
    addresses: list[tuple[str, int]] = []
    if cfg.bind:
        addresses = [(host, port) for host in cfg.bind.split()]
    try:
        if not addresses:
            if socket.has_dualstack_ipv6():
                listeners.append(socket.create_server(("", port), family=socket.AF_INET6,
                                                      backlog=cfg.tcp_backlog, dualstack_ipv6=True))
            else:
                listeners.append(socket.create_server(("", port), backlog=cfg.tcp_backlog))
        for host, port in addresses:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            listeners.append(socket.create_server((host, port), family=family,
                                                  backlog=cfg.tcp_backlog))
    except OSError as exc:
        for ls in listeners:
            ls.close()
        where = cfg.bind or "*"
        raise ServerError(f"Could not listen on {where}:{port}: {exc.strerror}") from None
    for ls in listeners:
        ls.setblocking(False)
    return listeners


# Descriptors kept for the node itself (listeners, the append log, the log file, the cluster
# bus, threads) on top of one per client, as Redis's CONFIG_MIN_RESERVED_FDS.
RESERVED_FDS = 32


def open_files_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def max_clients_for_limit() -> int:
    return max(1, open_files_limit() - RESERVED_FDS)


def fit_open_files_limit(maxclients: int) -> bool:
    """Raise the soft open-files limit, within the hard one, so that ``maxclients`` clients
    fit; True if they do."""
    need = maxclients + RESERVED_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return True
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("Server can't set maximum open files to %d because of OS error: %s.",
                    need, exc)
        return False
    return target >= need


def adjust_max_clients(config: Config) -> None:
    """At start: make room for ``maxclients``, or lower it to what the limit allows (past it a
    client gets ``-ERR max number of clients reached`` instead of an accept that never
    comes), and say so as Redis does."""
    if fit_open_files_limit(config.maxclients):
        return
    wanted = config.maxclients
    config.maxclients = max_clients_for_limit()
    log.warning("You requested maxclients of %d requiring at least %d max file descriptors. "
                "Current maximum open files is %d. maxclients has been reduced to %d to "
                "compensate for low ulimit. If you need higher maxclients increase "
                "'ulimit -n'.", wanted, wanted + RESERVED_FDS, open_files_limit(),
                config.maxclients)
