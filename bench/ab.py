"""Interleaved A/B runs of redis-benchmark against trisque checkouts and the reference Disque.

Each server named on the command line is started once per case (fresh directory, the case's
directives), then redis-benchmark drives each in turn, ``--runs`` times, alternating, so that
the machine's load, which moves by tens of percent on a shared box, hits every server alike.
For every run it records the throughput redis-benchmark reports, the server's CPU time per
request (utime + stime from /proc/PID/stat, a second measure that noise from other processes
affects less) and the 1-minute load average; it prints each run and then the medians.

    python -m bench.ab --trisque new=../checkout-a --trisque old=../checkout-b \\
        --disque /path/to/disque-server --cases addjob,getjob --runs 5

Cases: ``ping`` (PING, -c 50: the node's per-request I/O floor), ``addjob`` (ADDJOB, -c 50),
``p16`` (the same with -P 16), ``getjob`` (GETJOB NOHANG on a queue preloaded with as many
jobs as the run takes), ``always`` (ADDJOB -c 50 under ``appendfsync always``; Disque with
``appendonly yes`` too), ``everysec`` (the same under ``appendfsync everysec``: the log's CPU
without the fdatasync). A developer's tool, not a test: it needs redis-benchmark on the PATH
and stops only the servers it started.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from bench.servers import command, cpu_seconds
from tests.support.server import free_port


@dataclass
class Case:
    name: str
    args: list[str]  # redis-benchmark options and command
    directives: dict[str, str] = field(default_factory=dict)
    preload: bool = False  # fill the queue first (GETJOB)
    priorities: bool = False  # preload jobs of the 10 priorities (PRIORITY 0 to 9), in turn


CASES = {
    "ping": Case("PING -c 50", ["-c", "50", "PING"]),
    "addjob": Case("ADDJOB -c 50", ["-c", "50", "ADDJOB", "q", "body", "0"]),
    "p16": Case("ADDJOB -c 50 -P 16", ["-c", "50", "-P", "16", "ADDJOB", "q", "body", "0"]),
    "getjob": Case("GETJOB NOHANG -c 50", ["-c", "50", "GETJOB", "NOHANG", "FROM", "q"],
                   preload=True),
    # Priorities (docs/semantics.md): compare with addjob and getjob on the same checkout.
    "addjob-prio": Case("ADDJOB PRIORITY -c 50",
                        ["-c", "50", "ADDJOB", "q", "body", "0", "PRIORITY", "5"]),
    "getjob-prio": Case("GETJOB NOHANG -c 50 prio", ["-c", "50", "GETJOB", "NOHANG", "FROM", "q"],
                        preload=True, priorities=True),
    "always": Case("ADDJOB -c 50 always", ["-c", "50", "ADDJOB", "q", "body", "0"],
                   {"appendonly": "yes", "appendfsync": "always"}),
    "everysec": Case("ADDJOB -c 50 everysec", ["-c", "50", "ADDJOB", "q", "body", "0"],
                     {"appendonly": "yes", "appendfsync": "everysec"}),
}


@dataclass
class Server:
    label: str
    argv: list[str]
    env: dict[str, str]
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    tmp: tempfile.TemporaryDirectory[str] | None = None

    def start(self, directives: dict[str, str]) -> None:
        self.port = free_port()
        self.tmp = tempfile.TemporaryDirectory(prefix=f"ab-{self.label}-")
        argv = self.argv + ["--port", str(self.port), "--dir", self.tmp.name]
        for name, value in directives.items():
            argv += [f"--{name}", value]
        log = open(os.path.join(self.tmp.name, "server.log"), "wb")
        self.proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     cwd=self.tmp.name)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if command(self.port, "PING", timeout=1) == b"PONG":
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.label} did not start: {argv}")

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None


def trisque(label: str, checkout: str) -> Server:
    env = dict(os.environ, PYTHONPATH=checkout)
    return Server(label, [sys.executable, "-m", "cli.server", "--bind", "127.0.0.1"], env)


def disque(binary: str) -> Server:
    return Server("disque", [binary, "--bind", "127.0.0.1"], dict(os.environ))


_RPS = re.compile(rb"([0-9.]+) requests per second")


def bench(port: int, case: Case, requests: int) -> float:
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-n", str(requests), "-q",
                          *case.args], capture_output=True, timeout=600).stdout
    found = _RPS.findall(out)
    if not found:
        raise RuntimeError(f"no rate in redis-benchmark's output: {out[-300:]!r}")
    return float(found[-1])


def preload(port: int, requests: int, priorities: bool = False) -> None:
    for priority in range(10) if priorities else (None,):
        extra = ["PRIORITY", str(priority)] if priority is not None else []
        count = requests // 10 if priorities else requests
        subprocess.run(["redis-benchmark", "-p", str(port), "-n", str(count), "-q", "-c", "50",
                        "-P", "16", "ADDJOB", "q", "body", "0", *extra], capture_output=True,
                       timeout=600, check=True)


def load_average() -> float:
    return os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trisque", action="append", default=[], metavar="LABEL=CHECKOUT",
                    help="a trisque checkout to run (PYTHONPATH); repeatable")
    ap.add_argument("--env", action="append", default=[], metavar="LABEL:NAME=VALUE",
                    help="an environment variable for one trisque server; repeatable")
    ap.add_argument("--disque", help="path of a disque-server binary")
    ap.add_argument("--cases", default="addjob,p16,getjob,always",
                    help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200_000)
    args = ap.parse_args(argv)
    if shutil.which("redis-benchmark") is None:
        print("redis-benchmark is not on the PATH", file=sys.stderr)
        return 2
    servers = [trisque(*spec.split("=", 1)) for spec in args.trisque]
    for spec in args.env:
        label, _, assignment = spec.partition(":")
        name, _, value = assignment.partition("=")
        next(s for s in servers if s.label == label).env[name] = value
    if args.disque:
        servers.append(disque(args.disque))
    if not servers:
        ap.error("name at least one server")
    for key in args.cases.split(","):
        case = CASES[key]
        rates: dict[str, list[float]] = {s.label: [] for s in servers}
        cpus: dict[str, list[float]] = {s.label: [] for s in servers}
        loads: list[float] = []
        try:
            for server in servers:
                directives = dict(case.directives)
                if server.label == "disque" and directives.get("appendfsync"):
                    directives["appendonly"] = "yes"
                server.start(directives)
            for run in range(args.runs):
                order = servers if run % 2 == 0 else list(reversed(servers))
                for server in order:
                    if case.preload:
                        command(server.port, "DEBUG", "FLUSHALL")
                        preload(server.port, args.requests, case.priorities)
                    load = load_average()
                    cpu0 = server.cpu_seconds()
                    rate = bench(server.port, case, args.requests)
                    cpu_us = (server.cpu_seconds() - cpu0) / args.requests * 1e6
                    rates[server.label].append(rate)
                    cpus[server.label].append(cpu_us)
                    loads.append(load)
                    print(f"{case.name:22} run {run + 1} {server.label:10} {rate:10,.0f}/s "
                          f"{cpu_us:6.1f} us CPU/req  load {load:.2f}", flush=True)
                    if not case.preload:
                        command(server.port, "DEBUG", "FLUSHALL")
        finally:
            for server in servers:
                server.stop()
        print(f"-- {case.name}: medians of {args.runs} (load {min(loads):.2f}-{max(loads):.2f})")
        ref = statistics.median(rates["disque"]) if "disque" in rates else None
        for server in servers:
            rate = statistics.median(rates[server.label])
            ratio = f"  {rate / ref:.2f}x disque" if ref else ""
            print(f"   {server.label:10} {rate:10,.0f}/s  "
                  f"{statistics.median(cpus[server.label]):6.1f} us CPU/req{ratio}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["CASES", "main"]
