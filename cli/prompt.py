"""`trisque`'s interactive prompt: prompt_toolkit's line editor with redis-cli's manners.

* Tab completes the command name (``getj`` -> ``GETJOB``), then the subcommand, keyword or
  choice the syntax allows next (``CLUSTER <Tab>``), and queue names where a queue goes (from
  QSCAN, kept for ``QUEUE_NAMES_TTL`` seconds); ``help <Tab>`` completes command names.
* The hint: the syntax still to type, in grey after the cursor, shrinking as arguments are
  typed (``cli.syntax`` reads it from ``cli.help_table``, the table ``help`` prints). It is
  only drawn, never inserted: Enter sends what was typed, and the line stays on screen
  without it.
* History: one line per command in ~/.trisque_history ($TRISQUE_HISTFILE), the plain format
  readline wrote before, the last ``HISTORY_LENGTH`` kept.

When stdout is not a terminal (``trisque > file`` typed at a terminal) the editor would write
its escape codes into the file, so the prompt falls back to plain ``input()``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from cli import help_table, syntax
from cli.connection import NodeConnection, NodeGone
from protocol.resp import ProtocolError, split_args

HISTORY_LENGTH = 1000
QUEUE_NAMES_TTL = 5.0  # seconds a QSCAN listing is reused for completion
QSCAN_MAX_CALLS = 20  # at most this many QSCAN calls (of COUNT 1000) per listing
QSCAN_TIMEOUT = 1.0  # seconds; a node too busy to answer leaves Tab without queue names
HINT_STYLE = "fg:ansibrightblack"  # redis-cli's grey (SGR 90)


def history_path() -> str:
    return os.environ.get("TRISQUE_HISTFILE") or os.path.expanduser("~/.trisque_history")


class QueueNames:
    """The node's queue names for completion, listed with QSCAN at most every TTL seconds."""

    def __init__(self, conn: NodeConnection) -> None:
        self.conn = conn
        self.names: list[str] = []
        self.fetched = -QUEUE_NAMES_TTL

    def get(self) -> list[str]:
        now = time.monotonic()
        if now - self.fetched >= QUEUE_NAMES_TTL and self.conn.sock is not None:
            self.fetched = now
            try:
                self.names = self._scan()
            except NodeGone:
                self.names = []
        return self.names

    def _scan(self) -> list[str]:
        names: set[str] = set()
        cursor = b"0"
        for _ in range(QSCAN_MAX_CALLS):
            reply = self.conn.call([b"QSCAN", cursor, b"COUNT", b"1000"], timeout=QSCAN_TIMEOUT)
            if not isinstance(reply, list) or len(reply) != 2:
                break
            cursor = reply[0]
            names.update(n.decode("utf-8", "replace") for n in reply[1])
            if cursor == b"0":
                break
        return sorted(names)


def completions(line: str, queue_names: Callable[[], list[str]]) -> list[tuple[str, str]]:
    """(word, prefix it replaces) pairs for Tab on ``line``, the text before the cursor."""
    words, between = syntax.split_words(line)
    partial = "" if not words or between else words[-1]
    if len(words) <= 1 and partial == line.lstrip():
        names = syntax.command_names()
        names += [w for w in help_table.PROMPT_WORDS if w.upper() not in names]
        return [(n, partial) for n in names if n.upper().startswith(partial.upper())]
    if words[0].lower() == "help" and len(words) - (1 if partial else 0) == 1:
        return [(n, partial) for n in syntax.command_names()
                if n.upper().startswith(partial.upper())]
    analysis = syntax.analyse(line[:len(line) - len(partial)])
    if analysis is None:
        return []
    candidates = list(analysis.keywords)
    if analysis.wants_queue:
        candidates += queue_names()
    seen: set[str] = set()
    out = []
    for word in candidates:
        if word.upper().startswith(partial.upper()) and word not in seen:
            seen.add(word)
            out.append((word, partial))
    return out


