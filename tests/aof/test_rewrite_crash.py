"""A process killed at any step of a rewrite leaves a log that loads with every job (and,
with bodies in the log, every body).

The rewrite runs in a forked child that ``os._exit``s (no cleanup, no flush: a crash) just
before the n-th step; the parent then starts a node on the directory as a restart would.
"""

from __future__ import annotations

import os

import pytest
import trio

from broker import aof, core
from broker.clients import Client
from broker.config import Config as NodeConfig
from broker.effects import LogRecord
from broker.job import BodyRef
from node import logfile
from node.persistence import Persistence
from tests.aof.fakebroker import Config, FakeBroker

STEPS = ["write", "write", "fsync", "rename", "fsync-dir", "done"]


def _history(path: str) -> dict[bytes, list[object]]:
    """An old log with history (acks, nacks); returns the live jobs it stands for."""
    broker = FakeBroker()
    for i in range(200):
        broker.addjob(b"D-%d" % i, body=b"b%d" % i)
        if i % 3 == 0:
            broker.nack(b"D-%d" % i)
        if i % 2 == 0:
            broker.ackjob(b"D-%d" % i)
    logfile.create_log(path)
    with open(path, "ab") as f:
        f.write(aof.encode_records(broker.take_effects()))
    return broker.jobs


@pytest.mark.parametrize("crash_before", range(len(STEPS)))
def test_crash_at_each_rewrite_step_leaves_a_loadable_log(tmp_path, crash_before):
    path = str(tmp_path / "appendonly.aof")
    live = _history(path)
    old_size = os.path.getsize(path)
    pid = os.fork()
    if pid == 0:  # the child: rewrite, dying just before step number `crash_before`
        seen = 0

        def step(name: str) -> None:
            nonlocal seen
            if seen == crash_before:
                os._exit(0)
            seen += 1

        try:
            logfile.write_snapshot(path, [("job", list(v)) for v in live.values()], step=step)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) in (0, 3)
    renamed = crash_before > STEPS.index("rename")
    assert (os.path.getsize(path) < old_size) == renamed
    broker = FakeBroker()
    Persistence(Config(str(tmp_path)), broker).load(0)
    assert {k: v[:3] + v[4:] for k, v in broker.jobs.items()} == \
        {k: v[:3] + v[4:] for k, v in live.items()}
    assert not [f for f in os.listdir(tmp_path) if f.startswith(logfile.TEMP_PREFIX)]


# -- bodies in the log (body-memory-max) ---------------------------------------------------------

BODY_STEPS = ["write", "fsync", "rename", "fsync-dir", "done", None]  # None: the switch happens


def _body_node(directory: str, step=lambda name: None):
    config = NodeConfig()
    config.dir, config.appendonly, config.appendfsync = directory, True, "always"
    config.body_memory_max = 256
    broker = core.Broker(config, "abcdef01" * 5, os.urandom(8), now_ms=1_700_000_000_000)
    p = Persistence(config, broker, rewrite_step=step)
    p.load(1_700_000_000_000)
    return broker, p


def _body_of(broker, p, job_id: bytes) -> bytes | None:
    reply = broker.execute([b"SHOW", job_id], Client(9), 1_700_000_000_000)
    if reply is None:
        return None
    body = dict(zip(reply[::2], reply[1::2], strict=True))[b"body"]
    return p.bodies.read(body) if type(body) is BodyRef else body


async def _body_cmd(broker, p, *args: bytes) -> object:
    reply = broker.execute(list(args), Client(1), 1_700_000_000_000)
    records = [e for e in broker.take_effects() if isinstance(e, LogRecord)]
    await p.wait_durable(p.submit(records))
    return reply


@pytest.mark.parametrize("crash_before", BODY_STEPS, ids=lambda s: s or "after-switch")
def test_crash_in_a_rewrite_that_moves_bodies_loses_none(tmp_path, crash_before):
    """A node whose bodies are in the log rewrites it while clients add more; it dies before a
    step of the rewrite (or just after the switch, with jobs added on the new file). Every job
    it acknowledged comes back with the body that was added, wherever it then lies."""
    directory = str(tmp_path)
    acked_path = tmp_path / "acked"
    broker, p = _body_node(directory)
    bodies = {}

    async def fill() -> None:
        async with trio.open_nursery() as n:
            await n.start(p.run)
            for i in range(300):
                body = os.urandom(300 + i * 7)
                job_id = await _body_cmd(broker, p, b"ADDJOB", b"q", body, b"0")
                bodies[job_id.encode() if isinstance(job_id, str) else job_id] = body
            for job_id in list(bodies)[:120]:  # dead space for the rewrite to drop
                await _body_cmd(broker, p, b"ACKJOB", job_id)
                del bodies[job_id]
            n.cancel_scope.cancel()

    trio.run(fill)
    assert broker.disk_bodies == 180
    p.bodies.close_all()
    with open(acked_path, "wb") as f:
        f.write(b"".join(b"%s %s\n" % (k, v.hex().encode()) for k, v in bodies.items()))
    pid = os.fork()
    if pid == 0:  # the child: a node on that log, crashing in (or after) its rewrite
        try:
            seen: set[str] = set()

            def step(name: str) -> None:
                if name == crash_before and name not in seen:
                    os._exit(0)
                seen.add(name)

            child, cp = _body_node(directory, step)
            out = os.open(acked_path, os.O_WRONLY | os.O_APPEND)

            async def rewrite_under_load() -> None:
                async with trio.open_nursery() as n:
                    await n.start(cp.run)
                    assert await cp.bgrewrite() is not None
                    for i in range(200):  # during the rewrite, then after its switch
                        body = os.urandom(400 + i)
                        job_id = await _body_cmd(child, cp, b"ADDJOB", b"r", body, b"0")
                        job_id = job_id.encode() if isinstance(job_id, str) else job_id
                        os.write(out, b"%s %s\n" % (job_id, body.hex().encode()))
                        if i % 20 == 0:
                            await trio.sleep(0.005)
                    while cp.rewrite_buf is not None:
                        await trio.sleep(0.01)
                    assert cp.rewrites == 1
                    # The references now name the new file: each reads back right.
                    for line in open(acked_path, "rb").read().splitlines():
                        job_id, hexed = line.split()
                        assert _body_of(child, cp, job_id) == bytes.fromhex(hexed.decode())
                    os._exit(0)  # a crash: nothing flushed, nothing closed

            trio.run(rewrite_under_load)
        except BaseException:
            import traceback

            traceback.print_exc()  # shown by pytest with the failed exit status
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    again, p2 = _body_node(directory)
    acked = dict(line.split() for line in acked_path.read_bytes().splitlines())
    assert len(acked) >= 180 + (200 if crash_before is None else 0)
    # A job written but not yet acknowledged when the node died may be there too.
    assert acked.keys() <= again.jobs.keys() and again.disk_bodies == len(again.jobs)
    assert all(isinstance(_body_of(again, p2, job_id), bytes) for job_id in again.jobs)
    for job_id, hexed in acked.items():
        assert _body_of(again, p2, job_id) == bytes.fromhex(hexed.decode()), job_id
    assert not [f for f in os.listdir(tmp_path) if f.startswith(logfile.TEMP_PREFIX)]
    p2.bodies.close_all()
