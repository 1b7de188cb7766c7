"""Authentication and memory limits in the pure core: what a client is refused, and with what."""

from __future__ import annotations

import random

from broker.clients import Client
from broker.config import Config
from broker.core import Broker
from broker.effects import LogRecord
from broker.memory import QUEUE_BYTES
from protocol.resp import Error, Status

OOM = "OOM command not allowed when used memory > 'maxmemory'."

T0 = 1_795_315_892_054


def _broker(**settings: object) -> Broker:
    config = Config()
    for name, value in settings.items():
        setattr(config, name, value)
    return Broker(config, "ab" * 20, b"seed" * 5, now_ms=T0, rng=random.Random(1))


def _run(b: Broker, client: Client, *args: str) -> object:
    return b.execute([a.encode() for a in args], client, T0)


def test_requirepass_refuses_everything_but_auth_until_authenticated() -> None:
    b = _broker(requirepass="s3cret")
    c = Client(1)
    for command in (("PING",), ("HELLO",), ("ADDJOB", "q", "x", "0"), ("QLEN", "q")):
        assert _run(b, c, *command) == "NOAUTH Authentication required."
    assert _run(b, c, "AUTH", "wrong") == "ERR invalid password"
    assert _run(b, c, "AUTH", "s3cret") == "OK"
    assert _run(b, c, "PING") == "PONG"
    assert isinstance(_run(b, c, "ADDJOB", "q", "x", "0"), Status)
    # A wrong password later takes the authentication away again, as in Disque.
    assert _run(b, c, "AUTH", "nope") == "ERR invalid password"
    assert _run(b, c, "QLEN", "q") == "NOAUTH Authentication required."


def test_redis6_hello_handshake_authenticates() -> None:
    b = _broker(requirepass="pw")
    c = Client(7)
    assert _run(b, c, "HELLO", "3", "AUTH", "default", "bad") == (
        "WRONGPASS invalid username-password pair or user is disabled.")
    reply = _run(b, c, "HELLO", "3", "AUTH", "default", "pw", "SETNAME", "worker-1")
    assert isinstance(reply, dict) and reply[b"proto"] == 3 and reply[b"id"] == 7
    assert c.protover == 3 and c.name == b"worker-1"
    assert _run(b, c, "HELLO", "4") == "NOPROTO unsupported protocol version"


def test_auth_without_requirepass_is_an_error() -> None:
    assert _run(_broker(), Client(1), "AUTH", "x") == "ERR Client sent AUTH, but no password is set"


def test_memory_levels_refuse_addjob_as_disque_does() -> None:
    b = _broker(maxmemory=100_000)
    c = Client(1)
    b.runtime_bytes = 70_000
    assert isinstance(_run(b, c, "ADDJOB", "q", "x", "0"), Status)
    b.runtime_bytes = 80_000  # above 75 %: a single node cannot keep a copy
    reply = _run(b, c, "ADDJOB", "q", "x", "0")
    assert isinstance(reply, Error) and reply.startswith("NOREPL ") and reply.endswith(
        "for the following reason: I'm out of memory")
    b.runtime_bytes = 94_000  # above 95 % with the job and the queue
    assert _run(b, c, "ADDJOB", "q", "x", "0") == (
        "OOM command not allowed when used memory > 'maxmemory'.")
    assert _run(b, c, "INFO", "jobs") == b"# Jobs\r\nregistered_jobs:1\r\n"
    # Reads still work.
    assert _run(b, c, "QLEN", "q") == 1


