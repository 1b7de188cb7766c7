"""``make bench``'s single-node table: targets, medians, ratios, verdicts and the printed table.

Pure: it takes the samples ``bench.table`` measured and turns them into rows. Each row
compares trisque with one reference server, measured in the same invocation with the runs
interleaved: the reference Disque (the targets, when a binary is given) or
redis-server (the yardstick; targets of the first ``make bench``). Every figure is the median
of its runs; a row whose side has no successful run says why ("n/a") instead of a number.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# trisque / Disque in the same run; (d) is bytes per queued job, lower is better.
DISQUE_TARGETS: dict[str, tuple[str, float]] = {
    "a": (">=", 0.60), "b": (">=", 0.45), "c": (">=", 0.85), "d": ("<=", 1.00), "e": (">=", 0.70),
    # What a million finished jobs leave in RSS (bytes, trisque's own; Disque ~0).
    "m": ("<=", 2_000_000.0),
}
# The yardstick's, from the first make bench: trisque / redis-server, except (d), bytes per
# queued job of trisque itself, and (e1), trisque with the log on against itself without it.
REDIS_TARGETS: dict[str, tuple[str, float]] = {
    "a": (">=", 0.30), "b": (">=", 0.50), "c": (">=", 0.30), "d": ("<=", 600.0),
    "e1": (">=", 0.50), "e2": (">=", 0.35),
    # ADDJOB over TLS against plaintext, on the same node.
    "t": (">=", 0.60),
}


@dataclass
class Sample:
    """One measured run: its rate, its latency percentiles if the generator gave them, and the
    machine's 1-minute load average when it started."""

    ops_per_sec: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    load: float | None = None


@dataclass
class Figures:
    """What one server did in one case with one generator: its runs, or why there are none."""

    samples: list[Sample] = field(default_factory=list)
    failure: str | None = None

    def median(self) -> float | None:
        return statistics.median(s.ops_per_sec for s in self.samples) if self.samples else None

    def latency(self) -> str:
        p50 = [s.p50_ms for s in self.samples if s.p50_ms is not None]
        p99 = [s.p99_ms for s in self.samples if s.p99_ms is not None]
        if not p50 or not p99:
            return "-"
        return f"{statistics.median(p50):.2f}/{statistics.median(p99):.2f}"


@dataclass
class Row:
    """One case against one reference: the primary generator's figures and, under them, the
    secondary generator's (``None`` where it was not run)."""

    key: str
    title: str
    ours: Figures
    ref: Figures
    ours_alt: Figures | None = None
    ref_alt: Figures | None = None
    unit: str = "ops/s"
    target: tuple[str, float] | None = None
    absolute: bool = False  # the target bounds trisque's own value (B/job), not the ratio

    def ratio(self, alt: bool = False) -> float | None:
        ours, ref = (self.ours_alt, self.ref_alt) if alt else (self.ours, self.ref)
        a = ours.median() if ours else None
        b = ref.median() if ref else None
        return a / b if a is not None and b else None

    def verdict(self) -> str:
        if self.target is None:
            return ""
        value = self.ours.median() if self.absolute else self.ratio()
        if value is None:
            return "n/a"
        op, bound = self.target
        return "PASS" if (value >= bound if op == ">=" else value <= bound) else "MISS"

    def loads(self) -> list[float]:
        return [s.load for f in (self.ours, self.ref, self.ours_alt, self.ref_alt) if f
                for s in f.samples if s.load is not None]

    def to_json(self) -> dict[str, Any]:
        def side(f: Figures | None) -> dict[str, Any] | None:
            if f is None:
                return None
            return {"median": f.median(), "failure": f.failure,
                    "runs": [s.__dict__ for s in f.samples]}

        return {"key": self.key, "title": self.title, "unit": self.unit,
                "trisque": side(self.ours), "reference": side(self.ref),
                "trisque_secondary": side(self.ours_alt), "reference_secondary": side(self.ref_alt),
                "ratio": self.ratio(), "secondary_ratio": self.ratio(alt=True),
                "target": self.target, "absolute_target": self.absolute,
                "verdict": self.verdict()}


