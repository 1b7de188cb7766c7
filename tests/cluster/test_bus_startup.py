"""The real ``trisque-server`` process and its cluster config file: a corrupt nodes.conf stops
the start with one clear line naming the file and the line (never a silent reset); a missing
one is a new node whose file is written at once and reloaded at the next start."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.test_startup import run_server
from tests.support.server import ServerProcess, free_port


def test_a_corrupt_nodes_conf_stops_the_start(tmp_path: Path) -> None:
    conf = tmp_path / "nodes.conf"
    original = ("0123456789abcdef0123456789abcdef01234567 :7711 myself 0 0 connected\n"
                "0123456789abcdef0123456789abcdef0123456z 127.0.0.1:7712 noflags 0 0 connected\n")
    conf.write_text(original)
    proc = run_server("--port", str(free_port()), "--bind", "127.0.0.1", "--dir", str(tmp_path))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert str(conf) in proc.stderr and "line 2" in proc.stderr, output
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # one line, no traceback
    assert conf.read_text() == original  # untouched


def test_a_new_node_writes_nodes_conf_and_keeps_its_id(tmp_path: Path) -> None:
    with ServerProcess(directory=str(tmp_path)) as server:
        node_id = server.call("CLUSTER", "MYID")
        assert (tmp_path / "nodes.conf").read_text().startswith(node_id.decode())
        server.restart()
        assert server.call("CLUSTER", "MYID") == node_id
