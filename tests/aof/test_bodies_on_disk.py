"""Bodies kept in the append log instead of memory (``body-memory-max``), on real processes:
every read path returns the body that was added, a damaged body is an error for its job only,
and a rewrite and a restart keep every reference right."""

from __future__ import annotations

import io
import os
import time
from typing import Any

import msgpack
import pytest

from broker import aof
from node.log_core import body_offset
from protocol.resp import Error
from tests.support.server import ServerProcess, pipelined, send_command, wait_rewrite


def _info(port: int) -> dict[str, str]:
    text = send_command(port, "INFO", "persistence").decode()
    return dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)


def _show_body(port: int, job_id: bytes) -> Any:
    reply = send_command(port, "SHOW", job_id)
    return dict(zip(reply[::2], reply[1::2], strict=True))[b"body"]


def _add(port: int, bodies: list[bytes], queue: str = "q") -> list[bytes]:
    return [send_command(port, "ADDJOB", queue, body, 0) for body in bodies]


@pytest.mark.parametrize("fields", [16, 17])
@pytest.mark.parametrize("id_len,queue_len,body_len", [
    (40, 1, 257), (40, 300, 1000), (40, 255, 70_000), (40, 70_000, 300)])
def test_body_offset_is_where_msgpack_puts_the_body(fields, id_len, queue_len, body_len):
    body = os.urandom(body_len)
    record: list[Any] = [b"D" * id_len, b"q" * queue_len, body, "queued", 1, 60, 30, 0,
                         1, 0, 0, 0, [], [], 0, 0, 5][:fields]
    payload = msgpack.packb(("job", record), use_bin_type=True)
    at = body_offset(record, body_len)
    assert payload[at:at + body_len] == body


def test_every_read_path_returns_the_body_added_and_memory_holds_none_of_them():
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        used_before = int(send_command(srv.port, "INFO", "memory").decode()
                          .split("used_memory:")[1].split("\r\n")[0])
        bodies = [os.urandom(1000 + i) for i in range(100)]
        ids = _add(srv.port, bodies)
        small = _add(srv.port, [b"x" * 256])[0]  # at body-memory-max: stays in memory
        info = _info(srv.port)
        assert info["jobs_bodies_on_disk"] == "100"
        assert int(info["log_live_bytes"]) == sum(map(len, bodies))
        used = int(send_command(srv.port, "INFO", "memory").decode()
                   .split("used_memory:")[1].split("\r\n")[0])
        # The records and references are counted (under 700 bytes a job), not the bodies.
        assert used - used_before < 101 * 700 < sum(map(len, bodies))
        assert all(_show_body(srv.port, i) == b for i, b in zip(ids, bodies, strict=True))
        peeked = send_command(srv.port, "QPEEK", "q", 200)
        assert [p[2] for p in peeked] == [*bodies, b"x" * 256]
        cursor, shown = send_command(srv.port, "JSCAN", 0, "COUNT", 1000, "REPLY", "all")
        by_id = {dict(zip(s[::2], s[1::2], strict=True))[b"id"]: dict(zip(s[::2], s[1::2], strict=True))[b"body"]
                 for s in shown}
        assert by_id == {**dict(zip(ids, bodies, strict=True)), small: b"x" * 256}
        got = send_command(srv.port, "GETJOB", "COUNT", 200, "FROM", "q")
        assert [g[2] for g in got] == [*bodies, b"x" * 256]
        assert all(send_command(srv.port, "ACKJOB", i) == 1 for i in ids)
        assert _info(srv.port)["jobs_bodies_on_disk"] == "0"


def test_body_memory_max_0_keeps_every_body_in_memory():
    with ServerProcess(appendonly="yes", body_memory_max=0) as srv:
        body = os.urandom(5000)
        job_id = _add(srv.port, [body])[0]
        assert _info(srv.port)["jobs_bodies_on_disk"] == "0"
        assert _show_body(srv.port, job_id) == body


