"""SIGTERM stops an idle worker promptly whatever its nodes do (a node long dead, a node that
accepts connections and never answers), and a killed worker's scripts die with it."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

from tests.support.server import ServerProcess
from tests.support.worker import WorkerProcess, script

STOP_BOUND_S = 1.5  # "about a second" with room for a busy machine


def _sigterm_exit_time(worker: WorkerProcess) -> float:
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    code = worker.wait(10)
    took = time.monotonic() - started
    assert code == 0, worker.log()
    return took


def test_sigterm_stops_a_worker_whose_node_died_long_ago(tmp_path: Path) -> None:
    cmd = script(tmp_path / "ok.sh", "#!/bin/sh\necho done >&3\n")
    node = ServerProcess().start()
    try:
        worker = WorkerProcess([node.port], ["stop-q"], [cmd], log_dir=tmp_path / "logs").start()
    finally:
        node.kill()
    try:
        # Long enough for the backoff to grow past the bound (0.25, 0.5, 1, 2, 4 s...).
        time.sleep(9)
        assert worker.proc is not None and worker.proc.poll() is None, worker.log()
        assert "GETJOB failed" in worker.log()
        took = _sigterm_exit_time(worker)
    finally:
        worker.kill()
    assert took < STOP_BOUND_S, (took, worker.log())


def test_sigterm_stops_a_worker_stuck_on_a_node_that_never_answers(tmp_path: Path) -> None:
    """A listening socket nobody accepts on: connects succeed (the kernel's backlog), HELLO
    and GETJOB get no reply - a half-open node, waited on for the client's 5 s socket
    timeout."""
    cmd = script(tmp_path / "ok.sh", "#!/bin/sh\necho done >&3\n")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        worker = WorkerProcess([port], ["stop-q"], [cmd], log_dir=tmp_path / "logs").start()
        try:
            time.sleep(2)  # inside the first HELLO's 5 s wait
            took = _sigterm_exit_time(worker)
        finally:
            worker.kill()
    assert took < STOP_BOUND_S, (took, worker.log())
