"""What the broker knows of a connected client, and of a client blocked in GETJOB.

The driver creates a ``Client`` per connection and passes it with every command; the broker
records authentication, protocol version, name, the ``Waiter`` of a blocked GETJOB and the
synchronous ADDJOBs waiting for their copies (``repl_waits``, in the order they ran: their
replies leave in that order, see ``broker/cluster_jobs.py``) on it.
"""

from __future__ import annotations

from typing import Any, Final

from broker.acl import User
from broker.timers import NOT_SCHEDULED, Timed


class _Blocked:
    __slots__ = ()

    def __repr__(self) -> str:
        return "BLOCKED"


#: What ``Broker.execute`` returns for a client that must wait (GETJOB, synchronous ADDJOB);
#: it lives here so ``broker.cluster_jobs`` can return it without importing ``broker.core``.
BLOCKED: Final = _Blocked()


# CLIENT REPLY (Disque's flags): OFF answers nothing; SKIP_NEXT, set by CLIENT REPLY SKIP,
# becomes SKIP once that command is done, and SKIP silences the one command after it.
REPLY_OFF: Final = 1
REPLY_SKIP_NEXT: Final = 2
REPLY_SKIP: Final = 4


def _anyone() -> User:
    user = User("default")
    user.enabled = user.nopass = user.all_commands = user.all_queues = True
    user.restricted = False
    return user


#: The user of a client whose driver names none (the broker's own clients, tests): the
#: default user as a node starts, never changed by ACL SETUSER.
ANYONE: Final = _anyone()


class Client:
    __slots__ = ("id", "addr", "name", "authenticated", "protover", "waiter", "lib_name",
                 "lib_ver", "ctime_ms", "handle", "last_cmd", "reply_flags", "repl_waits",
                 "user")

    def __init__(self, client_id: int, addr: str = "", now_ms: int = 0, handle: Any = None,
                 user: User | None = None) -> None:
        self.id = client_id
        # The ACL user it runs as (broker/acl.py): the node's default user until AUTH.
        self.user: User = user if user is not None else ANYONE
        self.addr = addr
        self.name = b""
        self.authenticated = False
        self.protover = 2
        self.waiter: Waiter | None = None
        self.lib_name = b""
        self.lib_ver = b""
        self.ctime_ms = now_ms
        self.handle = handle  # the driver's connection object
        self.last_cmd = b"NULL"  # the command running or last run (CLIENT LIST's cmd=)
        self.reply_flags = 0  # REPLY_*: 0 for a client that gets every reply
        # Its synchronous ADDJOBs whose replies have not left yet (cluster_jobs.ReplWait), in
        # order: created with the first one.
        self.repl_waits: list[Any] | None = None


def reply_wanted(client: Client) -> bool:
    """Whether the reply of the command just run goes out (CLIENT REPLY), moving SKIP on as
    Disque's resetClient does. Called only when ``client.reply_flags`` is set."""
    flags = client.reply_flags
    wanted = not flags & (REPLY_OFF | REPLY_SKIP)
    flags &= ~REPLY_SKIP
    if flags & REPLY_SKIP_NEXT:
        flags = (flags & ~REPLY_SKIP_NEXT) | REPLY_SKIP
    client.reply_flags = flags
    return wanted


class Waiter(Timed):
    """A blocked GETJOB: served with one job from the first of its queues that gets one, or
    answered with a null array at ``awake`` (0: no timeout). A blocked WAITJOB has no queues
    and its ``job_id`` set (broker/results.py); its timeout is a null bulk string."""

    __slots__ = ("client", "queues", "withcounters", "count", "awake", "active", "job_id")

    def __init__(self, client: Client, queues: tuple[bytes, ...], withcounters: bool,
                 count: int = 1) -> None:
        self.client = client
        self.queues = queues
        self.withcounters = withcounters
        # GETJOB's COUNT: served one job, it comes back for more; what federation asks for.
        self.count = count
        self.awake = 0
        self.active = True
        self.job_id = b""
        self.timer_key = NOT_SCHEDULED  # the wheel's (broker/timers.py)
