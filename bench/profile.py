"""Where does trisque-server spend its time under load? ``python -m bench.profile``.

Starts a trisque-server on a free loopback port, drives it with ``trisque-benchmark`` (ADDJOB by
default), samples the server with py-spy (``pip install py-spy``) for the length of the run and
prints the functions with the most samples: self time (the function itself was on top of the
stack) and inclusive time (anywhere on the stack), as shares of all samples. The raw collapsed
stacks are kept next to the JSON results (``bench-results/profile-*.txt``) for flame graphs.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from bench.servers import REPO, BenchServer
from cli.bench import run_benchmark
from cli.bench_load import Spec

# A sample is charged to the first rule that matches, walking from the sampled frame to the root:
# so the send syscall inside a turn counts as "socket send", not as the reactor's round.
# (Frames of the compiled core are C: py-spy sees them only with TRISQUE_CORE=pure.)
CATEGORIES = [
    ("job ID generation", ("next_id", "(jobid.py")),
    ("request parsing (RESP)", ("RequestParser", "split_args", "_parse_int")),
    ("command parsing (argv -> command object)", ("(protocol/commands.py", "(commands.py")),
    ("reply encoding", ("encode_into", "_encode_into", "_encode (")),
    ("trio locks", ("_LockImpl", "AsyncContextManagerMixin")),
    ("append log", ("submit (", "commit_now", "wait_durable", "(aof.py", "(persistence.py",
                    "(log_core.py")),
    ("socket send", ("send_some", "send_nowait", "_send_pending")),
    ("socket recv", ("read_once",)),
    ("broker: command execution", ("Broker.", "(broker/",)),
    ("driver: the per-command loop", ("execute_commands",)),
    ("driver: the reactor's round", ("run_round", "end_round", "release_if_durable", "turn (",
                                     "poll (")),
    ("trio scheduler + epoll", ("unrolled_run", "get_events", "_epoll", "reschedule", "outcome",
                                "checkpoint", "wait_task_rescheduled")),
]


def categorize(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, markers in CATEGORIES:
            if any(m in frame for m in markers):
                return name
    return "other"


def summarize(collapsed: str, top: int = 25) -> str:
    """Self and inclusive sample shares per function from py-spy's collapsed ("raw") output."""
    self_counts: Counter[str] = Counter()
    incl_counts: Counter[str] = Counter()
    cat_counts: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        raw_frames = stack.split(";")
        cat_counts[categorize(raw_frames)] += count
        frames = [_short(f) for f in raw_frames]
        if frames and frames[0].startswith("process "):
            frames = frames[1:]  # py-spy --pid puts the process name first with some options
        if frames and frames[0].startswith("thread "):
            frames = frames[1:]
        if not frames:
            continue
        total += count
        self_counts[frames[-1]] += count
        for f in set(frames):
            incl_counts[f] += count
    if not total:
        return "no samples"
    lines = [f"{total} samples", "", "share %  where (first match from the sampled frame up)"]
    lines += [f"{100 * c / total:6.1f}   {name}" for name, c in cat_counts.most_common()]
    lines += ["", "self %   function (file of the sampled frame)"]
    lines += [f"{100 * c / total:6.1f}   {f}" for f, c in self_counts.most_common(top)]
    lines += ["", "incl %   function"]
    lines += [f"{100 * c / total:6.1f}   {f}" for f, c in incl_counts.most_common(top)]
    return "\n".join(lines)


def _short(frame: str) -> str:
    # py-spy frames look like "function (path/to/file.py:123)"; keep the function and file name.
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path, _, _line = where.rpartition(":")
    return f"{name} ({Path(path).name})" if path else name


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="produce", choices=("produce", "consume", "cycle"))
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--pipeline", type=int, default=1)
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--nonblocking", action="store_true",
                   help="do not pause the server to sample (less overhead, torn stacks)")
    p.add_argument("--server-arg", action="append", default=[], metavar="NAME=VALUE",
                   help="extra trisque-server directive, e.g. appendonly=yes")
    opts = p.parse_args(argv)
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(pyspy).exists():
        print("bench.profile: py-spy not found (pip install py-spy)", file=sys.stderr)
        return 2
    settings = dict(item.split("=", 1) for item in opts.server_arg)
    out_dir = REPO / "bench-results"
    out_dir.mkdir(exist_ok=True)
    raw_path = out_dir / f"profile-{opts.workload}-c{opts.clients}-P{opts.pipeline}.txt"
    with BenchServer("trisque", "trisque", **settings) as server:
        if not server.ok:
            print(f"bench.profile: trisque-server: {server.failure}", file=sys.stderr)
            return 2
        spy = subprocess.Popen([pyspy, "record", "--pid", str(server.pid), "--rate", str(opts.rate),
                                "--duration", str(int(opts.duration + 1)), "--format", "raw",
                                *(["--nonblocking"] if opts.nonblocking else []),
                                "-o", str(raw_path)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)
        spec = Spec(workload=opts.workload, nodes=[("127.0.0.1", server.port)],
                    clients=opts.clients, pipeline=opts.pipeline, jobs=50_000_000,
                    duration=opts.duration, queues=["prof"], producers=opts.clients // 2)
        result = run_benchmark(spec, procs=opts.procs, preload_jobs=100_000)
        try:
            _, err = spy.communicate(timeout=opts.duration + 30)
        except subprocess.TimeoutExpired:
            spy.kill()
            _, err = spy.communicate()
    print(f"{opts.workload}: {result['ops_per_sec']:,.0f} ops/s while sampling "
          f"(p50 {result['latency_ms']['p50']:.2f} ms, p99 {result['latency_ms']['p99']:.2f} ms)")
    if not raw_path.exists():
        print(f"bench.profile: py-spy wrote nothing: {err.decode(errors='replace')[-500:]}",
              file=sys.stderr)
        return 2
    print(summarize(raw_path.read_text(), opts.top))
    print(f"\ncollapsed stacks: {raw_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
