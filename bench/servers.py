"""Servers that ``make bench`` starts for itself: trisque-server, redis-server and, when a
binary is given, the reference Disque (``DisqueServer``), all on loopback.

Each one gets a free port on 127.0.0.1 and its own temporary directory, is waited for until it
answers PING, and is stopped (SIGTERM, then SIGKILL) when the ``with`` block ends. A server that
cannot start says why in ``BenchServer.failure`` instead of raising, so one missing server turns
its column into "n/a" rather than ending the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.server import free_port, send_command

REPO = Path(__file__).resolve().parents[1]


def command(port: int, *args: bytes | str | int, timeout: float = 10.0) -> Any:
    """One command on a fresh connection; the parsed reply (error replies as values). The
    tests' ``send_command``, given longer by default: a node under load may answer slowly."""
    return send_command(port, *args, timeout=timeout)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class BenchServer:
    """A server process for the benchmark; ``kind`` is "trisque" or "redis" (``DisqueServer``
    is "disque"). ``settings`` become ``--name value`` options of its command line."""

    def __init__(self, kind: str, label: str, **settings: str) -> None:
        self.kind = kind
        self.label = label
        self.settings = settings
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.failure: str | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix=f"trisque-bench-{kind}-")
        self.dir = self._tmp.name
        self.log_path = os.path.join(self.dir, "server.log")

    def argv(self) -> list[str]:
        if self.kind == "trisque":
            argv = [sys.executable, "-m", "cli.server", "--port", str(self.port),
                    "--bind", "127.0.0.1", "--dir", self.dir]
            settings = {"appendonly": "no", **self.settings}
            for k, v in settings.items():
                argv += [f"--{k}", v]
            return argv
        settings = {"save": "", "appendonly": "no", **self.settings}
        argv = [shutil.which("redis-server") or "redis-server", "--port", str(self.port),
                "--bind", "127.0.0.1", "--dir", self.dir, "--daemonize", "no"]
        for k, v in settings.items():
            argv += [f"--{k}", v]
        return argv

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def ok(self) -> bool:
        return self.failure is None

    def start(self, timeout: float = 30.0) -> BenchServer:
        if self.kind == "redis" and not shutil.which("redis-server"):
            self.failure = "redis-server not installed"
            return self
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.argv(), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        except OSError as exc:
            self.failure = f"cannot start: {exc}"
            return self
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.failure = f"exited with {self.proc.returncode}: {self.last_log_line()}"
                return self
            try:
                if command(self.port, "PING", timeout=1.0) in (b"PONG", "PONG"):
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        self.failure = f"not answering PING after {timeout:.0f} s: {self.last_log_line()}"
        return self

    def last_log_line(self) -> str:
        try:
            lines = Path(self.log_path).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1][:200] if lines else ""

    def config(self, name: str) -> str | None:
        reply = command(self.port, "CONFIG", "GET", name)
        if isinstance(reply, list) and len(reply) >= 2:
            value = reply[1]
            return value.decode() if isinstance(value, bytes) else str(value)
        return None

    def flush(self) -> None:
        """Empty the server between runs so every run starts from the same state."""
        args = ("DEBUG", "FLUSHALL") if self.kind == "trisque" else ("FLUSHALL",)
        try:
            command(self.port, *args, timeout=60.0)
        except OSError:
            pass

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._tmp.cleanup()

    def __enter__(self) -> BenchServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


DISQUE_ENV = "TRISQUE_BENCH_DISQUE"


def disque_binary(given: str | None = None) -> str | None:
    """The reference Disque to measure against: ``given`` (a ``--disque`` option), else the
    ``TRISQUE_BENCH_DISQUE`` environment variable, else None (no Disque in this run). A path
    that is not an executable file is an error, not a silent fallback to redis-server."""
    path = given or os.environ.get(DISQUE_ENV) or None
    if path is None:
        return None
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        origin = "--disque" if given else DISQUE_ENV
        raise ValueError(f"{origin}={path!r} is not an executable file (build Disque from "
                         "https://github.com/antirez/disque with make in src/ and give the "
                         "path of src/disque-server)")
    return path


class DisqueServer(BenchServer):
    """antirez's Disque server binary, the reference of the single-node targets: same interface as
    the other servers, its own command line (the log off unless ``settings`` say otherwise)."""

    def __init__(self, binary: str, label: str, **settings: str) -> None:
        super().__init__("disque", label, **settings)
        self.binary = binary

    def argv(self) -> list[str]:
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir]
        for k, v in {"appendonly": "no", **self.settings}.items():
            argv += [f"--{k}", v]
        return argv

    def flush(self) -> None:
        command(self.port, "DEBUG", "FLUSHALL", timeout=60.0)
