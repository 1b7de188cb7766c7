"""``make bench`` row (p): trisque --pipe next to redis-cli --pipe into one real node."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from bench import pipe
from cli.bench_load import BenchError
from tests.support.server import ServerProcess


def test_a_short_real_row() -> None:
    res = pipe.run(runs=1, n=2000)
    text = pipe.render(res)
    assert text.startswith("(p) --pipe, 2,000 ADDJOB into one trisque node: medians of 1 run")
    assert "trisque --pipe" in text and "start-up" in text
    if shutil.which("redis-cli"):
        seconds = res["seconds"]
        assert isinstance(seconds, dict)
        ratio = seconds["redis-cli"] / seconds["trisque"]
        assert f"{ratio:.2f}x: {'PASS' if ratio >= 1 else 'MISS'}" in text


def test_a_client_that_does_not_deliver_every_command_fails_the_run(tmp_path: Path) -> None:
    data = tmp_path / "commands.resp"
    pipe.write_commands(data, 10)
    # Claims success for 10 replies but sends nothing.
    liar = ["sh", "-c", "cat >/dev/null; echo 'errors: 0, replies: 10'", "liar"]
    with ServerProcess() as node, pytest.raises(BenchError, match="0 jobs queued"):
        pipe.one_run(liar, node.port, data, 10, timeout=30)


def test_trisque_runs_as_the_installed_command_or_the_one_given() -> None:
    assert pipe.clients("/opt/other/bin/trisque")["trisque"] == ["/opt/other/bin/trisque"]
    script = Path(sys.executable).parent / "trisque"
    expected = [str(script)] if script.exists() else [sys.executable, "-m", "cli.main"]
    assert pipe.clients()["trisque"] == expected
