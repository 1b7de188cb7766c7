"""What the broker knows of a connected client, and of a client blocked in GETJOB.

The driver creates a ``Client`` per connection and passes it with every command; the broker
records authentication, protocol version, name and the ``Waiter`` of a blocked GETJOB on it.
"""

from __future__ import annotations

from typing import Any, Final

from broker.timers import NOT_SCHEDULED, Timed


class _Blocked:
    __slots__ = ()

    def __repr__(self) -> str:
        return "BLOCKED"


#: What ``Broker.execute`` returns for a client that must wait (GETJOB, synchronous ADDJOB);
#: it lives here so ``broker.cluster_jobs`` can return it without importing ``broker.core``.
BLOCKED: Final = _Blocked()


class Client:
    __slots__ = ("id", "addr", "name", "authenticated", "protover", "waiter", "lib_name",
                 "lib_ver", "ctime_ms", "handle", "last_cmd")

    def __init__(self, client_id: int, addr: str = "", now_ms: int = 0, handle: Any = None) -> None:
        self.id = client_id
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


class Waiter(Timed):
    """A blocked GETJOB: served with one job from the first of its queues that gets one, or
    answered with a null array at ``awake`` (0: no timeout)."""

    __slots__ = ("client", "queues", "withcounters", "awake", "active")

    def __init__(self, client: Client, queues: tuple[bytes, ...], withcounters: bool) -> None:
        self.client = client
        self.queues = queues
        self.withcounters = withcounters
        self.awake = 0
        self.active = True
        self.timer_key = NOT_SCHEDULED  # the wheel's (broker/timers.py)
