"""A whole node in-process, appendfsync always, a disk whose fdatasync is stuck: a GETJOB that
delivers a job for the first time is answered at once (its only log record, ``dlv``, is
advisory), while an ADDJOB waits for the fsync as it must.

On a fast disk the reactor fdatasyncs inline at the end of its round, as Disque does, and
nothing runs during that fdatasync; once an fdatasync took longer than
``node.persistence.INLINE_FSYNC_MAX_USEC`` the batches go to the writer's thread and the loop
keeps serving. The stuck fsync here comes after a slow one, as on a disk that is struggling."""

from __future__ import annotations

import threading
import time

import trio

from broker.aof import ReadEnd, read_records
from node.persistence import INLINE_FSYNC_MAX_USEC
from tests.server.test_inprocess import connect, node


async def test_first_getjob_is_answered_while_the_fsync_is_stuck(tmp_path) -> None:
    async with node(tmp_path, appendonly="yes", appendfsync="always") as (server, port):
        with trio.fail_after(20):
            consumer, producer = await connect(port), await connect(port)
            job_id = await consumer.call("ADDJOB", "q", "body", 0)
            f = server.persistence.writer.file  # type: ignore[union-attr]
            real_sync = f.sync
            gate, in_sync = threading.Event(), threading.Event()

            def slow_sync() -> None:
                time.sleep(2 * INLINE_FSYNC_MAX_USEC / 1e6)
                real_sync()

            f.sync = slow_sync  # type: ignore[method-assign]
            assert (await producer.call("ADDJOB", "elsewhere", "x", 0)).startswith(b"D-")  # type: ignore[union-attr]

            def stuck_sync() -> None:
                in_sync.set()
                gate.wait(15)
                real_sync()

            f.sync = stuck_sync  # type: ignore[method-assign]
            syncs = server.persistence.fsync_count
            await producer.stream.send_all(
                b"*4\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$5\r\nother\r\n$1\r\n0\r\n")
            await trio.to_thread.run_sync(in_sync.wait, 10)
            with trio.fail_after(5):
                got = await consumer.call("GETJOB", "NOHANG", "FROM", "q")
            assert got[0][1] == job_id
            assert server.persistence.fsync_count == syncs  # answered with the fsync stuck
            gate.set()
            assert bytes(await producer.reply()).startswith(b"D-")
            # The delivery time reached the log: ACKJOB's batch fsyncs it along.
            assert await consumer.call("ACKJOB", job_id) == 1
            with open(server.persistence.path, "rb") as log:
                kinds = [k for k, _ in read_records(log, "log", ReadEnd())]
            assert kinds.count("dlv") == 1 and kinds.count("job") == 3