def test_a_damaged_body_is_an_error_for_its_job_only():
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        bodies = [os.urandom(800) for _ in range(5)]
        ids = _add(srv.port, bodies)
        path = os.path.join(srv.dir, "trisque.aof")
        with open(path, "r+b") as f:
            data = f.read()
            at = data.index(bodies[2])
            f.seek(at + 10)
            f.write(bytes([data[at + 10] ^ 0xFF]))
        shown = _show_body(srv.port, ids[2])
        assert isinstance(shown, Error) and "checksum mismatch" in shown
        got = send_command(srv.port, "GETJOB", "COUNT", 10, "FROM", "q")
        assert [g[1] for g in got] == ids
        for g, body, k in zip(got, bodies, range(5), strict=True):
            if k == 2:
                assert isinstance(g[2], Error) and "checksum mismatch" in g[2]
            else:
                assert g[2] == body
        # A rewrite cannot copy the damaged body: it fails and the log stays as it was.
        send_command(srv.port, "BGREWRITEAOF")
        info = wait_rewrite(srv.port)
        assert info["aof_last_bgrewrite_status"] == "err"
        assert int(info["bodies_unreadable"]) >= 2
        assert send_command(srv.port, "PING") == b"PONG"
        assert "body unreadable from the append log: checksum mismatch" in srv.log()
        srv.kill()


def _damage(srv: ServerProcess, body: bytes, at: int = 5) -> None:
    with open(os.path.join(srv.dir, "trisque.aof"), "r+b") as f:
        data = f.read()
        where = data.index(body) + at
        f.seek(where)
        f.write(bytes([data[where] ^ 1]))


def test_a_command_that_must_log_a_damaged_body_is_undone_with_an_error_reply():
    """A NACK writes the job's whole record, body included: with the body damaged it cannot,
    so the NACK is undone (memory stays what the log says) and answered with an error; the
    connection goes on, and the failure is logged once."""
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        body = os.urandom(800)
        job_id = _add(srv.port, [body])[0]
        _damage(srv, body)
        assert send_command(srv.port, "GETJOB", "FROM", "q")[0][1] == job_id
        before = srv.log().count("checksum mismatch")
        refused, pong = pipelined(srv.port, [("NACK", job_id), ("PING",)])
        assert isinstance(refused, Error) and "checksum mismatch" in refused, refused
        assert "undone" in refused
        assert pong == b"PONG"  # on the same connection
        log = srv.log()
        assert log.count("checksum mismatch") == before + 1, log  # the NACK's, once
        assert "Unexpected error" not in log
        shown = send_command(srv.port, "SHOW", job_id)
        fields = dict(zip(shown[::2], shown[1::2], strict=True))
        assert fields[b"state"] == b"active" and fields[b"nacks"] == 0  # not requeued
        assert send_command(srv.port, "QLEN", "q") == 0
        srv.kill()


def test_a_timed_requeue_of_a_damaged_body_is_undone_and_tried_again_a_retry_later():
    """The requeue's record cannot carry the body either: the node goes on, the job stays
    active, and the next attempt waits its RETRY (not every tick of the timer wheel)."""
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        body = os.urandom(800)
        job_id = send_command(srv.port, "ADDJOB", "q", body, 0, "RETRY", 1)
        _damage(srv, body)
        assert send_command(srv.port, "GETJOB", "FROM", "q")[0][1] == job_id
        time.sleep(2.6)  # requeues due at about 1 s and 2 s
        assert send_command(srv.port, "PING") == b"PONG"
        assert 2 <= int(_info(srv.port)["bodies_unreadable"]) <= 5  # the GETJOB's, and each try
        assert send_command(srv.port, "QLEN", "q") == 0
        assert "Unexpected error" not in srv.log() and "Traceback" not in srv.log()
        srv.kill()


