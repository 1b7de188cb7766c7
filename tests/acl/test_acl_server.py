"""ACL users against a real node: redis-py and redis-cli, a users x commands x queues matrix,
ACL LOG, the aclfile across a restart, requirepass as the default user's password."""

from __future__ import annotations

import os
import subprocess

import pytest
import redis

from tests.support.server import ServerProcess, pipelined, send_command

USERS = {
    # name: rules
    "producer": ["on", ">p1", "~orders:*", "+@jobs", "-getjob", "+ping"],
    "consumer": ["on", ">c1", "~orders:*", "+getjob", "+ackjob", "+qlen"],
    "reader": ["on", ">r1", "allkeys", "+@read"],
}
# (command, queue) -> users allowed; the matrix runs every pair for every user.
COMMANDS = [
    (["ADDJOB", "{q}", "body", "0"], {"producer"}),
    (["GETJOB", "NOHANG", "FROM", "{q}"], {"consumer"}),
    (["QLEN", "{q}"], {"consumer", "reader"}),
    (["QPEEK", "{q}", "1"], {"reader"}),
    (["CONFIG", "GET", "port"], set()),
    (["DEBUG", "FLUSHALL"], set()),
]
QUEUES = {"orders:eu": {"producer", "consumer", "reader"}, "secret": {"reader"}}


def _client(port: int, user: str, password: str, protocol: int = 2) -> redis.Redis:
    return redis.Redis(port=port, username=user, password=password, protocol=protocol)


@pytest.mark.parametrize("protocol", [2, 3])
def test_matrix_of_users_commands_and_queues(protocol: int) -> None:
    with ServerProcess() as node:
        admin = redis.Redis(port=node.port)
        for name, rules in USERS.items():
            assert admin.execute_command("ACL", "SETUSER", name, *rules) == b"OK"
        clients = {name: _client(node.port, name, rules[1][1:], protocol)
                   for name, rules in USERS.items()}
        for argv, allowed_by_command in COMMANDS:
            for queue, allowed_by_queue in QUEUES.items():
                args = [a.format(q=queue) for a in argv]
                for name, r in clients.items():
                    may = name in allowed_by_command and (
                        "{q}" not in argv or name in allowed_by_queue)
                    try:
                        r.execute_command(*args)
                        ran = True
                    except redis.exceptions.NoPermissionError as exc:
                        ran = False
                        if name not in allowed_by_command:
                            assert str(exc).startswith(f"User {name} has no permissions"), exc
                        else:
                            assert str(exc) == "No permissions to access a key", exc
                    assert ran == may, (name, args)
        log = admin.execute_command("ACL", "LOG")
        assert log, "denials are logged"
        first = log[0]
        entry = first if isinstance(first, dict) else dict(zip(first[::2], first[1::2], strict=True))
        assert {b"reason", b"object", b"username", b"client-info"} <= set(entry)
        assert admin.execute_command("ACL", "WHOAMI") == b"default"


def test_wrong_password_disabled_user_and_auth_log() -> None:
    with ServerProcess() as node:
        admin = redis.Redis(port=node.port)
        admin.execute_command("ACL", "SETUSER", "alice", "on", ">a", "+@all", "~*")
        admin.execute_command("ACL", "SETUSER", "bob", "off", ">b", "+@all", "~*")
        assert _client(node.port, "alice", "a").ping()
        for user, pw in (("alice", "x"), ("bob", "b"), ("nobody", "x")):
            with pytest.raises(redis.AuthenticationError):
                _client(node.port, user, pw).ping()
        reasons = [e[b"reason"] if isinstance(e, dict) else e[3]
                   for e in admin.execute_command("ACL", "LOG")]
        assert b"auth" in reasons
        assert admin.execute_command("ACL", "DELUSER", "alice", "ghost") == 1
        with pytest.raises(redis.ResponseError, match="cannot be removed"):
            admin.execute_command("ACL", "DELUSER", "default")
        with pytest.raises(redis.ResponseError, match="modifier 'bogus': Syntax error"):
            admin.execute_command("ACL", "SETUSER", "carol", "on", "bogus")
        assert admin.execute_command("ACL", "GETUSER", "carol") is None  # atomic: not created


