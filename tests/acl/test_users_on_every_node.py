"""ACL users replicate to the whole cluster (cluster/user_sync.py): real nodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from tests.support.cluster import LocalCluster, local_cluster, wait_until

__all__ = ["local_cluster"]  # the fixture


def _logs_in(port: int, user: str, password: str) -> bool:
    try:
        r = redis.Redis(port=port, username=user, password=password, socket_timeout=5)
        return bool(r.ping())
    except (redis.AuthenticationError, redis.exceptions.NoPermissionError):
        # NOPERM: the user was deleted between AUTH and PING (a deleted user's connections
        # stay, and may run nothing).
        return False


def test_a_user_made_on_one_node_logs_in_on_every_node(
        local_cluster: Callable[..., LocalCluster]) -> None:
    c = local_cluster(3, directives=[{"aclfile": "users.acl"}] * 3)
    c.meet(0, 1)
    c.meet(0, 2)
    ids = [c.myid(i) for i in range(3)]
    wait_until(lambda: c.mesh_ok([0, 1, 2], ids), 20, "mesh")
    assert c.call(0, "ACL", "SETUSER", "app", "on", ">pw", "~jobs:*", "+@jobs", "+ping") == b"OK"
    for i in (1, 2):
        wait_until(lambda i=i: _logs_in(c.port(i), "app", "pw"), 20, f"app on node {i}")
    r2 = redis.Redis(port=c.port(2), username="app", password="pw")
    assert r2.execute_command("ADDJOB", "jobs:1", "x", "0").startswith(b"D-")
    try:
        r2.execute_command("QLEN", "jobs:1")
        raise AssertionError("QLEN is @queues")
    except redis.exceptions.NoPermissionError:
        pass
    # A change on another node wins everywhere, and a deletion too.
    assert c.call(1, "ACL", "SETUSER", "app", "<pw", ">pw2") == b"OK"
    wait_until(lambda: _logs_in(c.port(0), "app", "pw2") and not _logs_in(c.port(0), "app", "pw"),
               20, "the new password on node 0")
    # A node down while a user is deleted learns it when it comes back (its aclfile is older).
    c.kill(2)
    assert c.call(0, "ACL", "DELUSER", "app") == 1
    c.restart(2)
    wait_until(lambda: not _logs_in(c.port(2), "app", "pw2"), 30, "the deletion on node 2")
    users: Any = c.call(2, "ACL", "USERS")
    assert users == [b"default"]
