"""One script process per job: spawned in its own session, with the status pipe on fds 3 and 4.

Theory of operation
-------------------
``spawn`` starts the command with ``posix_spawnp`` (the only standard way to place pipes on
fixed descriptor numbers in the child without running Python code between fork and exec, which
is unsafe in a threaded parent): fd 0 is /dev/null, fds 1 and 2 one pipe (stdout and stderr in
the order they were written), fd 3 the write end of the status pipe and fd 4 the read end of
the answer pipe. Every other descriptor of the worker is close-on-exec. The child calls
``setsid``: it leads a new session and process group (its pgid is its pid), so one ``killpg``
reaches every process it forks, and a terminal's Ctrl-C reaches the worker only, which decides
what its scripts get. Signals the worker ignores (Python ignores SIGPIPE) are reset to their
default, and the signal mask is emptied, so a script behaves as it would from a shell. A
command that cannot be executed (not found, not executable) raises ``OSError`` here: glibc's
``posix_spawn`` reports the exec failure.

``ScriptProcess.wait`` waits on a pidfd (Linux 5.3+; a 50 ms poll elsewhere) and reaps the
child: its exit status, or minus the signal that killed it. ``signal_group`` signals the whole
group and says whether any process was left to receive it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
from collections.abc import Mapping, Sequence

import trio

_LOWEST_PARENT_FD = 10  # pipe ends live above 0-4, so the child's dup2 targets never collide
_RESET_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                  signal.SIGQUIT, signal.SIGCHLD)


def _high_pipe() -> tuple[int, int]:
    """A close-on-exec pipe whose ends are above the child's fixed descriptors."""
    fds = os.pipe()
    try:
        return tuple(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _LOWEST_PARENT_FD)
                     for fd in fds)  # type: ignore[return-value]
    finally:
        for fd in fds:
            os.close(fd)


class ScriptProcess:
    def __init__(self, pid: int, out: int, status: int, answers: int) -> None:
        self.pid = pid
        self.out = trio.lowlevel.FdStream(out)  # stdout + stderr of the script
        self.status = trio.lowlevel.FdStream(status)  # what the script writes on its fd 3
        self.answers = trio.lowlevel.FdStream(answers)  # what the script reads on its fd 4
        self.exit_code: int | None = None

    async def wait(self) -> int:
        if self.exit_code is not None:
            return self.exit_code
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            pidfd = -1
        if pidfd >= 0:
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
            _, status = os.waitpid(self.pid, 0)
        else:
            while True:
                done, status = os.waitpid(self.pid, os.WNOHANG)
                if done:
                    break
                await trio.sleep(0.05)
        self.exit_code = os.waitstatus_to_exitcode(status)
        return self.exit_code

    def signal_group(self, sig: int) -> bool:
        """Send ``sig`` to the script's process group; False when no process was left."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:
            return False  # a member changed its credentials: nothing we may signal
        return True

    async def aclose(self) -> None:
        for stream in (self.out, self.status, self.answers):
            await stream.aclose()


def spawn(argv: Sequence[str], env: Mapping[str, str]) -> ScriptProcess:
    out_r, out_w = _high_pipe()
    st_r, st_w = _high_pipe()
    ans_r, ans_w = _high_pipe()
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, out_w, 1),
        (os.POSIX_SPAWN_DUP2, out_w, 2),
        (os.POSIX_SPAWN_DUP2, st_w, 3),
        (os.POSIX_SPAWN_DUP2, ans_r, 4),
    ]
    try:
        pid = os.posix_spawnp(argv[0], list(argv), dict(env), file_actions=actions, setsid=True,
                              setsigdef=_RESET_SIGNALS, setsigmask=())
    except BaseException:
        for fd in (out_r, out_w, st_r, st_w, ans_r, ans_w):
            os.close(fd)
        raise
    for fd in (out_w, st_w, ans_r):
        os.close(fd)  # the child's ends: EOF on ours once every process of the script is gone
    return ScriptProcess(pid, out_r, st_r, ans_w)


def spawn_error_text(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "")
    text = exc.strerror or str(exc)
    return f"{text} ({name})" if name else text
