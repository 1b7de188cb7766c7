"""``make bench`` case (p): ``trisque --pipe`` next to ``redis-cli --pipe``, the same 100,000
ADDJOB commands (RESP, 16-byte bodies) from the same file into the same trisque node (log
off, emptied with DEBUG FLUSHALL before every run), runs interleaved and the order rotating.

Each run is the wall time of the whole command as a user runs it (start-up included), and
counts only if it printed ``errors: 0, replies: 100000`` and the queue then holds every job.
The row gives the medians and trisque's speed as a multiple of redis-cli's (the target:
at least 1.00x, as fast). Under each client, its start-up: the median of runs with nothing on
stdin (process start, connect, the closing ECHO), the part of a run that does not depend on
the commands (a Python interpreter's start-up against a C program's), and the rest, the
transfer. trisque runs as the ``trisque`` command of this environment (or ``--trisque
PATH``: another installation's, e.g. a regular ``pip install .`` next to this editable one),
with this checkout's code first on its path and bytecode caching on, as in a user's shell.
``python -m bench.pipe`` runs it alone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.servers import REPO, BenchServer, command
from cli.bench_load import BenchError

COMMANDS = 100_000
BODY = b"x" * 16
QUEUE = b"pipeq"


def write_commands(path: Path, n: int) -> None:
    one = b"*4\r\n$6\r\nADDJOB\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$1\r\n0\r\n" % (
        len(QUEUE), QUEUE, len(BODY), BODY)
    path.write_bytes(one * n)


def clients(trisque: str | None = None) -> dict[str, list[str]]:
    script = Path(sys.executable).parent / "trisque"
    if trisque:
        found = {"trisque": [trisque]}
    elif script.exists():
        found = {"trisque": [str(script)]}
    else:
        found = {"trisque": [sys.executable, "-m", "cli.main"]}
    redis_cli = shutil.which("redis-cli")
    if redis_cli:
        found["redis-cli"] = [redis_cli]
    return found


def client_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def one_run(argv: list[str], port: int, data: Path, n: int, timeout: float) -> float:
    """Seconds for one ``--pipe`` run of ``data`` into the node on ``port``, checked."""
    with data.open("rb") as stdin:
        start = time.perf_counter()
        done = subprocess.run(argv + ["-p", str(port), "--pipe"], stdin=stdin, cwd=REPO,
                              env=client_env(), capture_output=True, timeout=timeout)
        elapsed = time.perf_counter() - start
    summary = f"errors: 0, replies: {n}\n".encode()
    if done.returncode or not done.stdout.endswith(summary):
        raise BenchError(f"{argv[-1]} --pipe: exit {done.returncode}, "
                         f"{done.stdout[-80:]!r} {done.stderr[-200:]!r}")
    queued = command(port, "QLEN", QUEUE.decode())
    if queued != n:
        raise BenchError(f"{argv[-1]} --pipe: {queued} jobs queued, not {n}")
    return elapsed


def startup(argv: list[str], port: int, runs: int = 5) -> float:
    """Median seconds of ``--pipe`` with nothing on stdin."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv + ["-p", str(port), "--pipe"], stdin=subprocess.DEVNULL, cwd=REPO,
                       env=client_env(), capture_output=True, timeout=60)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(runs: int, n: int = COMMANDS, timeout: float = 300.0,
        trisque: str | None = None) -> dict[str, object]:
    tools = clients(trisque)
    times: dict[str, list[float]] = {name: [] for name in tools}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="trisque-bench-pipe-") as tmp, \
            BenchServer("trisque", "trisque") as server:
        if not server.ok:
            raise BenchError(f"trisque-server: {server.failure}")
        data = Path(tmp) / "commands.resp"
        write_commands(data, n)
        names = list(tools)
        for i in range(runs + 1):  # the first round warms up and is not counted
            for name in names[i % len(names):] + names[:i % len(names)]:
                server.flush()
                took = one_run(tools[name], server.port, data, n, timeout)
                if i:
                    times[name].append(took)
        starts = {name: startup(argv, server.port) for name, argv in tools.items()}
    return {"commands": n, "runs": runs, "load": load, "load_after": os.getloadavg()[0],
            "seconds": {name: statistics.median(t) for name, t in times.items()},
            "startup_seconds": starts, "all_seconds": times}


def render(res: dict[str, object]) -> str:
    n = int(res["commands"])  # type: ignore[call-overload]
    seconds: dict[str, float] = res["seconds"]  # type: ignore[assignment]
    starts: dict[str, float] = res.get("startup_seconds", {})  # type: ignore[assignment]
    lines = [f"(p) --pipe, {n:,} ADDJOB into one trisque node: medians of {res['runs']} "
             f"run(s), load {res['load']:.2f} -> {res['load_after']:.2f}"]
    for name, s in seconds.items():
        lines.append(f"    {name + ' --pipe':<18}{s:6.2f} s  {n / s:>9,.0f} commands/s")
        if name in starts:
            lines.append(f"      of which start-up {starts[name] * 1000:5.0f} ms, transfer "
                         f"{(s - starts[name]) * 1000:5.0f} ms")
    if "redis-cli" in seconds:
        ratio = seconds["redis-cli"] / seconds["trisque"]
        verdict = "PASS" if ratio >= 1.0 else "MISS"
        lines.append(f"    trisque speed / redis-cli speed {ratio:.2f}x: {verdict} "
                     "(target >= 1.00x)")
    else:
        lines.append("    redis-cli is not installed: no ratio")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pipe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="measured runs per client (default 5)")
    p.add_argument("--commands", type=int, default=COMMANDS)
    p.add_argument("--trisque", metavar="PATH", help="the trisque command to run (default: "
                   "this environment's)")
    opts = p.parse_args(argv)
    print(render(run(opts.runs, opts.commands, trisque=opts.trisque)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
