"""What a killed worker's scripts left running: recorded while they run, killed at the next start.

Theory of operation
-------------------
A script dies with its worker (``PR_SET_PDEATHSIG``, see ``cli.worker.process``), but the
processes it started do not: the death signal is not inherited. They are in the script's
process group (its pgid is the script's pid), so the worker records each running script in
``<log-dir>/.running/<worker pid>-<pgid>``: the worker's pid and start time (``/proc/<pid>/stat``
field 22, so a reused pid is told apart), the pgid, the job ID and the attempt. The file is
removed once the job's group was killed at its end. ``sweep``, called when a worker starts,
reads the files left by workers that are gone (a live worker's files, sharing the log
directory, are left alone) and kills, with SIGKILL, only the processes that are in that
process group *and* whose environment still says ``TRISQUE_JOB_ID=<the job>`` and
``TRISQUE_ATTEMPT=<the attempt>``: after pid reuse an unrelated process has neither, so it is
never signalled.

Limits: the sweep runs when a worker starts with the same ``--log-dir`` (until then the
leftovers run; a leftover writing to its output pipe meanwhile gets SIGPIPE and usually dies);
a process that left the group (``setsid``), cleared its environment, or belongs to another
user is not found; it needs ``/proc`` (Linux). Elsewhere nothing is recorded.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

log = logging.getLogger("trisque.worker")

DIR_NAME = ".running"


def enabled() -> bool:
    return sys.platform.startswith("linux") and Path("/proc/self/stat").exists()


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (which may hold spaces and parentheses):
    index 0 is the state, 2 the pgid, 19 the start time."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _start_time(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[19] if fields else None


def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs}


class RunningScripts:
    """The records of this worker's running scripts."""

    def __init__(self, log_dir: Path) -> None:
        self.dir = log_dir / DIR_NAME
        self.on = enabled()
        self._me = f"{os.getpid()} {_start_time(os.getpid()) or '?'}"
        if self.on:
            self.dir.mkdir(exist_ok=True)

    def _path(self, pgid: int) -> Path:
        return self.dir / f"{os.getpid()}-{pgid}"

    def record(self, pgid: int, job_id: str, attempt: int) -> None:
        if not self.on:
            return
        path = self._path(pgid)
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(f"{self._me} {pgid} {job_id} {attempt}\n")
            tmp.replace(path)
        except OSError as exc:
            log.warning("job %s: cannot record its process group in %s (%s): if this worker "
                        "is killed its leftovers are not found", job_id, self.dir, exc)

    def forget(self, pgid: int) -> None:
        if self.on:
            try:
                self._path(pgid).unlink()
            except FileNotFoundError:
                pass


def _members(pgid: int, job_id: str, attempt: int) -> list[int]:
    """The live processes of group ``pgid`` that are still that job's run."""
    want = {b"TRISQUE_JOB_ID": job_id.encode(), b"TRISQUE_ATTEMPT": str(attempt).encode()}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        fields = _stat_fields(pid)
        if not fields or fields[0] == "Z" or fields[2] != str(pgid):
            continue
        env = _environ(pid)
        if all(env.get(k) == v for k, v in want.items()):
            found.append(pid)
    return found


def sweep(log_dir: Path) -> int:
    """Kill what workers that are gone left running; the number of processes killed."""
    directory = log_dir / DIR_NAME
    if not enabled() or not directory.is_dir():
        return 0
    killed = 0
    for path in sorted(directory.iterdir()):
        try:
            owner, owner_start, pgid_text, job_id, attempt_text = path.read_text().split()
            owner_pid, pgid, attempt = int(owner), int(pgid_text), int(attempt_text)
        except (OSError, ValueError):
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)  # a record half written when its worker died
            continue
        if _start_time(owner_pid) == owner_start:
            continue  # its worker runs (another worker sharing this log directory)
        for pid in _members(pgid, job_id, attempt):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            killed += 1
            log.warning("job %s (attempt %d): killed pid %d, left running by worker pid %d "
                        "that is gone", job_id, attempt, pid, owner_pid)
        path.unlink(missing_ok=True)
    return killed
