"""``bench.cluster``'s rows: the medians, the ratio to Disque, the PASS/MISS verdicts, the table.

Pure: it takes the runs ``bench.cluster`` measured on the two three-node clusters (trisque and
the reference Disque, the runs interleaved) and turns them into printed rows. A judged row has
two bounds on trisque / Disque: the resolve bar (what the cluster must reach) and the goal
(Disque's own figure). For a rate, higher is better; for a latency, lower is.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Target:
    """Bounds on trisque / Disque: ``higher`` is True for a rate, False for a latency."""

    higher: bool
    bar: float
    goal: float

    def met(self, ratio: float, bound: float) -> bool:
        return ratio >= bound if self.higher else ratio <= bound

    def text(self, bound: float) -> str:
        return f"{'>=' if self.higher else '<='} {bound:.1f}x"


RATE = Target(higher=True, bar=0.8, goal=1.0)
ONE_CONNECTION_P50 = Target(higher=False, bar=1.2, goal=1.0)
FEDERATION_P99 = Target(higher=False, bar=1.0, goal=1.0)
# tls-cluster against the same cluster without it (the bar: the 0.6x).
TLS_RATE = Target(higher=True, bar=0.6, goal=0.8)


@dataclass
class Side:
    """One cluster's runs of one row: the measured values, the server CPU per job of each run
    (all three nodes, microseconds), the 1-minute load average when each run started, and why
    there are no (more) runs, if so."""

    values: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    failure: str | None = None
    notes: list[str] = field(default_factory=list)  # what a reader must know about a value

    def median(self) -> float | None:
        return float(statistics.median(self.values)) if self.values else None

    def cpu_median(self) -> float | None:
        return float(statistics.median(self.cpu_us)) if self.cpu_us else None


@dataclass
class Row:
    """One workload, trisque against Disque. ``unit`` says how a value prints; ``target`` is
    None for the rows only shown (idle traffic, the 40 MB job)."""

    title: str
    unit: str  # "/s", "ms", "s" or "" (a count)
    trisque: Side
    disque: Side
    target: Target | None = None
    show_cpu: bool = True

    def ratio(self) -> float | None:
        ours, ref = self.trisque.median(), self.disque.median()
        return ours / ref if ours is not None and ref else None

    def verdict(self, goal: bool = False) -> str:
        """PASS or MISS against the bar (or the goal); n/a without both medians; "" unjudged."""
        if self.target is None:
            return ""
        ratio = self.ratio()
        if ratio is None:
            return "n/a"
        bound = self.target.goal if goal else self.target.bar
        return "PASS" if self.target.met(ratio, bound) else "MISS"

    def loads(self) -> list[float]:
        return self.trisque.loads + self.disque.loads

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "unit": self.unit,
                "trisque": self.trisque.__dict__, "disque": self.disque.__dict__,
                "trisque_median": self.trisque.median(), "disque_median": self.disque.median(),
                "ratio": self.ratio(), "bar": self.verdict(), "goal": self.verdict(goal=True)}


def p99_lower_bound(p99_ms: float, delivered: int, undelivered: int, waited_ms: float) -> float:
    """The p99 of all the jobs of a cycle, some of them never delivered before the run ended:
    each of those waited at least ``waited_ms``. Over 1 % of them, the p99 is at least that."""
    total = delivered + undelivered
    if total and undelivered > 0.01 * total:
        return max(p99_ms, waited_ms)
    return p99_ms


def value_text(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit == "ms":
        return f"{value:.3f} ms" if value < 10 else f"{value:,.0f} ms"
    if unit == "s":
        return f"{value:.2f} s"
    return f"{value:,.0f}"


def _cpu_text(side: Side) -> str:
    cpu = side.cpu_median()
    return "-" if cpu is None else f"{cpu:.0f}"


def render(rows: Sequence[Row], header: Sequence[str] = (),
           columns: tuple[str, str] = ("trisque", "Disque")) -> str:
    """The printed table: a line per row, then the reasons for the n/a cells. ``columns``
    names the two sides (a row's ``trisque`` and ``disque``)."""
    w = 46
    out = list(header)
    cpu_title = f"CPU us/job {columns[0][0]} | {columns[1][0]}"
    out.append(f"{'workload':<{w}} {columns[0]:>11} {columns[1]:>11} {'ratio':>6}  "
               f"{'bar':>8} {'':<4}  {'goal':>8} {'':<4}  {cpu_title:>16}  load")
    out.append("-" * (w + 86))
    notes: list[str] = []
    for row in rows:
        cells = []
        for side in (row.trisque, row.disque):
            text = value_text(side.median(), row.unit)
            for note in ([side.failure] if side.failure else []) + side.notes:
                if note not in notes:
                    notes.append(note)
                text += f" [{notes.index(note) + 1}]"
            cells.append(text)
        ratio = row.ratio()
        bar = goal = ""
        if row.target is not None:
            bar, goal = row.target.text(row.target.bar), row.target.text(row.target.goal)
        cpu = f"{_cpu_text(row.trisque)} | {_cpu_text(row.disque)}" if row.show_cpu else ""
        loads = row.loads()
        load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"
        out.append(f"{row.title:<{w}} {cells[0]:>11} {cells[1]:>11} "
                   f"{(f'{ratio:.2f}x' if ratio is not None else '-'):>6}  "
                   f"{bar:>8} {row.verdict():<4}  {goal:>8} {row.verdict(goal=True):<4}  "
                   f"{cpu:>16}  {load}")
    out += [f"[{i + 1}] {note}" for i, note in enumerate(notes)]
    return "\n".join(out)
