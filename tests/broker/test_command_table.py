"""The command table (broker/command_table.py): every command the node accepts has exactly one
row, the row's parser and handler are the code that runs, unknown commands, arity and NOAUTH
come from it for every command, and the commands the runtime finishes are rows whose handlers
return an intent (broker/intents.py) that the node carries out through one table of its own."""

from __future__ import annotations

from typing import Any

import pytest

from broker import admin, intents
from broker.clients import Client
from broker.command_table import ACKJOB, ADDJOB, GETJOB, NO_AUTH, ROWS, RUNTIME, lookup
from broker.config import Config
from broker.core import Broker
from broker.state import BrokerState
from protocol.commands import parse_addjob, parse_getjob, parse_jobs
from protocol.resp import Error

T0 = 1_700_000_000_000
JOB_ID = b"D-00000000-000000000000000000000000-05a1"
NAMES = [row.name for row in ROWS]


def _broker(**settings: str) -> Broker:
    cfg = Config()
    for name, value in settings.items():
        cfg.set(name, [value])
    return Broker(cfg, "ab" * 20, b"seed", now_ms=T0)


RUNTIME_CASES = [
    ([b"QUIT"], intents.Quit()),
    ([b"SHUTDOWN"], intents.Shutdown(rewrite=False)),
    ([b"SHUTDOWN", b"REWRITE-AOF"], intents.Shutdown(rewrite=True)),
    ([b"BGREWRITEAOF"], intents.RewriteLog()),
    ([b"MONITOR"], intents.Monitor()),
    ([b"CONFIG", b"REWRITE"], intents.RewriteConfig()),
    ([b"CONFIG", b"RESETSTAT"], intents.ResetStats()),
    ([b"CONFIG", b"SET", b"appendonly", b"yes"], intents.ConfigApplied("appendonly", False)),
    ([b"CLIENT", b"KILL", b"127.0.0.1:1"],
     intents.KillClients("127.0.0.1:1", None, False, True)),
    ([b"CLIENT", b"KILL", b"ID", b"7", b"SKIPME", b"no"],
     intents.KillClients(None, 7, False, False)),
    ([b"CLIENT", b"PAUSE", b"250"], intents.PauseClients(T0 + 250)),
    ([b"CLIENT", b"PAUSE", b"0"], intents.PauseClients(0)),
]


@pytest.mark.parametrize("argv, intent", RUNTIME_CASES, ids=[b" ".join(a).decode() for a, _ in RUNTIME_CASES])
def test_runtime_commands_return_intents(argv: list[bytes], intent: intents.Intent) -> None:
    assert _broker().execute(argv, Client(1), T0) == intent


@pytest.mark.parametrize("name", NAMES)
def test_noauth_comes_from_the_table(name: bytes) -> None:
    b = _broker(requirepass="secret")
    row = next(r for r in ROWS if r.name == name)
    argv = [name] + [b"x"] * max(0, (row.arity if row.arity > 0 else -row.arity) - 1)
    reply = b.execute(argv, Client(1), T0)
    if NO_AUTH in row.flags:
        assert reply != Error("NOAUTH Authentication required.") or name == b"hello"
    else:
        assert reply == Error("NOAUTH Authentication required."), (name, reply)


def test_arity_and_unknown_commands_come_from_the_table() -> None:
    b = _broker()
    assert b.execute([b"SHUTDOWN", b"a", b"b"], Client(1), T0) == Error("ERR syntax error")
    assert b.execute([b"BGREWRITEAOF", b"now"], Client(1), T0) == Error(
        "ERR wrong number of arguments for 'bgrewriteaof' command")
    assert b.execute([b"MONITOR", b"x"], Client(1), T0) == Error(
        "ERR wrong number of arguments for 'monitor' command")
    assert b.execute([b"NOPE"], Client(1), T0) == Error("ERR unknown command 'NOPE'")
    # Unknown and arity come before NOAUTH, as in Disque's processCommand.
    locked = _broker(requirepass="secret")
    assert locked.execute([b"NOPE"], Client(1), T0) == Error("ERR unknown command 'NOPE'")
    assert locked.execute([b"QLEN"], Client(1), T0) == Error(
        "ERR wrong number of arguments for 'qlen' command")


def test_every_command_has_one_row_found_by_any_spelling() -> None:
    assert len(NAMES) == len(set(NAMES)), "a command with two rows"
    for row in ROWS:
        assert row.name == row.name.lower()
        for spelling in (row.name, row.name.upper(), row.name.capitalize()):
            argv = [spelling] + [b"x"] * (abs(row.arity) - 1)
            assert lookup(argv) is row, spelling


def test_every_row_names_a_parser_and_a_handler_of_its_own() -> None:
    handlers = [row.handler for row in ROWS]
    for row in ROWS:
        assert callable(row.parser) and callable(row.handler), row
        # A handler is named after its command (``client_command``: ``client`` is the
        # handlers' parameter; ``quit_``: the builtin): a row pasted from its neighbour and
        # left pointing at the neighbour's handler fails here.
        name = row.handler.__name__.removesuffix("_").removesuffix("_command")
        assert name == row.name.decode(), (row, row.handler)
        assert handlers.count(row.handler) == 1, f"{row.handler} serves two rows"


def test_every_admin_handler_is_reached_from_a_row() -> None:
    handlers = {row.handler for row in ROWS}
    public = [value for name, value in vars(admin).items()
              if callable(value) and not isinstance(value, type) and not name.startswith("_")
              and getattr(value, "__module__", None) == "broker.admin"]
    assert len(public) >= 14  # HELLO ... MONITOR (AUTH and ACL: broker/acl_command.py)
    assert [f for f in public if f not in handlers] == []