def test_requirepass_is_the_default_users_password() -> None:
    with ServerProcess(requirepass="pw") as node:
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=node.port).ping()
        r = redis.Redis(port=node.port, password="pw")
        assert r.ping()
        assert _client(node.port, "default", "pw").ping()
        r.execute_command("ACL", "SETUSER", "ops", "on", ">o", "+@all", "~*")
        assert _client(node.port, "ops", "o").execute_command("ACL", "WHOAMI") == b"ops"


def test_redis_cli_with_user_and_aclfile_across_restart() -> None:
    with ServerProcess(aclfile="users.acl") as node:
        cli = ["redis-cli", "-p", str(node.port)]
        out = subprocess.run([*cli, "ACL", "SETUSER", "w", "on", ">wpw", "~jobs*", "+@jobs"],
                             capture_output=True, text=True, check=True).stdout
        assert out.strip() == "OK"
        text = open(os.path.join(node.dir, "users.acl")).read()
        assert "user w on #" in text and "wpw" not in text  # SHA-256, never the password
        node.restart()
        out = subprocess.run([*cli, "--user", "w", "--pass", "wpw", "--no-auth-warning",
                              "ADDJOB", "jobs1", "x", "0"],
                             capture_output=True, text=True, check=True).stdout
        assert out.startswith("D-")
        out = subprocess.run([*cli, "--user", "w", "--pass", "wpw", "--no-auth-warning",
                              "ADDJOB", "other", "x", "0"],
                             capture_output=True, text=True, check=True).stdout
        assert "NOPERM" in out
        r = redis.Redis(port=node.port)
        r.execute_command("ACL", "DELUSER", "w")
        assert r.execute_command("ACL", "LOAD") == b"OK"
        assert r.execute_command("ACL", "USERS") == [b"default"]


def test_monitor_never_shows_a_password_given_to_acl() -> None:
    with ServerProcess() as node:
        mon = redis.Redis(port=node.port).monitor()
        with mon:
            r = redis.Redis(port=node.port)
            r.execute_command("ACL", "SETUSER", "x", "on", ">hunter2")
            r.execute_command("ECHO", "after")
            seen = []
            while not seen or "after" not in seen[-1]:
                seen.append(mon.next_command()["command"])
        assert not any("hunter2" in line for line in seen), seen


def test_names_and_rules_that_are_not_utf8_come_back_as_sent() -> None:
    """A user name, pattern or bad rule in any bytes is echoed byte for byte by every ACL
    reply and error; none of them may break the connection (the node's audit fails the test
    on an unexpected error)."""
    name, pattern, bad_rule = b"u\xf6\xff", b"~q\xf8*", b"+\xfe\xcc"
    with ServerProcess() as srv:
        setuser, users, acl_list, getuser, bad, login, whoami, qlen = pipelined(srv.port, [
            (b"ACL", b"SETUSER", name, b"on", b"nopass", pattern, b"+ADDJOB",
             b"+ACL|WHOAMI"),
            (b"ACL", b"USERS"), (b"ACL", b"LIST"), (b"ACL", b"GETUSER", name),
            (b"ACL", b"SETUSER", name, bad_rule),
            (b"AUTH", name, b"x"), (b"ACL", b"WHOAMI"), (b"QLEN", b"q")])
        assert setuser == b"OK"
        assert name in users
        assert any(line.startswith(b"user " + name + b" ") and pattern in line
                   for line in acl_list)
        assert getuser[getuser.index(b"keys") + 1] == pattern
        assert bad.startswith("ERR Error in ACL SETUSER modifier '+"), bad
        assert (login, whoami) == (b"OK", name)
        assert qlen.startswith("NOPERM"), qlen
        log = send_command(srv.port, "ACL", "LOG")
        assert log[0][log[0].index(b"username") + 1] == name
        assert srv.audit() == []
