"""What the broker asks the node's runtime to carry out.

Theory of operation
-------------------
Some commands cannot be finished without the process, the network or the disk: stopping the
node, rewriting the append log or the config file, closing or pausing other clients, streaming
MONITOR output. The broker still owns them like every other command: each has its row in the
command table (``broker/command_table.py``, flag ``runtime``), which checks its arity and
authentication, and its parser and handler (``broker/admin.py``) check its arguments; the
handler then returns one of these frozen intents instead of a reply. The node carries each out
through one table of its own, intent type -> function (``node.server.INTENTS``), and answers
the client. So there is one dispatcher for commands, and the node's table only for intents.
"""

from __future__ import annotations

from dataclasses import dataclass

# A directive's value as Config holds it (int, bool, str...). Named: mypyc's dataclasses load a
# field's annotation by name, and fail on a bare ``object``.
ConfigValue = object


class Intent:
    """Base of every intent: the driver tells a reply from an intent with one isinstance."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Quit(Intent):
    """Reply +OK, write every reply before it, then close the connection."""


@dataclass(frozen=True, slots=True)
class Shutdown(Intent):
    rewrite: bool  # SHUTDOWN REWRITE-AOF: end with an exact snapshot


@dataclass(frozen=True, slots=True)
class RewriteLog(Intent):
    """BGREWRITEAOF."""


@dataclass(frozen=True, slots=True)
class RewriteConfig(Intent):
    """CONFIG REWRITE."""


@dataclass(frozen=True, slots=True)
class ConfigApplied(Intent):
    """CONFIG SET of a directive the runtime must act on (appendonly, maxclients). The value is
    already set; ``previous`` is what to put back if the runtime cannot carry it out."""

    name: str
    previous: ConfigValue


@dataclass(frozen=True, slots=True)
class ResetStats(Intent):
    """CONFIG RESETSTAT: the runtime's counters (command statistics)."""


@dataclass(frozen=True, slots=True)
class Monitor(Intent):
    """MONITOR: stream every command the node runs to this client."""


@dataclass(frozen=True, slots=True)
class KillClients(Intent):
    """CLIENT KILL: close the clients that match every filter given (None: any)."""

    addr: str | None
    client_id: int | None
    skip_me: bool
    old_form: bool  # CLIENT KILL addr:port answers OK / No such client, the filters a count
    normal_only: bool = True  # TYPE normal (or none); TYPE master/slave/pubsub match nobody


@dataclass(frozen=True, slots=True)
class PauseClients(Intent):
    """CLIENT PAUSE: no client's command runs before ``until_ms`` (a later pause extends it)."""

    until_ms: int


@dataclass(frozen=True, slots=True)
class AclSave(Intent):
    """ACL SAVE: write every user to the aclfile."""


@dataclass(frozen=True, slots=True)
class AclLoad(Intent):
    """ACL LOAD: replace the users with the aclfile's (all of them, or none on an error)."""
