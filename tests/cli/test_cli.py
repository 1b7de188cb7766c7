"""`trisque` as a user runs it: a subprocess, its exact output and exit status.

Replies come from an in-process fake node (so nested replies can hold status, nil, errors and
binary bulks on demand). Where redis-cli and redis-server are installed, the formatting is
also compared byte for byte with redis-cli's on the same replies.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest

from protocol.resp import Error, Status
from tests.client.fake_node import CLOSE, FakeNode
from tests.support.server import REPO, free_port, repo_env
from tests.support.terminal import Terminal

NESTED = [
    [b"q1", Status("D-80c616e9-j2Mn-05a1"), b"body-1", b"nacks", 0],
    [],
    None,
    [b"a\n\"b\\\x01\xff", -7, [Error("ERR inner")]],
    1, 2, 3, 4, 5, 6, 7, 8,
]

TTY_NESTED = """\
 1) 1) "q1"
    2) D-80c616e9-j2Mn-05a1
    3) "body-1"
    4) "nacks"
    5) (integer) 0
 2) (empty array)
 3) (nil)
 4) 1) "a\\n\\"b\\\\\\x01\\xff"
    2) (integer) -7
    3) 1) (error) ERR inner
 5) (integer) 1
 6) (integer) 2
 7) (integer) 3
 8) (integer) 4
 9) (integer) 5
