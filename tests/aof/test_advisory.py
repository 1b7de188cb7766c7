"""Advisory records (``dlv``: a job's first delivery) with the real broker and the group commit:
no reply waits for them, no fdatasync is made for them alone, a failed write of them undoes
nothing, and a restart reads them back."""

from __future__ import annotations

import errno
import threading

import pytest
import trio
import trio.testing

from broker.clients import Client
from node.persistence import PersistenceError
from tests.aof.test_core_integration import NOW, _cmd, _node, _records, _show
from tests.aof.test_persistence import RecordingFile


class GatedFile(RecordingFile):
    """A log file whose fdatasync blocks (in the writer's thread) while ``gate`` is clear."""

    def __init__(self, path: str, events: list[tuple[str, object]]) -> None:
        super().__init__(path, events)
        self.gate = threading.Event()
        self.gate.set()
        self.in_sync = threading.Event()

    def sync(self):
        self.in_sync.set()
        self.gate.wait(10)
        super().sync()


def _gated_node(tmp_path):
    files: list[GatedFile] = []
    events: list[tuple[str, object]] = []

    def open_file(path: str) -> GatedFile:
        files.append(GatedFile(path, events))
        return files[-1]

    broker, p = _node(str(tmp_path), open_file=open_file)
    return broker, p, files, events


def _getjob(broker, p) -> tuple[list, int]:
    """What the server does for one GETJOB: execute, submit its records, the ticket it waits
    for (0: none)."""
    reply = broker.execute([b"GETJOB", b"NOHANG", b"FROM", b"q"], Client(1), NOW)
    return reply, p.submit(_records(broker))


async def test_first_getjob_reply_does_not_wait_for_an_fsync(tmp_path):
    broker, p, files, events = _gated_node(tmp_path)
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            first = await _cmd(broker, p, "ADDJOB", "q", "first", 0, "RETRY", 60)
            syncs = p.fsync_count
            # An ADDJOB whose batch is stuck in fdatasync (a slow disk).
            f = files[0]
            f.gate.clear()
            f.in_sync.clear()
            added = trio.Event()

            async def producer() -> None:
                await _cmd(broker, p, "ADDJOB", "q", "second", 0)
                added.set()

            n.start_soon(producer)
            await trio.to_thread.run_sync(f.in_sync.wait, 5)
            # Meanwhile the first job's first delivery: answered at once, ticket 0.
            reply, ticket = _getjob(broker, p)
            assert reply[0][1] == first and ticket == 0
            await p.wait_durable(ticket)  # returns without waiting
            assert not added.is_set() and p.fsync_count == syncs  # the disk is still stuck
            f.gate.set()
            await added.wait()
            await trio.testing.wait_all_tasks_blocked()
            # The ADDJOB's batch had one fdatasync; the batch holding only the dlv record was
            # written with none of its own.
            assert p.fsync_count == syncs + 1
            assert events[-1][0] == "write"
            # The next command that logs covers it with its fdatasync.
            await _cmd(broker, p, "ACKJOB", first)
            assert events[-1] == ("sync", f.size())
            n.cancel_scope.cancel()
    again, _ = _node(str(tmp_path))
    assert first not in again.jobs and len(again.jobs) == 1


async def test_a_restart_reads_the_delivery_time_back(tmp_path):
    broker, p, _, _ = _gated_node(tmp_path)
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            job_id = await _cmd(broker, p, "ADDJOB", "q", "body", 0, "RETRY", 60)
            _getjob(broker, p)
            await _cmd(broker, p, "ADDJOB", "q", "other", 0)  # writes after the dlv
            n.cancel_scope.cancel()
    again, _ = _node(str(tmp_path))
    assert again.jobs[job_id].dtime == NOW


@pytest.mark.parametrize("fault", ["write", "sync"])
async def test_failed_write_of_the_delivery_record_undoes_nothing(tmp_path, fault):
    broker, p, files, _ = _gated_node(tmp_path)
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            delivered = await _cmd(broker, p, "ADDJOB", "q", "a", 0, "RETRY", 60)
            await _cmd(broker, p, "ADDJOB", "q", "b", 0, "RETRY", 60)
            if fault == "write":
                files[0].fail = errno.ENOSPC
            else:
                files[0].fail_sync = errno.EIO
            # GETJOB (dlv only) and an ACKJOB land in the same failing batch.
            reply, ticket = _getjob(broker, p)
            assert reply[0][1] == delivered and ticket == 0
            with pytest.raises(PersistenceError):
                await _cmd(broker, p, "ACKJOB", reply[0][1])  # undone: it replies an error
            await trio.testing.wait_all_tasks_blocked()
            # The delivery stands: the client has the job, it is not back in the queue, and
            # its delivery time stays (the ACKJOB's undo put the job back as delivered).
            assert _show(broker, delivered)[b"state"] == b"active"
            assert broker.execute([b"QLEN", b"q"], Client(2), NOW) == 1
            assert broker.jobs[delivered].dtime == NOW
            files[0].fail = files[0].fail_sync = None
            n.cancel_scope.cancel()


async def test_a_batch_of_dlv_only_that_fails_answers_nobody_an_error(tmp_path):
    broker, p, files, _ = _gated_node(tmp_path)
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            job_id = await _cmd(broker, p, "ADDJOB", "q", "a", 0)
            files[0].fail = errno.ENOSPC
            reply, ticket = _getjob(broker, p)
            assert reply[0][1] == job_id and ticket == 0
            await trio.testing.wait_all_tasks_blocked()
            assert p.info()[8] == ("aof_last_write_status", "err")  # the write was tried
            assert broker.jobs[job_id].dtime == NOW and job_id in broker.jobs
            files[0].fail = None
            n.cancel_scope.cancel()
