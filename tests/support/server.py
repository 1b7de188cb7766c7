"""Start real ``trisque-server`` processes on loopback for end-to-end tests.

``ServerProcess`` runs ``python -m cli.server`` with directives given as ``--name value``
arguments, on a free port of 127.0.0.1, with its ``dir`` in a temporary folder, and waits until
the node answers PING. It is a context manager; ``kill()`` sends SIGKILL (crash tests),
``stop()`` SIGTERM, ``restart()`` starts it again on the same port and directory.

Every stop and kill first audits the node: INFO's ``cluster_unexpected_errors`` (while it
runs) and its log's new lines (an exception a cluster core raised, which the bus caught, or
one raised serving a client, which closed that connection). What
it finds goes to ``FINDINGS``; ``tests/conftest.py`` fails the test that started the node.
"""

from __future__ import annotations

import os
import random
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from protocol.resp import NEED_DATA, ReplyReader, encode_command

REPO = Path(__file__).resolve().parents[2]

#: The lines a node logs when it catches an exception it did not expect: out of a cluster
#: core (node/bus.py), or serving a client over RESP or HTTP (node/conn_core.py,
#: node/http_front.py). Each is a bug, whatever the input.
UNEXPECTED_ERROR_LINES = ("Cluster bus: unexpected error", "Unexpected error serving")
#: What the audits found: one text per node and stop (read and cleared by tests/conftest.py).
FINDINGS: list[str] = []


def repo_env() -> dict[str, str]:
    """The environment for a child process that must run this checkout's code: the installed
    package may be an editable install of another checkout (a git worktree), so put REPO first."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


# Each pytest-xdist worker (PYTEST_XDIST_WORKER gw0, gw1, ...) hands out client ports from its
# own block, and a run without workers from block 0: two workers never pick the same port, nor
# one's bus port (port + 10000) as another's client port. The blocks lie below the kernel's
# ephemeral range (32768 up), where outgoing connections and bind(("", 0)) take theirs.
PORT_BASE = 11000  # client ports 11000-19999, their bus ports 21000-29999
PORT_BLOCK = 1000
PORT_BLOCKS = 9
_cursor: list[int] = []  # the next offset to try in this process's block


def _port_block() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return 0
    return 1 + int(worker[2:]) % (PORT_BLOCKS - 1)


def _bindable(port: int) -> bool:
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def free_port() -> int:
    """A port p such that p and p + 10000 (the cluster bus) are both free, from this process's
    block; successive calls go round the block, so a port just given out is not given again
    while its node may still be starting."""
    start = PORT_BASE + _port_block() * PORT_BLOCK
    if not _cursor:
        _cursor.append(random.Random(os.getpid()).randrange(PORT_BLOCK))
    for _ in range(PORT_BLOCK):
        port = start + _cursor[0] % PORT_BLOCK
        _cursor[0] += 1
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError(f"no free port in {start}-{start + PORT_BLOCK - 1}")


def read_replies(sock: socket.socket, count: int) -> list[Any]:
    """The next ``count`` replies on ``sock``, parsed (errors as protocol.resp.Error)."""
    reader = ReplyReader()
    replies: list[Any] = []
    while len(replies) < count:
        reply = reader.next()
        if reply is NEED_DATA:
            data = sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the node closed the connection")
            reader.feed(data)
        else:
            replies.append(reply)
    return replies


def pipelined(port: int, commands: list[tuple[Any, ...]], timeout: float = 30.0) -> list[Any]:
    """Many commands on one fresh connection, written at once: the parsed replies, in order."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"".join(encode_command(*cmd) for cmd in commands))
        return read_replies(s, len(commands))


def send_command(port: int, *args: bytes | str | int, timeout: float = 5.0) -> Any:
    """One command over a fresh connection; the parsed reply (errors as protocol.resp.Error)."""
    return pipelined(port, [args], timeout)[0]


def wait_rewrite(port: int, timeout: float = 10.0) -> dict[str, str]:
    """INFO persistence's fields once no log rewrite is in progress on the node at ``port``
    (AssertionError after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        text = send_command(port, "INFO", "persistence").decode()
        info = dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)
        if info["aof_rewrite_in_progress"] == "0":
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"the rewrite did not finish in {timeout:.0f} s")
        time.sleep(0.01)


class ServerProcess:
    def __init__(self, *, port: int | None = None, directory: str | None = None,
                 config_file: str | None = None, open_files: int | None = None,
                 **directives: Any) -> None:
        self.port = port or free_port()
        self._tmp = None if directory else tempfile.TemporaryDirectory(prefix="trisque-test-")
        self.dir = directory or self._tmp.name  # type: ignore[union-attr]
        self.config_file = config_file
        self.directives = {k.replace("_", "-"): v for k, v in directives.items()}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = os.path.join(self.dir, "server.log")
        self.open_files = open_files  # RLIMIT_NOFILE (soft and hard) for the process
        self._audited_to = 0  # how much of the log the audits have read

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "cli.server"]
        if self.config_file:
            argv.append(self.config_file)
        settings = {"port": self.port, "bind": "127.0.0.1", "dir": self.dir}
        settings.update(self.directives)
        for k, v in settings.items():
            argv += [f"--{k}", str(v)]
        return argv

    def start(self, wait: bool = True) -> ServerProcess:
        if self.proc is not None and self.proc.poll() is None:
            # A second process would be left running when this object stops the newer one
            # (``with node.start():`` starts twice).
            raise RuntimeError(f"trisque-server on {self.port} is already running")
        self._logfile = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv(), cwd=REPO, env=repo_env(), stdout=self._logfile,
                                     stderr=subprocess.STDOUT, preexec_fn=self._limits)
        if wait:
            self.wait_ready()
        return self

    def _limits(self) -> None:
        if self.open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, self.open_files))

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"trisque-server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                reply = send_command(self.port, "PING", timeout=1.0)
                # With requirepass, NOAUTH is the answer of a node that is up.
                if reply == b"PONG" or str(reply).startswith("NOAUTH"):
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"trisque-server on {self.port} not ready:\n{self.log()}")

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def call(self, *args: bytes | str) -> Any:
        return send_command(self.port, *args)

    def audit(self) -> list[str]:
        """What is wrong with the node since the last audit: a non-zero
        ``cluster_unexpected_errors``, unexpected-error lines in its log. Also appended to
        ``FINDINGS``."""
        found = []
        if self.proc is not None and self.proc.poll() is None:
            try:
                info = send_command(self.port, "INFO", "stats", timeout=2.0)
            except OSError:
                info = None
            if isinstance(info, bytes):
                for line in info.decode().split("\r\n"):
                    if line.startswith("cluster_unexpected_errors:") and line != \
                            "cluster_unexpected_errors:0":
                        found.append(f"node on port {self.port}: INFO {line}")
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._audited_to)
                new = fh.read().decode(errors="replace")
                self._audited_to = fh.tell()
        except OSError:
            new = ""
        for line in UNEXPECTED_ERROR_LINES:
            if line in new:
                at = new.index(line)
                found.append(f"node on port {self.port} logged:\n{new[at:at + 3000]}")
        FINDINGS.extend(found)
        return found

    def kill(self) -> None:
        if self.proc:
            self.audit()
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc:
            self.audit()
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode if self.proc else None

    def restart(self, wait: bool = True) -> ServerProcess:
        self.stop()
        return self.start(wait)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if getattr(self, "_logfile", None):
            self._logfile.close()
        if self._tmp:
            self._tmp.cleanup()
