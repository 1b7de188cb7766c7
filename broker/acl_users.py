"""The node's ACL users, ACL LOG, and the checks a restricted user's command goes through.

``Users`` holds every user by name (``default`` always among them) and the denials ACL LOG
shows. ``requirepass`` is the default user's password, as in Redis 6: setting it gives the
default user that one password, clearing it makes the default user ``nopass``. A client must
authenticate (NOAUTH) while the default user is off or needs a password: ``auth_required``.

``denial`` is the slow path of ``Broker.execute``, taken only by a client whose user is
``restricted``: may the user run the command, and use every queue it names? Commands that
name jobs are checked against each job's queue; a job this node does not know has no queue
to allow it, so only a user with every queue may name it.
"""

from __future__ import annotations

from typing import Any, Final

from broker import acl
from broker.acl import User
from broker.clients import Client
from protocol.commands import (
    AddJob,
    GetJob,
    JobRun,
    JobsCommand,
    JScan,
    Pause,
    QPeek,
    QPolicy,
    QueueCommand,
    Resolve,
    Timer,
    WaitJob,
)
from protocol.resp import Error

LOG_MAX_LEN: Final = 128  # Redis's acllog-max-len default
# What a client that names this node's job table sees for an unknown job (no queue).
_NO_QUEUE: Final = b""


def command_denied(user: str, command: str) -> Error:
    return Error(f"NOPERM User {user} has no permissions to run the '{command}' command")


QUEUE_DENIED: Final = Error("NOPERM No permissions to access a key")


class Users:
    def __init__(self) -> None:
        self.users: dict[str, User] = {"default": acl.default_user()}
        self.log: list[dict[str, Any]] = []  # newest first
        self.next_entry_id = 0
        self.auth_required = False
        # Called with each user changed or deleted (the cluster's table sync and the aclfile
        # listen): the name, and the user or None once deleted.
        self.changed: list[Any] = []
        # Every name's last version, ``(ms, node ID)``, deleted ones included (tombstones):
        # across the cluster the greater stamp wins (cluster/user_sync.py).
        self.stamps: dict[str, tuple[int, str]] = {}
        self.node_id = ""

    @property
    def default(self) -> User:
        return self.users["default"]

    def refresh(self) -> None:
        d = self.default
        self.auth_required = not (d.enabled and d.nopass)

    def set_requirepass(self, password: str) -> None:
        """``requirepass``'s value as the default user's one password (empty: nopass)."""
        d = self.default
        acl.apply(d, "resetpass")
        acl.apply(d, ">" + password if password else "nopass")
        self.refresh()

    # -- changes ---------------------------------------------------------------------------

    def setuser(self, name: str, rules: list[str], now_ms: int) -> tuple[str, str] | None:
        """ACL SETUSER: every rule applies, or none (the first failing rule and its error)."""
        current = self.users.get(name)
        user = current.copy() if current is not None else acl.new_user(name)
        failed = acl.apply_all(user, rules)
        if failed is not None:
            return failed
        self.stamp(name, now_ms)
        self.put(user)
        return None

    def stamp(self, name: str, now_ms: int) -> None:
        """A new version of ``name`` made here: later than any it had."""
        before = self.stamps.get(name, (0, ""))[0]
        self.stamps[name] = (max(now_ms, before + 1), self.node_id)

    def put(self, user: User) -> None:
        """``user`` in place of the one of its name: connected clients keep the object they
        authenticated with, so the old one takes the new rules."""
        current = self.users.get(user.name)
        if current is not None:
            current.take(user)
            user = current
        else:
            self.users[user.name] = user
        self.refresh()
        for listener in self.changed:
            listener(user.name, user)

    def delete(self, name: str, now_ms: int = 0) -> bool:
        if name in self.users:
            self.stamp(name, now_ms)
        return self.drop(name)

    def drop(self, name: str) -> bool:
        """Remove ``name`` (its stamp stays, as a tombstone)."""
        user = self.users.pop(name, None)
        if user is None:
            return False
        user.deleted = True
        user.refresh()
        for listener in self.changed:
            listener(name, None)
        return True

    def replace_all(self, users: list[User], now_ms: int | None) -> None:
        """ACL LOAD: these users and no others (``default`` as it was, unless given), each a
        new version at ``now_ms``; None: versions older than any the cluster made (a node
        starting with its aclfile)."""
        given = {u.name for u in users}
        for name in [n for n in self.users if n not in given and n != "default"]:
            if now_ms is not None:
                self.stamp(name, now_ms)
            self.drop(name)
        for user in users:
            if now_ms is not None:
                self.stamp(user.name, now_ms)
            self.put(user)

    def lines(self) -> list[str]:
        """Every user as an aclfile line."""
        return [" ".join(["user", u.name, *acl.describe(u)])
                for u in (self.users[n] for n in sorted(self.users))]

    def has_password(self) -> bool:
        """Whether any user needs a password (the default one included): protected mode
        answers other hosts only then."""
        d = self.default
        return not (d.enabled and d.nopass) or any(u.passwords for u in self.users.values())

    def login(self, name: str, password: bytes) -> User | None:
        user = self.users.get(name)
        if user is None or not user.password_ok(password):
            return None
        return user

    # -- ACL LOG ---------------------------------------------------------------------------

    def record(self, reason: str, obj: str, client: Client, username: str, now_ms: int) -> None:
        """A denial in ACL LOG: the same reason, object and user within a minute count once."""
        info = (f"id={client.id} addr={client.addr} name="
                f"{client.name.decode('utf-8', 'replace')} user={username}")
        for entry in self.log:
            if (entry["reason"] == reason and entry["object"] == obj
                    and entry["username"] == username
                    and now_ms - entry["timestamp-last-updated"] < 60_000):
                entry["count"] += 1
                entry["timestamp-last-updated"] = now_ms
                entry["client-info"] = info
                return
        self.log.insert(0, {
            "count": 1, "reason": reason, "context": "toplevel", "object": obj,
            "username": username, "client-info": info, "entry-id": self.next_entry_id,
            "timestamp-created": now_ms, "timestamp-last-updated": now_ms})
        self.next_entry_id += 1
        del self.log[LOG_MAX_LEN:]


