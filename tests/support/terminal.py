"""A program in a real pseudo-terminal, and what a user would see on its screen.

``Terminal`` starts a command with pexpect and feeds everything it writes to pyte, a VT100
emulator, so tests read the screen (text, cursor, colours) instead of escape sequences. The
emulator also answers the cursor position requests a full-screen line editor sends, as a
terminal would.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pexpect
import pyte


class _AnsweringScreen(pyte.Screen):  # type: ignore[misc]
    def __init__(self, columns: int, lines: int, answer: Callable[[str], object]) -> None:
        super().__init__(columns, lines)
        self._answer = answer

    def write_process_input(self, data: str) -> None:
        self._answer(data)


class Terminal:
    def __init__(self, argv: list[str], env: dict[str, str], cwd: str,
                 columns: int = 160, lines: int = 30) -> None:
        self.child = pexpect.spawn(argv[0], argv[1:], env=env, cwd=cwd,
                                   dimensions=(lines, columns))
        self.screen = _AnsweringScreen(columns, lines, self.child.send)
        self.stream = pyte.ByteStream(self.screen)

    def pump(self, wait: float = 0.05) -> None:
        """Read what the program wrote so far into the screen."""
        while True:
            try:
                data = self.child.read_nonblocking(65536, timeout=wait)
            except (pexpect.TIMEOUT, pexpect.EOF):
                return
            self.stream.feed(data)
            wait = 0.01

    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display]

    def text(self) -> str:
        return "\n".join(self.lines())

    def cursor_line(self) -> str:
        return self.lines()[self.screen.cursor.y]

    def wait_for(self, check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump()
            if check():
                return
        raise AssertionError(f"timed out waiting for {what}; screen:\n{self.text()}")

    def wait_text(self, text: str, timeout: float = 10.0) -> None:
        self.wait_for(lambda: text in self.text(), repr(text), timeout)

    def type(self, keys: str) -> None:
        self.child.send(keys)

    def colour_at(self, y: int, x: int) -> str:
        return str(self.screen.buffer[y][x].fg)

    def close(self) -> int | None:
        if self.child.isalive():
            self.child.terminate(force=True)
        self.child.close()
        return self.child.exitstatus