def test_rewrite_moves_the_bodies_and_a_kill_9_restart_finds_them():
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        bodies = [os.urandom(600 + i) for i in range(300)]
        ids = _add(srv.port, bodies)
        for i in ids[:100]:  # dead space the rewrite drops
            send_command(srv.port, "ACKJOB", i)
        size_before = int(_info(srv.port)["log_bytes"])
        send_command(srv.port, "BGREWRITEAOF")
        later = _add(srv.port, [os.urandom(700) for _ in range(20)], "r")  # during the rewrite
        info = wait_rewrite(srv.port)
        assert info["aof_last_bgrewrite_status"] == "ok"
        assert int(info["log_bytes"]) < size_before
        assert all(_show_body(srv.port, i) == b for i, b in zip(ids[100:], bodies[100:], strict=True))
        assert all(isinstance(_show_body(srv.port, i), bytes) for i in later)
        later_bodies = [_show_body(srv.port, i) for i in later]
        srv.kill()
        srv.start()
        assert _info(srv.port)["jobs_bodies_on_disk"] == "220"
        assert all(_show_body(srv.port, i) == b for i, b in zip(ids[100:], bodies[100:], strict=True))
        assert [_show_body(srv.port, i) for i in later] == later_bodies
        assert all(send_command(srv.port, "SHOW", i) is None for i in ids[:100])


@pytest.mark.parametrize("kill_after", [0.0, 0.02, 0.08, 0.3, None])
def test_kill_9_at_any_point_of_a_rewrite_loses_no_body(kill_after):
    """A rewrite of 3,000 1 KB bodies with writes going on, the node killed -9 at a point of
    it (None: after it finished); the restarted node has every job with its body."""
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        bodies = {}
        conn_ids = _add(srv.port, [os.urandom(1024) for _ in range(3000)])
        for job_id in conn_ids:
            bodies[job_id] = _show_body(srv.port, job_id)
        for job_id in conn_ids[:1000]:
            send_command(srv.port, "ACKJOB", job_id)
            del bodies[job_id]
        send_command(srv.port, "BGREWRITEAOF")
        start = time.monotonic()
        while kill_after is None or time.monotonic() - start < kill_after:
            body = os.urandom(1024)
            bodies[_add(srv.port, [body], "during")[0]] = body
            if kill_after is None and _info(srv.port)["aof_rewrite_in_progress"] == "0":
                break
        srv.kill()
        srv.start()
        assert _info(srv.port)["jobs_bodies_on_disk"] == str(len(bodies))
        for job_id, body in bodies.items():
            assert _show_body(srv.port, job_id) == body
        assert not [f for f in os.listdir(srv.dir) if f.startswith("temp-rewriteaof")]


@pytest.mark.parametrize("cut", ["inside-last-body", "inside-last-frame-header", "zeros"])
def test_a_torn_tail_after_bodies_on_disk_loads_and_keeps_the_whole_records(cut):
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        bodies = [os.urandom(2000) for _ in range(20)]
        ids = _add(srv.port, bodies)
        srv.kill()
        path = os.path.join(srv.dir, "trisque.aof")
        with open(path, "r+b") as f:
            data = f.read()
            end = data.index(bodies[-1]) + len(bodies[-1])  # the last record ends a few bytes on
            if cut == "inside-last-body":
                f.truncate(data.index(bodies[-1]) + 500)
            elif cut == "inside-last-frame-header":
                # The last record's frame (its metadata, then its body).
                read = aof.ReadEnd()
                list(aof.read_records(io.BytesIO(data), path, read))
                frame = read.frame
                assert frame < data.index(bodies[-1]) < frame + 200
                check, length = (int.from_bytes(data[frame + k:frame + k + 4], "big")
                                 for k in (0, 4))
                assert check ^ length == 0xFFFFFFFF  # ~length | length: a frame starts here
                f.truncate(frame + 6)
            else:  # the last record half written into a zero-filled tail
                f.seek(data.index(bodies[-1]) + 300)
                f.write(bytes(len(data) - data.index(bodies[-1]) - 300 + 4096))
        assert end > 0
        srv.start()
        assert "truncated" in srv.log()
        assert _info(srv.port)["jobs_bodies_on_disk"] == "19"
        assert [_show_body(srv.port, i) for i in ids[:19]] == bodies[:19]
        assert send_command(srv.port, "SHOW", ids[19]) is None
        # The node appends after the cut: a new body is read back right after a restart.
        new = _add(srv.port, [b"n" * 3000])[0]
        srv.kill()
        srv.start()
        assert _show_body(srv.port, new) == b"n" * 3000


