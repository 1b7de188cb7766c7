"""ACL users replicated to every node: a small core beside the queue policy core.

Theory of operation
-------------------
Every node holds every user (``broker.acl_users.Users``), each name stamped ``(ms,
node_id)``; a deletion keeps its stamp as a tombstone. Merging keeps the greater stamp, so
the order versions arrive in does not matter. One message type, ``USERS`` (42), carries
``{"users": [["user", name, rules | None, ms, node], ...]}`` (the rules as ``describe``
writes them: passwords as SHA-256, never in clear), sent as ``cluster/table_sync.py``
describes: a change at once to every reachable node, the whole table to a node that gains a
link and every 5 s to one random node. So a user created on one node logs in on any.

A version received is checked by applying its rules to a new user: a record no node could
have written is dropped as malformed. Bus frames are authenticated by ``cluster-secret``;
without it protected mode keeps the bus to loopback peers (docs/security.md).
"""

from __future__ import annotations

import random
from typing import Any

from broker import acl
from broker.acl import User
from broker.acl_users import Users
from broker.core import Broker
from cluster.membership import Membership
from cluster.table_sync import TableSync
from cluster.wire import MalformedBody, MessageType

Stamp = tuple[int, str]


class UserSync(TableSync):
    HANDLES: frozenset[MessageType] = frozenset({MessageType.USERS})
    MESSAGE = MessageType.USERS
    KEY = "users"
    KIND = "users"

    def __init__(self, broker: Broker, membership: Membership,
                 rng: random.Random | None = None, now_ms: int = 0) -> None:
        super().__init__(membership, rng, now_ms)
        self.users: Users = broker.acl
        self._applying = False

    def _record(self, name: str) -> list[Any]:
        ms, node = self.users.stamps.get(name, (0, ""))
        user = self.users.users.get(name)
        return ["user", name, acl.describe(user) if user is not None else None, ms, node]

    def records(self) -> list[Any]:
        names = set(self.users.users) | set(self.users.stamps)
        return [self._record(n) for n in sorted(names)]

    def empty(self) -> bool:
        return False  # the default user is always there

    def parse_record(self, rec: Any) -> tuple[str, User | None, Stamp]:
        if (not isinstance(rec, list) or len(rec) != 5 or rec[0] != "user"
                or not isinstance(rec[1], str) or not isinstance(rec[3], int)
                or not isinstance(rec[4], str)
                or not acl.valid_name(rec[1].encode("utf-8", "surrogateescape"))):
            raise MalformedBody("a user record a node could not have written")
        rules = rec[2]
        if rules is None:
            if rec[1] == "default":
                raise MalformedBody("the default user cannot be deleted")
            return rec[1], None, (rec[3], rec[4])
        if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
            raise MalformedBody("a user's rules are not a list of strings")
        user = acl.new_user(rec[1])
        if acl.apply_all(user, rules) is not None:
            raise MalformedBody("a user's rules do not parse")
        return rec[1], user, (rec[3], rec[4])

    def apply(self, item: tuple[str, User | None, Stamp], sender: str, now_ms: int) -> bool:
        name, user, stamp = item
        if stamp <= self.users.stamps.get(name, (0, "")):
            return False
        self.users.stamps[name] = stamp
        self._applying = True
        try:
            if user is None:
                self.users.drop(name)
            else:
                self.users.put(user)
        finally:
            self._applying = False
        return True

    def newer_than(self, items: list[tuple[str, User | None, Stamp]]) -> list[Any]:
        theirs = {name: stamp for name, _, stamp in items}
        return [self._record(n) for n, stamp in sorted(self.users.stamps.items())
                if theirs.get(n, (-1, "")) < stamp]

    def changed(self, name: str, user: User | None) -> None:
        """A user changed on this node (``Users.changed``): sent to every node."""
        if not self._applying and name in self.users.stamps:
            self.broadcast([self._record(name)])
