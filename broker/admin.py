"""Administrative commands: HELLO, PING, TIME, INFO, CLUSTER, CONFIG, DEBUG, CLIENT,
SELECT, ECHO, and the ones the runtime finishes (QUIT, SHUTDOWN, BGREWRITEAOF, MONITOR, CONFIG
REWRITE/RESETSTAT/SET of appendonly or maxclients, CLIENT KILL and PAUSE).

They read and set node-level state (configuration, the leaving flag, client attributes) and
leave jobs and queues to ``broker/state.py``. Each is a handler that a row of
``broker/command_table.py`` names: it takes the broker, the parsed command, the client and the
time, and returns the reply, like the job commands do, or an intent (``broker/intents.py``)
for the runtime to carry out. AUTH and ACL are ``broker/acl_command.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from broker import acl_command, intents
from broker.acl_users import Users
from broker.clients import REPLY_OFF, REPLY_SKIP, REPLY_SKIP_NEXT, Client
from broker.cluster_view import ClusterView
from broker.config import Config
from broker.federation import Federation
from broker.info import render
from broker.protected import MEET_REFUSED, bus_open_to
from broker.version import VERSION
from protocol import errors
from protocol.commands import Generic, parse_int
from protocol.resp import OK, Error, Status


class Broker(Protocol):
    """What the administrative commands read and change of the broker
    (``broker.state.BrokerState``): no more than this."""

    config: Config
    acl: Users
    node_id: str
    leaving: bool

    # Read-only (properties): the broker's dictionaries of its own types fit a Mapping here.
    @property
    def jobs(self) -> Mapping[bytes, Any]: ...

    @property
    def queues(self) -> Mapping[bytes, Any]: ...

    info_sources: dict[str, Callable[[], list[tuple[str, Any]]]]
    cluster: ClusterView
    federation: Federation | None

    def hello_nodes(self) -> list[list[bytes]]: ...

    def reachable_nodes(self) -> int: ...

    def set_leaving(self, leaving: bool) -> None: ...

    def flushall(self) -> None: ...


# CONFIG SET of these needs the runtime: switching the log, checking the open-files limit.
# CONFIG SET of these is finished by the runtime: switching the log, checking the open-files
# limit, building new TLS contexts (client port, bus, HTTPS) from the tls-* directives.
_RUNTIME_DIRECTIVES = frozenset((
    "appendonly", "maxclients", "tls-cert-file", "tls-key-file", "tls-key-file-pass",
    "tls-client-cert-file", "tls-client-key-file", "tls-client-key-file-pass",
    "tls-ca-cert-file", "tls-ca-cert-dir", "tls-auth-clients", "tls-protocols", "tls-ciphers",
    "tls-ciphersuites", "tls-prefer-server-ciphers"))


def hello(b: Broker, cmd: Generic, client: Client, now_ms: int) -> Any:
    if not cmd.args:
        if b.acl.auth_required and not client.authenticated:
            return errors.NOAUTH
        return [1, b.node_id.encode(), *b.hello_nodes()]
    # Redis 6 handshake: HELLO protover [AUTH user pass] [SETNAME name]
    ver = parse_int(cmd.args[0])
    if ver is None:
        return errors.BAD_PROTOVER
    if ver not in (2, 3):
        return errors.NOPROTO
    j = 1
    args = cmd.args
    while j < len(args):
        opt = args[j].lower()
        if opt == b"auth" and j + 2 < len(args):
            name = args[j + 1].decode("utf-8", "surrogateescape")
            if not acl_command.authenticate(b, client, name, args[j + 2], now_ms, "HELLO"):
                return errors.WRONGPASS
            j += 3
        elif opt == b"setname" and j + 1 < len(args):
            client.name = args[j + 1]
            j += 2
        else:
            return errors.hello_syntax(args[j].decode("utf-8", "replace"))
    if b.acl.auth_required and not client.authenticated:
        return errors.NOAUTH
    client.protover = ver
    return {
        b"server": b"trisque",
        b"version": VERSION.encode(),
        b"proto": ver,
        b"id": client.id,
        b"mode": b"cluster",
        b"role": b"master",
        b"modules": [],
    }

def ping(b: Broker, cmd: Generic, client: Client, now_ms: int) -> Any:
    if len(cmd.args) > 1:
        return errors.wrong_arity("ping")
    return cmd.args[0] if cmd.args else Status("PONG")

def time(b: Broker, cmd: Generic, client: Client, now_ms: int) -> Any:
    return [str(now_ms // 1000).encode(), str((now_ms % 1000) * 1000).encode()]

def info(b: Broker, cmd: Generic, client: Client, now_ms: int) -> Any:
    section = cmd.args[0].decode("utf-8", "replace").lower() if cmd.args else "default"
    if len(cmd.args) > 1:
        return errors.SYNTAX
    sources = dict(b.info_sources)
    fed = b.federation
    # jobs_imported/jobs_exported (federation, a node with a bus) are trisque's: Disque's
    # INFO has no such fields, and without them a moved job is invisible on both nodes. A
    # section of their own, shown by INFO federation and INFO all: INFO and INFO jobs stay
    # Disque's, byte for byte, on every node (every node runs a bus).
    sources["jobs"] = lambda: [("registered_jobs", len(b.jobs))]
    if fed is not None:
        sources["federation"] = fed.info
    sources["queues"] = lambda: [("registered_queues", len(b.queues))]
    # trisque's too (`trisque --stat`): the jobs ready in a queue, a sum over the queues
    # rather than over the jobs, so asking every second stays cheap.
    sources["jobstats"] = lambda: [("queued_jobs", sum(len(q) for q in b.queues.values()))]
    return render(sources, section).encode()

def cluster(b: Broker, cmd: Generic, client: Client, now_ms: int) -> Any:
    sub = cmd.args[0].lower()
    rest = cmd.args[1:]
    if sub == b"leaving":
        if not rest:
            return Status("yes" if b.leaving else "no")
        flag = rest[0].lower()
        if len(rest) != 1 or flag not in (b"yes", b"no"):
            return errors.BAD_LEAVING_ARG
        b.set_leaving(flag == b"yes")
        b.cluster.set_leaving(flag == b"yes", now_ms)
        return OK
    if (sub == b"meet" and rest
            and not bus_open_to(rest[0].decode("utf-8", "replace"), b.config.protected_mode,
                                b.config.cluster_secret, b.config.tls_cluster)):
        return MEET_REFUSED
    reply = b.cluster.command(sub, rest, now_ms)
    if sub == b"reset" and reply is OK:
        # Disque's CLUSTER RESET (soft or hard) also drops every job: their replicas
        # lived on nodes this one has just forgotten.
        b.flushall()
    return reply

def config(b: Broker, cmd: Generic, client: Client, now_ms: int) -> Any:
    sub = cmd.args[0].lower()
    want = {b"get": 2, b"set": 3, b"resetstat": 1, b"rewrite": 1}.get(sub)
    if want is not None and len(cmd.args) != want:
        return errors.config_arity(cmd.args[0].decode("utf-8", "replace"))
    if sub == b"get" and len(cmd.args) == 2:
        return b.config.config_get(cmd.args[1].decode("utf-8", "replace"))
    if sub == b"set" and len(cmd.args) == 3:
        name = cmd.args[1].decode("utf-8", "replace").lower()
        previous = getattr(b.config, name.replace("-", "_"), None)
        error = b.config.config_set(name, cmd.args[2].decode("utf-8", "replace"))
        if error:
            return errors.err(error)
        if name == "requirepass":
            b.acl.set_requirepass(b.config.requirepass)
        return intents.ConfigApplied(name, previous) if name in _RUNTIME_DIRECTIVES else OK
    if sub == b"resetstat" and len(cmd.args) == 1:
        return intents.ResetStats()
    if sub == b"rewrite" and len(cmd.args) == 1:
        return intents.RewriteConfig()
    return errors.BAD_CONFIG_SUB

def debug(b: Broker, cmd: Generic, client: Client, now_ms: int) -> Any:
    sub = cmd.args[0].lower()
    if sub == b"flushall" and len(cmd.args) == 1:
        b.flushall()
        return OK
    return errors.debug_unknown(cmd.args[0].decode("utf-8", "replace"))

def client_command(b: Broker, cmd: Generic, client: Client, now_ms: int) -> Any:
    sub = cmd.args[0].lower()
    args = cmd.args[1:]
    if sub == b"setname" and len(args) == 1:
        if any(c <= 32 or c >= 127 for c in args[0]):
            return errors.BAD_CLIENT_NAME
        client.name = args[0]
        return OK
    if sub == b"getname" and not args:
        return client.name or None
    if sub == b"id" and not args:
        return client.id
    if sub == b"setinfo" and len(args) == 2:
        field = args[0].lower()
        if field == b"lib-name":
            client.lib_name = args[1]
        elif field == b"lib-ver":
            client.lib_ver = args[1]
        else:
            return errors.unrecognized_option(args[0].decode("utf-8", "replace"))
        return OK
    if sub == b"kill":
        return _client_kill(args, client) if args else errors.SYNTAX
    if sub == b"reply" and len(args) == 1:
        return _client_reply(args[0].lower(), client)
    if sub == b"pause" and len(args) == 1:
        ms = parse_int(args[0])
        if ms is None:
            return errors.BAD_TIMEOUT
        if ms < 0:
            return errors.NEGATIVE_TIMEOUT
        return intents.PauseClients(now_ms + ms if ms else 0)
    if sub == b"list" and not args:
        lister = b.info_sources.get("__client_list__")
        lines = lister() if lister else []
        return "".join(f"{line}\n" for _, line in lines).encode()
    return errors.CLIENT_SYNTAX


def _client_reply(mode: bytes, client: Client) -> Any:
    """CLIENT REPLY ON answers OK; OFF and SKIP answer nothing (their flags silence their own
    reply: broker.clients.reply_wanted)."""
    if mode == b"on":
        client.reply_flags = 0
        return OK
    if mode == b"off":
        client.reply_flags |= REPLY_OFF
        return OK
    if mode == b"skip":
        if not client.reply_flags & REPLY_OFF:
            client.reply_flags |= REPLY_SKIP | REPLY_SKIP_NEXT
        return OK
    return errors.SYNTAX


def _client_kill(args: tuple[bytes, ...], client: Client) -> intents.KillClients | Error:
    """Redis's CLIENT KILL: ``addr:port``, or the filters ID, ADDR, TYPE and SKIPME."""
    if len(args) == 1:
        return intents.KillClients(args[0].decode("utf-8", "replace"), None, False, True)
    if len(args) % 2:
        return errors.SYNTAX
    addr: str | None = None
    client_id: int | None = None
    skip_me, normal = True, True
    for opt, value in zip(args[::2], args[1::2], strict=True):
        opt = opt.lower()
        if opt == b"id":
            client_id = parse_int(value)
            if client_id is None:
                return errors.SYNTAX
        elif opt == b"addr":
            addr = value.decode("utf-8", "replace")
        elif opt == b"type":
            kind = value.lower()
            if kind not in (b"normal", b"master", b"slave", b"replica", b"pubsub"):
                return errors.unknown_client_type(value.decode("utf-8", "replace"))
            normal = kind == b"normal"  # a node has only normal clients
        elif opt == b"skipme":
            if value.lower() not in (b"yes", b"no"):
                return errors.SYNTAX
            skip_me = value.lower() == b"yes"
        else:
            return errors.SYNTAX
    return intents.KillClients(addr, client_id, skip_me, False, normal)


def quit_(b: Broker, cmd: Generic, client: Client, now_ms: int) -> Any:
    return intents.Quit()


def shutdown(b: Broker, cmd: Generic, client: Client, now_ms: int) -> Any:
    if len(cmd.args) > 1 or (cmd.args and cmd.args[0].lower() != b"rewrite-aof"):
        return errors.SYNTAX
    return intents.Shutdown(rewrite=bool(cmd.args))


def bgrewriteaof(b: Broker, cmd: Generic, client: Client, now_ms: int) -> Any:
    return intents.RewriteLog()


def monitor(b: Broker, cmd: Generic, client: Client, now_ms: int) -> Any:
    return intents.Monitor()


def select(b: Broker, cmd: Generic, client: Client, now_ms: int) -> Any:
    return OK if cmd.args[0] == b"0" else errors.BAD_DB_INDEX


def echo(b: Broker, cmd: Generic, client: Client, now_ms: int) -> Any:
    return cmd.args[0]
