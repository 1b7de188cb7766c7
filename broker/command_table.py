"""The command table: every command the node accepts, one row each, as Disque's
serverCommandTable.

A row names the command, its arity (counting the name; negative: at least that many), its
flags, its parser (``protocol/commands.py``: argv -> command object or the exact error reply)
and its handler, ``(broker, command, client, now_ms) -> reply``. So ``grep -n addjob`` here
finds where ADDJOB is parsed and where it runs. ``broker.core.Broker.execute`` looks a command
up (``lookup``: unknown command, arity), checks NOAUTH, parses it and calls the row's handler.

The last columns are the command's ACL categories and, for a command whose subcommands
differ (CLUSTER MEET is ``@admin``, CLUSTER NODES is not), theirs.

Flags: ``no-auth`` may run before AUTH when ``requirepass`` is set; ``runtime`` is finished by
the node's runtime: its handler may return an intent (``broker/intents.py``) instead of a reply.
Handlers live in ``broker/state.py`` (jobs and queues: methods of ``BrokerState``),
``broker/admin.py`` (the node), and the modules of the features they adapt below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar

from broker import acl, admin, parking, periodic, policies, results
from broker import acl_command as acl_command_module
from broker.clients import Client
from broker.state import BrokerState
from protocol import errors
from protocol.commands import (
    Generic as GenericCommand,
)
from protocol.commands import (
    JobRun,
    QPolicy,
    Resolve,
    Timer,
    WaitJob,
    parse_addjob,
    parse_generic,
    parse_getjob,
    parse_jobrun,
    parse_jobs,
    parse_jscan,
    parse_pause,
    parse_qpeek,
    parse_qpolicy,
    parse_qscan,
    parse_queue,
    parse_resolve,
    parse_timer,
    parse_waitjob,
)
from protocol.resp import Error

NO_AUTH: Final = "no-auth"
RUNTIME: Final = "runtime"

C = TypeVar("C")


class Row(Generic[C]):
    """One command. The parser's command type ``C`` is the one the handler takes (mypy checks
    each row)."""

    def __init__(self, name: bytes, arity: int, flags: frozenset[str],
                 parser: Callable[[list[bytes]], C | Error],
                 handler: Callable[[BrokerState, C, Client, int], Any],
                 categories: str, subcommands: dict[str, str] | None = None) -> None:
        self.name: Final = name
        # ACL categories (broker/acl.py), and those of subcommands that differ from them.
        self.categories: Final = categories
        self.subcommands: Final = subcommands or {}
        acl.CATALOG.add(name.decode(), categories, subcommands)
        self.arity: Final = arity
        self.flags: Final = flags
        self.parser: Final = parser
        self.handler: Final = handler
        self.no_auth: Final = NO_AUTH in flags  # read per command while requirepass is set

    def __repr__(self) -> str:
        return f"Row({self.name!r}, {self.arity}, {sorted(self.flags)})"


# -- handlers that adapt a feature module's entry point to the row's signature ---------------


def qpolicy(b: BrokerState, cmd: QPolicy, client: Client, now_ms: int) -> Any:
    if cmd.sub == "PARK":  # a script worker's failed job, out of its queue
        return parking.park(b, cmd, now_ms)
    return policies.command(b, cmd, client, now_ms)


def jobrun(b: BrokerState, cmd: JobRun, client: Client, now_ms: int) -> Any:
    return b.runs.command(cmd, now_ms)


def timer(b: BrokerState, cmd: Timer, client: Client, now_ms: int) -> Any:
    return periodic.command(b, cmd, now_ms)


def resolve(b: BrokerState, cmd: Resolve, client: Client, now_ms: int) -> Any:
    return results.resolve(b, cmd.job_id, cmd.result, now_ms)


def waitjob(b: BrokerState, cmd: WaitJob, client: Client, now_ms: int) -> Any:
    return results.waitjob(b, cmd.job_id, cmd.timeout_ms, client, now_ms)


def acl_command(b: BrokerState, cmd: GenericCommand, client: Client, now_ms: int) -> Any:
    """ACL (broker/acl_command.py); DRYRUN here, where the rows are."""
    if cmd.args[0].lower() == b"dryrun" and len(cmd.args) >= 3:
        argv = list(cmd.args[2:])
        return acl_command_module.dryrun(b, cmd.args[1].decode("utf-8", "surrogateescape"),
                                         argv, lookup(argv))
    return acl_command_module.subcommand(b, cmd, client, now_ms)


def loadjob(b: BrokerState, cmd: GenericCommand, client: Client, now_ms: int) -> Any:
    # Disque's AOF replays jobs with LOADJOB; trisque's log has its own records (broker/aof.py).
    return errors.LOADJOB_FROM_AOF


def command(b: BrokerState, cmd: GenericCommand, client: Client, now_ms: int) -> Any:
    """COMMAND, COMMAND COUNT, COMMAND DOCS: this table."""
    if cmd.args and cmd.args[0].lower() == b"count":
        return len(ROWS)
    if cmd.args and cmd.args[0].lower() == b"docs":
        return []
    return [[row.name, row.arity, sorted(f.encode() for f in row.flags), 0, 0, 0]
            for row in sorted(ROWS, key=lambda row: row.name)]


_NONE: Final[frozenset[str]] = frozenset()
_NA: Final = frozenset((NO_AUTH,))
_RT: Final = frozenset((RUNTIME,))
_B: Final = BrokerState

# The commands of every job's life: Broker.execute calls these rows' parser and handler
# directly (broker/core.py).
ADDJOB: Final = Row(b"addjob", -4, _NONE, parse_addjob, _B.addjob, "@write @jobs @fast")
GETJOB: Final = Row(b"getjob", -2, _NONE, parse_getjob, _B.getjob, "@write @jobs @fast")
ACKJOB: Final = Row(b"ackjob", -1, _NONE, parse_jobs, _B.ackjob, "@write @jobs @fast")

ROWS: Final[tuple[Row[Any], ...]] = (
    ADDJOB,
    GETJOB,
    ACKJOB,
    Row(b"fastack", -1, _NONE, parse_jobs, _B.fastack, "@write @jobs @fast"),
    Row(b"nack", -1, _NONE, parse_jobs, _B.nack, "@write @jobs @fast"),
    Row(b"enqueue", -1, _NONE, parse_jobs, _B.enqueue, "@write @jobs @fast"),
    Row(b"dequeue", -1, _NONE, parse_jobs, _B.dequeue, "@write @jobs @fast"),
    Row(b"deljob", -1, _NONE, parse_jobs, _B.deljob, "@write @jobs @fast"),
    Row(b"working", 2, _NONE, parse_jobs, _B.working, "@write @jobs @fast"),
    Row(b"show", 2, _NONE, parse_jobs, _B.show, "@read @jobs @fast"),
    Row(b"qlen", 2, _NONE, parse_queue, _B.qlen, "@read @queues @fast"),
    Row(b"qstat", 2, _NONE, parse_queue, _B.qstat, "@read @queues @fast"),
    Row(b"qpeek", 3, _NONE, parse_qpeek, _B.qpeek, "@read @queues @slow"),
    Row(b"qscan", -1, _NONE, parse_qscan, _B.qscan, "@read @queues @slow"),
    Row(b"jscan", -1, _NONE, parse_jscan, _B.jscan, "@read @jobs @slow"),
    Row(b"pause", -3, _NONE, parse_pause, _B.pause, "@write @queues @slow"),
    Row(b"qpolicy", -2, _NONE, parse_qpolicy, qpolicy, "@write @queues @slow",
        {"get": "@read @queues @slow", "list": "@read @queues @slow",
         "origin": "@read @jobs @slow"}),
    Row(b"jobrun", -2, _NONE, parse_jobrun, jobrun, "@write @jobs @slow",
        {"get": "@read @jobs @slow", "output": "@read @jobs @slow", "list": "@read @jobs @slow"}),
    Row(b"timer", -2, _NONE, parse_timer, timer, "@write @queues @slow",
        {"get": "@read @queues @slow", "list": "@read @queues @slow", "help": "@slow"}),
    Row(b"resolve", 3, _NONE, parse_resolve, resolve, "@write @jobs @fast"),
    Row(b"waitjob", -2, _NONE, parse_waitjob, waitjob, "@read @jobs @slow"),
    Row(b"loadjob", 2, _NONE, parse_generic, loadjob, "@write @admin @dangerous @slow"),
    Row(b"hello", -1, _NA, parse_generic, admin.hello, "@fast @connection"),  # bare HELLO checks AUTH itself
    Row(b"auth", -2, _NA, parse_generic, acl_command_module.auth, "@fast @connection"),
    Row(b"quit", -1, _NA | _RT, parse_generic, admin.quit_, "@fast @connection"),
    Row(b"ping", -1, _NONE, parse_generic, admin.ping, "@fast @connection"),
    Row(b"echo", 2, _NONE, parse_generic, admin.echo, "@fast @connection"),
    Row(b"time", 1, _NONE, parse_generic, admin.time, "@fast"),
    Row(b"select", 2, _NONE, parse_generic, admin.select, "@fast @connection"),
    Row(b"info", -1, _NONE, parse_generic, admin.info, "@slow @dangerous"),
    Row(b"command", -1, _NONE, parse_generic, command, "@slow @connection"),
    Row(b"cluster", -2, _NONE, parse_generic, admin.cluster, "@cluster @slow",
        {s: "@admin @dangerous @cluster @slow"
         for s in ("meet", "forget", "reset", "leaving", "saveconfig")}),
    Row(b"debug", -2, _NONE, parse_generic, admin.debug, "@admin @dangerous @slow"),
    Row(b"config", -2, _RT, parse_generic, admin.config, "@admin @dangerous @slow"),
    Row(b"client", -2, _RT, parse_generic, admin.client_command, "@connection @slow",
        {s: "@admin @dangerous @connection @slow" for s in ("kill", "pause", "list")}),
    Row(b"shutdown", -1, _RT, parse_generic, admin.shutdown, "@admin @dangerous @slow"),
    Row(b"bgrewriteaof", 1, _RT, parse_generic, admin.bgrewriteaof, "@admin @dangerous @slow"),
    Row(b"acl", -2, _RT, parse_generic, acl_command, "@admin @dangerous @slow",
        {"whoami": "@slow", "cat": "@slow", "genpass": "@slow", "help": "@slow"}),
    Row(b"monitor", 1, _RT, parse_generic, admin.monitor, "@admin @dangerous @slow"),
)

# Every name as clients usually spell it, lower and upper case: most lookups need no lower()
# (a Python-level call) before the table.
_BY_SPELLING: Final[dict[bytes, Row[Any]]] = {
    spelling: row for row in ROWS for spelling in (row.name, row.name.upper())}


def lookup(argv: list[bytes]) -> Row[Any] | Error:
    """The row of ``argv``'s command, or the unknown-command or arity error."""
    name = argv[0]
    row = _BY_SPELLING.get(name)
    if row is None:
        row = _BY_SPELLING.get(name.lower())
    if row is None:
        return errors.unknown_command(name.decode("utf-8", "replace"))
    arity = row.arity
    argc = len(argv)
    if (arity > 0 and argc != arity) or argc < -arity:
        return errors.wrong_arity(name.decode("latin-1"))
    return row


def parse(argv: list[bytes]) -> Any:
    """``argv`` as its row's parser reads it (a command object), or the error reply."""
    row = lookup(argv)
    if isinstance(row, Error):
        return row
    return row.parser(argv)