def run_prompt(conn: NodeConnection, run_line: Callable[[list[bytes]], None]) -> int:
    """The prompt loop; ``run_line`` sends one command and prints its reply."""
    read_line, finish = (_editor(conn) if sys.stdout.isatty() else _plain_input())
    try:
        conn.connect()
    except NodeGone as exc:
        sys.stderr.write(f"{exc}\n")
    try:
        while True:
            prompt = f"{conn.name}> " if conn.sock is not None else "not connected> "
            try:
                line = read_line(prompt)
            except EOFError:
                sys.stdout.write("\n")
                return 0
            except KeyboardInterrupt:
                sys.stdout.write("\n")
                continue
            try:
                args = split_args(line.encode("utf-8", "surrogateescape"))
            except ProtocolError:
                sys.stdout.write("Invalid argument(s)\n")
                continue
            if not args:
                continue
            word = args[0].decode("utf-8", "replace").lower()
            if word in ("quit", "exit"):
                return 0
            if word == "help":
                topic = b" ".join(args[1:]).decode("utf-8", "replace")
                sys.stdout.write(help_table.help_text(topic))
                continue
            if word == "clear":
                sys.stdout.write("\033[H\033[2J")
                continue
            try:
                run_line(args)
            except NodeGone as exc:
                sys.stdout.write(f"{exc}\n")
            except KeyboardInterrupt:
                conn.close()  # the reply, if it ever comes, must not answer the next command
                sys.stdout.write("\n")
    finally:
        finish()
        conn.close()


def _editor(conn: NodeConnection) -> tuple[Callable[[str], str], Callable[[], None]]:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.completion import CompleteEvent, Completer, Completion
    from prompt_toolkit.document import Document
    from prompt_toolkit.filters import is_done
    from prompt_toolkit.history import History
    from prompt_toolkit.layout.processors import (
        ConditionalProcessor,
        Processor,
        Transformation,
        TransformationInput,
    )
    from prompt_toolkit.styles import Style

    path = Path(history_path())

    class LineHistory(History):
        def load_history_strings(self) -> Iterable[str]:
            try:
                lines = path.read_text("utf-8", "surrogateescape").splitlines()
            except OSError:
                lines = []
            return list(reversed(lines[-HISTORY_LENGTH:]))

        def store_string(self, string: str) -> None:
            try:
                with path.open("a", encoding="utf-8", errors="surrogateescape") as f:
                    f.write(string.replace("\n", " ") + "\n")
            except OSError:
                pass

    queues = QueueNames(conn)

    class CommandCompleter(Completer):
        def get_completions(self, document: Document,
                            complete_event: CompleteEvent) -> Iterator[Completion]:
            for word, partial in completions(document.text_before_cursor, queues.get):
                yield Completion(word, start_position=-len(partial))

    class Hint(Processor):
        def apply_transformation(self, ti: TransformationInput) -> Transformation:
            fragments: list[Any] = list(ti.fragments)
            document = ti.document
            if ti.lineno == document.line_count - 1 and document.is_cursor_at_the_end:
                analysis = syntax.analyse(document.text)
                if analysis is not None and analysis.hint:
                    fragments.append(("class:hint", analysis.hint))
            return Transformation(fragments)

    session: PromptSession[str] = PromptSession(
        history=LineHistory(), completer=CommandCompleter(), complete_while_typing=False,
        # Once Enter is pressed the line stays on screen as sent, without its hint.
        input_processors=[ConditionalProcessor(Hint(), ~is_done)], style=Style.from_dict({"hint": HINT_STYLE}))

    def finish() -> None:
        try:  # keep the file to its last HISTORY_LENGTH lines
            lines = path.read_text("utf-8", "surrogateescape").splitlines()
            if len(lines) > HISTORY_LENGTH:
                path.write_text("\n".join(lines[-HISTORY_LENGTH:]) + "\n", "utf-8",
                                "surrogateescape")
        except OSError:
            pass

    return (lambda prompt: session.prompt(prompt)), finish


def _plain_input() -> tuple[Callable[[str], str], Callable[[], None]]:
    return input, lambda: None