def parse_redis_benchmark_csv(text: str) -> Sample | None:
    """The rate and latency of ``redis-benchmark --csv`` output (one test), or None."""
    rows = list(csv.reader(io.StringIO(text)))
    for i, row in enumerate(rows[:-1]):
        if "rps" in row and "p50_latency_ms" in row and "p99_latency_ms" in row:
            data = rows[i + 1]
            try:
                return Sample(float(data[row.index("rps")]),
                              float(data[row.index("p50_latency_ms")]),
                              float(data[row.index("p99_latency_ms")]))
            except (ValueError, IndexError):
                return None
    return None


def _note(text: str, notes: list[str]) -> int:
    if text not in notes:
        notes.append(text)
    return notes.index(text) + 1


def _cell(f: Figures, unit: str, notes: list[str]) -> str:
    """A median, or n/a with a numbered note saying why; a median of fewer runs than asked
    (one failed, the rest were skipped) is marked with a note too."""
    m = f.median()
    if m is None:
        reason = "n/a: " + (f.failure or "no run succeeded")
        return f"n/a [{_note(reason, notes)}]"
    text = f"{m:,.0f}" if unit == "ops/s" else f"{m:,.0f} B"
    if f.failure:
        partial = f"after {len(f.samples)} run(s): {f.failure}"
        text += f" [{_note(partial, notes)}]"
    return text


def _target_text(row: Row) -> str:
    if row.target is None:
        return ""
    op, bound = row.target
    return f"{op} {bound:.0f} B" if row.absolute else f"{op} {bound:.2f}x"


def _load_text(row: Row) -> str:
    loads = row.loads()
    return f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"


def render_section(title: str, ref_name: str, rows: Sequence[Row], primary: str,
                   secondary: str | None, notes: list[str]) -> list[str]:
    w = 44
    out = [title,
           f"{'case':<{w}} {'trisque':>10} {ref_name:>10} {'ratio':>7}  {'target':>9}  "
           f"{'verdict':<7}  {'p50/p99 ms trisque | ' + ref_name:<30} load",
           "-" * (w + 95)]
    for row in rows:
        ratio = row.ratio()
        lat = (f"{row.ours.latency()} | {row.ref.latency()}" if row.unit == "ops/s" else "")
        out.append(f"{row.title:<{w}} {_cell(row.ours, row.unit, notes):>10} "
                   f"{_cell(row.ref, row.unit, notes):>10} "
                   f"{(f'{ratio:.3f}x' if ratio is not None else '-'):>7}  "
                   f"{_target_text(row):>9}  {row.verdict():<7}  {lat:<30} {_load_text(row)}")
        if row.ours_alt is not None and row.ref_alt is not None and secondary:
            alt = row.ratio(alt=True)
            out.append(f"{'   ' + secondary + ' driving both':<{w}} "
                       f"{_cell(row.ours_alt, row.unit, notes):>10} "
                       f"{_cell(row.ref_alt, row.unit, notes):>10} "
                       f"{(f'{alt:.3f}x' if alt is not None else '-'):>7}  {'':>9}  {'':<7}  "
                       f"{row.ours_alt.latency() + ' | ' + row.ref_alt.latency():<30}")
    return out


def render(sections: Sequence[tuple[str, str, Sequence[Row]]], header: Sequence[str],
           primary: str, secondary: str | None, footer: Sequence[str] = ()) -> str:
    """The whole printed table: the header lines, each section, the notes for n/a cells."""
    notes: list[str] = []
    out = list(header)
    for title, ref_name, rows in sections:
        if rows:
            out += [""] + render_section(title, ref_name, rows, primary, secondary, notes)
    out += [""] + list(footer)
    out += [f"[{i + 1}] {note}" for i, note in enumerate(notes)]
    return "\n".join(out)
