"""Current redis-py connects to a node without special options, over RESP2 and RESP3."""

from __future__ import annotations

import pytest
import redis

from tests.support.server import ServerProcess


@pytest.mark.parametrize("protocol", [2, 3])
def test_redis_py_produces_and_consumes(protocol: int) -> None:
    with ServerProcess(requirepass="pw") as node:
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=node.port, protocol=protocol).ping()
        r = redis.Redis(port=node.port, password="pw", protocol=protocol, client_name="w1")
        assert r.ping() is True
        job_id = r.execute_command("ADDJOB", "rq", b"\xff\x00body", 0)
        assert job_id.startswith(b"D-")
        [[queue, got_id, body, *counters]] = r.execute_command(
            "GETJOB", "WITHCOUNTERS", "FROM", "rq")
        assert (queue, got_id, body) == (b"rq", job_id, b"\xff\x00body")
        assert counters == [b"nacks", 0, b"additional-deliveries", 0]
        assert r.execute_command("ACKJOB", got_id) == 1
        assert r.execute_command("CLIENT", "GETNAME") == b"w1"
        assert r.info("jobs") == {"registered_jobs": 0}
        listed = r.client_list()
        assert any(c["name"] == "w1" and c["addr"].startswith("127.0.0.1:") for c in listed)
        r.close()
