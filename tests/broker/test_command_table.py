"""Issue 7, point 2: one command table. Unknown commands, arity and NOAUTH come from it for
every command, and the commands the runtime finishes are entries whose handlers return an
intent (broker/intents.py) instead of being dispatched a second time by the driver."""

from __future__ import annotations

import pytest

from broker import intents
from broker.clients import Client
from broker.config import Config
from broker.core import Broker
from protocol.commands import COMMANDS, NO_AUTH, RUNTIME
from protocol.resp import Error

T0 = 1_700_000_000_000


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


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_noauth_comes_from_the_table(name: bytes) -> None:
    b = _broker(requirepass="secret")
    spec = COMMANDS[name]
    argv = [name] + [b"x"] * max(0, (spec.arity if spec.arity > 0 else -spec.arity) - 1)
    reply = b.execute(argv, Client(1), T0)
    if NO_AUTH in spec.flags:
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


def test_every_runtime_flag_has_a_handler() -> None:
    from broker.admin import HANDLERS

    for name, spec in COMMANDS.items():
        if RUNTIME in spec.flags:
            assert name.decode().upper() in HANDLERS, name
