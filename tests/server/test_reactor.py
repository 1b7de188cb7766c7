"""The reactor's guarantees (node/reactor.py, node/connection.py), on a whole node in-process
over loopback sockets: fairness against a flooding pipeliner, a client that stops reading is
paused rather than buffered, a connection handed to a task comes back, the idle timeout is
applied at run time, and the group commit happens in the reactor's round."""

from __future__ import annotations

import socket

import trio

from node.conn_state import ConnState
from node.reactor import MAX_COMMANDS_PER_TURN
from protocol.resp import NEED_DATA, ReplyReader, encode_command
from tests.server.test_inprocess import Conn, connect, node
from tests.support.server import free_port


async def _until(predicate, limit: float = 10) -> None:
    with trio.fail_after(limit):
        while not predicate():
            await trio.sleep(0.001)


async def test_a_flooding_pipeliner_does_not_starve_another_client(tmp_path) -> None:
    """200,000 pipelined PINGs from one client; another client's PING sent in the middle of
    them is answered after a few turns of the flooder, not after its flood."""
    flood = 200_000
    async with node(tmp_path) as (server, port):
        flooder, other = await connect(port), await connect(port)
        assert await other.call("PING") == b"PONG"
        received = 0

        async def send_flood() -> None:
            await flooder.stream.send_all(b"PING\r\n" * flood)

        async def drain_flood() -> None:
            nonlocal received
            while received < flood * 7:  # "+PONG\r\n"
                data = await flooder.stream.receive_some(1 << 16)
                assert data
                received += len(data)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_flood)
                nursery.start_soon(drain_flood)
                start = server.commands
                await _until(lambda: server.commands - start > 5_000)
                before = server.commands
                assert await other.call("PING") == b"PONG"
                ran_meanwhile = server.commands - before
                assert server.commands - start < flood  # the flood was not over
        # A few turns of the flooder (MAX_COMMANDS_PER_TURN each), not its whole buffer
        # (a 64 KB read holds ~11,000 of these PINGs). The test's own tasks share the node's
        # loop, so the reply is read some turns after it was written: 16 turns, not 8.
        assert ran_meanwhile <= 16 * MAX_COMMANDS_PER_TURN, ran_meanwhile


async def test_a_client_that_stops_reading_is_paused_not_buffered(tmp_path) -> None:
    """Each QPEEK answers a 1 MB job; a client sends 200 of them and reads nothing. The node
    keeps about one reply for it (its input is left unread meanwhile), serves everyone else,
    and once the client reads, every reply arrives whole and in order."""
    body = b"j" * (1 << 20)
    requests = 200
    async with node(tmp_path) as (server, port):
        producer = await connect(port)
        await producer.call("ADDJOB", "big", body, 0)
        slow = trio.socket.socket()
        slow.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
        await slow.connect(("127.0.0.1", port))
        await slow.send(encode_command("QPEEK", "big", "1") * requests)
        conn = max(server.connections, key=lambda c: c.client.id)
        await _until(lambda: conn.sending)  # its socket is full: a sender task holds it
        await trio.sleep(0.5)
        unsent = sum(map(len, conn.pending))
        assert unsent <= 2 * len(body), unsent  # not 200 MB
        assert not conn.registered  # paused: its input is not read
        # The others are served meanwhile.
        for _ in range(20):
            assert (await producer.call("ADDJOB", "other", "x", 0)).startswith(b"D-")  # type: ignore[union-attr]
        # It reads: everything arrives, in order, and it is served again afterwards.
        stream = trio.SocketStream(slow)
        reader = Conn(stream)
        with trio.fail_after(60):
            for _ in range(requests):
                reply = await reader.reply()
                assert reply[0][2] == body  # type: ignore[index]
            assert await reader.call("PING") == b"PONG"
        await stream.aclose()


