"""The timer table in the append log (broker/periodic.py's ``timer`` records): replayed at
start, kept by a rewrite, undone when a write fails, and a record no node could write is
damage, not state."""

from __future__ import annotations

import errno
import os
from typing import Any

import pytest
import trio

from broker import aof, periodic
from broker.core import Broker
from broker.periodic import Entry, Progress
from node import logfile
from node.persistence import PersistenceError
from tests.aof.test_core_integration import NOW, _cmd, _node, _records
from tests.aof.test_persistence import RecordingFile


def replicated_view(b: Broker) -> list[Any]:
    """What the log must keep of each timer: everything but this node's own counters."""
    return [(v.name, v.period_ms, v.queue, v.body, v.params, v.start_ms, v.paused,
             v.next_due_ms, v.last_fired_due_ms, v.last_fired_by, v.holder)
            for v in b.periodic.list(NOW + 60_000)]


async def _fire(broker: Broker, p: Any, name: bytes, due: int) -> Any:
    """What the cluster core does when this node owns the timer and ``due`` has come."""
    reply = periodic.fire(broker, broker.periodic.entries[name], due, NOW)
    await p.wait_durable(p.submit(_records(broker)))
    return reply


async def _fill(broker: Broker, p: Any) -> bytes:
    broker.config.timer_min_period = 1
    assert await _cmd(broker, p, "TIMER", "ADD", "a", 60, "qa", "body a", "RETRY", 30) == b"OK"
    assert await _cmd(broker, p, "TIMER", "ADD", "b", 5, "qb", "b", "START", NOW + 999) == b"OK"
    assert await _cmd(broker, p, "TIMER", "ADD", "b", 7, "qb", "b2", "REPLACE") == b"OK"
    assert await _cmd(broker, p, "TIMER", "ADD", "gone", 9, "q", "x") == b"OK"
    assert await _cmd(broker, p, "TIMER", "DEL", "gone") == 1
    assert await _cmd(broker, p, "TIMER", "PAUSE", "a") == b"OK"
    job = await _fire(broker, p, b"b", NOW)
    assert isinstance(job, str) and job.startswith("D-")
    return job.encode()


async def test_timers_and_their_progress_survive_a_restart(tmp_path: Any) -> None:
    broker, p = _node(str(tmp_path))
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            job = await _fill(broker, p)
            n.cancel_scope.cancel()
    again, _ = _node(str(tmp_path))
    assert replicated_view(again) == replicated_view(broker)
    assert [v.name for v in again.periodic.list()] == [b"a", b"b"]
    assert again.periodic.entries[b"gone"].definition is None  # the tombstone came back too
    assert again.periodic.get(b"b").progress.fired_due_ms == NOW
    # The fired job is an ordinary job, back with its derived ID.
    assert job in again.jobs and again.jobs[job].queue == b"qb"
    # The same due time fired again on this node adds nothing: its ID is held.
    assert periodic.fire(again, again.periodic.entries[b"b"], NOW, NOW) == job.decode()
    assert len(again.jobs) == 1


async def test_a_rewrite_keeps_the_table_tombstones_included(tmp_path: Any) -> None:
    broker, p = _node(str(tmp_path))
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            await _fill(broker, p)
            assert (await p.bgrewrite()).startswith("Background")
            while dict(p.info())["aof_rewrite_in_progress"]:
                await trio.sleep(0.01)
            assert dict(p.info())["aof_last_bgrewrite_status"] == "ok"
            n.cancel_scope.cancel()
    end = logfile.scan(os.path.join(str(tmp_path), "trisque.aof"), Broker.validate_record)
    assert end.state == "clean" and end.counts["timer"] == 3  # a, b and the tombstone
    again, _ = _node(str(tmp_path))
    assert replicated_view(again) == replicated_view(broker)
    assert again.periodic.entries[b"gone"].definition is None


async def test_a_failed_write_undoes_the_timer_change(tmp_path: Any) -> None:
    files: list[RecordingFile] = []

    def open_file(path: str) -> RecordingFile:
        files.append(RecordingFile(path, []))
        return files[-1]

    broker, p = _node(str(tmp_path), open_file=open_file)
    broker.config.timer_min_period = 1
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            assert await _cmd(broker, p, "TIMER", "ADD", "kept", 5, "q", "x") == b"OK"
            before = replicated_view(broker)
            files[0].fail = errno.ENOSPC
            for argv in (("TIMER", "ADD", "lost", 5, "q", "x"), ("TIMER", "PAUSE", "kept"),
                         ("TIMER", "DEL", "kept")):
                with pytest.raises(PersistenceError, match="No space left on device"):
                    await _cmd(broker, p, *argv)
            assert replicated_view(broker) == before
            assert b"lost" not in broker.periodic.entries
            files[0].fail = None
            n.cancel_scope.cancel()
    again, _ = _node(str(tmp_path))
    assert replicated_view(again) == before


def _entry(**fields: Any) -> list[Any]:
    rec = Entry(b"t", periodic.Definition(60_000, b"q", b"x", (b"RETRY", b"5"), 1, 1,
                                          origin="ab" * 20),
                (1, "n"), Progress(0, 1, "n")).to_record()
    return [rec[0], {**rec[1], **fields}, *rec[2:]]


@pytest.mark.parametrize(("record", "why"), [
    ("x", "not a list"),
    ([b"t", None, 1, "n"], "not a list of 5"),
    ([b"t", None, 1, "n", [0, 1, "n"]], "malformed progress"),
    ([b"t", None, -1, "n", [0, 1, "n", 0, ""]], "malformed"),
    (_entry(period_ms=0), "out of range"),
    (_entry(params=[b"RETRY"]), "ADDJOB refuses"),
    (_entry(params=[b"TTL", b"-1"]), "ADDJOB refuses"),
    (_entry(body=b"x" * (periodic.MAX_BODY + 1)), "out of range"),
    (_entry(extra=1), "wrong fields"),
])
def test_records_no_node_could_write_are_refused(record: Any, why: str) -> None:
    reason = Broker.validate_record("timer", record)
    assert reason is not None and why in reason


def test_a_poisoned_timer_record_is_damage_at_its_offset(tmp_path: Any) -> None:
    path = os.path.join(str(tmp_path), "trisque.aof")
    with open(path, "wb") as f:
        f.write(aof.encode_header())
        f.write(aof.encode_frame("timer", _entry()))
        offset = f.tell()
        f.write(aof.encode_frame("timer", _entry(period_ms=-5)))
        f.write(aof.encode_frame("timer", _entry()))
    end = logfile.scan(path, Broker.validate_record)
    assert end.state == "corrupt" and end.offset == offset and "out of range" in end.reason
    assert Broker.validate_record("timer", _entry()) is None