10) (integer) 6
11) (integer) 7
12) (integer) 8
"""


def fake_replies(argv: list[bytes]) -> Any:
    cmd = argv[0].upper()
    return {
        b"NESTED": NESTED,
        b"OKAY": Status("OK"),
        b"BULK": b"OK",
        b"NUM": 42,
        b"NIL": None,
        b"EMPTY": [],
        b"BINARY": b"\xff\x00ok",
        b"ECHO": argv[1:],
        b"DIE": CLOSE,
    }.get(cmd, Error(f"ERR unknown command '{argv[0].decode()}'"))


@pytest.fixture
def node() -> Iterator[FakeNode]:
    with FakeNode(fake_replies) as n:
        yield n


def trisque(*args: str, stdin: bytes | None = None, port: int | None = None,
            timeout: float = 20) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-m", "cli.main"]
    if port is not None:
        argv += ["-p", str(port)]
    return subprocess.run(argv + list(args), cwd=REPO, input=stdin if stdin is not None else b"",
                          capture_output=True, timeout=timeout)


def test_nested_reply_formatted_like_redis_cli(node: FakeNode) -> None:
    r = trisque("--no-raw", "NESTED", port=node.port)
    assert r.stdout.decode() == TTY_NESTED
    assert r.returncode == 0


@pytest.mark.parametrize(("cmd", "tty", "raw"), [
    ("OKAY", "OK\n", "OK\n"),
    ("BULK", '"OK"\n', "OK\n"),
    ("NUM", "(integer) 42\n", "42\n"),
    ("NIL", "(nil)\n", "\n"),
    ("EMPTY", "(empty array)\n", "\n"),
])
def test_scalars_tty_and_raw(node: FakeNode, cmd: str, tty: str, raw: str) -> None:
    assert trisque("--no-raw", cmd, port=node.port).stdout.decode() == tty
    # Not a terminal: raw by default, as redis-cli.
    assert trisque(cmd, port=node.port).stdout.decode() == raw
    assert trisque("--raw", cmd, port=node.port).stdout.decode() == raw


def test_raw_nested_one_element_per_line(node: FakeNode) -> None:
    r = trisque("--raw", "NESTED", port=node.port)
    assert r.stdout == (b"q1\nD-80c616e9-j2Mn-05a1\nbody-1\nnacks\n0\n\n\n"
                        b"a\n\"b\\\x01\xff\n-7\nERR inner\n\n1\n2\n3\n4\n5\n6\n7\n8\n")


def test_json_output_with_binary_and_errors(node: FakeNode) -> None:
    r = trisque("--json", "NESTED", port=node.port)
    doc = json.loads(r.stdout)
    assert doc[0] == ["q1", "D-80c616e9-j2Mn-05a1", "body-1", "nacks", 0]
    assert doc[1] == [] and doc[2] is None
    assert doc[3][0] == {"$bytes": "YQoiYlwB/w=="} and doc[3][2] == [{"error": "ERR inner"}]
    r = trisque("--json", "BULK", port=node.port)
    assert r.stdout == b'"OK"\n'
    r = trisque("--json", "FOO", port=node.port)
    assert json.loads(r.stdout) == {"error": "ERR unknown command 'FOO'"} and r.returncode == 1


def test_error_reply_exit_status(node: FakeNode) -> None:
    r = trisque("--no-raw", "FOO", "x", port=node.port)
    assert r.stdout == b"(error) ERR unknown command 'FOO'\n"
    assert r.returncode == 1
    r = trisque("FOO", port=node.port)
    assert r.stdout == b"ERR unknown command 'FOO'\n\n" and r.returncode == 1


def test_arguments_are_sent_verbatim(node: FakeNode) -> None:
    r = trisque("--no-raw", "ECHO", "-h", "a b", "", port=node.port)
    assert r.stdout == b'1) "-h"\n2) "a b"\n3) ""\n'


def test_stdin_mode_splits_with_quotes(node: FakeNode) -> None:
    lines = b'ECHO "a b" \'c d\' "\\x00\\xff"\n\nNUM\nFOO\nOKAY\n'
    r = trisque("--no-raw", port=node.port, stdin=lines)
    assert r.stdout == (b'1) "a b"\n2) "c d"\n3) "\\x00\\xff"\n(integer) 42\n'
                        b"(error) ERR unknown command 'FOO'\nOK\n")
    assert r.returncode == 1  # one reply was an error
    r = trisque("--no-raw", port=node.port, stdin=b"NUM\nOKAY\n")
    assert r.returncode == 0
    r = trisque("--no-raw", port=node.port, stdin=b'ECHO "unbalanced\nNUM\n')
    assert r.stderr == b"Invalid argument(s)\n"
    assert r.stdout == b"(integer) 42\n" and r.returncode == 1


def test_repeat_and_interval(node: FakeNode) -> None:
    start = time.monotonic()
    r = trisque("-r", "3", "-i", "0.2", "NUM", port=node.port)
    assert r.stdout == b"42\n42\n42\n"
    assert time.monotonic() - start >= 0.4
    assert sum(1 for c in node.commands if c == [b"NUM"]) == 3


def test_unreachable_node_one_line_message() -> None:
    port = free_port()
    r = trisque("PING", port=port)
    assert r.returncode == 1
    assert r.stderr.decode() == f"Could not connect to trisque at 127.0.0.1:{port}: Connection refused\n"
    assert r.stdout == b""


def test_node_dying_mid_command(node: FakeNode) -> None:
    r = trisque("DIE", port=node.port)
    assert r.returncode == 1
    assert r.stderr.decode() == (f"Error: connection to trisque at 127.0.0.1:{node.port} lost: "
                                 "Server closed the connection\n")
    assert b"Traceback" not in r.stderr


@pytest.mark.parametrize("args", [["-p"], ["-p", "x"], ["-p", "70000"], ["--bogus"],
                                  ["-r", "many", "PING"]])
def test_usage_errors_exit_2(args: list[str]) -> None:
    r = trisque(*args)
    assert r.returncode == 2
    assert r.stderr.startswith(b"trisque: ") and b"Traceback" not in r.stderr


def test_help_documents_options_tools_and_exit_status() -> None:
    r = trisque("--help")
    text = r.stdout.decode()
    assert r.returncode == 0
    for word in ("-h <hostname>", "-a <password>", "--raw", "--json", "--tool", "check-log",
                 "Exit status", "trisque-benchmark", ".trisque_history"):
        assert word in text


def test_hyphenated_tool_names_run_locally_and_never_reach_the_node(
        node: FakeNode, tmp_path: Path) -> None:
    before = list(node.commands)
    r = trisque("check-log", str(tmp_path / "missing.aof"), port=node.port)
    assert node.commands == before  # nothing was sent to the node
    assert r.returncode != 0 and b"Traceback" not in r.stderr
    assert b"missing.aof" in (r.stdout + r.stderr)
    r = trisque("--tool", "nope")
    assert r.returncode == 2 and b"unknown tool 'nope'" in r.stderr


def test_check_log_tool_is_dispatched(tmp_path: Path) -> None:
    r = trisque("--tool", "check-log", str(tmp_path / "missing.aof"))
    assert b"Traceback" not in r.stderr
    assert r.returncode != 0  # a missing file cannot be a good log


def test_interactive_prompt_help_and_quit(node: FakeNode, tmp_path: Path) -> None:
    env = repo_env()
    env.update(TRISQUE_HISTFILE=str(tmp_path / "hist"), TERM="xterm-256color")
    term = Terminal([sys.executable, "-m", "cli.main", "-p", str(node.port)], env, str(REPO))
    try:
        term.wait_text(f"127.0.0.1:{node.port}>")
        term.type("NESTED\r")
        term.wait_text("12) (integer) 8")
        assert TTY_NESTED in term.text() + "\n"
        term.type("help qpeek\r")
        term.wait_text("QPEEK queue count")
        term.type("FOO\r")
        term.wait_text("(error) ERR unknown command 'FOO'")
        term.type("quit\r")
        term.child.expect(pexpect.EOF, timeout=10)
        term.child.close()
        assert term.child.exitstatus == 0
    finally:
        term.close()
    assert "Traceback" not in term.text()
    assert (tmp_path / "hist").read_text().splitlines()[-1] == "quit"


needs_redis = pytest.mark.skipif(
    not (shutil.which("redis-cli") and shutil.which("redis-server")),
    reason="redis-cli/redis-server not installed")


@pytest.fixture
def redis_port(tmp_path: Path) -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ping = subprocess.run(["redis-cli", "-p", str(port), "PING"], capture_output=True,
                                  timeout=5)
            if ping.stdout == b"PONG\n":
                break
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@needs_redis
@pytest.mark.parametrize("mode", ["--no-raw", "--raw"])
@pytest.mark.parametrize("script", [
    "return {1,{2,'a',{}},{},false,redis.status_reply('OK'),'x\\n\\1y\"\\\\'}",
    "return {1,2,3,4,5,6,7,8,9,10,{1,{2,{}}},redis.error_reply('ERR inner')}",
    "return redis.error_reply('ERR top')",
    "return {}",
    "return false",
    "return 'caf\\195\\169'",
])
def test_same_bytes_as_redis_cli(redis_port: int, mode: str, script: str) -> None:
    ours = trisque(mode, "EVAL", script, "0", port=redis_port)
    theirs = subprocess.run(["redis-cli", "-p", str(redis_port), mode, "EVAL", script, "0"],
                            capture_output=True, timeout=10)
    assert ours.stdout == theirs.stdout
