"""Job churn for memory measurements: many jobs through a node whose queue stays (nearly)
empty, so that whatever the node's memory does afterwards is what finished jobs left behind.

One blocking connection, pipelined in batches: a batch of commands goes out with one send and
its replies are read back before the next batch, so a path's steps (ADDJOB, then GETJOB, then
ACKJOB of the IDs it got) are each one round trip for ``batch`` jobs. Every reply is checked:
a refused job (``-OOM``, ``-NOREPL``, a job not deleted) raises ``ChurnError`` at once
instead of being counted. Used by the memory tests (tests/memory/) and ``make bench``'s
memory-churn row (``bench.memory``); works against the reference Disque too.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from typing import Any

from protocol.resp import NEED_DATA, Error, ReplyReader, encode_command

BODY = b"x" * 16
BATCH = 500


class ChurnError(Exception):
    """A reply that a healthy node would not give (the job was refused or lost)."""


class Pipe:
    """A pipelined blocking connection: ``run`` sends commands and returns their replies."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 30.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = ReplyReader()

    def run(self, commands: Sequence[Sequence[bytes | str | int]]) -> list[Any]:
        self.send(commands)
        return self.read(len(commands))

    def send(self, commands: Sequence[Sequence[bytes | str | int]]) -> None:
        self.sock.sendall(b"".join(encode_command(*c) for c in commands))

    def read(self, count: int) -> list[Any]:
        replies: list[Any] = []
        while len(replies) < count:
            reply = self.reader.next()
            if reply is NEED_DATA:
                data = self.sock.recv(1 << 18)
                if not data:
                    raise ChurnError("the node closed the connection")
                self.reader.feed(data)
            else:
                replies.append(reply)
        return replies

    def call(self, *args: bytes | str | int) -> Any:
        return self.run([args])[0]

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Pipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ids(replies: list[Any], what: str) -> list[bytes]:
    for r in replies:
        if isinstance(r, Error) or not isinstance(r, bytes):
            raise ChurnError(f"{what}: {r!r}")
    return replies


def _all_ones(replies: list[Any], what: str) -> None:
    for r in replies:
        if r != 1:
            raise ChurnError(f"{what} answered {r!r}, not 1")


def _taken(replies: list[Any], want: int) -> list[bytes]:
    """The job IDs of a GETJOB reply ([[queue, id, body], ...])."""
    reply = replies[0]
    if not isinstance(reply, list) or len(reply) != want:
        raise ChurnError(f"GETJOB gave {len(reply) if isinstance(reply, list) else reply!r} "
                         f"jobs, not {want}")
    return [entry[1] for entry in reply]


def add(pipe: Pipe, queue: str, n: int, *options: bytes | str | int,
        body: bytes = BODY) -> list[bytes]:
    return _ids(pipe.run([("ADDJOB", queue, body, 0, *options)] * n), "ADDJOB")


def add_delete(pipe: Pipe, jobs: int, *, retry0: bool = False, queue: str = "churn",
               batch: int = BATCH) -> None:
    """ADDJOB then DELJOB of each job at once: the queue holds at most ``batch`` jobs."""
    options = ("RETRY", 0) if retry0 else ()
    for n in batches(jobs, batch):
        ids = add(pipe, queue, n, *options)
        _all_ones(pipe.run([("DELJOB", i) for i in ids]), "DELJOB")


def consume(pipe: Pipe, jobs: int, *, ack: str = "ACKJOB", nack_first: bool = False,
            queue: str = "churn", batch: int = BATCH, body: bytes = BODY) -> None:
    """ADDJOB, GETJOB, then ACKJOB or FASTACK of what was taken; with ``nack_first`` each job
    is NACKed once and taken again before it is acknowledged."""
    getjob = ("GETJOB", "NOHANG", "COUNT", batch, "FROM", queue)
    for n in batches(jobs, batch):
        add(pipe, queue, n, body=body)
        ids = _taken(pipe.run([getjob]), n)
        if nack_first:
            _all_ones(pipe.run([("NACK", i) for i in ids]), "NACK")
            ids = _taken(pipe.run([getjob]), n)
        _all_ones(pipe.run([(ack, i) for i in ids]), ack)


def expire(pipe: Pipe, jobs: int, *, queue: str = "churn-ttl", batch: int = BATCH,
           timeout: float = 30.0) -> None:
    """ADDJOB ... TTL 1 RETRY 0, never taken: every job must expire by itself. Returns once
    the queue is empty again (raises after ``timeout`` s)."""
    for n in batches(jobs, batch):
        add(pipe, queue, n, "TTL", 1, "RETRY", 0)
    deadline = time.monotonic() + timeout
    while pipe.call("QLEN", queue):
        if time.monotonic() > deadline:
            raise ChurnError(f"jobs with TTL 1 still queued after {timeout:.0f} s")
        time.sleep(0.1)


def batches(jobs: int, batch: int) -> list[int]:
    full, rest = divmod(jobs, batch)
    return [batch] * full + ([rest] if rest else [])


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")
