"""What the first delivery of a job costs: in-process GETJOB NOHANG (parse + execute + encode of
the reply, plus encoding the log records it emits) on jobs never delivered before, and the log
bytes each consumed job (ADDJOB, GETJOB, ACKJOB) adds, by command.

    PYTHONPATH=. python -m bench.aof_first_delivery [jobs] [runs]

Prints the best and the median of ``runs`` runs, in microseconds per GETJOB.
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from broker import aof
from broker.clients import Client
from broker.config import Config
from broker.core import Broker
from broker.effects import LogRecord
from protocol.resp import RequestParser, encode

T0 = 1_700_000_000_000
BODY = b"x" * 100


def _broker(jobs: int) -> tuple[Broker, Client]:
    b = Broker(Config(), "ab" * 20, b"seed" * 5, now_ms=T0, rng=random.Random(1))
    c = Client(1)
    for _ in range(jobs):
        b.execute([b"ADDJOB", b"q", BODY, b"0"], c, T0)
    b.take_effects()
    return b, c


def getjob_us(jobs: int, log: bool) -> float:
    b, c = _broker(jobs)
    request = b"*4\r\n$6\r\nGETJOB\r\n$6\r\nNOHANG\r\n$4\r\nFROM\r\n$1\r\nq\r\n"
    parser = RequestParser()
    now = T0 + 1000
    t0 = time.perf_counter()
    for _ in range(jobs):
        parser.feed(request)
        argv = parser.next()
        reply = b.execute(argv, c, now)  # type: ignore[arg-type]
        encode(reply)
        records = [e for e in b.take_effects() if type(e) is LogRecord]
        if log and records:
            aof.encode_records(records)
    return (time.perf_counter() - t0) / jobs * 1e6


def log_bytes_per_job() -> dict[str, int]:
    b, c = _broker(0)

    def logged(*argv: bytes) -> tuple[object, int]:
        reply = b.execute(list(argv), c, T0 + 1000)
        records = [e for e in b.take_effects() if type(e) is LogRecord]
        return reply, len(aof.encode_records(records))

    job_id, added = logged(b"ADDJOB", b"q", BODY, b"0")
    _, got = logged(b"GETJOB", b"NOHANG", b"FROM", b"q")
    _, acked = logged(b"ACKJOB", str(job_id).encode())
    return {"ADDJOB": added, "GETJOB": got, "ACKJOB": acked}


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    for log in (False, True):
        times = [getjob_us(jobs, log) for _ in range(runs)]
        what = "with its log records encoded" if log else "core only"
        print(f"GETJOB NOHANG, first delivery, {what}: best {min(times):.2f} us, median "
              f"{statistics.median(times):.2f} us ({runs} runs of {jobs})")
    sizes = log_bytes_per_job()
    print("log bytes per consumed job (body 100 bytes): "
          + ", ".join(f"{k} {v}" for k, v in sizes.items()) + f", total {sum(sizes.values())}")


if __name__ == "__main__":
    main()
