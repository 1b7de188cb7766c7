"""One script process per job: spawned in its own session, with the status pipe on fd 3 and the
answer-and-result socket on fd 4.

Theory of operation
-------------------
``spawn`` starts the command with ``posix_spawnp`` (the only standard way to place pipes on
fixed descriptor numbers in the child without running Python code between fork and exec, which
is unsafe in a threaded parent): fd 0 is /dev/null, fds 1 and 2 one pipe (stdout and stderr in
the order they were written), fd 3 the write end of the status pipe and fd 4 one end of a
socket pair (a Unix stream socket: the script reads the worker's answers from it and writes its
result to it, so both directions share the descriptor rq's ``RQ_READ`` names). Every other descriptor of the worker is close-on-exec. The child calls
``setsid``: it leads a new session and process group (its pgid is its pid), so one ``killpg``
reaches every process it forks, and a terminal's Ctrl-C reaches the worker only, which decides
what its scripts get. Signals the worker ignores (Python ignores SIGPIPE) are reset to their
default, and the signal mask is emptied, so a script behaves as it would from a shell. A
command that cannot be executed (not found, not executable) raises ``OSError`` here: glibc's
``posix_spawn`` reports the exec failure.

Dying with the worker (Linux): a script must not outlive a worker killed with SIGKILL, or its
job, redelivered after RETRY, runs twice at once. ``posix_spawn`` cannot arm
``PR_SET_PDEATHSIG``, so on Linux the command is started through a launcher that arms
``PR_SET_PDEATHSIG(SIGKILL)`` and execs the command in the same process (same pid, session
and descriptors). The launcher is util-linux's ``setpriv --pdeathsig KILL --`` when it is
installed and knows that option (about 2 ms a job), else this interpreter with ``-I -S``
running ``_LAUNCHER`` (about 15 ms of CPU a job: measured 200 tiny jobs in 5.1 s instead of
2.0 s). The Python launcher also checks that its parent is still the worker (the worker may
die before the signal is armed), puts SIGPIPE and SIGXFSZ back to their defaults (Python
ignores them, and an ignored signal stays ignored across exec), and reports an exec failure
as its errno on fd 5 (close-on-exec otherwise): ``spawn`` reads that pipe to its EOF and raises
``OSError`` like a direct spawn. With setpriv the command is looked up first
(``_check_executable``, as execvp does), so a command not found or not executable still
raises ``OSError``; any other exec failure (a bad ``#!`` line) is setpriv's message in the
job's log and exit status 126 or 127; and a worker killed within the millisecond between spawn and the prctl
leaves its script to the next start's sweep. The death signal follows the *thread* that
forked: ``spawn`` is called from the thread running trio (the worker's main thread), which
lives as long as the worker. It is not inherited by the script's own children: what they leave
behind is found by ``cli.worker.leftovers`` when a worker starts again. Elsewhere the command is
spawned directly and a killed worker's scripts run on until they end (or write to their output
pipe and get SIGPIPE); ``leftovers`` is Linux-only too.

``ScriptProcess.wait`` waits on a pidfd (Linux 5.3+; a 50 ms poll elsewhere) and reaps the
child: its exit status, or minus the signal that killed it. ``signal_group`` signals the whole
group and says whether any process was left to receive it.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence

import trio

_LOWEST_PARENT_FD = 10  # pipe ends live above 0-4, so the child's dup2 targets never collide
_ERROR_FD = 5  # the launcher's exec failure report
# The launcher's argv: -c CODE, the error fd, the worker's pid, then the command.
_LAUNCHER = """\
import os, signal, sys
err, worker = int(sys.argv[1]), int(sys.argv[2])
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
except (ImportError, OSError, AttributeError):
    pass  # no death signal: the restart's leftover sweep is what remains
if os.getppid() != worker:
    os.kill(os.getpid(), signal.SIGKILL)  # the worker died before the signal was armed
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
os.set_inheritable(err, False)
try:
    os.execvp(sys.argv[3], sys.argv[3:])
except OSError as exc:
    os.write(err, str(exc.errno or 0).encode())
