"""SIGTERM stops an idle worker promptly whatever its nodes do (a node long dead, a node that
accepts connections and never answers), and a killed worker's scripts die with it."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from cli.worker import leftovers
from cli.worker.joblog import file_name
from cli.worker.loop import Worker
from cli.worker.settings import parse
from tests.support.cluster import wait_until
from tests.support.server import REPO, ServerProcess, free_port, repo_env
from tests.support.worker import (
    WorkerProcess,
    add_job,
    kill_group,
    process_gone,
    script,
    wait_state,
)

STOP_BOUND_S = 1.5  # "about a second" with room for a busy machine


def _sigterm_exit_time(worker: WorkerProcess) -> float:
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    code = worker.wait(10)
    took = time.monotonic() - started
    assert code == 0, worker.log()
    return took


async def test_stopping_cuts_short_the_backoff_of_a_worker_whose_node_died_long_ago(
        tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    """In-process on the mock clock: a minute of failed GETJOBs grows the backoff to its
    longest sleep; the stop (what SIGTERM calls, as the next test shows on a real process)
    ends the worker at once, not after the sleep."""
    cmd = script(tmp_path / "ok.sh", "#!/bin/sh\necho done >&3\n")
    dead = free_port()  # nothing listens there: a node long dead
    worker = Worker(parse(["--nodes", f"127.0.0.1:{dead}", "--queue", "stop-q",
                           "--log-dir", str(tmp_path / "logs"), "--", str(cmd)]))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(60)  # virtual: past 0.25, 0.5, 1, 2, 4 s to the 5 s backoff
        assert worker._backoff is not None, "the worker is not in a backoff sleep"
        stopped_at = trio.current_time()
        worker.stop_taking()
    took = trio.current_time() - stopped_at
    assert took < STOP_BOUND_S / 10, took


@pytest.mark.timing
def test_sigterm_stops_a_worker_stuck_on_a_node_that_never_answers(tmp_path: Path) -> None:
    """A node that accepts connections and never answers: HELLO and GETJOB get no reply - a
    half-open node, waited on for the client's 5 s socket timeout."""
    cmd = script(tmp_path / "ok.sh", "#!/bin/sh\necho done >&3\n")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        silent.settimeout(20)
        port = silent.getsockname()[1]
        worker = WorkerProcess([port], ["stop-q"], [cmd], log_dir=tmp_path / "logs").start()
        try:
            conn, _ = silent.accept()
            with conn:
                conn.settimeout(20)
                assert conn.recv(4096), "no HELLO"  # the worker now waits for its reply
                took = _sigterm_exit_time(worker)
        finally:
            worker.kill()
    assert took < STOP_BOUND_S, (took, worker.log())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_workers_script_and_what_it_left_die(tmp_path: Path) -> None:
    q = "kill9-q"
    child_file = tmp_path / "child.pid"
    cmd = script(tmp_path / "spawns.sh", f"""\
        #!/bin/bash
        sleep 300 &
        echo $! > {child_file}
        echo "run started" >&3
        sleep 300
    """)
    with ServerProcess() as node:
        job = add_job(node.port, q, "x", "RETRY", "60")
        logs = tmp_path / "logs"
        first = WorkerProcess([node.port], [q], [cmd], log_dir=logs).start()
        script_pid = child_pid = 0
        try:
            running = wait_state(node.port, job, states=("running",))
            script_pid = running["pid"]
            wait_until(lambda: child_file.exists() and child_file.read_text().strip(), 10,
                       "the background child's pid")
            child_pid = int(child_file.read_text())
            assert list((logs / ".running").iterdir())  # the group is recorded
            first.kill()
            wait_until(lambda: process_gone(script_pid), 2.0, "the script dead with its worker")
            # Its background child has no death signal: the next worker's start kills it.
            assert not process_gone(child_pid)
            with WorkerProcess([node.port], [q], [cmd], log_dir=logs) as second:
                wait_until(lambda: process_gone(child_pid), 2.0, "the leftover killed at the start")
                assert f"killed pid {child_pid}, left running by worker pid" in second.log()
            assert not list((logs / ".running").iterdir())
        finally:
            for pid in (script_pid, child_pid):
                kill_group(pid)
                if pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not leftovers.enabled(), reason="needs /proc")
