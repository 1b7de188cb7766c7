"""``trisque --stat``, ``--latency`` and ``--latency-history``: a node watched until Ctrl-C.

``--stat`` prints a line every interval (1 s) from INFO and INFO jobstats, with the two header
lines first and every 20 lines, as ``redis-cli --stat`` does; its columns are a job broker's:
jobs held (registered), queued (ready in a queue), active (held but not queued: delivered,
delayed, replicas), the commands per second other clients sent (this mode's own two INFO
commands left out, so an idle node shows 0), clients, clients blocked in GETJOB, the node's
memory (redis-cli's units: B, K, M, G) and queues.

``--latency`` PINGs every 10 ms and prints ``min: 0, max: 1, avg: 0.20 (10 samples)`` in
milliseconds, redrawn in place on a terminal; elsewhere (or with --raw) one line ``0 1 0.20
10`` after the interval (1 s), then it exits; --json gives ``{"min": ...}``.
``--latency-history`` starts a new line with `` -- 15.00 seconds range`` every interval
(15 s). Times are whole milliseconds, as redis-cli measures them.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from cli.connection import NodeConnection
from protocol.resp import Error

STAT_HEADER_EVERY = 20
LATENCY_SAMPLE_S = 0.010
LATENCY_HISTORY_DEFAULT_S = 15.0
LATENCY_RAW_DEFAULT_S = 1.0

#: --stat's columns: (group, title, width).
STAT_COLUMNS = (("jobs", "held", 10), ("jobs", "queued", 10), ("jobs", "active", 10),
                ("load", "ops/s", 9), ("load", "clients", 8), ("load", "blocked", 8),
                ("node", "mem", 9), ("node", "queues", 7))


def bytes_to_human(n: int) -> str:
    """redis-cli's bytesToHuman: 1023B, 1.00K, 1.50M, ..."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1024:
        return f"{sign}{n}B"
    for unit, scale in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("T", 1 << 40)):
        if n < scale * 1024 or unit == "T":
            return f"{sign}{n / scale:.2f}{unit}"
    raise AssertionError("unreachable")


def info_fields(text: bytes) -> dict[str, str]:
    fields = {}
    for line in text.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition(":")
        if sep and not line.startswith("#"):
            fields[key] = value
    return fields


def stat_header() -> str:
    groups: list[tuple[str, int]] = []
    for group, _title, width in STAT_COLUMNS:
        if groups and groups[-1][0] == group:
            groups[-1] = (group, groups[-1][1] + width)
        else:
            groups.append((group, width))
    top = "".join(f" {name} ".center(width - 1, "-") + " " for name, width in groups)
    titles = "".join(f"{title:<{width}}" for _group, title, width in STAT_COLUMNS)
    return top.rstrip() + "\n" + titles.rstrip() + "\n"


def stat_line(fields: dict[str, str], ops_per_sec: int) -> str:
    def num(key: str) -> int:
        try:
            return int(fields.get(key, "0"))
        except ValueError:
            return 0

    held, queued = num("registered_jobs"), num("queued_jobs")
    values = (held, queued, max(held - queued, 0), ops_per_sec, num("connected_clients"),
              num("blocked_clients"), bytes_to_human(num("used_memory")),
              num("registered_queues"))
    line = "".join(f"{v!s:<{w}}" for v, (_g, _t, w) in zip(values, STAT_COLUMNS, strict=True))
    return line.rstrip() + "\n"


def run_stat(conn: NodeConnection, interval: float | None, out: TextIO) -> int:
    interval = 1.0 if not interval else interval
    conn.connect()
    lines = 0
    last: tuple[int, float] | None = None
    while True:
        started = time.monotonic()
        fields: dict[str, str] = {}
        for section in ([b"INFO"], [b"INFO", b"jobstats"]):
            reply = conn.call(section)
            if isinstance(reply, Error):
                sys.stderr.write(f"ERROR: {reply}\n")
                return 1
            fields.update(info_fields(reply))
        total = int(fields.get("total_commands_processed", "0"))
        ops = 0
        if last is not None:
            # Two INFO commands per line are this mode's own.
            ops = max(round((total - last[0] - 2) / (started - last[1])), 0)
        last = (total, started)
        if lines % STAT_HEADER_EVERY == 0:
            out.write(stat_header())
        lines += 1
        out.write(stat_line(fields, ops))
        out.flush()
        time.sleep(max(interval - (time.monotonic() - started), 0.0))


def _latency_text(mode: str, low: int, high: int, avg: float, count: int) -> str:
    if mode == "tty":
        return f"min: {low}, max: {high}, avg: {avg:.2f} ({count} samples)"
    if mode == "json":
        return f'{{"min": {low}, "max": {high}, "avg": {avg:.2f}, "count": {count}}}\n'
    return f"{low} {high} {avg:.2f} {count}\n"


def run_latency(conn: NodeConnection, history: bool, interval: float | None, mode: str,
                out: TextIO) -> int:
    """``mode`` is the output: tty (redrawn line), raw or json."""
    history_ms = (interval or LATENCY_HISTORY_DEFAULT_S) * 1000
    report_ms = (interval or LATENCY_RAW_DEFAULT_S) * 1000
    conn.connect()
    low = high = total = count = 0
    window_start = _ms()
    while True:
        start = _ms()
        conn.call([b"PING"])
        latency = _ms() - start
        count += 1
        if count == 1:
            low = high = total = latency
        else:
            low, high, total = min(low, latency), max(high, latency), total + latency
        avg = total / count
        text = _latency_text(mode, low, high, avg, count)
        if mode == "tty":
            out.write("\x1b[0G\x1b[2K" + text)  # redraw the line
        elif history:
            out.write(text)
        elif _ms() - window_start > report_ms:
            out.write(text)
            out.flush()
            return 0
        if history and _ms() - window_start > history_ms:
            out.write(f" -- {(_ms() - window_start) / 1000:.2f} seconds range\n")
            window_start = _ms()
            low = high = total = count = 0
        out.flush()
        time.sleep(LATENCY_SAMPLE_S)


def _ms() -> int:
    return time.monotonic_ns() // 1_000_000
