"""Replay speed of a large append log (a program, not a test): ``python -m bench.aof_replay``.

Writes a log of N jobs (default 1,000,000; 64-byte bodies, real ``Job.to_record()`` records,
plus an ACK for every tenth job), then times the two halves of a start: reading and checking
the frames alone (``logfile.scan``) and the full replay into the broker (``broker.core.Broker`` when
it can be built, otherwise ``Job.from_record`` into a dict, which is what the core does first).
``--body 1024 --split`` writes bodies longer than 256 bytes as split records (format 3) and
replays them as a node with bodies on disk does, keeping references; without ``--split`` the
bodies stay inside their frames (as format 2 wrote them) and the replay reads them and takes
each long body's CRC, as the node does to give it a reference.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import zlib
from typing import Any

from broker import aof
from broker.job import REC_BODY, BodyRef, Job
from node import logfile

BODY_MAX = 256


def write_log(path: str, n: int, now_ms: int, body: int = 64, split: bool = False) -> None:
    logfile.create_log(path)
    with open(path, "ab") as f:
        batch: list[tuple[str, Any]] = []
        for i in range(n):
            job = Job(b"D-%08x-%024d-0005" % (i, i), b"queue-%d" % (i % 16), b"x" * body,
                      repl=1, ttl=86400, retry=300, delay=0, ctime=now_ms * 1_000_000 + i,
                      delivered=("abcdef01" * 5,))
            batch.append(("job", job.to_record()))
            if i % 10 == 9:
                batch.append(("ack", job.id))
            if len(batch) >= 10000:
                f.write(aof.encode_records(batch, None, BODY_MAX if split else 0))
                batch.clear()
        f.write(aof.encode_records(batch, None, BODY_MAX if split else 0))


class DictLoader:
    def __init__(self) -> None:
        self.jobs: dict[bytes, Job] = {}

    def load_record(self, record: tuple[Any, ...], now_ms: int) -> None:
        if record[0] == "job":
            job = Job.from_record(record[1])
            self.jobs[job.id] = job
        else:
            self.jobs.pop(record[1], None)

    def finish_load(self, now_ms: int, enqueue: bool) -> None:
        pass


def make_broker(now_ms: int) -> Any:
    try:
        from broker.config import Config
        from broker.core import Broker

        return Broker(Config(), "abcdef01" * 5, b"seed", now_ms=now_ms)
    except Exception as exc:  # noqa: BLE001 - the core may not be importable yet
        print(f"(broker.core.Broker not usable: {exc!r}; loading into a dict of Jobs)")
        return DictLoader()


def _keep(offset: int, length: int, crc: int) -> BodyRef:
    return BodyRef(1, offset, length, crc)


def _body_crc(record: tuple[Any, ...], frame: int) -> None:
    if record[0] == "job" and len(record[1][REC_BODY]) > BODY_MAX:
        zlib.crc32(record[1][REC_BODY])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=1_000_000)
    ap.add_argument("--body", type=int, default=64, help="body size in bytes")
    ap.add_argument("--split", action="store_true", help="split records, bodies left on disk")
    args = ap.parse_args()
    now_ms = int(time.time() * 1000)
    with tempfile.TemporaryDirectory(dir=".") as d:
        path = os.path.join(d, "replay.aof")
        t0 = time.perf_counter()
        write_log(path, args.n, now_ms, args.body, args.split)
        print(f"wrote {args.n} jobs: {os.path.getsize(path) / 1e6:.1f} MB "
              f"in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        end = logfile.scan(path)
        print(f"scan (frames, CRC, msgpack): {time.perf_counter() - t0:.2f} s, "
              f"{end.records} records, {end.state}")
        broker = make_broker(now_ms)
        t0 = time.perf_counter()
        logfile.load_into(path, broker, now_ms, stored=None if args.split else _body_crc,
                          keep=_keep if args.split else None)
        broker.finish_load(now_ms, False)
        print(f"replay into {type(broker).__name__}: {time.perf_counter() - t0:.2f} s, "
              f"{len(broker.jobs)} live jobs")


if __name__ == "__main__":
    main()
