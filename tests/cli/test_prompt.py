"""The interactive `trisque` prompt as a user sees it: a real trisque-server, the real `trisque`
command in a pseudo-terminal, and the screen read back through a terminal emulator
(tests/support/terminal.py): what Tab completes, the grey hint, history, help.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pexpect
import pytest

from tests.support.server import REPO, ServerProcess, repo_env
from tests.support.terminal import Terminal


def trisque_argv() -> list[str]:
    """The installed `trisque` command of this environment (this checkout's code runs: the
    environment puts it first on PYTHONPATH)."""
    script = Path(sys.executable).parent / "trisque"
    return [str(script)] if script.exists() else [sys.executable, "-m", "cli.main"]


@pytest.fixture(scope="module")
def node() -> Iterator[ServerProcess]:
    with ServerProcess() as n:
        n.call("ADDJOB", "orders-eu", "x", "0")
        n.call("ADDJOB", "orders-us", "x", "0")
        n.call("ADDJOB", "billing", "x", "0")
        yield n


@pytest.fixture
def histfile(tmp_path: Path) -> Path:
    return tmp_path / "history"


@pytest.fixture
def open_prompt(node: ServerProcess, histfile: Path) -> Iterator[Callable[[], Terminal]]:
    terminals: list[Terminal] = []

    def start() -> Terminal:
        env = repo_env()
        env.update(TRISQUE_HISTFILE=str(histfile), TERM="xterm-256color")
        term = Terminal(trisque_argv() + ["-p", str(node.port)], env, str(REPO))
        terminals.append(term)
        term.wait_text(f"127.0.0.1:{node.port}>")
        return term

    yield start
    for term in terminals:
        term.close()


def prompt_line(term: Terminal) -> str:
    return term.cursor_line().split("> ", 1)[1] if "> " in term.cursor_line() else ""


def wait_line(term: Terminal, expected: str) -> None:
    term.wait_for(lambda: prompt_line(term) == expected, f"the line {expected!r}")


def test_tab_completes_command_names_and_subcommands(open_prompt: Callable[[], Terminal]) -> None:
    term = open_prompt()
    term.type("getj\t")
    wait_line(term, "GETJOB [NOHANG] [TIMEOUT ms] [COUNT count] [WITHCOUNTERS] FROM queue "
                    "[queue ...]")
    assert term.screen.cursor.x == len(term.cursor_line().split("> ")[0]) + 2 + len("GETJOB")
    term.type("\x15CLUSTER \t")  # Ctrl-U clears the line
    term.wait_for(lambda: all(f" {sub}" in term.text() for sub in
                              ("MEET", "NODES", "INFO", "LEAVING", "FORGET", "RESET")),
                  "the subcommands of CLUSTER listed")
    term.type("\x15CLUSTER LEAV\t")
    wait_line(term, "CLUSTER LEAVING [yes|no]")
    term.type("\x15help qpe\t")
    wait_line(term, "help QPEEK")


def test_tab_completes_queue_names_where_a_queue_goes(open_prompt: Callable[[], Terminal]) -> None:
    term = open_prompt()
    term.type("QLEN bil\t")
    wait_line(term, "QLEN billing")
    term.type("\r")
    term.wait_text("(integer) 1")
    term.type("GETJOB NOHANG FROM orders-e\t")
    wait_line(term, "GETJOB NOHANG FROM orders-eu [queue ...]")
    term.type("\x15GETJOB NOHANG FROM ord\t")  # two queues match: both are offered
    term.wait_for(lambda: "orders-eu" in term.text() and "orders-us" in term.text()
                  and prompt_line(term).startswith("GETJOB NOHANG FROM orders-"),
                  "both orders queues offered")
    term.type("\x15ADDJOB q body 0 bil\t")  # no queue goes there: nothing completes
    term.wait_for(lambda: prompt_line(term).startswith("ADDJOB q body 0 bil "), "the line")
    term.pump(0.5)
    assert prompt_line(term).startswith("ADDJOB q body 0 bil ")
    below = term.lines()[term.screen.cursor.y + 1:]
    assert not any("billing" in line for line in below)  # no menu


def test_grey_hint_shrinks_as_arguments_are_typed(open_prompt: Callable[[], Terminal],
                                                  node: ServerProcess) -> None:
    term = open_prompt()
    term.type("ADDJOB ")
    rest = "[REPLICATE count] [DELAY sec] [RETRY sec] [TTL sec] [MAXLEN count] [ASYNC] [PRIORITY 0-9] [AFTER id ...]"
    wait_line(term, "ADDJOB queue body ms-timeout " + rest)
    y, start = term.screen.cursor.y, term.screen.cursor.x
    hint_colours = {term.colour_at(y, x) for x in range(start, start + len("queue body"))}
    typed_colours = {term.colour_at(y, x) for x in range(start - len("ADDJOB "), start - 1)}
    assert hint_colours == {"brightblack"}  # grey, as redis-cli's (SGR 90)
    assert "brightblack" not in typed_colours
    term.type("hinted ")
    wait_line(term, "ADDJOB hinted body ms-timeout " + rest)
    term.type("b 0 REPLICATE ")
    wait_line(term, "ADDJOB hinted b 0 REPLICATE count [DELAY sec] [RETRY sec] [TTL sec] "
                    "[MAXLEN count] [ASYNC] [PRIORITY 0-9] [AFTER id ...]")
    term.type("1")
    wait_line(term, "ADDJOB hinted b 0 REPLICATE 1 [DELAY sec] [RETRY sec] [TTL sec] "
                    "[MAXLEN count] [ASYNC] [PRIORITY 0-9] [AFTER id ...]")
    term.type("\r")  # the hint is only drawn: what was typed is what is sent
    term.wait_for(lambda: any(line.startswith("D-") for line in term.lines()), "a job ID")
    assert any(line.endswith("> ADDJOB hinted b 0 REPLICATE 1") for line in term.lines())
    assert node.call("QLEN", "hinted") == 1
    term.type("INFO")
    wait_line(term, "INFO [section]")


def test_history_is_kept_across_sessions(open_prompt: Callable[[], Terminal], histfile: Path) -> None:
    term = open_prompt()
    term.type("PING remember-me\r")
    term.wait_text('"remember-me"')
    term.type("help QPEEK\r")
    term.wait_text("QPEEK queue count")
    term.type("quit\r")
    term.child.expect_exact(pexpect.EOF, timeout=10)
    assert histfile.read_text().splitlines() == ["PING remember-me", "help QPEEK", "quit"]
    term = open_prompt()
    term.type("\x1b[A\x1b[A\x1b[A")  # Up three times
    wait_line(term, "PING remember-me")
    term.type("\r")
    term.wait_for(lambda: term.text().count('"remember-me"') == 1 and
                  term.text().rstrip().endswith(">"), "the reply to the recalled line")
    term.type("\x04")  # Ctrl-D leaves
    term.child.expect_exact(pexpect.EOF, timeout=10)
    term.child.close()
    assert term.child.exitstatus == 0
    assert os.path.getsize(histfile) > 0
