"""used_memory on a real node counts the data it holds, not the interpreter (docs/limits.md):
a small maxmemory bounds the jobs, as Disque's does."""

from __future__ import annotations

import time

from protocol.resp import Error, encode_command
from tests.hardening.test_resources import _pipeline
from tests.support.server import ServerProcess

# docs/limits.md, "Memory": what a queued job costs beyond its body, per core.
JOB_OVERHEAD = {"compiled": 390, "pure": 480}
OUT_OF_MEMORY = ("NOREPL Not enough reachable nodes for the requested replication level, since "
                 "I'm unable to hold a copy of the message for the following reason: "
                 "I'm out of memory")
OOM = "OOM command not allowed when used memory > 'maxmemory'."


def _info(srv: ServerProcess, section: str) -> dict[str, str]:
    text = srv.call("INFO", section).decode()
    return dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)


def _used(srv: ServerProcess) -> int:
    return int(_info(srv, "memory")["used_memory"])


def test_a_fresh_node_reports_its_data_and_its_process_apart() -> None:
    with ServerProcess() as srv:
        mem = _info(srv, "memory")
        assert int(mem["used_memory"]) < 100_000  # one client and nothing else
        assert int(mem["used_memory_rss"]) > 10_000_000  # the interpreter
        assert 0 < int(mem["used_memory_startup"]) <= int(mem["used_memory_rss"])
        assert int(mem["used_memory_peak"]) >= int(mem["used_memory"])


def test_jobs_grow_used_memory_by_the_documented_cost() -> None:
    jobs, body = 5000, 1000
    with ServerProcess() as srv:
        core = _info(srv, "server")["trisque_core"]
        srv.call("ADDJOB", "q", "first", 0)  # the queue exists
        before = _used(srv)
        adds = [encode_command("ADDJOB", "q", b"%05d" % i + b"j" * (body - 5), 0)
                for i in range(jobs)]
        for start in range(0, jobs, 1000):
            replies = _pipeline(srv.port, adds[start:start + 1000])
            assert all(isinstance(r, bytes) and r.startswith(b"D-") for r in replies)
        grown = _used(srv) - before
        expected = jobs * (body + JOB_OVERHEAD[core])
        assert abs(grown - expected) <= expected // 10, (grown / jobs, expected / jobs)
        peak = int(_info(srv, "memory")["used_memory_peak"])
        assert srv.call("DEBUG", "FLUSHALL") == b"OK"
        assert _used(srv) < before  # the jobs and their queue are gone
        assert int(_info(srv, "memory")["used_memory_peak"]) == peak


def test_a_small_maxmemory_takes_jobs_until_75_then_95_percent() -> None:
    """Before, used_memory was the RSS (about 40 MB): the first ADDJOB under a 3 MB
    maxmemory was refused. Now jobs fill 75 % of it; a single node then cannot keep a copy,
    and past 95 % ADDJOB is refused: the reference's behaviour and texts (the fixture's
    "maxmemory 3000000 on one node": 138 jobs of 10,000 bytes from its 772,624-byte start)."""
    limit, body = 3_000_000, 10_000
    with ServerProcess(maxmemory=limit) as srv:
        accepted = 0
        while True:
            reply = srv.call("ADDJOB", "q", b"m" * body, 0)
            if isinstance(reply, Error):
                break
            accepted += 1
            assert accepted < 1000, _used(srv)
        assert reply == OUT_OF_MEMORY
        used = _used(srv)
        assert limit * 0.72 <= used <= limit * 0.76, used
        assert accepted >= limit * 0.7 // (body + 500)
        # Past 95 % (a body that takes it there): -OOM, and nothing is kept.
        assert srv.call("ADDJOB", "q", b"m" * (limit // 4), 0) == OOM
        assert int(_info(srv, "jobs")["registered_jobs"]) == accepted
        # Acknowledged jobs give the room back at once.
        ids = srv.call("GETJOB", "NOHANG", "COUNT", 10, "FROM", "q")
        assert srv.call("FASTACK", *[job[1] for job in ids]) == 10
        time.sleep(0.01)
        assert isinstance(srv.call("ADDJOB", "q", b"m" * body, 0), bytes)
