"""`trisque worker`: run a command once per job taken from trisque queues.

The package: ``settings`` (the command line), ``loop`` (taking jobs, concurrency, stopping),
``runner`` (one job's life), ``process`` (spawning the script with its pipes), ``status`` (the
fd 3 protocol and the verdict, without I/O), ``report`` (the node's run record, JOBRUN),
``joblog`` (per-job log files), ``leftovers`` (what a killed worker's scripts left running).
The user's view is docs/worker.md.
"""

from __future__ import annotations

import logging
import sys

import trio

from cli.worker.loop import Worker, close_inherited_fds
from cli.worker.settings import UsageError, parse


def main(argv: list[str]) -> int:
    try:
        settings = parse(argv)
    except UsageError as exc:
        sys.stderr.write(f"trisque worker: {exc}\n")
        return 2
    logging.basicConfig(
        level=logging.WARNING if settings.quiet else logging.INFO, stream=sys.stderr,
        format="%(asctime)s.%(msecs)03d worker[%(process)d] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S")
    close_inherited_fds()
    try:
        worker = Worker(settings)
    except OSError as exc:
        sys.stderr.write(f"trisque worker: cannot use --log-dir {settings.log_dir}: {exc}\n")
        return 1
    trio.run(worker.serve)
    return 0