async def test_a_connection_handed_to_a_task_comes_back(tmp_path) -> None:
    """A pipeline with commands only the runtime can finish in the middle (CONFIG RESETSTAT,
    CONFIG SET appendonly yes, which takes a snapshot while the log is locked) is answered in
    order, and the connection is served by the reactor again after."""
    async with node(tmp_path, appendfsync="always") as (server, port):
        c = await connect(port)
        pipeline = (encode_command("ADDJOB", "q", "a", "0")
                    + encode_command("CONFIG", "RESETSTAT")
                    + encode_command("ADDJOB", "q", "b", "0")
                    + encode_command("CONFIG", "SET", "appendonly", "yes")
                    + encode_command("ADDJOB", "q", "c", "0")
                    + encode_command("QLEN", "q"))
        await c.stream.send_all(pipeline)
        replies = [await c.reply() for _ in range(6)]
        assert [r[:2] for r in replies[0:5:2]] == [b"D-"] * 3  # type: ignore[index]
        assert replies[1] == replies[3] == b"OK"
        assert replies[5] == 3
        conn = max(server.connections, key=lambda x: x.client.id)
        assert conn.registered and not conn.parks and conn.state is ConnState.OPEN
        turns = server.reactor.turns
        assert await c.call("QLEN", "q") == 3
        assert server.reactor.turns > turns  # served by the reactor again
        # The job added after the switch is in the log.
        with open(server.persistence.path, "rb") as f:
            assert f.read().count(b"c") >= 1


async def test_timeout_set_at_run_time_closes_idle_clients_only(tmp_path, autojump_clock) -> None:
    async with node(tmp_path) as (server, port):
        idle, busy, blocked = await connect(port), await connect(port), await connect(port)
        assert await idle.call("PING") == b"PONG"
        await blocked.stream.send_all(b"GETJOB TIMEOUT 15000 FROM nothing\r\n")
        await _until(lambda: server.broker.blocked_clients == 1)
        assert await busy.call("CONFIG", "SET", "timeout", "10") == b"OK"
        for _ in range(10):  # 20 s, talking every 2 s
            await trio.sleep(2)
            assert await busy.call("PING") == b"PONG"
        assert isinstance(await idle.reply(), ConnectionError)  # closed after 10-12 s
        # The blocked client was not idle. Answered at its timeout (15 s), it was not closed
        # although it had sent nothing for longer than the timeout.
        assert await blocked.reply() is None
        assert await blocked.call("PING") == b"PONG"
        assert await busy.call("CONFIG", "SET", "timeout", "0") == b"OK"
        await trio.sleep(60)
        assert await busy.call("PING") == b"PONG"


async def test_the_group_commit_is_done_in_the_reactors_round(tmp_path) -> None:
    """appendfsync always on a fast disk: 50 clients' ADDJOBs share fdatasyncs written by the
    reactor itself, and every reply came after its record was synced."""
    async with node(tmp_path, appendonly="yes", appendfsync="always") as (server, port):
        clients = [await connect(port) for _ in range(50)]
        p = server.persistence
        p.last_fsync_usec = 0  # a disk judged fast (a slow one moves the fsync to the thread)
        inline, syncs = p.inline_commits, p.fsync_count
        ids: list[bytes] = []

        async def produce(c: Conn) -> None:
            for i in range(20):
                reply = await c.call("ADDJOB", "g", f"job{i}", 0)
                assert isinstance(reply, bytes) and reply.startswith(b"D-")
                ids.append(reply)

        async with trio.open_nursery() as nursery:
            for c in clients:
                nursery.start_soon(produce, c)
        assert len(ids) == 1000
        assert p.inline_commits > inline
        assert p.fsync_count - syncs < 1000  # grouped
        with open(p.path, "rb") as f:
            data = f.read()
        assert all(job_id in data for job_id in ids)


async def test_a_client_that_shuts_its_sending_side_gets_every_reply(tmp_path) -> None:
    """A pipeline then shutdown(SHUT_WR), both there before the node looks (so it reads the
    end of the stream while the replies wait for the log), under appendfsync always: every
    command runs and every reply arrives, each after its fdatasync, then the node closes."""
    async with node(tmp_path, appendonly="yes", appendfsync="always") as (server, port):
        raw = socket.create_connection(("127.0.0.1", port))
        raw.sendall(b"".join(encode_command("ADDJOB", "h", f"j{i}", "0") for i in range(200))
                    + encode_command("QLEN", "h"))
        raw.shutdown(socket.SHUT_WR)  # no checkpoint since connect: the node sees both at once

        def read_to_end() -> bytes:
            chunks = []
            while chunk := raw.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks)

        with trio.fail_after(20):
            data = await trio.to_thread.run_sync(read_to_end)
        raw.close()
        reader = ReplyReader()
        reader.feed(data)
        replies = [reader.next() for _ in range(201)]
        assert all(isinstance(r, bytes) and r.startswith(b"D-") for r in replies[:200])
        assert replies[200] == 200 and reader.next() is NEED_DATA
        with open(server.persistence.path, "rb") as f:
            log = f.read()
        assert all(job_id in log for job_id in replies[:200])  # type: ignore[operator]


