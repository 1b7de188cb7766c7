"""ACL and AUTH: Redis 6/7's subcommands, replies and error texts over ``broker/acl_users.py``.

ACL SAVE and ACL LOAD touch the aclfile: they return intents the node carries out
(``broker/intents.py``). Everything else is answered here.
"""

from __future__ import annotations

import secrets
from typing import Any, Final, Protocol

from broker import acl, intents
from broker.acl import User
from broker.acl_users import (
    Users,
    command_denied,
    command_name,
    first_arg,
    queues_allowed,
    queues_named,
)
from broker.clients import Client
from broker.config import Config
from protocol import errors
from protocol.commands import Generic, parse_int
from protocol.resp import Error, Status

OK: Final = Status("OK")
DEFAULT_USER_NOT_REMOVABLE: Final = Error("ERR The 'default' user cannot be removed")
BAD_GENPASS: Final = Error("ERR ACL GENPASS argument must be the number of bits for the output "
                           "password, a positive number up to 4096")
NO_ACLFILE: Final = Error(
    "ERR This trisque instance is not configured to use an ACL file. Set 'aclfile' in the "
    "configuration file to keep users in a file (docs/security.md).")

HELP: Final = [
    b"ACL <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    b"CAT [<category>]", b"    List the categories, or the commands in one.",
    b"DELUSER <username> [<username> ...]", b"    Delete users.",
    b"DRYRUN <username> <command> [<arg> ...]", b"    Whether the user may run the command.",
    b"GETUSER <username>", b"    A user's rules.",
    b"LIST", b"    Every user as the rules that make it.",
    b"USERS", b"    Every user name.",
    b"SETUSER <username> <rule> [<rule> ...]", b"    Create or change a user.",
    b"SAVE", b"    Write the users to the aclfile.",
    b"LOAD", b"    Read the users from the aclfile.",
    b"LOG [<count> | RESET]", b"    Recent denials.",
    b"GENPASS [<bits>]", b"    A random password.",
    b"WHOAMI", b"    The current connection's user.",
]


class AclBroker(Protocol):
    acl: Users
    config: Config

    @property
    def jobs(self) -> Any: ...


def setuser_error(rule: str, error: str) -> Error:
    return Error(f"ERR Error in ACL SETUSER modifier '{rule}': {error}")


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _wire(text: str) -> bytes:
    """The bytes ``_text`` came from: names and patterns may be any bytes a client sent."""
    return text.encode("utf-8", "surrogateescape")


