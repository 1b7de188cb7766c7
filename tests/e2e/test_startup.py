"""The server refuses a configuration it does not understand, and says where the mistake is.

A typo in a directive must stop the start-up (a node running with a setting silently ignored is
worse than one that does not start), with a message naming the directive and, for a file, the
line. Checked on the real process: exit status and what it printed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.server import REPO, ServerProcess, free_port


def run_server(*args: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "cli.server", *args],
            cwd=REPO, capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        # subprocess.run has killed it: it started instead of refusing.
        raise AssertionError(f"the server did not exit within {timeout} s with {args}: "
                             f"{exc.stdout!r} {exc.stderr!r}") from None


def test_unknown_directive_on_the_command_line(tmp_path: Path) -> None:
    proc = run_server("--port", str(free_port()), "--bind", "127.0.0.1", "--dir", str(tmp_path),
                      "--bogus-directive", "1")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "bogus-directive" in output, output


def test_unknown_directive_in_a_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "bad.conf"
    conf.write_text(f"# a trisque configuration\nport {free_port()}\nbogus-directive 1\nhz 10\n")
    proc = run_server(str(conf), "--bind", "127.0.0.1", "--dir", str(tmp_path))
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "bogus-directive" in output, output
    # Redis and Disque say "at line 3"; "bad.conf:3" says the same.
    assert re.search(r"line\s*:?\s*3\b|bad\.conf:3\b", output), output


def test_a_valid_config_file_starts(tmp_path: Path) -> None:
    # The refusal above is about the directive, not about config files in general.
    conf = tmp_path / "good.conf"
    conf.write_text("# a trisque configuration\nhz 10\n")
    with ServerProcess(config_file=str(conf)) as server:
        assert server.call("PING") == b"PONG"