async def test_quit_in_a_pipeline_answers_what_came_before_and_runs_nothing_after(
        tmp_path) -> None:
    async with node(tmp_path) as (server, port):
        c = await connect(port)
        await c.stream.send_all(encode_command("ADDJOB", "quitq", "a", "0")
                                + encode_command("QUIT")
                                + encode_command("ADDJOB", "quitq", "b", "0"))
        assert (await c.reply()).startswith(b"D-")  # type: ignore[union-attr]
        assert await c.reply() == b"OK"
        assert isinstance(await c.reply(), ConnectionError)
        other = await connect(port)
        assert await other.call("QLEN", "quitq") == 1


async def test_a_client_ready_during_the_round_shares_its_fdatasync(tmp_path) -> None:
    """appendfsync always: a client whose ADDJOB arrives while a round runs joins that round
    before its commit, so both commands' records are synced by one fdatasync."""
    async with node(tmp_path, appendonly="yes", appendfsync="always") as (server, port):
        first = await connect(port)
        late = socket.create_connection(("127.0.0.1", port))
        late.setblocking(False)
        late.send(encode_command("PING"))
        reader = ReplyReader()

        async def late_reply() -> object:
            with trio.fail_after(10):
                while True:
                    reply = reader.next()
                    if reply is not NEED_DATA:
                        return reply
                    try:
                        reader.feed(late.recv(65536))
                    except BlockingIOError:
                        await trio.sleep(0.001)

        assert await late_reply() == b"PONG"
        p = server.persistence
        p.last_fsync_usec = 0  # a disk judged fast: the round syncs inline
        sync_due = p.sync_due
        sent = False

        def arrives_during_the_round() -> bool:
            nonlocal sent
            if not sent:  # after the first client's turn, before the round's commit
                sent = True
                late.send(encode_command("ADDJOB", "q", "late", "0"))
            return sync_due()

        p.sync_due = arrives_during_the_round  # type: ignore[method-assign]
        rounds, syncs = server.reactor.rounds, p.fsync_count
        try:
            assert bytes(await first.call("ADDJOB", "q", "first", 0)).startswith(b"D-")  # type: ignore[arg-type]
            assert bytes(await late_reply()).startswith(b"D-")  # type: ignore[arg-type]
        finally:
            late.close()
        assert sent
        assert server.reactor.rounds - rounds == 1
        assert p.fsync_count - syncs == 1


async def test_the_bus_is_flushed_once_per_round_not_per_command(tmp_path) -> None:
    """200 pipelined commands run in a round or two: the cluster bus is flushed at the end of
    the round, not after each command, and what a command left for it (CLUSTER MEET's link
    to keep up) has been routed by the time the replies arrive."""
    async with node(tmp_path) as (server, port):
        c = await connect(port)
        flushes = 0
        flush = server.bus.flush

        def counting_flush() -> None:
            nonlocal flushes
            flushes += 1
            flush()

        server.bus.flush = counting_flush  # type: ignore[method-assign]
        server.reactor.flush_bus = counting_flush
        kept = len(server.bus.outbound)
        nobody = free_port()  # nothing listens there: the keeper just retries
        await c.stream.send_all(encode_command("CLUSTER", "MEET", "127.0.0.1", str(nobody))
                                + encode_command("PING") * 199)
        replies = [await c.reply() for _ in range(200)]
        assert replies == [b"OK"] + [b"PONG"] * 199
        assert len(server.bus.outbound) == kept + 1
        assert 1 <= flushes <= 4, flushes