def test_maxdisk_refuses_addjob_past_it_and_qstat_shows_the_bytes_a_queue_holds():
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        bodies = [os.urandom(1000) for _ in range(30)]
        ids = _add(srv.port, bodies)
        _add(srv.port, [b"small"])
        qstat = send_command(srv.port, "QSTAT", "q")
        fields = dict(zip(qstat[::2], qstat[1::2], strict=True))
        assert fields[b"bytes"] == 30 * 1000 + 5
        info = _info(srv.port)
        assert info["jobs_bodies_on_disk"] == "30"
        assert int(info["log_live_bytes"]) == 30_000
        assert int(info["log_bytes"]) > 30_000
        limit = int(info["log_bytes"]) + 1500
        assert send_command(srv.port, "CONFIG", "SET", "maxdisk", str(limit)) == b"OK"
        assert isinstance(send_command(srv.port, "ADDJOB", "q", os.urandom(1000), 0), bytes)
        refused = send_command(srv.port, "ADDJOB", "q", os.urandom(1000), 0)
        assert isinstance(refused, Error) and "maxdisk" in refused
        # Acknowledging frees nothing on disk until the log is rewritten.
        for job_id in ids:
            send_command(srv.port, "ACKJOB", job_id)
        send_command(srv.port, "BGREWRITEAOF")
        assert int(wait_rewrite(srv.port)["log_bytes"]) < limit - 20_000
        assert isinstance(send_command(srv.port, "ADDJOB", "q", os.urandom(1000), 0), bytes)


def test_redrive_moves_back_a_dead_letter_whose_body_is_in_the_log():
    """A dead letter shares its original's reference; REDRIVE reads the body back through the
    node for the new job, whose body goes to the log in turn."""
    with ServerProcess(appendonly="yes") as srv:
        send_command(srv.port, "QPOLICY", "CREATE", "dlq")
        send_command(srv.port, "QPOLICY", "CREATE", "q", "REDRIVE", "1", "dlq")
        body = os.urandom(1000)
        job_id = _add(srv.port, [body])[0]
        assert _info(srv.port)["jobs_bodies_on_disk"] == "1"
        assert send_command(srv.port, "GETJOB", "FROM", "q")[0][2] == body
        send_command(srv.port, "NACK", job_id)  # a second receive: dead-lettered
        assert send_command(srv.port, "QPEEK", "dlq", 1)[0][2] == body
        assert _info(srv.port)["jobs_bodies_on_disk"] == "1"  # the dead letter's
        assert send_command(srv.port, "QPOLICY", "REDRIVE", "dlq") == 1
        assert send_command(srv.port, "QLEN", "dlq") == 0
        moved = send_command(srv.port, "GETJOB", "FROM", "q")[0]
        assert moved[1] != job_id and moved[2] == body
        assert _info(srv.port)["jobs_bodies_on_disk"] == "1"  # the new job's


def test_redrive_leaves_a_dead_letter_whose_body_is_damaged_where_it_is():
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        send_command(srv.port, "QPOLICY", "CREATE", "dlq")
        send_command(srv.port, "QPOLICY", "CREATE", "q", "REDRIVE", "1", "dlq")
        body = os.urandom(1000)
        job_id = _add(srv.port, [body])[0]
        send_command(srv.port, "GETJOB", "FROM", "q")
        send_command(srv.port, "NACK", job_id)
        assert send_command(srv.port, "QLEN", "dlq") == 1
        _damage(srv, body)
        assert send_command(srv.port, "QPOLICY", "REDRIVE", "dlq") == 0
        assert send_command(srv.port, "QLEN", "dlq") == 1 and send_command(srv.port, "QLEN", "q") == 0
        log = srv.log()
        assert "its body cannot be read back from the append log" in log
        assert "checksum mismatch" in log and int(_info(srv.port)["bodies_unreadable"]) == 1
        srv.kill()