def test_a_body_is_judged_before_it_is_accepted() -> None:
    """Memory was judged only on the RSS sampled once a second, so a 400 MB
    body on a node with 1 GB maxmemory was accepted, and bursts overshot the limit."""
    b = _broker(maxmemory=1_000_000)
    c = Client(1)
    b.runtime_bytes = 100_000
    reply = _run(b, c, "ADDJOB", "q", "x" * 700_000, "0")  # would pass 75 %
    assert isinstance(reply, Error) and reply.endswith("I'm out of memory")
    # A burst of small jobs between two samples counts too: the 75 % level is reached before
    # the next sample, after (750,000 - 100,000 - the queue) / (body + overhead) jobs.
    accepted = 0
    while isinstance(_run(b, c, "ADDJOB", "q", "y" * 1000, "0"), Status):
        accepted += 1
        assert accepted < 1000
    assert accepted == (750_000 - 100_000 - QUEUE_BYTES) // (1000 + b.job_overhead)
    # Freed jobs give the room back before the next sample.
    for job_id in list(b.jobs):
        _run(b, c, "FASTACK", job_id.decode())
    assert isinstance(_run(b, c, "ADDJOB", "q", "y" * 1000, "0"), Status)


def test_idle_queues_go_sooner_under_memory_pressure() -> None:
    b = _broker(maxmemory=1000)
    c = Client(1)
    _run(b, c, "GETJOB", "NOHANG", "FROM", "a")  # creates the empty queue "a"
    assert b"a" in b.queues
    b.runtime_bytes = 800 - b.used_memory
    b.tick(T0 + 5_000)
    assert b"a" in b.queues  # 10 s at this level
    b.tick(T0 + 11_000)
    assert b"a" not in b.queues


def _fill_with_delivered(b: Broker, c: Client, retry: str) -> list[bytes]:
    """20 delivered jobs of 1,000 bytes, then the count taken just past 95 % of 100,000."""
    ids = []
    for _ in range(20):
        ids.append(str(_run(b, c, "ADDJOB", "q", "d" * 1000, "0", "RETRY", retry)).encode())
    assert len(_run(b, c, "GETJOB", "COUNT", "20", "FROM", "q")) == 20  # type: ignore[arg-type]
    b.runtime_bytes = 96_000 - b.used_memory
    return ids


def test_past_95_percent_delivered_at_most_once_jobs_are_freed_first() -> None:
    """Disque's freeMemoryIfNeeded under the acks policy: a RETRY 0 job already delivered is
    needed by nobody; it is freed (with its log record) before ADDJOB is judged."""
    b = _broker(maxmemory=100_000)
    c = Client(1)
    ids = _fill_with_delivered(b, c, "0")
    b.take_effects()
    reply = _run(b, c, "ADDJOB", "q", "x", "0")
    # Back under 95 % but above 75 %: a single node still cannot keep a copy.
    assert isinstance(reply, Error) and reply.endswith("I'm out of memory"), reply
    assert 0 < len(b.jobs) < 20 and b.used_memory <= 95_000
    freed = [e for e in b.take_effects() if isinstance(e, LogRecord) and e.kind == "del"]
    assert {e.payload for e in freed} == set(ids) - set(b.jobs)


def test_past_95_percent_jobs_still_needed_are_kept_and_addjob_refused() -> None:
    b = _broker(maxmemory=100_000)
    c = Client(1)
    _fill_with_delivered(b, c, "5")  # will be queued again: needed
    assert _run(b, c, "ADDJOB", "q", "x", "0") == OOM
    assert len(b.jobs) == 20


def test_noeviction_frees_nothing() -> None:
    b = _broker(maxmemory=100_000, maxmemory_policy="noeviction")
    c = Client(1)
    _fill_with_delivered(b, c, "0")
    assert _run(b, c, "ADDJOB", "q", "x", "0") == OOM
    assert len(b.jobs) == 20


def test_past_95_percent_nack_and_enqueue_are_refused_too() -> None:
    b = _broker(maxmemory=100_000)
    c = Client(1)
    ids = _fill_with_delivered(b, c, "5")
    assert _run(b, c, "NACK", ids[0].decode()) == OOM
    assert _run(b, c, "ENQUEUE", ids[0].decode()) == OOM
    assert _run(b, c, "ACKJOB", ids[0].decode()) == 1  # acks free memory: allowed
