"""Read the recorded replies of the reference Disque server (tests/fixtures/).

The fixture is Markdown: one ``## title`` per scenario, then a fenced block where each
``> COMMAND args`` line (or ``[port]> COMMAND args`` when several nodes were involved) is
followed by one ``< reply`` line holding the parsed reply as a Python literal: bytes for a bulk
string, int, None for a null, ``('+', text)`` for a status reply, ``('-', text)`` for an error,
lists for arrays. ``load_section`` turns a section into ``Exchange`` records, in order.

The arguments in the recording contain no spaces or quotes, so a command line is split on
whitespace; a line that would need quoting is refused rather than guessed at.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "disque-reference-replies.md"

_COMMAND = re.compile(r"^(?:\[(\d+)\])?> (.+)$")


@dataclass(frozen=True)
class Exchange:
    line: int  # 1-based line of the '>' line in the fixture, for failure messages
    port: int | None  # the node the command went to, when the section names one
    argv: tuple[str, ...]
    expected: Any

    def __str__(self) -> str:
        where = f"[{self.port}]" if self.port else ""
        return f"{where}> {' '.join(self.argv)}  (fixture line {self.line})"


def section_lines(title: str, path: Path = FIXTURE) -> list[tuple[int, str]]:
    """The numbered lines inside the first fenced block under ``## title``."""
    lines = path.read_text().splitlines()
    try:
        start = lines.index(f"## {title}")
    except ValueError:
        raise KeyError(f"no section '## {title}' in {path}") from None
    out: list[tuple[int, str]] = []
    inside = False
    for number, text in enumerate(lines[start + 1 :], start + 2):
        if text.startswith("```"):
            if inside:
                return out
            inside = True
            continue
        if text.startswith("## "):
            break
        if inside:
            out.append((number, text))
    raise ValueError(f"section '## {title}' has no closed fenced block")


def parse_reply(text: str) -> Any:
    """A recorded reply, validated to contain only the value types the fixture uses."""
    value = ast.literal_eval(text)
    _check_value(value, text)
    return value


def _check_value(value: Any, text: str) -> None:
    if value is None or type(value) in (bytes, int):
        return
    if type(value) is tuple:
        if len(value) == 2 and value[0] in ("+", "-") and type(value[1]) is str:
            return
        raise ValueError(f"a tuple reply must be ('+'|'-', text): {text}")
    if type(value) is list:
        for item in value:
            _check_value(item, text)
        return
    raise ValueError(f"unexpected {type(value).__name__} in recorded reply: {text}")


def load_section(title: str, path: Path = FIXTURE) -> list[Exchange]:
    exchanges: list[Exchange] = []
    pending: tuple[int, int | None, tuple[str, ...]] | None = None
    for number, text in section_lines(title, path):
        if not text.strip():
            continue
        m = _COMMAND.match(text)
        if m:
            if pending is not None:
                raise ValueError(f"line {pending[0]}: command without a reply")
            if any(q in m.group(2) for q in "\"'\\"):
                raise ValueError(f"line {number}: quoted arguments are not supported")
            port = int(m.group(1)) if m.group(1) else None
            pending = (number, port, tuple(m.group(2).split()))
        elif text.startswith("< "):
            if pending is None:
                raise ValueError(f"line {number}: reply without a command")
            exchanges.append(Exchange(pending[0], pending[1], pending[2], parse_reply(text[2:])))
            pending = None
        else:
            raise ValueError(f"line {number}: neither '> command' nor '< reply': {text!r}")
    if pending is not None:
        raise ValueError(f"line {pending[0]}: command without a reply")
    return exchanges


def one_node() -> list[Exchange]:
    return load_section("One node")