def test_a_version_2_log_is_rewritten_as_version_3_with_its_bodies_split():
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        bodies = [os.urandom(2000) for _ in range(5)]
        ids = _add(srv.port, bodies)
        srv.kill()
        path = os.path.join(srv.dir, "trisque.aof")
        with open(path, "rb") as f:
            records = list(aof.read_records(f, path))  # bodies read back into the records
        with open(path, "wb") as f:  # the same jobs as a node of format version 2 wrote them
            f.write(aof.encode_header(version=2))
            f.write(b"".join(aof.encode_frame(kind, data, version=2) for kind, data in records))
        srv.start()
        assert "rewritten from format version 2 to 3" in srv.log()
        assert [_show_body(srv.port, i) for i in ids] == bodies
        with open(path, "rb") as f:
            data = f.read()
        end = aof.ReadEnd()
        list(aof.read_records(io.BytesIO(data), path, end, keep=lambda at, n, crc: (at, n)))
        assert end.header is not None and end.header.version == 3 and end.state == "clean"
        srv.kill()
        srv.start()  # the bodies now replayed from split records, left in the file
        assert _info(srv.port)["jobs_bodies_on_disk"] == "5"
        assert [_show_body(srv.port, i) for i in ids] == bodies


def test_a_queue_with_a_policy_keeps_its_bodies_in_the_log_across_a_restart():
    """Policy queues' bodies stay in the log like any other: after a kill -9 and restart,
    deduplication still finds the job (a candidate of the same length and CRC-32 is read back
    and compared), and
    REDRIVE moves the dead letter back with its body."""
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        send_command(srv.port, "QPOLICY", "CREATE", "dlq")
        send_command(srv.port, "QPOLICY", "CREATE", "q", "REDRIVE", "1", "dlq")
        send_command(srv.port, "QPOLICY", "CREATE", "d", "DEDUP", "yes")
        body, other = os.urandom(1000), os.urandom(1000)
        job_id = _add(srv.port, [body])[0]
        assert send_command(srv.port, "GETJOB", "FROM", "q")[0][2] == body
        send_command(srv.port, "NACK", job_id)  # a second receive: dead-lettered
        assert send_command(srv.port, "QLEN", "dlq") == 1
        deduped = _add(srv.port, [other], queue="d")[0]
        assert _add(srv.port, [other], queue="d") == [deduped]
        plain = _add(srv.port, [os.urandom(1000)], queue="plain")[0]
        assert _info(srv.port)["jobs_bodies_on_disk"] == "3"
        srv.kill()
        srv.start()
        assert _info(srv.port)["jobs_bodies_on_disk"] == "3"
        assert len(_show_body(srv.port, plain)) == 1000
        assert _add(srv.port, [other], queue="d") == [deduped]
        assert _add(srv.port, [other[:-1] + bytes([other[-1] ^ 1])], queue="d") != [deduped]
        assert _info(srv.port)["jobs_bodies_on_disk"] == "4"  # the index kept no body
        dead = send_command(srv.port, "JSCAN", "QUEUE", "dlq", "REPLY", "all")[1]
        assert [dict(zip(j[::2], j[1::2], strict=True))[b"body"] for j in dead] == [body]
        # A replayed job waits its retry before it is queued again: queue it now.
        assert send_command(srv.port, "ENQUEUE", dead[0][dead[0].index(b"id") + 1]) == 1
        assert send_command(srv.port, "QPOLICY", "REDRIVE", "dlq") == 1
        assert send_command(srv.port, "GETJOB", "FROM", "q")[0][2] == body


def test_a_throttled_queue_with_backoff_serves_its_bodies_from_the_log_across_a_restart():
    with ServerProcess(appendonly="yes", appendfsync="always") as srv:
        send_command(srv.port, "QPOLICY", "CREATE", "t", "MAXINFLIGHT", "1", "BACKOFF", "1", "2")
        bodies = [os.urandom(700 + k) for k in range(3)]
        ids = _add(srv.port, bodies, queue="t")
        assert _info(srv.port)["jobs_bodies_on_disk"] == "3"
        srv.restart()  # SIGTERM: the queues come back as they were
        assert _info(srv.port)["jobs_bodies_on_disk"] == "3"
        for job_id, body in zip(ids, bodies, strict=True):
            got = send_command(srv.port, "GETJOB", "NOHANG", "COUNT", 3, "FROM", "t")
            assert [g[1:] for g in got] == [[job_id, body]]  # one in flight at a time
            assert send_command(srv.port, "ACKJOB", job_id) == 1