def subcommand(b: AclBroker, cmd: Generic, client: Client, now_ms: int) -> Any:
    sub = cmd.args[0].lower()
    args = cmd.args[1:]
    users = b.acl
    if sub == b"setuser" and args:
        if not acl.valid_name(args[0]):
            return errors.err(acl.BAD_NAME)
        failed = users.setuser(_text(args[0]), [_text(a) for a in args[1:]], now_ms)
        return OK if failed is None else setuser_error(*failed)
    if sub == b"getuser" and len(args) == 1:
        user = users.users.get(_text(args[0]))
        return None if user is None else getuser(user)
    if sub == b"deluser" and args:
        names = [_text(a) for a in args]
        if "default" in names:
            return DEFAULT_USER_NOT_REMOVABLE
        return sum(users.delete(name, now_ms) for name in names)
    if sub == b"list" and not args:
        return [_wire(describe_line(u)) for u in _sorted(users)]
    if sub == b"users" and not args:
        return [_wire(u.name) for u in _sorted(users)]
    if sub == b"whoami" and not args:
        return _wire(client.user.name)
    if sub == b"cat" and len(args) <= 1:
        if not args:
            return [c.encode() for c in acl.CATEGORIES]
        ids = acl.CATALOG.by_category.get(_text(args[0]).lower())
        if ids is None:
            return errors.err(f"Unknown category '{_text(args[0])}'")
        return [i.encode() for i in sorted(ids)]
    if sub == b"log" and len(args) <= 1:
        return acl_log(users, args, now_ms)
    if sub == b"genpass" and len(args) <= 1:
        bits = parse_int(args[0]) if args else 256
        if bits is None or not 0 < bits <= 4096:
            return BAD_GENPASS
        return secrets.token_hex((bits + 7) // 8)[:(bits + 3) // 4].encode()
    if sub in (b"save", b"load") and not args:
        if not b.config.aclfile:
            return NO_ACLFILE
        return intents.AclSave() if sub == b"save" else intents.AclLoad()
    if sub == b"help" and not args:
        return HELP
    return errors.unknown_subcommand("ACL", cmd.args[0].decode("utf-8", "replace")) if sub not in (
        b"setuser", b"getuser", b"deluser", b"list", b"users", b"whoami", b"cat", b"log",
        b"genpass", b"dryrun", b"save", b"load", b"help") \
        else errors.wrong_arity("acl|" + sub.decode("latin-1"))


def _sorted(users: Users) -> list[User]:
    return [users.users[n] for n in sorted(users.users)]


def describe_line(user: User) -> str:
    return " ".join(["user", user.name, *acl.describe(user)])


def getuser(user: User) -> dict[bytes, Any]:
    keys = "~*" if user.all_queues else " ".join(
        "~" + p.decode("utf-8", "surrogateescape") for p in user.patterns)
    return {
        b"flags": [f.encode() for f in acl.flags(user)],
        b"passwords": [p.encode() for p in user.passwords],
        b"commands": _wire(acl.command_text(user)),
        b"keys": _wire(keys),
        b"channels": b"",
        b"selectors": [],
    }


def acl_log(users: Users, args: tuple[bytes, ...], now_ms: int) -> Any:
    count = 10
    if args:
        if args[0].lower() == b"reset":
            users.log.clear()
            return OK
        n = parse_int(args[0])
        if n is None or n < 0:
            return errors.NOT_INTEGER
        count = n
    out = []
    for entry in users.log[:count]:
        row = dict(entry)
        row["age-seconds"] = round((now_ms - entry["timestamp-created"]) / 1000, 3)
        out.append({k.encode(): (_wire(v) if isinstance(v, str) else v)
                    for k, v in row.items()})
    return out


def dryrun(b: AclBroker, name: str, argv: list[bytes], row: Any) -> Any:
    """ACL DRYRUN: ``row`` is the command table's row of ``argv`` (or its lookup error)."""
    user = b.acl.users.get(name)
    if user is None:
        return errors.err(f"User '{name}' not found")
    if isinstance(row, Error):
        return errors.err(f"Command '{_text(argv[0])}' not found") \
            if row.startswith("ERR unknown command") else row
    cname = row.name.decode()
    if not user.may_run(cname, first_arg(argv)):
        return _wire(command_denied(name, command_name(argv, cname))[len("NOPERM "):])
    cmd = row.parser(argv)
    if not isinstance(cmd, Error):
        named = queues_named(b.jobs, cmd)
        if named is not None and queues_allowed(user, named) is not None:
            return b"No permissions to access a key"
    return OK


# -- AUTH and HELLO's AUTH --------------------------------------------------------------------


def authenticate(b: AclBroker, client: Client, name: str, password: bytes, now_ms: int,
                 what: str) -> bool:
    """Log ``client`` in as ``name``; a failure lands in ACL LOG (reason ``auth``)."""
    user = b.acl.login(name, password)
    if user is None:
        b.acl.record("auth", what, client, name, now_ms)
        return False
    client.user = user
    client.authenticated = True
    return True


def auth(b: AclBroker, cmd: Generic, client: Client, now_ms: int) -> Any:
    """AUTH password (Disque: the default user), or AUTH username password (Redis 6)."""
    if len(cmd.args) > 2:
        return errors.SYNTAX
    if len(cmd.args) == 1 and not b.acl.auth_required and not b.acl.default.passwords:
        return errors.NO_PASSWORD_SET
    name = _text(cmd.args[0]) if len(cmd.args) == 2 else "default"
    if authenticate(b, client, name, cmd.args[-1], now_ms, "AUTH"):
        return OK
    client.authenticated = False
    return errors.WRONGPASS if len(cmd.args) == 2 else errors.INVALID_PASSWORD
