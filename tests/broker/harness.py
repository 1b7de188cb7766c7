"""A broker core driven by a fake clock: times are plain integers passed as ``now_ms``."""

from __future__ import annotations

import random
from typing import Any

from broker.clients import Client
from broker.config import Config
from broker.core import Broker
from broker.effects import LogRecord, Reply

T0 = 1_700_000_000_000
NODE = "ab" * 20


class Node:
    def __init__(self, now: int = T0) -> None:
        self.now = now
        self.b = Broker(Config(), NODE, b"seed" * 5, now_ms=now, rng=random.Random(1))
        self.client = Client(1)
        self._log: list[LogRecord] = []
        self._replies: list[Reply] = []

    def _drain(self) -> None:
        """Sort the broker's effects as the server's route() does."""
        for effect in self.b.take_effects():
            (self._log if isinstance(effect, LogRecord) else self._replies).append(effect)

    @property
    def log(self) -> list[LogRecord]:
        """Log records emitted so far and not cleared by the test."""
        self._drain()
        return self._log

    @property
    def replies(self) -> list[Reply]:
        self._drain()
        return self._replies

    def __call__(self, *args: object, client: Client | None = None) -> Any:
        argv = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        reply = self.b.execute(argv, client or self.client, self.now)
        self._drain()
        return reply

    def add(self, queue: str = "q", body: str = "body", *opts: object) -> bytes:
        reply = self("ADDJOB", queue, body, 0, *opts)
        assert reply.startswith("D-"), reply
        return reply.encode()

    def tick(self, at: int) -> None:
        """One timer run at ``at`` (the driver may sleep long and wake once)."""
        assert at >= self.now
        self.now = at
        self.b.tick(at)
        self._drain()

    def run_until(self, at: int) -> None:
        """Wake up at every deadline the broker asks for, up to ``at``, like the driver."""
        while True:
            due = self.b.next_deadline()
            if due is None:
                break
            # A deadline is the start of a timer bucket: it may already be past.
            step = max(due, self.now + 1)
            if step > at:
                break
            self.tick(step)
        if at > self.now:
            self.tick(at)

    def show(self, job_id: bytes) -> dict[bytes, Any] | None:
        reply = self("SHOW", job_id)
        return None if reply is None else dict(zip(reply[::2], reply[1::2], strict=True))

    def qlen(self, queue: str = "q") -> int:
        return int(self("QLEN", queue))

    def info(self, field: str) -> int:
        text = self("INFO").decode()
        for line in text.split("\r\n"):
            if line.startswith(field + ":"):
                return int(line.split(":", 1)[1])
        raise KeyError(field)

    def jobs(self) -> int:
        return self.info("registered_jobs")

    def queues(self) -> int:
        return self.info("registered_queues")

    def take_replies(self) -> list[tuple[Client, Any]]:
        out = [(r.client, r.value) for r in self.replies]
        self._replies.clear()
        return out
