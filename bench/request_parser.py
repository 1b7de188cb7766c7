"""What parsing one request costs, with and without the RESP fast path.

Usage: python -m bench.request_parser [--rounds 2000] [--repeat 25]

For each shape of input the server commonly reads (one command per read, as with 50
unpipelined clients; 16 pipelined commands per read, as with ``-P 16``; other commands; a
4 KiB body) and those the fast path cannot finish alone (a frame split over two reads, a body
larger than its window, an inline command), it feeds a ``RequestParser`` the same bytes
``--rounds`` times and takes every command out, as ``node/server.py`` does, and prints the
best of ``--repeat`` runs in microseconds per command, the two parsers interleaved: the full
parser alone (``RequestParser(fast=False)``, the code before the fast path) next to the parser
with the fast path. It checks first that both give the same commands. A program, not a test:
the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

from protocol.resp import NEED_DATA, RequestParser, encode_command

JOB_ID = b"D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"
BODY = b"x" * 16

# name -> the reads (each a bytes object fed at once) that make one round
CASES: dict[str, list[bytes]] = {
    "ADDJOB, 16 B body, one per read": [encode_command("ADDJOB", "q", BODY, "0")],
    "ADDJOB, 16 B body, 16 per read (-P 16)": [encode_command("ADDJOB", "q", BODY, "0") * 16],
    "GETJOB NOHANG FROM q, one per read": [encode_command("GETJOB", "NOHANG", "FROM", "q")],
    "ACKJOB <id>, one per read": [encode_command("ACKJOB", JOB_ID)],
    "ADDJOB with options, one per read": [
        encode_command("ADDJOB", "q", BODY, "0", "REPLICATE", "1", "RETRY", "30", "TTL", "600")],
    "ADDJOB, 4 KiB body, one per read": [encode_command("ADDJOB", "q", b"x" * 4096, "0")],
    # Inputs the fast path cannot finish: it hands what it read of the frame to the full
    # parser (a frame cut by a read, one larger than its window), or leaves it all (inline).
    "ADDJOB split over two reads (handed over)": [encode_command("ADDJOB", "q", BODY, "0")[:20],
                                                  encode_command("ADDJOB", "q", BODY, "0")[20:]],
    "ADDJOB, 64 KiB body (handed over)": [encode_command("ADDJOB", "q", b"x" * 65536, "0")],
    "inline PING (full parser only)": [b"PING\r\n"],
}


def run(reads: list[bytes], rounds: int, make: Callable[[], RequestParser]) -> tuple[float, int]:
    """Seconds for ``rounds`` rounds, and the commands they gave."""
    parser = make()
    commands = 0
    started = time.perf_counter()
    for _ in range(rounds):
        for data in reads:
            parser.feed(data)
            while parser.next() is not NEED_DATA:
                commands += 1
    return time.perf_counter() - started, commands


def commands_of(reads: list[bytes], make: Callable[[], RequestParser]) -> list[list[bytes]]:
    parser = make()
    out: list[list[bytes]] = []
    for data in reads:
        parser.feed(data)
        while (cmd := parser.next()) is not NEED_DATA:
            assert isinstance(cmd, list)
            out.append(cmd)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.request_parser", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2_000, help="rounds per run (default 2000)")
    p.add_argument("--repeat", type=int, default=25, help="runs per figure; the best is shown (default 25)")
    opts = p.parse_args(argv)
    if opts.rounds < 1 or opts.repeat < 1:
        p.error("--rounds and --repeat must be at least 1")

    def full() -> RequestParser:
        return RequestParser(fast=False)

    def fast() -> RequestParser:
        return RequestParser()

    load = os.getloadavg()
    print(f"RESP request parsing, us per command, best of {opts.repeat} runs of {opts.rounds} "
          f"rounds; Python {sys.version.split()[0]}, load average {load[0]:.2f}")
    print(f"{'input':<44} {'full parser':>12} {'fast path':>10} {'ratio':>7}")
    for name, reads in CASES.items():
        if commands_of(reads, full) != commands_of(reads, fast):
            print(f"{name}: the two parsers disagree", file=sys.stderr)
            return 1
        # Interleaved, best of each: a run that a busy machine preempted does not count.
        figures = [float("inf"), float("inf")]
        for _ in range(opts.repeat):
            for i, make in enumerate((full, fast)):
                seconds, commands = run(reads, opts.rounds, make)
                figures[i] = min(figures[i], seconds / commands * 1e6)
        print(f"{name:<44} {figures[0]:>12.2f} {figures[1]:>10.2f} {figures[1] / figures[0]:>6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