os._exit(127)
"""
_RESET_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                  signal.SIGQUIT, signal.SIGCHLD)


def _high_pipe(both_ways: bool = False) -> tuple[int, int]:
    """A close-on-exec pipe whose ends are above the child's fixed descriptors; with
    ``both_ways``, a Unix stream socket pair instead (each end reads and writes)."""
    if both_ways:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = (a.detach(), b.detach())
    else:
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
        # The worker's end of the script's fd 4: answers written, the result read.
        self.answers = trio.lowlevel.FdStream(answers)
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


@functools.cache
def launcher() -> tuple[str, ...]:
    """The argv prefix that starts a command with a death signal; () when there is none.
    ``-c`` marks the Python launcher, which takes the error fd and the worker's pid."""
    if not sys.platform.startswith("linux"):
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv:
        try:
            usage = subprocess.run([setpriv, "--help"], capture_output=True, timeout=5,
                                   check=False).stdout
        except (OSError, subprocess.SubprocessError):
            usage = b""
        if b"--pdeathsig" in usage:
            return (setpriv, "--pdeathsig", "KILL", "--")
    if sys.executable:
        return (sys.executable, "-I", "-S", "-c", _LAUNCHER)
    return ()


def _check_executable(name: str, env: Mapping[str, str]) -> None:
    """Raise the OSError execvp would (ENOENT, EACCES) for a command that cannot run."""
    if "/" in name:
        candidates = [name]
    else:
        path = env.get("PATH", os.defpath)
        candidates = [os.path.join(d or ".", name) for d in path.split(os.pathsep)]
    denied = False
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return
        denied = denied or os.path.exists(candidate)
    code = errno.EACCES if denied else errno.ENOENT
    raise OSError(code, os.strerror(code), name)


async def spawn(argv: Sequence[str], env: Mapping[str, str]) -> ScriptProcess:
    if launcher() and "-c" not in launcher():
        _check_executable(argv[0], env)
    out_r, out_w = _high_pipe()
    st_r, st_w = _high_pipe()
    ans_r, ans_w = _high_pipe(both_ways=True)  # ans_r: the script's end
    prefix = launcher()
    err_r, err_w = _high_pipe() if "-c" in prefix else (-1, -1)
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, out_w, 1),
        (os.POSIX_SPAWN_DUP2, out_w, 2),
        (os.POSIX_SPAWN_DUP2, st_w, 3),
        (os.POSIX_SPAWN_DUP2, ans_r, 4),
    ]
    if err_w >= 0:
        actions.append((os.POSIX_SPAWN_DUP2, err_w, _ERROR_FD))
        args = [*prefix, str(_ERROR_FD), str(os.getpid()), *argv]
    else:
        args = [*prefix, *argv]
    program = args[0]
    mine = [fd for fd in (out_r, out_w, st_r, st_w, ans_r, ans_w, err_r, err_w) if fd >= 0]
    try:
        pid = os.posix_spawnp(program, args, dict(env), file_actions=actions, setsid=True,
                              setsigdef=_RESET_SIGNALS, setsigmask=())
    except BaseException:
        for fd in mine:
            os.close(fd)
        raise
    for fd in (out_w, st_w, ans_r, err_w):
        if fd >= 0:
            os.close(fd)  # the child's ends: EOF on ours once every process of the script is gone
    proc = ScriptProcess(pid, out_r, st_r, ans_w)
    if err_r >= 0:
        error = b""
        try:
            async with trio.lowlevel.FdStream(err_r) as report:
                while data := await report.receive_some(64):  # EOF: exec'd, or exited
                    error += data
        except BaseException:  # cancelled before it was known to run: it must not stay
            proc.signal_group(signal.SIGKILL)
            with trio.CancelScope(shield=True):
                await proc.wait()
                await proc.aclose()
            raise
        if error:
            await proc.wait()
            await proc.aclose()
            code = int(error) if error.isdigit() else errno.ENOEXEC
            raise OSError(code, os.strerror(code), argv[0])
    return proc


def spawn_error_text(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "")
    text = exc.strerror or str(exc)
    return f"{text} ({name})" if name else text
