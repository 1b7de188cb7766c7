"""Run real ``trisque worker`` processes against real nodes, and read their run records.

``WorkerProcess`` starts ``python -m cli.main worker`` (this checkout's code, see
``repo_env``) with its stderr in a file, waits until it logs that it serves, and stops it with
SIGTERM (``stop``) or SIGKILL (``kill``). ``run_record`` reads ``JOBRUN GET`` as a dict of str
keys. ``script`` writes an executable file; ``process_gone`` says a process has died. Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from tests.support.cluster import wait_until
from tests.support.server import REPO, repo_env, send_command


def process_gone(pid: int) -> bool:
    """Gone, or a zombie waiting for whoever adopted it (init may reap it a little later)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:  # reaped between the two looks
        return True


def script(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    path.chmod(0o755)
    return path


def run_record(port: int, job_id: str | bytes) -> dict[str, Any] | None:
    reply = send_command(port, "JOBRUN", "GET", job_id)
    if reply is None:
        return None
    assert isinstance(reply, list), reply
    return {k.decode(): (v.decode() if isinstance(v, bytes) else v)
            for k, v in zip(reply[::2], reply[1::2], strict=True)}


def run_output(port: int, job_id: str | bytes, offset: int = 0) -> tuple[int, int, bytes]:
    start, nxt, data = send_command(port, "JOBRUN", "OUTPUT", job_id, str(offset))
    return start, nxt, data


def add_job(port: int, queue: str, body: str | bytes, *opts: str) -> str:
    reply = send_command(port, "ADDJOB", queue, body, "0", *opts)
    assert isinstance(reply, bytes) and reply.startswith(b"D-"), reply
    return reply.decode()


def wait_state(port: int, job_id: str, timeout: float = 20.0, *,
               states: tuple[str, ...] = ("done", "failed", "resent", "timeout", "stopped",
                                          "lost")) -> dict[str, Any]:
    """The job's newest run record once it is in one of ``states`` (by default: ended)."""
    record, _ = wait_until(
        lambda: (r := run_record(port, job_id)) is not None and r["state"] in states and r,
        timeout, f"a run of {job_id} in {states}")
    return record  # type: ignore[return-value]


class WorkerProcess:
    def __init__(self, nodes: list[int], queues: list[str], command: list[str | Path], *,
                 log_dir: Path, options: tuple[str, ...] = ()) -> None:
        argv = [sys.executable, "-m", "cli.main", "worker",
                "--nodes", ",".join(f"127.0.0.1:{p}" for p in nodes),
                "--log-dir", str(log_dir)]
        for q in queues:
            argv += ["--queue", q]
        self.argv = [*argv, *options, "--", *map(str, command)]
        self.stderr_path = log_dir.parent / f"worker-{time.monotonic_ns()}.stderr"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(self.argv, cwd=REPO, env=repo_env(),
                                     stdout=subprocess.DEVNULL, stderr=self._stderr)
        wait_until(lambda: "queues" in self.log() or self.proc.poll() is not None,  # type: ignore[union-attr]
                   20.0, "the worker to start")
        assert self.proc.poll() is None, self.log()
        return self

    def log(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        finally:
            self._stderr.close()

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        except subprocess.TimeoutExpired:
            self.kill()
            raise


def kill_group(pid: int) -> None:
    """Kill a script's process group the test left running (a killed worker's orphans)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