def test_the_sweep_never_kills_a_process_that_is_not_the_recorded_run(tmp_path: Path) -> None:
    """After pid reuse the recorded group may be someone else's: not the job's environment,
    not killed. A record of a live worker is left alone too."""
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True,
                                env={"PATH": os.environ["PATH"], "TRISQUE_JOB_ID": "D-other",
                                     "TRISQUE_ATTEMPT": "1"})
    try:
        running = tmp_path / leftovers.DIR_NAME
        running.mkdir()
        dead_worker = stranger.pid + 1_000_000  # no such pid
        (running / f"{dead_worker}-{stranger.pid}").write_text(
            f"{dead_worker} 1 {stranger.pid} D-recorded 1\n")
        assert leftovers.sweep(tmp_path) == 0
        assert stranger.poll() is None
        assert not list(running.iterdir())  # the stale record is dropped
        # The same group recorded with the stranger's own job but by a live worker (us):
        me = f"{os.getpid()} {leftovers._start_time(os.getpid())}"
        (running / f"{os.getpid()}-{stranger.pid}").write_text(f"{me} {stranger.pid} D-other 1\n")
        assert leftovers.sweep(tmp_path) == 0 and stranger.poll() is None
        # Its worker gone, the same record is the run's: killed.
        (running / f"{os.getpid()}-{stranger.pid}").write_text(
            f"{dead_worker} 1 {stranger.pid} D-other 1\n")
        assert leftovers.sweep(tmp_path) == 1
        assert stranger.wait(5) == -signal.SIGKILL
    finally:
        stranger.kill()
        stranger.wait(5)


def test_a_script_started_through_the_launcher_has_a_shells_signal_state(
        tmp_path: Path) -> None:
    """The launcher is Python, which ignores SIGPIPE and SIGXFSZ: the command exec'd from it
    must not ignore them (nor block any signal), and have no descriptor 5 (the launcher's)."""
    fds = tmp_path / "fds"
    checker = script(tmp_path / "fds.sh", f"""\
        #!/bin/bash
        ls /proc/$$/fd > {fds}
        echo done ok >&3
    """)
    with ServerProcess() as node:
        logs = tmp_path / "logs"
        job = grep_job = add_job(node.port, "sigs-q", "x")
        # grep itself is the command: what it inherited is what a script would.
        with WorkerProcess([node.port], ["sigs-q"], ["grep", "-E", "^Sig(Ign|Blk):",
                                                     "/proc/self/status"], log_dir=logs):
            assert wait_state(node.port, job)["exit-code"] == 0  # no fd 3 line: "failed"
        job = add_job(node.port, "fds-q", "x")
        with WorkerProcess([node.port], ["fds-q"], [checker], log_dir=logs):
            assert wait_state(node.port, job)["state"] == "done"
    masks = dict(line.split() for line in (logs / file_name(grep_job, 1)).read_text().splitlines())
    assert int(masks["SigBlk:"], 16) == 0
    ignored = int(masks["SigIgn:"], 16)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGINT):
        assert not ignored & (1 << (sig - 1)), (sig, masks)
    assert "5" not in fds.read_text().split()


_SPAWNER = """
import sys, trio
from cli.worker import process
process.launcher = lambda: (sys.executable, "-I", "-S", "-c", process._LAUNCHER)
async def main():
    try:
        await process.spawn(["no-such-program-anywhere"], {"PATH": "/usr/bin:/bin"})
    except FileNotFoundError as exc:
        print("refused", exc.errno, flush=True)
    proc = await process.spawn(["sleep", "60"], {"PATH": "/usr/bin:/bin"})
    print(proc.pid, flush=True)
    await trio.sleep(60)
trio.run(main)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_python_launcher_reports_exec_failures_and_its_script_dies_with_the_worker(
        tmp_path: Path) -> None:
    """The fallback where setpriv is missing: a stand-in worker spawns through it, then is
    killed with SIGKILL."""
    spawner = subprocess.Popen([sys.executable, "-c", _SPAWNER], cwd=REPO, env=repo_env(),
                               stdout=subprocess.PIPE, text=True)
    pid = 0
    try:
        assert spawner.stdout is not None
        assert spawner.stdout.readline().split() == ["refused", str(errno.ENOENT)]
        pid = int(spawner.stdout.readline())
        assert not process_gone(pid)
        spawner.kill()
        spawner.wait(5)
        wait_until(lambda: process_gone(pid), 2.0, "the script dead with its worker")
    finally:
        spawner.kill()
        spawner.wait(5)
        kill_group(pid)
