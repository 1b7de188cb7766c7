"""The command table: every command the node accepts, one row each, as Disque's
serverCommandTable.

A row names the command, its arity (counting the name; negative: at least that many), its
flags, its parser (``protocol/commands.py``: argv -> command object or the exact error reply)
and its handler, ``(broker, command, client, now_ms) -> reply``. So ``grep -n addjob`` here
finds where ADDJOB is parsed and where it runs. ``broker.core.Broker.execute`` looks a command
up (``lookup``: unknown command, arity), checks NOAUTH, parses it and calls the row's handler.

Flags: ``no-auth`` may run before AUTH when ``requirepass`` is set; ``runtime`` is finished by
the node's runtime: its handler may return an intent (``broker/intents.py``) instead of a reply.
Handlers live in ``broker/state.py`` (jobs and queues: methods of ``BrokerState``),
``broker/admin.py`` (the node), and the modules of the features they adapt below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar

from broker import admin, parking, periodic, policies, results
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
                 handler: Callable[[BrokerState, C, Client, int], Any]) -> None:
        self.name: Final = name
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
ADDJOB: Final = Row(b"addjob", -4, _NONE, parse_addjob, _B.addjob)
GETJOB: Final = Row(b"getjob", -2, _NONE, parse_getjob, _B.getjob)
ACKJOB: Final = Row(b"ackjob", -1, _NONE, parse_jobs, _B.ackjob)

ROWS: Final[tuple[Row[Any], ...]] = (
    ADDJOB,
    GETJOB,
    ACKJOB,
    Row(b"fastack", -1, _NONE, parse_jobs, _B.fastack),
    Row(b"nack", -1, _NONE, parse_jobs, _B.nack),
    Row(b"enqueue", -1, _NONE, parse_jobs, _B.enqueue),
    Row(b"dequeue", -1, _NONE, parse_jobs, _B.dequeue),
    Row(b"deljob", -1, _NONE, parse_jobs, _B.deljob),
    Row(b"working", 2, _NONE, parse_jobs, _B.working),
    Row(b"show", 2, _NONE, parse_jobs, _B.show),
    Row(b"qlen", 2, _NONE, parse_queue, _B.qlen),
    Row(b"qstat", 2, _NONE, parse_queue, _B.qstat),
    Row(b"qpeek", 3, _NONE, parse_qpeek, _B.qpeek),
    Row(b"qscan", -1, _NONE, parse_qscan, _B.qscan),
    Row(b"jscan", -1, _NONE, parse_jscan, _B.jscan),
    Row(b"pause", -3, _NONE, parse_pause, _B.pause),
    Row(b"qpolicy", -2, _NONE, parse_qpolicy, qpolicy),
    Row(b"jobrun", -2, _NONE, parse_jobrun, jobrun),
    Row(b"timer", -2, _NONE, parse_timer, timer),
    Row(b"resolve", 3, _NONE, parse_resolve, resolve),
    Row(b"waitjob", -2, _NONE, parse_waitjob, waitjob),
    Row(b"loadjob", 2, _NONE, parse_generic, loadjob),
    Row(b"hello", -1, _NA, parse_generic, admin.hello),  # bare HELLO checks AUTH itself
    Row(b"auth", -2, _NA, parse_generic, admin.auth),
    Row(b"quit", -1, _NA | _RT, parse_generic, admin.quit_),
    Row(b"ping", -1, _NONE, parse_generic, admin.ping),
    Row(b"echo", 2, _NONE, parse_generic, admin.echo),
    Row(b"time", 1, _NONE, parse_generic, admin.time),
    Row(b"select", 2, _NONE, parse_generic, admin.select),
    Row(b"info", -1, _NONE, parse_generic, admin.info),
    Row(b"command", -1, _NONE, parse_generic, command),
    Row(b"cluster", -2, _NONE, parse_generic, admin.cluster),
    Row(b"debug", -2, _NONE, parse_generic, admin.debug),
    Row(b"config", -2, _RT, parse_generic, admin.config),
    Row(b"client", -2, _RT, parse_generic, admin.client_command),
    Row(b"shutdown", -1, _RT, parse_generic, admin.shutdown),
    Row(b"bgrewriteaof", 1, _RT, parse_generic, admin.bgrewriteaof),
    Row(b"monitor", 1, _RT, parse_generic, admin.monitor),
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
