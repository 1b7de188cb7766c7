"""The append log with the real ``broker.core.Broker`` (in-process, no sockets)."""

from __future__ import annotations

import errno
import os

import pytest
import trio

from broker import core
from broker.clients import Client
from broker.config import Config
from broker.effects import LogRecord
from node import logfile
from node.persistence import Persistence, PersistenceError
from tests.aof.test_persistence import RecordingFile

NOW = 1_700_000_000_000
NODE = "abcdef01" * 5


def _config(directory: str, **kw: object) -> Config:
    c = Config()
    c.dir = directory
    c.appendonly = True
    c.appendfsync = "always"
    for k, v in kw.items():
        setattr(c, k, v)
    return c


def _node(directory: str, open_file=logfile.OsLogFile, **kw: object):
    config = _config(directory, **kw)
    broker = core.Broker(config, NODE, os.urandom(8), now_ms=NOW)
    p = Persistence(config, broker, open_file=open_file)
    p.load(NOW)
    return broker, p


_CLIENT = Client(1)


def _records(broker) -> list[LogRecord]:
    """The log records among the broker's effects (the server's route() does the same)."""
    return [e for e in broker.take_effects() if isinstance(e, LogRecord)]


async def _cmd(broker, p, *args: object, client=_CLIENT):
    reply = broker.execute([a if isinstance(a, bytes) else str(a).encode() for a in args],
                           client, NOW)
    await p.wait_durable(p.submit(_records(broker)))
    return reply.encode() if isinstance(reply, str) else reply  # ADDJOB: a status reply


def _show(broker, job_id):
    reply = broker.execute([b"SHOW", job_id], Client(9), NOW)
    return None if reply is None else dict(zip(reply[::2], reply[1::2], strict=True))


async def test_jobs_and_counters_survive_a_restart(tmp_path):
    broker, p = _node(str(tmp_path))
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            ids = [await _cmd(broker, p, "ADDJOB", "q", f"body{i}", 0, "RETRY", 5)
                   for i in range(50)]
            await _cmd(broker, p, "GETJOB", "NOHANG", "COUNT", 5, "FROM", "q")
            await _cmd(broker, p, "NACK", ids[0], ids[1])
            await _cmd(broker, p, "ACKJOB", ids[2], ids[3])
            await _cmd(broker, p, "DELJOB", ids[4])
            n.cancel_scope.cancel()
    again, _ = _node(str(tmp_path))
    assert set(again.jobs) == set(ids[:2] + ids[5:])
    for job_id in ids[:2] + ids[5:]:
        a, b = _show(broker, job_id), _show(again, job_id)
        for field in (b"body", b"nacks", b"additional-deliveries", b"ctime", b"retry", b"ttl"):
            assert a[field] == b[field], (job_id, field)


async def test_failed_write_undoes_addjob_and_ackjob_in_the_core(tmp_path):
    files: list[RecordingFile] = []

    def open_file(path: str) -> RecordingFile:
        files.append(RecordingFile(path, []))
        return files[-1]

    broker, p = _node(str(tmp_path), open_file=open_file)
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            kept = await _cmd(broker, p, "ADDJOB", "q", "kept", 0)
            files[0].fail = errno.ENOSPC
            with pytest.raises(PersistenceError, match="No space left on device"):
                await _cmd(broker, p, "ADDJOB", "q", "lost", 0)
            with pytest.raises(PersistenceError):
                await _cmd(broker, p, "ACKJOB", kept)
            # Memory is as before the failed commands: one job, still queued.
            assert list(broker.jobs) == [kept]
            assert broker.execute([b"QLEN", b"q"], Client(2), NOW) == 1
            files[0].fail = None
            assert await _cmd(broker, p, "ACKJOB", kept) == 1
            n.cancel_scope.cancel()
    again, _ = _node(str(tmp_path))
    assert again.jobs == {}


@pytest.mark.slow
async def test_rewrite_of_the_real_broker_under_churn(tmp_path):
    broker, p = _node(str(tmp_path))
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            ids = [await _cmd(broker, p, "ADDJOB", "q", f"b{i}", 0) for i in range(3000)]
            for job_id in ids[:1500]:
                await _cmd(broker, p, "ACKJOB", job_id)

            async def churn(k: int) -> None:
                for i in range(100):
                    job_id = await _cmd(broker, p, "ADDJOB", f"q{k}", f"c{i}", 0)
                    if i % 2:
                        await _cmd(broker, p, "ACKJOB", job_id)

            assert (await p.bgrewrite()).startswith("Background")
            async with trio.open_nursery() as clients:
                for k in range(5):
                    clients.start_soon(churn, k)
            while dict(p.info())["aof_rewrite_in_progress"]:
                await trio.sleep(0.01)
            assert dict(p.info())["aof_last_bgrewrite_status"] == "ok"
            n.cancel_scope.cancel()
    again, _ = _node(str(tmp_path))
    assert set(again.jobs) == set(broker.jobs)


async def test_a_replay_keeps_no_object_of_an_acknowledged_job(tmp_path):
    """Acknowledged jobs of the replayed history leave the scan list at load (it compacts by
    itself only once holes outnumber live jobs: here they are exactly half)."""
    broker, p = _node(str(tmp_path))
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            ids = [await _cmd(broker, p, "ADDJOB", "q", f"body{i}", 0) for i in range(300)]
            await _cmd(broker, p, "ACKJOB", *ids[:150])
            n.cancel_scope.cancel()
    again, _ = _node(str(tmp_path))
    assert len(again.jobs) == 150
    assert len(again.job_scan._items) == 150
