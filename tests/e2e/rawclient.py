"""A blocking loopback connection for end-to-end tests that sees reply *types* as sent.

The fixture of reference replies tells ``+status`` from ``$bulk`` (ADDJOB answers a status, GETJOB
a bulk ID), and hiredis cannot, so replies are parsed here by a deliberately small reader that
is independent of the server's own codec: a test that used the code under test as its oracle
could not catch a bug shared by both. Values come out in the fixture's notation:
``('+', text)``, ``('-', text)``, ``bytes``, ``int``, ``None`` (null bulk or null array), lists.

Every socket operation has a timeout, so a stalled server fails a test instead of hanging it.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from protocol.resp import encode_command


class Incomplete(Exception):
    """The buffer ends before the reply does."""


class ServerClosed(Exception):
    """The server closed the connection; ``data`` is what it sent before closing."""

    def __init__(self, data: bytes) -> None:
        super().__init__(f"server closed the connection after sending {data!r}")
        self.data = data


def parse_one(buf: bytes, pos: int = 0) -> tuple[Any, int]:
    """One reply starting at ``pos``: (value, position after it). Raises ``Incomplete``."""
    nl = buf.find(b"\r\n", pos)
    if nl < 0:
        raise Incomplete
    kind, line, after = buf[pos : pos + 1], buf[pos + 1 : nl], nl + 2
    # surrogateescape: an error may echo a client's raw bytes (an unknown command's name).
    if kind == b"+":
        return ("+", line.decode("utf-8", "surrogateescape")), after
    if kind == b"-":
        return ("-", line.decode("utf-8", "surrogateescape")), after
    if kind == b":":
        return int(line), after
    if kind == b"$":
        n = int(line)
        if n < 0:
            return None, after
        if len(buf) < after + n + 2:
            raise Incomplete
        if buf[after + n : after + n + 2] != b"\r\n":
            raise ValueError(f"bulk of {n} bytes not followed by CRLF in {buf!r}")
        return buf[after : after + n], after + n + 2
    if kind == b"*":
        n = int(line)
        if n < 0:
            return None, after
        items = []
        for _ in range(n):
            item, after = parse_one(buf, after)
            items.append(item)
        return items, after
    if kind == b"_":
        return None, after
    raise ValueError(f"unknown reply type {kind!r} in {buf[pos:pos + 80]!r}")


class RawConnection:
    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.timeout = timeout
        self.buf = b""

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def call(self, *args: bytes | str | int) -> Any:
        self.send(encode_command(*args))
        return self.reply()

    def reply(self, timeout: float | None = None) -> Any:
        """The next reply; ``ServerClosed`` if the connection ends first."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            try:
                value, used = parse_one(self.buf)
            except Incomplete:
                pass
            else:
                self.buf = self.buf[used:]
                return value
            self._recv(deadline)

    def raw_reply(self, timeout: float | None = None) -> bytes:
        """The exact bytes of the next reply."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            try:
                _, used = parse_one(self.buf)
            except Incomplete:
                self._recv(deadline)
                continue
            raw, self.buf = self.buf[:used], self.buf[used:]
            return raw

    def read_until_closed(self, timeout: float | None = None) -> bytes:
        """Everything the server sends until it closes; fails if it keeps the connection open."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        try:
            while True:
                self._recv(deadline)
        except ServerClosed as closed:
            return closed.data

    def _recv(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no complete reply in time; buffered {self.buf[:200]!r}")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise TimeoutError(f"no complete reply in time; buffered {self.buf[:200]!r}") from None
        except ConnectionResetError:
            data = b""
        if not data:
            data, self.buf = self.buf, b""
            raise ServerClosed(data)
        self.buf += data
