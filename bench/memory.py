"""``make bench`` case (m): RSS growth per million jobs processed with an empty queue.

A fresh server of each kind (trisque, and the reference Disque when given) takes a warm-up of
jobs, then ``jobs`` more, each added, taken with GETJOB and acknowledged with ACKJOB in
pipelined batches (``bench.churn``), so its queue never holds more than one batch. The growth of
its RSS between the two, scaled to a million jobs, is what finished jobs leave behind: 0 for a
node that frees everything (a few pages of noise either way). Before the timer wheel
cancelled timers, trisque grew by about 85 MB per million.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from bench import churn
from bench.report import Figures, Sample
from bench.servers import BenchServer, DisqueServer

WARM_UP = 50_000


def churn_case(kinds: list[tuple[str, str | None]], jobs: int,
               log: Callable[[str], None] = print) -> dict[str, Figures]:
    """Figures (bytes per million jobs) for each (kind, Disque binary or None)."""
    out: dict[str, Figures] = {}
    for kind, binary in kinds:
        server = (DisqueServer(binary, "disque (churn)") if binary
                  else BenchServer(kind, f"{kind} (churn)"))
        figures = out[kind] = Figures()
        with server:
            if not server.ok:
                figures.failure = server.failure
                continue
            load = os.getloadavg()[0]
            try:
                with churn.Pipe(server.port) as pipe:
                    churn.consume(pipe, WARM_UP)
                    time.sleep(0.3)
                    before = server.rss()
                    started = time.monotonic()
                    churn.consume(pipe, jobs)
                    elapsed = time.monotonic() - started
                    time.sleep(0.3)
                    after = server.rss()
            except (churn.ChurnError, OSError) as exc:
                figures.failure = str(exc)
                continue
            per_million = (after - before) * 1_000_000 / jobs
            figures.samples.append(Sample(per_million, load=load))
            log(f"  (m) churn: {kind}: {before / 2**20:.2f} MiB -> {after / 2**20:.2f} MiB "
                f"after {jobs:,} jobs ({jobs / elapsed:,.0f} jobs/s) = "
                f"{per_million / 2**20:+.2f} MiB per million")
    return out
