"""`trisque`'s redis-cli modes against a real trisque-server: --pipe, -x/-X, -u, --stat,
--latency and --latency-history, run as a user runs them (the real command, its stdout,
stderr and exit status). Where redis-cli is installed it runs against the same node and its
output is the yardstick.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_prompt import trisque_argv
from tests.support.server import REPO, ServerProcess, repo_env
from tests.support.terminal import Terminal

needs_redis_cli = pytest.mark.skipif(not shutil.which("redis-cli"),
                                     reason="redis-cli not installed")


@pytest.fixture(scope="module")
def node() -> Iterator[ServerProcess]:
    with ServerProcess() as n:
        yield n


def trisque(*args: str, stdin: bytes = b"", timeout: float = 60
            ) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(trisque_argv() + list(args), cwd=REPO, env=repo_env(), input=stdin,
                          capture_output=True, timeout=timeout)


def resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


SUMMARY = b"All data transferred. Waiting for the last reply...\n" \
          b"Last reply received from server.\n"


def test_pipe_100000_commands(node: ServerProcess) -> None:
    data = b"".join(resp(b"ADDJOB", b"piped", b"job-%d" % i, b"0") for i in range(100_000))
    r = trisque("-p", str(node.port), "--pipe", stdin=data)
    assert r.stdout == SUMMARY + b"errors: 0, replies: 100000\n"
    assert r.stderr == b"" and r.returncode == 0
    assert node.call("QLEN", "piped") == 100_000


def test_pipe_from_a_file_sends_it_whole(node: ServerProcess, tmp_path: Path) -> None:
    # A file on stdin goes with sendfile, a pipe with read and send: the same result.
    data = b"".join(resp(b"ADDJOB", b"filed", b"job-%d" % i, b"0") for i in range(20_000))
    (tmp_path / "commands").write_bytes(data + b"BOGUS\nQLEN filed\n")
    with (tmp_path / "commands").open("rb") as stdin:
        r = subprocess.run(trisque_argv() + ["-p", str(node.port), "--pipe"], stdin=stdin,
                           cwd=REPO, env=repo_env(), capture_output=True, timeout=60)
    assert r.stdout == SUMMARY + b"errors: 1, replies: 20002\n"
    assert (r.stderr, r.returncode) == (b"ERR unknown command 'BOGUS'\n", 1)
    assert node.call("QLEN", "filed") == 20_000


def test_pipe_one_command_per_line_with_errors(node: ServerProcess) -> None:
    lines = b'ADDJOB lines "a b" 0\nNOSUCHCOMMAND\nADDJOB lines\nQLEN lines\n'
    r = trisque("-p", str(node.port), "--pipe", stdin=lines)
    assert r.stdout == SUMMARY + b"errors: 2, replies: 4\n"
    assert r.stderr == (b"ERR unknown command 'NOSUCHCOMMAND'\n"
                        b"ERR wrong number of arguments for 'addjob' command\n")
    assert r.returncode == 1
    assert node.call("QPEEK", "lines", "1")[0][2] == b"a b"


def test_pipe_counts_integer_zero_replies(node: ServerProcess) -> None:
    # hiredis's "no reply yet" is False by default, which equals the reply 0: the batch
    # of replies must not end at a 0, nor the last reply be missed behind it.
    lines = b"QLEN nothing-here\n" * 3 + b"PING\n"
    r = trisque("-p", str(node.port), "--pipe", "--pipe-timeout", "5", stdin=lines)
    assert (r.stdout, r.stderr, r.returncode) == \
        (SUMMARY + b"errors: 0, replies: 4\n", b"", 0)


def test_pipe_with_a_password() -> None:
    with ServerProcess(requirepass="s3cret") as n:
        r = trisque("-p", str(n.port), "-a", "s3cret", "--pipe", stdin=resp(b"PING") * 3)
        assert (r.stdout, r.returncode) == (SUMMARY + b"errors: 0, replies: 3\n", 0)
        r = trisque("-p", str(n.port), "--pipe", stdin=resp(b"PING"))
        assert r.returncode == 1 and r.stderr.startswith(b"NOAUTH")


def test_pipe_starts_without_the_other_modes_imports(node: ServerProcess) -> None:
    """Start-up is what --pipe costs beyond redis-cli: none of these may load on its path."""
    code = ("import sys\n"
            "from cli.main import main\n"
            f"status = main(['-p', '{node.port}', '--pipe'])\n"
            "print(status, sorted(sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=repo_env(),
                       input=resp(b"PING"), capture_output=True, timeout=60)
    status, modules = r.stdout.decode().splitlines()[-1].split(" ", 1)
    assert status == "0", r.stdout + r.stderr
    loaded = set(json.loads(modules.replace("'", '"')))
    # hiredis too: one-line replies (PING's) are counted without a parser.
    heavy = {"socket", "selectors", "typing", "trio", "prompt_toolkit", "protocol",
             "cli.command_loop", "cli.reply_format", "cli.prompt", "hiredis"}
    assert "cli.pipe_mode" in loaded
    assert not heavy & loaded


@needs_redis_cli
@pytest.mark.parametrize("data", [
    b"".join(resp(b"ADDJOB", b"same", b"x", b"0") for _ in range(1000)) + resp(b"BOGUS"),
    b"PING\nQLEN same\n",
])
def test_pipe_prints_what_redis_cli_prints(node: ServerProcess, data: bytes) -> None:
    ours = trisque("-p", str(node.port), "--pipe", stdin=data)
    theirs = subprocess.run(["redis-cli", "-p", str(node.port), "--pipe"], input=data,
                            capture_output=True, timeout=60)
    assert (ours.stdout, ours.stderr, ours.returncode) == \
        (theirs.stdout, theirs.stderr, theirs.returncode)


def test_pipe_to_a_node_that_is_not_there() -> None:
    from tests.support.server import free_port

    port = free_port()
    r = trisque("-p", str(port), "--pipe", stdin=b"PING\n")
    assert r.returncode == 1
    assert r.stderr.decode() == f"Could not connect to trisque at 127.0.0.1:{port}: " \
                                "Connection refused\n"


def test_x_reads_the_last_argument_and_capital_x_a_tagged_one(node: ServerProcess,
                                                              tmp_path: Path) -> None:
    body = b"\x00binary\r\nbody\xff" * 100
    r = trisque("-p", str(node.port), "-X", "@", "ADDJOB", "bodies", "@", "0", stdin=body)
    assert r.returncode == 0 and r.stdout.startswith(b"D-")
    assert node.call("QPEEK", "bodies", "1")[0][2] == body
    r = trisque("-p", str(node.port), "-x", "QLEN", stdin=b"bodies")
    assert r.stdout == b"1\n"
    r = trisque("-p", str(node.port), "-X", "@", "QLEN", "bodies")
    assert r.returncode == 2 and b"no argument is '@'" in r.stderr


def test_u_uri_with_password() -> None:
    with ServerProcess(requirepass="s3cret") as n:
        for uri in (f"trisque://:s3cret@127.0.0.1:{n.port}",
                    f"redis://default:s3cret@127.0.0.1:{n.port}",
                    f"TRISQUE://s3cret@127.0.0.1:{n.port}"):
            r = trisque("-u", uri, "PING")
            assert (r.stdout, r.returncode) == (b"PONG\n", 0), uri
        r = trisque("-u", f"trisque://:wrong@127.0.0.1:{n.port}", "PING")
        assert r.returncode == 1
        assert r.stderr.startswith(b"AUTH failed: ")
        assert r.stdout.startswith(b"NOAUTH")
    r = trisque("-u", "http://127.0.0.1:1", "PING")
    assert r.returncode == 2 and b"invalid URI scheme" in r.stderr


def test_stat_lines(node: ServerProcess) -> None:
    with ServerProcess() as n:
        for i in range(3):
            n.call("ADDJOB", "stat-q", f"job{i}", "0")
        n.call("GETJOB", "FROM", "stat-q")  # one job delivered: held 3, queued 2, active 1
        proc = subprocess.Popen(trisque_argv() + ["-p", str(n.port), "--stat", "-i", "0.3"],
                                cwd=REPO, env=repo_env(), stdout=subprocess.PIPE)
        try:
            assert proc.stdout is not None
            lines = [proc.stdout.readline().decode() for _ in range(4)]
        finally:
            proc.terminate()
            proc.wait(10)
    assert lines[:2] == [
        "------------ jobs ----------- --------- load --------- ----- node ----\n",
        "held      queued    active    ops/s    clients blocked mem      queues\n"]
    first, second = lines[2].split(), lines[3].split()
    assert first[:3] == ["3", "2", "1"]
    assert first[4:6] == ["1", "0"]  # this client; nobody blocked
    assert re.fullmatch(r"\d+\.\d\d[KMG]", first[6])
    assert first[7] == "1"
    assert second[3] == "0"  # an idle node: its own INFO commands are not counted


def test_latency_not_on_a_terminal_prints_one_line_and_exits(node: ServerProcess) -> None:
    start = time.monotonic()
    r = trisque("-p", str(node.port), "--latency", "-i", "0.3")
    assert time.monotonic() - start < 20
    assert r.returncode == 0
    m = re.fullmatch(rb"(\d+) (\d+) (\d+\.\d\d) (\d+)\n", r.stdout)
    assert m, r.stdout
    low, high, avg, count = int(m[1]), int(m[2]), float(m[3]), int(m[4])
    assert low <= avg <= high and count >= 2  # sampled again and again (few under load)
    r = trisque("-p", str(node.port), "--json", "--latency", "-i", "0.2")
    assert set(json.loads(r.stdout)) == {"min", "max", "avg", "count"}


@needs_redis_cli
def test_latency_line_has_redis_cli_shape(node: ServerProcess) -> None:
    shape = rb"\d+ \d+ \d+\.\d\d \d+\n"
    theirs = subprocess.run(["redis-cli", "-p", str(node.port), "--latency", "-i", "0.2"],
                            capture_output=True, timeout=20)
    assert re.fullmatch(shape, theirs.stdout)
    assert re.fullmatch(shape, trisque("-p", str(node.port), "--latency", "-i", "0.2").stdout)


def test_latency_history_on_a_terminal(node: ServerProcess) -> None:
    term = Terminal(trisque_argv() + ["-p", str(node.port), "--latency-history", "-i", "0.5"],
                    repo_env(), str(REPO))
    line = re.compile(r"min: (\d+), max: (\d+), avg: (\d+\.\d\d) \((\d+) samples\) -- "
                      r"(\d+\.\d\d) seconds range")
    try:
        term.wait_for(lambda: sum(bool(line.fullmatch(t)) for t in term.lines()) >= 2,
                      "two latency history lines")
        lines = term.lines()
        cursor_y = term.screen.cursor.y
    finally:
        term.close()
    for text in lines[:2]:
        m = line.fullmatch(text)
        assert m, lines
        low, high, avg, samples, seconds = int(m[1]), int(m[2]), float(m[3]), int(m[4]), float(m[5])
        assert low <= avg <= high and samples >= 2 and seconds >= 0.5
    # The open window is redrawn in place on one line, not printed line after line.
    assert all(text == "" for y, text in enumerate(lines) if y > cursor_y)
    assert sum(1 for text in lines if text.startswith("min: ")) <= 3


def test_help_lists_every_mode() -> None:
    r = subprocess.run([sys.executable, "-m", "cli.main", "--help"], cwd=REPO,
                       capture_output=True, timeout=20)
    for option in ("--pipe", "--pipe-timeout", "--stat", "--latency ", "--latency-history",
                   "-x ", "-X <tag>", "-u <uri>", "-i <interval>", "--raw", "--json"):
        assert option in r.stdout.decode(), option


@pytest.mark.parametrize(("uri", "expected"), [
    ("trisque://10.0.0.5:7000", ("10.0.0.5", 7000, None, None)),
    ("redis://:p%40ss@node-a", ("node-a", 7711, None, "p@ss")),
    ("redis://default:pw@[::1]:7712", ("::1", 7712, "default", "pw")),
    ("trisque://justpass@h:1", ("h", 1, None, "justpass")),  # redis-cli: a password alone
])
def test_u_uri_forms(uri: str, expected: tuple[str, int, str | None, str | None]) -> None:
    from cli.options import parse_argv

    opts = parse_argv(["-a", "earlier", "-u", uri, "PING"])
    password = expected[3] if expected[3] is not None else "earlier"
    assert (opts.host, opts.port, opts.user, opts.password) == expected[:3] + (password,)
