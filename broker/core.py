"""The broker: one node's jobs, queues and clients, one command at a time, without I/O.

Theory of operation
-------------------
``Broker.execute(argv, client, now_ms)`` runs one command and returns its reply, ``BLOCKED``
when the client must wait (GETJOB with nothing to deliver), or an intent
(``broker/intents.py``) for the runtime to finish. It looks the command up in the command table
(``broker/command_table.py``: unknown command and arity), answers NOAUTH to a client that must
authenticate first unless the row says ``no-auth``, sends a client whose ACL user is
restricted through ``execute_restricted`` (broker/acl_users.py's checks), parses argv with the row's parser (the
command's own argument checks) and calls the row's handler: Disque's order. The state and the
handlers are ``BrokerState``'s (``broker/state.py``: timers, the outbox of effects, replay).
"""

from __future__ import annotations

from typing import Any, Final

from broker import command_table
from broker.acl_users import (
    QUEUE_DENIED,
    command_denied,
    command_name,
    first_arg,
    queues_allowed,
    queues_named,
)
from broker.clients import BLOCKED as BLOCKED  # re-exported: the node imports it here
from broker.clients import Client
from broker.command_table import Row, lookup
from broker.state import REQUEUE_JITTER_MS as REQUEUE_JITTER_MS
from broker.state import BrokerState
from broker.state import requeue_jitter as requeue_jitter
from broker.version import VERSION as _VERSION
from protocol import errors
from protocol.commands import parse_addjob, parse_getjob, parse_jobs
from protocol.resp import Error

# The rows of the commands of every job's life, which execute calls directly (compiled, a
# direct call of a native function; through the row, a call of a Python object). Final: a C
# static, where an imported name is read from the module's dictionary.
_ADDJOB: Final = command_table.ADDJOB
_GETJOB: Final = command_table.GETJOB
_ACKJOB: Final = command_table.ACKJOB


class Broker(BrokerState):
    def execute(self, argv: list[bytes], client: Client, now_ms: int) -> Any:
        row = lookup(argv)
        if isinstance(row, Error):
            return row
        if not row.no_auth and self.acl.auth_required and not client.authenticated:
            return errors.NOAUTH
        if client.user.restricted and not row.no_auth:  # the one ACL test of the hot path
            return self.execute_restricted(row, argv, client, now_ms)
        # The same parser and handler as the row's (tests/broker/test_command_table.py).
        if row is _ADDJOB:
            add = parse_addjob(argv)
            if isinstance(add, Error):
                return add
            return self.addjob(add, client, now_ms)
        if row is _GETJOB:
            get = parse_getjob(argv)
            if isinstance(get, Error):
                return get
            return self.getjob(get, client, now_ms)
        if row is _ACKJOB:
            ack = parse_jobs(argv)
            if isinstance(ack, Error):
                return ack
            return self.ackjob(ack, client, now_ms)
        cmd = row.parser(argv)
        if isinstance(cmd, Error):
            return cmd
        return row.handler(self, cmd, client, now_ms)


    def execute_restricted(self, row: Row[Any], argv: list[bytes], client: Client,
                           now_ms: int) -> Any:
        """``execute`` for a user who may not run everything everywhere: the command, then
        every queue it names (broker/acl_users.py), then the row's parser and handler."""
        user = client.user
        name = row.name.decode()
        if not user.may_run(name, first_arg(argv)):
            full = command_name(argv, name)
            self.acl.record("command", full, client, user.name, now_ms)
            return command_denied(user.name, full)
        cmd = row.parser(argv)
        if isinstance(cmd, Error):
            return cmd
        named = queues_named(self.jobs, cmd)
        if named is not None:
            refused = queues_allowed(user, named)
            if refused is not None:
                self.acl.record("key", refused.decode("utf-8", "replace"), client, user.name,
                                now_ms)
                return QUEUE_DENIED
        return row.handler(self, cmd, client, now_ms)

    def may_run_ahead(self, argv: list[bytes]) -> bool:
        """Whether ``argv`` may run while its client's earlier ADDJOBs wait for their copies,
        its reply queued behind theirs (the connection's pipelined ADDJOBs,
        node/conn_core.py): only an ADDJOB whose outcome cannot depend on those jobs. Not one
        with MAXLEN (it counts the queue's jobs, which the waiting ones join when confirmed),
        nor one into a queue with a policy (deduplication looks for the same body among the
        queue's jobs). Anything else waits for their replies, as it would behind a client
        that sends one command at a time: a GETJOB there could never see a job whose ADDJOB
        has not replied."""
        if len(argv) < 4 or argv[0].lower() != b"addjob":
            return False
        if self.policies.live and self.policies.get(argv[1]) is not None:
            return False
        for i in range(4, len(argv)):  # options and their numbers: a number is no MAXLEN
            if argv[i].lower() == b"maxlen":
                return False
        return True


VERSION: Final = _VERSION