def test_the_fast_path_calls_the_rows_own_parser_and_handler() -> None:
    # Broker.execute calls these directly for ADDJOB, GETJOB and ACKJOB: they must be the
    # rows' own, and the rows the table's.
    assert lookup([b"ADDJOB", b"q", b"body", b"0"]) is ADDJOB
    assert ADDJOB.parser is parse_addjob and ADDJOB.handler is BrokerState.addjob
    assert lookup([b"GETJOB", b"FROM", b"q"]) is GETJOB
    assert GETJOB.parser is parse_getjob and GETJOB.handler is BrokerState.getjob
    assert lookup([b"ACKJOB"]) is ACKJOB
    assert ACKJOB.parser is parse_jobs and ACKJOB.handler is BrokerState.ackjob


def test_command_count_and_command_are_the_table() -> None:
    b = _broker()
    assert b.execute([b"COMMAND", b"COUNT"], Client(1), T0) == len(ROWS)
    reply = b.execute([b"COMMAND"], Client(1), T0)
    assert [entry[0] for entry in reply] == sorted(NAMES)
    for entry in reply:
        row = next(r for r in ROWS if r.name == entry[0])
        assert entry[1] == row.arity and entry[2] == sorted(f.encode() for f in row.flags)


# One well-formed command per row: each must reach its own handler, which must accept what
# its parser made. A new row needs an entry here.
SAMPLES: dict[bytes, list[bytes]] = {
    b"addjob": [b"ADDJOB", b"q", b"body", b"0"],
    b"getjob": [b"GETJOB", b"NOHANG", b"FROM", b"q"],
    b"ackjob": [b"ACKJOB", JOB_ID],
    b"fastack": [b"FASTACK", JOB_ID],
    b"nack": [b"NACK", JOB_ID],
    b"enqueue": [b"ENQUEUE", JOB_ID],
    b"dequeue": [b"DEQUEUE", JOB_ID],
    b"deljob": [b"DELJOB", JOB_ID],
    b"working": [b"WORKING", JOB_ID],
    b"show": [b"SHOW", JOB_ID],
    b"qlen": [b"QLEN", b"q"],
    b"qstat": [b"QSTAT", b"q"],
    b"qpeek": [b"QPEEK", b"q", b"1"],
    b"qscan": [b"QSCAN"],
    b"jscan": [b"JSCAN"],
    b"pause": [b"PAUSE", b"q", b"in"],
    b"qpolicy": [b"QPOLICY", b"LIST"],
    b"jobrun": [b"JOBRUN", b"LIST"],
    b"timer": [b"TIMER", b"LIST"],
    b"resolve": [b"RESOLVE", JOB_ID, b"done"],
    b"waitjob": [b"WAITJOB", JOB_ID, b"TIMEOUT", b"10"],
    b"loadjob": [b"LOADJOB", b"x"],
    b"hello": [b"HELLO"],
    b"auth": [b"AUTH", b"x"],
    b"quit": [b"QUIT"],
    b"ping": [b"PING"],
    b"echo": [b"ECHO", b"x"],
    b"time": [b"TIME"],
    b"select": [b"SELECT", b"0"],
    b"info": [b"INFO", b"jobs"],
    b"command": [b"COMMAND", b"COUNT"],
    b"cluster": [b"CLUSTER", b"LEAVING"],
    b"debug": [b"DEBUG", b"FLUSHALL"],
    b"config": [b"CONFIG", b"GET", b"hz"],
    b"client": [b"CLIENT", b"ID"],
    b"shutdown": [b"SHUTDOWN"],
    b"bgrewriteaof": [b"BGREWRITEAOF"],
    b"monitor": [b"MONITOR"],
    b"acl": [b"ACL", b"USERS"],
}


def test_every_row_has_a_sample() -> None:
    assert sorted(SAMPLES) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_row_runs_its_handler_on_its_parsers_command(name: bytes) -> None:
    b = _broker()
    argv = SAMPLES[name]
    row = lookup(argv)
    assert not isinstance(row, Error) and row.name == name
    command = row.parser(argv)
    assert not isinstance(command, Error), command
    reply: Any = b.execute(argv, Client(1), T0)
    direct: Any = row.handler(_broker(), command, Client(1), T0)
    assert type(reply) is type(direct), (reply, direct)
    if isinstance(reply, Error):
        assert not reply.startswith(("ERR unknown", "ERR wrong number")), reply
    # Only a row flagged runtime may hand the node an intent.
    assert isinstance(reply, intents.Intent) == (
        RUNTIME in row.flags and name not in (b"config", b"client", b"acl")), (name, reply)


def test_runtime_intents_come_from_runtime_rows() -> None:
    for argv, _ in RUNTIME_CASES:
        row = lookup(argv)
        assert not isinstance(row, Error) and RUNTIME in row.flags, argv


def test_the_node_carries_out_every_intent_through_its_table() -> None:
    from node.server import AWAITED, INTENTS

    # The module's classes (``dataclass(slots=True)`` makes a new class; the first one may
    # still be among the subclasses).
    kinds = {k for k in intents.Intent.__subclasses__() if getattr(intents, k.__name__) is k}
    assert len(kinds) >= 9
    assert set(INTENTS) == kinds
    assert set(AWAITED) == {intents.Shutdown, intents.ConfigApplied}
