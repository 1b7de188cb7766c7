"""`trisque worker`'s command line: options before ``--``, the command to run after it."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path

from client.tls import TlsOptions

DEFAULT_TIME_LIMIT = 3600.0
DEFAULT_KILL_AFTER = 5.0
DEFAULT_GRACE = 30.0
DEFAULT_LOG_DIR = "trisque-worker-logs"
DEFAULT_LOG_MAX_BYTES = 8 << 20
DEFAULT_LOG_KEEP = 500
DEFAULT_BACKOFF = (5.0, 300.0)  # seconds before the first retry, and at most

USAGE = "trisque worker --queue QUEUE [--queue QUEUE ...] [options] -- COMMAND [ARGS ...]"

DESCRIPTION = """\
Take jobs from trisque queues with GETJOB and run COMMAND once per job, in its own process
group, with the job in its environment (TRISQUE_JOB_ID, TRISQUE_QUEUE, TRISQUE_BODY_FILE,
TRISQUE_BODY when the body is text of at most 64 KB, TRISQUE_ATTEMPT, TRISQUE_NACKS,
TRISQUE_ADDITIONAL_DELIVERIES, TRISQUE_NODE, TRISQUE_WORKER, TRISQUE_LOG_FILE). The script
reports on fd 3 with one line per status: 'run TEXT', 'done TEXT' (with exit status 0: the job
is acknowledged), 'err TEXT' (failed), 'resend SECONDS-TEXT' (the job comes back after SECONDS),
'dup SECONDS-X-QUEUE' (a copy into QUEUE; the answer 'ok ID' or 'fail REASON' comes on fd 4).
What it writes to fd 4 becomes the job's result (RESOLVE, read with WAITJOB; see --result).
A failed job (err, a non-zero exit status, exit 0 without done, a time limit) is run again
only with --retries, after a backoff, and otherwise leaves its queue for the queue's dead-letter
queue (redrive policy) or <queue>.err, with why (QPOLICY ORIGIN, the dashboard). stdout and
stderr go to a log file per job and to the node's run record (JOBRUN GET / OUTPUT). SIGTERM
or Ctrl-C: stop taking jobs and wait for the running ones up to --grace seconds (a second
signal stops them at once). If the worker is killed (kill -9) its scripts die with it
(Linux), and what they left running is killed when a worker starts again with the same
--log-dir (recorded in its .running/). See docs/worker.md."""

EPILOG = """\
example:
  trisque worker --queue thumbnails --concurrency 4 --time-limit 600 -- ./make-thumbnail.sh
  trisque worker --queue mail --retries 3 --backoff 10:600 -- ./send.sh
  trisque worker --queue a --queue b --time-limit b=30 --nodes 10.0.0.1:7711,10.0.0.2:7711 \\
      -- python3 job.py"""


class UsageError(Exception):
    pass


@dataclass
class Settings:
    queues: list[str]
    command: list[str]
    concurrency: int = 1
    nodes: list[str] = field(default_factory=lambda: ["127.0.0.1:7711"])
    password: str | None = None
    tls: TlsOptions | None = None  # --tls: to the nodes' tls-port
    name: str = ""
    time_limit: float | None = DEFAULT_TIME_LIMIT  # None: no limit
    queue_time_limits: dict[str, float | None] = field(default_factory=dict)
    kill_after: float = DEFAULT_KILL_AFTER
    grace: float = DEFAULT_GRACE
    log_dir: Path = Path(DEFAULT_LOG_DIR)
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    log_keep: int = DEFAULT_LOG_KEEP
    quiet: bool = False
    retries: int = 0
    queue_retries: dict[str, int] = field(default_factory=dict)
    backoff: tuple[float, float] = DEFAULT_BACKOFF
    # RESOLVE a job done with its output (stdout and stderr, the first RESULT_MAX bytes)
    # instead of a plain ACKJOB; what the script writes to fd 4 wins either way.
    result_from_output: bool = False

    def time_limit_for(self, queue: str) -> float | None:
        return self.queue_time_limits.get(queue, self.time_limit)

    def retries_for(self, queue: str) -> int:
        return self.queue_retries.get(queue, self.retries)

    def backoff_after(self, attempt: int) -> float:
        """Seconds before the run after failed run number ``attempt``: BASE doubled each
        time, at most MAX."""
        base, most = self.backoff
        return min(base * 2.0 ** min(attempt - 1, 64), most)


def _seconds(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{what} must be a number of seconds, not {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{what} must be a non-negative number of seconds, not {text!r}")
    return value


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    scale = units.get(text[-1:].lower(), 1)
    digits = text[:-1] if scale != 1 else text
    if not digits.isdigit() or int(digits) * scale < 4096:
        raise UsageError(f"--log-max-bytes must be a size of at least 4096 bytes (e.g. 8M), "
                         f"not {text!r}")
    return int(digits) * scale


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trisque worker", usage=USAGE, description=DESCRIPTION,
                                epilog=EPILOG, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--queue", "-q", action="append", required=True, metavar="QUEUE",
                   help="a queue to take jobs from (repeat for several; earlier queues first)")
    p.add_argument("--concurrency", "-c", type=int, default=1, metavar="N",
                   help="jobs run at once (default 1)")
    p.add_argument("--nodes", default="127.0.0.1:7711", metavar="HOST:PORT,...",
                   help="nodes to connect to; the client moves to another one when its node "
                        "fails (default 127.0.0.1:7711)")
    p.add_argument("--password", "-a", metavar="PASSWORD",
                   help="sent with AUTH (default: $TRISQUE_PASSWORD, if set)")
    p.add_argument("--tls", action="store_true",
                   help="connect over TLS (the nodes' tls-port), as trisque --tls")
    for name, what in (("cacert", "CA certificate file to verify the nodes with"),
                       ("cacertdir", "directory of trusted CA certificates"),
                       ("cert", "client certificate (tls-auth-clients yes)"),
                       ("key", "the client certificate's private key")):
        p.add_argument(f"--{name}", metavar="PATH", help=what)
    p.add_argument("--insecure", action="store_true", help="skip the certificate check")
    p.add_argument("--name", metavar="NAME",
                   help="this worker's name in run records (default host:pid)")
    p.add_argument("--time-limit", action="append", default=[], metavar="[QUEUE=]SECONDS",
                   help=f"stop a script running longer (SIGTERM to its process group, then "
                        f"SIGKILL after --kill-after); QUEUE=SECONDS for one queue; 0: no "
                        f"limit (default {DEFAULT_TIME_LIMIT:g})")
    p.add_argument("--retries", action="append", default=[], metavar="[QUEUE=]N",
                   help="run a failed job again up to N times, after a backoff, before it "
                        "leaves its queue; QUEUE=N for one queue (default 0: never, as RQ)")
    p.add_argument("--backoff", default=f"{DEFAULT_BACKOFF[0]:g}:{DEFAULT_BACKOFF[1]:g}",
                   metavar="BASE[:MAX]",
                   help=f"seconds before the first retry, doubled for each next one, at most "
                        f"MAX (default {DEFAULT_BACKOFF[0]:g}:{DEFAULT_BACKOFF[1]:g})")
    p.add_argument("--kill-after", default=str(DEFAULT_KILL_AFTER), metavar="SECONDS",
                   help=f"from SIGTERM to SIGKILL when a script is stopped "
                        f"(default {DEFAULT_KILL_AFTER:g})")
    p.add_argument("--grace", default=str(DEFAULT_GRACE), metavar="SECONDS",
                   help=f"on SIGTERM, how long running jobs may finish before they are "
                        f"stopped and NACKed (default {DEFAULT_GRACE:g})")
    p.add_argument("--log-dir", default=DEFAULT_LOG_DIR, metavar="DIR",
                   help=f"where each job's output goes, in <job-id>.<attempt>.log, and the "
                        f"running scripts' process groups, in .running/ "
                        f"(default ./{DEFAULT_LOG_DIR})")
    p.add_argument("--log-max-bytes", default=str(DEFAULT_LOG_MAX_BYTES), metavar="SIZE",
                   help="a job's log file is rotated to .log.1 at this size, so a job "
                        "keeps at most twice this (default 8M)")
    p.add_argument("--log-keep", type=int, default=DEFAULT_LOG_KEEP, metavar="N",
                   help=f"job logs kept in --log-dir, the oldest deleted first "
                        f"(default {DEFAULT_LOG_KEEP})")
    p.add_argument("--quiet", action="store_true", help="log only warnings and errors")
    p.add_argument("--result", choices=("fd4", "output"), default="fd4",
                   help="what becomes the result of a job done (RESOLVE, read by WAITJOB):\n"
                        "fd4: what the script wrote to its fd 4, if it wrote anything\n"
                        "(else a plain ACKJOB); output: fd 4's bytes, else its output\n"
                        "(stdout and stderr). Either is bounded by the node's\n"
                        "result-max-size (default 1 MB): past it the run fails")
    return p


def parse(argv: list[str]) -> Settings:
    """Raises UsageError (or SystemExit for --help, as argparse does)."""
    if "--" in argv:
        cut = argv.index("--")
        options, command = argv[:cut], argv[cut + 1:]
    else:
        options, command = argv, []
    parser = _parser()
    if "-h" in options or "--help" in options:
        parser.print_help()
        raise SystemExit(0)
    try:
        ns, extra = parser.parse_known_args(options)
    except SystemExit as exc:
        raise UsageError("invalid options (see trisque worker --help)") from exc
    words = [w for w in extra if not w.startswith("-")]
    if words and not command:
        raise UsageError(f"the command to run goes after '--': trisque worker --queue q -- "
                         f"{' '.join(words)}")
    if extra:
        raise UsageError(f"unknown options {' '.join(extra)} (see trisque worker --help)")
    if not command:
        raise UsageError("the command to run goes after '--', e.g. "
                         "trisque worker --queue q -- ./job.sh")
    if ns.concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    if ns.log_keep < 1:
        raise UsageError("--log-keep must be at least 1")
    settings = Settings(
        queues=ns.queue, command=command, concurrency=ns.concurrency,
        nodes=[n.strip() for n in ns.nodes.split(",") if n.strip()],
        password=ns.password if ns.password is not None else os.environ.get("TRISQUE_PASSWORD"),
        name=ns.name or f"{socket.gethostname()}:{os.getpid()}",
        kill_after=_seconds(ns.kill_after, "--kill-after"),
        grace=_seconds(ns.grace, "--grace"),
        log_dir=Path(ns.log_dir), log_max_bytes=_size(ns.log_max_bytes),
        log_keep=ns.log_keep, quiet=ns.quiet, result_from_output=ns.result == "output",
        tls=TlsOptions(ns.cacert, ns.cacertdir, ns.cert, ns.key, ns.insecure,
                       check_hostname=False) if ns.tls else None)
    if not settings.nodes:
        raise UsageError("--nodes needs at least one host:port")
    for item in ns.time_limit:
        queue, eq, value = item.rpartition("=")
        limit = _seconds(value, "--time-limit") or None
        if eq:
            if queue not in settings.queues:
                raise UsageError(f"--time-limit {item}: {queue!r} is not one of the --queue "
                                 "names")
            settings.queue_time_limits[queue] = limit
        else:
            settings.time_limit = limit
    for item in ns.retries:
        queue, eq, value = item.rpartition("=")
        if not value.isdigit() or int(value) > 1_000_000:
            raise UsageError(f"--retries {item}: the count must be a whole number "
                             "(0 .. 1000000)")
        if eq:
            if queue not in settings.queues:
                raise UsageError(f"--retries {item}: {queue!r} is not one of the --queue names")
            settings.queue_retries[queue] = int(value)
        else:
            settings.retries = int(value)
    base_text, _, most_text = ns.backoff.partition(":")
    base = _seconds(base_text, "--backoff BASE")
    most = _seconds(most_text, "--backoff MAX") if most_text else max(base, DEFAULT_BACKOFF[1])
    if most < base:
        raise UsageError(f"--backoff {ns.backoff}: MAX must not be less than BASE")
    settings.backoff = (base, most)
    check_command(command[0])
    return settings


def check_command(program: str) -> None:
    """Refuse at start a command that cannot run: every job would fail the same way."""
    if "/" in program:
        if not os.path.isfile(program):
            raise UsageError(f"cannot execute {program!r}: no such file")
        if not os.access(program, os.X_OK):
            raise UsageError(f"cannot execute {program!r}: not executable (chmod +x?)")
    elif shutil.which(program) is None:
        raise UsageError(f"cannot execute {program!r}: not found in PATH")
