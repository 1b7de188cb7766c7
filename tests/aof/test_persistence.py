"""The trio side: group commit, fsync-before-reply, write faults and undo, online rewrite."""

from __future__ import annotations

import errno
import logging
import os
import time

import pytest
import trio

from broker import aof
from node import logfile
from node import persistence as pmod
from node.persistence import Persistence, PersistenceError, StartupError
from tests.aof.fakebroker import Config, FakeBroker


class RecordingFile(logfile.OsLogFile):
    """A real file that records the order of writes and syncs in a shared event list, and
    fails on demand (``fail = errno``) after writing half of the data, as a full disk does."""

    def __init__(self, path: str, events: list[tuple[str, object]]) -> None:
        super().__init__(path)
        self.events = events
        self.fail: int | None = None
        self.fail_sync: int | None = None

    def write(self, data, /):
        if self.fail is not None:
            os.pwrite(self.fd, bytes(data[: len(data) // 2]), self.end)
            raise OSError(self.fail, os.strerror(self.fail))
        n = super().write(data)
        self.events.append(("write", self.size()))
        return n

    def sync(self):
        if self.fail_sync is not None:
            raise OSError(self.fail_sync, os.strerror(self.fail_sync))
        super().sync()
        self.events.append(("sync", self.size()))


def _make(tmp_path, events=None, **kw):
    broker = FakeBroker()
    files: list[RecordingFile] = []

    def open_file(path: str) -> RecordingFile:
        f = RecordingFile(path, events if events is not None else [])
        files.append(f)
        return f

    p = Persistence(Config(str(tmp_path), **kw), broker, logging.getLogger("test.aof"),
                    open_file=open_file)
    p.load(0)
    return p, broker, files


def _reload(tmp_path, **kw) -> FakeBroker:
    broker = FakeBroker()
    Persistence(Config(str(tmp_path), **kw), broker).load(0)
    return broker


async def _client(p, broker, job_id, events=None):
    broker.addjob(job_id)
    ticket = p.submit(broker.take_effects())
    await p.wait_durable(ticket)
    if events is not None:
        events.append(("reply", job_id))


async def test_fsync_comes_before_every_reply_and_batches_are_grouped(tmp_path):
    events: list[tuple[str, object]] = []
    p, broker, files = _make(tmp_path, events)
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            for round_ in range(5):
                async with trio.open_nursery() as clients:
                    for i in range(40):
                        clients.start_soon(_client, p, broker, b"D-%d-%d" % (round_, i), events)
            n.cancel_scope.cancel()
    data = open(p.path, "rb").read()
    synced = 0
    syncs = writes = 0
    for kind, value in events:
        if kind == "sync":
            synced = value
            syncs += 1
        elif kind == "write":
            writes += 1
        else:
            frame = aof.encode_frame("job", [value, b"q", b"x", True, 0])
            end = data.index(frame) + len(frame)
            assert end <= synced, f"reply for {value!r} before its record was fsynced"
    replies = sum(1 for k, _ in events if k == "reply")
    assert replies == 200
    assert syncs == writes < replies / 4, "no group commit: about one fsync per client"
    assert p.fsync_count == syncs
    assert dict(p.info())["aof_last_fsync_latency_usec"] > 0
    assert _reload(tmp_path).jobs.keys() == broker.jobs.keys()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
async def test_write_failure_errors_undoes_and_recovers(tmp_path, caplog, code):
    p, broker, files = _make(tmp_path)
    caplog.set_level(logging.WARNING, logger="test.aof")
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            await _client(p, broker, b"D-before")
            files[0].fail = code
            failures: list[PersistenceError] = []

            async def client(job_id: bytes, ack: bytes | None = None) -> None:
                if ack is not None:
                    broker.ackjob(ack)
                else:
                    broker.addjob(job_id)
                try:
                    await p.wait_durable(p.submit(broker.take_effects()))
                except PersistenceError as exc:
                    failures.append(exc)

            async with trio.open_nursery() as clients:
                clients.start_soon(client, b"", b"D-before")
                for i in range(10):
                    clients.start_soon(client, b"D-fail-%d" % i)
            assert len(failures) == 11
            assert os.strerror(code) in str(failures[0])
            assert all(exc.entries for exc in failures)
            # Nothing half-applied: the failed ADDJOBs are gone, the failed ACK is undone.
            assert list(broker.jobs) == [b"D-before"]
            info = dict(p.info())
            assert info["aof_last_write_status"] == "err"
            files[0].fail = None
            await _client(p, broker, b"D-after")
            assert dict(p.info())["aof_last_write_status"] == "ok"
            n.cancel_scope.cancel()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("Errors writing to the AOF file" in m for m in messages) == 1
    assert any("looks solved" in m for m in messages)
    # The partial writes were cut: the log is whole and matches memory.
    assert logfile.scan(p.path).state == "clean"
    assert _reload(tmp_path).jobs.keys() == {b"D-before", b"D-after"}


async def test_fsync_failure_is_a_write_failure_under_always(tmp_path):
    p, broker, files = _make(tmp_path)
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            files[0].fail_sync = errno.EIO
            with pytest.raises(PersistenceError, match="Input/output error"):
                await _client(p, broker, b"D-1")
            assert broker.jobs == {}
            files[0].fail_sync = None
            await _client(p, broker, b"D-2")
            n.cancel_scope.cancel()
    assert _reload(tmp_path).jobs.keys() == {b"D-2"}


async def test_everysec_writes_before_reply_and_syncs_later(tmp_path):
    events: list[tuple[str, object]] = []
    p, broker, files = _make(tmp_path, events, appendfsync="everysec")
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            await _client(p, broker, b"D-1", events)
            assert [k for k, _ in events] == ["write", "reply"]
            await trio.sleep(1.5)
            assert [k for k, _ in events] == ["write", "reply", "sync"]
            n.cancel_scope.cancel()


async def test_log_off_means_no_file_and_no_waiting(tmp_path):
    p, broker, _ = _make(tmp_path, appendonly=False)
    broker.addjob(b"D-1")  # the log is off: its record is dropped
    assert p.submit(broker.take_effects()) == 0
    await p.wait_durable(0)
    assert not os.path.exists(p.path)
    assert dict(p.info())["aof_enabled"] == 0


async def test_online_rewrite_while_clients_write(tmp_path, monkeypatch):
    monkeypatch.setattr(pmod, "REWRITE_SLICE", 7)
    p, broker, _ = _make(tmp_path)
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            for i in range(300):
                broker.addjob(b"D-%d" % i)
            for i in range(0, 300, 2):
                broker.ackjob(b"D-%d" % i)
            await p.wait_durable(p.submit(broker.take_effects()))
            size_before = p.writer.good_size

            async def churn(k: int) -> None:
                for i in range(60):
                    jid = b"D-c%d-%d" % (k, i)
                    broker.addjob(jid)
                    if i % 3 == 0:
                        broker.nack(jid)
                    if i % 4 == 0:
                        broker.ackjob(jid)
                    if i % 5 == 0 and b"D-%d" % (2 * i + 1) in broker.jobs:
                        broker.ackjob(b"D-%d" % (2 * i + 1))
                    await p.wait_durable(p.submit(broker.take_effects()))

            assert await p.bgrewrite() == "Background append only file rewriting started"
            with pytest.raises(PersistenceError, match="rewriting already in progress"):
                await p.bgrewrite()
            async with trio.open_nursery() as clients:
                for k in range(8):
                    clients.start_soon(churn, k)
            while dict(p.info())["aof_rewrite_in_progress"]:
                await trio.sleep(0.01)
            assert p.rewrites == 1 and p.last_bgrewrite_ok
            await _client(p, broker, b"D-after-rewrite")
            n.cancel_scope.cancel()
    assert p.writer.good_size < size_before + 8 * 60 * 200
    reloaded = _reload(tmp_path)
    assert {k: v[:3] + v[4:] for k, v in reloaded.jobs.items()} == \
        {k: v[:3] + v[4:] for k, v in broker.jobs.items()}


async def test_automatic_rewrite_on_growth(tmp_path):
    p, broker, _ = _make(tmp_path, auto_aof_rewrite_min_size=4096,
                         auto_aof_rewrite_percentage=100)
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            for i in range(400):  # add and ack: the live set stays tiny, the log grows
                broker.addjob(b"D-%d" % i)
                broker.ackjob(b"D-%d" % i)
                await p.wait_durable(p.submit(broker.take_effects()))
                await trio.sleep(0)
            while dict(p.info())["aof_rewrite_in_progress"]:
                await trio.sleep(0.01)
            n.cancel_scope.cancel()
    assert p.rewrites >= 1
    assert p.writer.good_size < 400 * 40
    assert _reload(tmp_path).jobs == {}


@pytest.mark.parametrize("step", ["write", "fsync", "rename", "fsync-dir", "done"])
async def test_online_rewrite_failing_at_each_step_keeps_a_loadable_log(tmp_path, step):
    def fail_at(name: str) -> None:
        if name == step:
            raise OSError(errno.EIO, f"injected at {step}")

    broker = FakeBroker()
    p = Persistence(Config(str(tmp_path)), broker, open_file=logfile.OsLogFile,
                    rewrite_step=fail_at)
    p.load(0)
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            for i in range(50):
                await _client(p, broker, b"D-%d" % i)
            await p.bgrewrite()
            while dict(p.info())["aof_rewrite_in_progress"]:
                await trio.sleep(0.01)
            assert dict(p.info())["aof_last_bgrewrite_status"] == "err"
            await _client(p, broker, b"D-after")  # the writer goes on with the right file
            n.cancel_scope.cancel()
    assert [f for f in os.listdir(tmp_path) if f.startswith("temp-")] == []
    assert _reload(tmp_path).jobs.keys() == broker.jobs.keys()


async def test_shutdown_rewrite_restores_queues_once(tmp_path):
    p, broker, _ = _make(tmp_path)
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            for i in range(5):
                await _client(p, broker, b"D-%d" % i)
            broker.jobs[b"D-3"][3] = False  # dequeued (GETJOB), not logged for RETRY > 0
            await p.shutdown(rewrite=True)
            n.cancel_scope.cancel()
    first = _reload(tmp_path)
    assert first.loaded_with is True
    assert {k: v[3] for k, v in first.jobs.items()} == {k: v[3] for k, v in broker.jobs.items()}
    second = _reload(tmp_path)  # a later (crash) restart must not enqueue everything again
    assert second.loaded_with is False


async def test_shutdown_rewrite_with_log_off_is_loaded_once(tmp_path):
    p, broker, _ = _make(tmp_path, appendonly=False)
    broker.addjob(b"D-1")
    async with trio.open_nursery() as n:
        await n.start(p.run)
        await p.shutdown(rewrite=True)
        n.cancel_scope.cancel()
    assert _reload(tmp_path, appendonly=False).jobs.keys() == {b"D-1"}


def test_mid_file_corruption_stops_the_start(tmp_path):
    path = tmp_path / "appendonly.aof"
    with open(path, "wb") as f:
        f.write(aof.encode_header())
        first = aof.encode_frame("job", [b"D-1", b"q", b"x", True, 0])
        f.write(first)
        f.write(b"\x01" * 20)
        f.write(aof.encode_frame("job", [b"D-2", b"q", b"x", True, 0]))
    with pytest.raises(StartupError, match=f"{path}.*offset {aof.HEADER_SIZE + len(first)}"):
        _reload(tmp_path)


def test_newer_version_stops_the_start(tmp_path):
    (tmp_path / "appendonly.aof").write_bytes(aof.encode_header(version=99))
    with pytest.raises(StartupError, match="version 99"):
        _reload(tmp_path)


async def test_config_set_appendonly_switches_the_log_on_and_off(tmp_path):
    config = Config(str(tmp_path), appendonly=False)
    broker = FakeBroker()
    p = Persistence(config, broker)
    p.load(0)
    assert broker.log_wanted is False  # the broker's hot paths build no records for nobody
    broker.addjob(b"D-before")  # log off: not logged
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            config.appendonly = True
            await p.config_changed("appendonly")
            assert p.enabled and dict(p.info())["aof_enabled"] == 1
            assert broker.log_wanted is True
            await _client(p, broker, b"D-after")
            config.appendonly = False
            await p.config_changed("appendonly")
            assert broker.log_wanted is False
            broker.addjob(b"D-off")
            assert p.submit(broker.take_effects()) == 0
            n.cancel_scope.cancel()
    assert _reload(tmp_path).jobs.keys() == {b"D-before", b"D-after"}


@pytest.mark.parametrize("failure", [OverflowError("int too big to convert"),
                                     OSError(28, "No space left on device")])
async def test_switching_the_log_on_is_all_or_nothing(tmp_path, failure):
    """A failure other than OSError while switching on left INFO
    saying ``aof_state:on`` with no writer, and every later write waited forever."""
    config = Config(str(tmp_path), appendonly=False)
    broker = FakeBroker()
    p = Persistence(config, broker)
    p.load(0)
    broker.addjob(b"D-before")

    def failing_snapshot():
        raise failure
        yield  # a generator, like the real one

    broker.snapshot = failing_snapshot
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            config.appendonly = True
            error = await p.config_changed("appendonly")
            assert error is not None and "Could not switch the append log on" in error
            assert not config.appendonly and not p.enabled
            assert dict(p.info())["aof_state"] == "off"
            broker.addjob(b"D-after")  # not logged, and nothing waits
            assert p.submit(broker.take_effects()) == 0
            n.cancel_scope.cancel()


async def test_everysec_fsync_that_waited_for_a_rewrite_syncs_the_new_log(tmp_path):
    """The everysec fsync waits for the rewrite's switch (which closes the old log's file);
    it must then sync the log as it is, not the file closed meanwhile (that raised
    ValueError on a closed descriptor and took the node down)."""
    import threading

    in_switch, go_on = threading.Event(), threading.Event()

    def pause_at_rename(name: str) -> None:
        if name == "rename":
            in_switch.set()
            go_on.wait(10)

    broker = FakeBroker()
    p = Persistence(Config(str(tmp_path), appendfsync="everysec"), broker,
                    logging.getLogger("test.aof"), rewrite_step=pause_at_rename)
    p.load(0)
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            await _client(p, broker, b"D-1")  # written, not yet synced
            await p.bgrewrite()
            await trio.to_thread.run_sync(in_switch.wait, 10)  # the switch holds the locks
            n.start_soon(p._sync_now)  # what the everysec timer does meanwhile
            await trio.sleep(0.05)
            go_on.set()
            while p.rewrite_buf is not None:
                await trio.sleep(0.01)
            await _client(p, broker, b"D-2")
            await p._sync_now()
            n.cancel_scope.cancel()
    assert _reload(tmp_path).jobs.keys() == {b"D-1", b"D-2"}


def test_commit_now_writes_and_syncs_in_the_calling_task(tmp_path):
    """The reactor's group commit: no writer task, no thread; the batch is durable when
    commit_now returns, and records submitted during a round do not wake the writer."""
    events: list[tuple[str, object]] = []
    p, broker, files = _make(tmp_path, events)
    p.round_open = True
    tickets = []
    for i in range(5):
        broker.addjob(b"D-%d" % i)
        tickets.append(p.submit(broker.take_effects()))
    assert len(set(tickets)) == 1 and p.done_ticket < tickets[0]
    assert not p._wakeup.is_set()  # the round will commit
    p.round_open = False
    assert p.commit_now() is True
    assert p.done_ticket >= tickets[0] and p.failure(tickets[0]) is None
    assert [k for k, _ in events] == ["write", "sync"]  # one write, one fdatasync
    assert p.inline_commits == 1
    assert _reload(tmp_path).jobs.keys() == {b"D-%d" % i for i in range(5)}


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_commit_now_failure_undoes_and_reports_the_error(tmp_path, code, monkeypatch):
    # Every commit here must be inline, however long this machine's fdatasync takes (a slow
    # one hands the next batch to the writer's thread: the test below covers that rule).
    monkeypatch.setattr(pmod, "INLINE_FSYNC_MAX_USEC", 10**9)
    p, broker, files = _make(tmp_path)
    broker.addjob(b"D-kept")
    p.submit(broker.take_effects())
    assert p.commit_now()
    files[0].fail = code
    broker.addjob(b"D-lost")
    ticket = p.submit(broker.take_effects())
    assert p.commit_now() is True  # done: failed and undone
    assert ticket <= p.done_ticket
    assert os.strerror(code) in (p.failure(ticket) or "")
    assert list(broker.jobs) == [b"D-kept"]
    files[0].fail = None
    broker.addjob(b"D-after")
    ticket = p.submit(broker.take_effects())
    assert p.commit_now() and p.failure(ticket) is None
    assert logfile.scan(p.path).state == "clean"
    assert _reload(tmp_path).jobs.keys() == {b"D-kept", b"D-after"}


async def test_commit_now_leaves_the_batch_to_the_writer_when_it_must(tmp_path):
    """Declined (False, writer woken) while the log file is held, and under always once an
    fdatasync was slow; the writer task then writes the batch."""
    p, broker, files = _make(tmp_path)
    with trio.fail_after(10):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            async with p._write_lock:  # what a rewrite's switch holds
                broker.addjob(b"D-1")
                ticket = p.submit(broker.take_effects())
                assert p.commit_now() is False
            await p.wait_durable(ticket)
            p.last_fsync_usec = pmod.INLINE_FSYNC_MAX_USEC + 1  # a slow disk
            p.round_open = True
            broker.addjob(b"D-2")
            ticket = p.submit(broker.take_effects())
            p.round_open = False
            inline = p.inline_commits
            assert p.commit_now() is False
            await p.wait_durable(ticket)
            assert p.inline_commits == inline  # written by the writer's thread
            n.cancel_scope.cancel()
    assert _reload(tmp_path).jobs.keys() == {b"D-1", b"D-2"}


async def test_the_log_is_zero_filled_ahead_of_its_writes(tmp_path, monkeypatch):
    """The file runs ahead of the records with zeros (what makes an fdatasync cheaper),
    INFO tells the two sizes apart, a crash leaves a tail that loads, a clean stop cuts it."""
    monkeypatch.setattr(logfile, "PREALLOCATE_MAX", 256 * 1024)
    p, broker, files = _make(tmp_path)
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            for i in range(300):
                await _client(p, broker, b"D-%d" % i)
            while files[0].filling:  # the last fill's thread
                await trio.sleep(0.01)
            n.cancel_scope.cancel()
    info = dict(p.info())
    logical = p.writer.good_size
    assert info["aof_current_size"] == logical
    assert info["aof_preallocated_size"] > 0
    assert os.path.getsize(p.path) == logical + info["aof_preallocated_size"]
    assert open(p.path, "rb").read()[logical:] == bytes(info["aof_preallocated_size"])
    # A crash here (nothing closed): the zeros are the end, no warning, every job is back.
    crashed = open(p.path, "rb").read()
    assert logfile.scan(p.path).state == "clean"
    assert _reload(tmp_path).jobs.keys() == broker.jobs.keys()
    assert os.path.getsize(p.path) == logical  # the start cut the tail
    open(p.path, "wb").write(crashed)
    p.writer.close()  # a clean stop: the file is the log
    assert os.path.getsize(p.path) == logical


def test_writes_go_below_a_fill_without_overwriting_it(tmp_path, monkeypatch):
    """The filler and the writer share the file: records written while fills run, and past
    what was filled, are all read back whole."""
    monkeypatch.setattr(logfile, "PREALLOCATE_MAX", 128 * 1024)
    path = str(tmp_path / "a.aof")
    logfile.create_log(path)
    f = logfile.OsLogFile(path)
    w = aof.LogWriter(f)
    recs = [("job", [b"D-%d" % i, b"q", os.urandom(i % 700), True, 0]) for i in range(3000)]
    for i in range(0, len(recs), 10):
        w.write(aof.encode_records(recs[i : i + 10]))

    def settle() -> None:
        deadline = time.monotonic() + 10
        while f.filling and time.monotonic() < deadline:
            time.sleep(0.01)

    settle()  # the writes may have outrun the last fill: the next write starts another
    recs.append(("ack", b"D-1"))
    w.write(aof.encode_records(recs[-1:]))
    settle()
    assert f.file_size() > f.size() == w.good_size
    assert list(logfile.read_log(path)) == [(k, d) for k, d in recs]
    f.close()
    assert os.path.getsize(path) == w.good_size


async def test_a_log_of_the_previous_format_is_upgraded_at_start(tmp_path):
    from tests.aof.test_format import _V1_LOG

    path = tmp_path / "appendonly.aof"
    path.write_bytes(_V1_LOG)
    p, broker, _ = _make(tmp_path)
    assert broker.jobs.keys() == {b"D-00000002"}
    end = logfile.scan(str(path))
    assert end.header is not None and end.header.version == aof.FORMAT_VERSION
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            await _client(p, broker, b"D-3")
            n.cancel_scope.cancel()
    assert _reload(tmp_path).jobs.keys() == {b"D-00000002", b"D-3"}


async def test_the_log_is_zero_filled_under_always_only(tmp_path):
    p, broker, files = _make(tmp_path, appendfsync="everysec")
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(p.run)
            for i in range(50):
                await _client(p, broker, b"D-%d" % i)
            assert dict(p.info())["aof_preallocated_size"] == 0
            p.config.appendfsync = "always"  # CONFIG SET: read when a fill is due
            await _client(p, broker, b"D-always")
            while files[0].filling:
                await trio.sleep(0.01)
            assert dict(p.info())["aof_preallocated_size"] > 0
            n.cancel_scope.cancel()