def parse_lines(lines: list[str]) -> list[User] | str:
    """An aclfile's users (``user <name> <rule> ...`` a line; blank lines and ``#``
    comments skipped), or the error of its first bad line."""
    users: dict[str, User] = {}
    for number, line in enumerate(lines, 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] != "user" or len(words) < 2:
            return f"line {number}: should start with 'user <name>'"
        if not acl.valid_name(words[1].encode("utf-8", "surrogateescape")):
            return f"line {number}: {acl.BAD_NAME}"
        if words[1] in users:
            return f"line {number}: duplicate user '{words[1]}'"
        user = acl.new_user(words[1])
        failed = acl.apply_all(user, words[2:])
        if failed is not None:
            return f"line {number}: error in rule '{failed[0]}': {failed[1]}"
        users[user.name] = user
    return list(users.values())


def first_arg(argv: list[bytes]) -> str:
    return argv[1].decode("utf-8", "replace").lower() if len(argv) > 1 else ""


def command_name(argv: list[bytes], name: str) -> str:
    """The command as NOPERM and ACL LOG name it: ``config|set`` for a subcommand."""
    sub = first_arg(argv)
    return name + "|" + sub if acl.CATALOG.command_id(name, sub) != name else name


def queues_named(jobs: Any, cmd: Any) -> list[bytes] | None:
    """The queues ``cmd`` names (a named job: its queue here, or ``b""`` if unknown); None
    for a command that names none. A scan of every job (JSCAN without QUEUE) names ``*``."""
    if isinstance(cmd, AddJob):
        return [cmd.queue]
    if isinstance(cmd, GetJob):
        return list(cmd.queues)
    if isinstance(cmd, JobsCommand):
        return [_queue_of(jobs, i) for i in cmd.ids]
    if isinstance(cmd, (QueueCommand, QPeek, Pause)):
        return [cmd.queue]
    if isinstance(cmd, JScan):
        return [cmd.queue if cmd.queue is not None else b"*"]
    if isinstance(cmd, (Resolve, WaitJob)):
        return [_queue_of(jobs, cmd.job_id)]
    if isinstance(cmd, QPolicy):
        if cmd.sub in ("ORIGIN", "PARK"):
            return [_queue_of(jobs, cmd.target)]
        return [cmd.target] if cmd.target else None
    if isinstance(cmd, JobRun):
        named = [cmd.queue] if cmd.queue else []
        if cmd.job_id:
            named.append(_queue_of(jobs, cmd.job_id))
        return named or None
    if isinstance(cmd, Timer):
        return [cmd.queue] if cmd.queue else None
    return None


def _queue_of(jobs: Any, job_id: bytes) -> bytes:
    job = jobs.get(job_id)
    return job.queue if job is not None else _NO_QUEUE


def queues_allowed(user: User, named: list[bytes]) -> bytes | None:
    """The first queue in ``named`` the user may not use, or None."""
    for q in named:
        if q == b"*" or q == _NO_QUEUE:
            if not user.all_queues:
                return q
        elif not user.may_use(q):
            return q
    return None
