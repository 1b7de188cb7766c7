"""The status pipe's protocol and a run's verdict, without I/O.

Theory of operation
-------------------
A script talks to its worker over two pipes (rq's queue-script API):
it writes status lines to fd 3 and reads answers from fd 4. A line is ``VERB [TEXT]`` ended
by a newline:

* ``run TEXT`` - progress, shown in the run record;
* ``done TEXT`` - success; with exit status 0 the job is acknowledged;
* ``err TEXT`` - failure, whatever the exit status: the job needs an operator (RQ's ``err``);
* ``resend N-TEXT`` (or ``resend N``) - try again in N seconds;
* ``dup N-X-QUEUE`` - add a copy of the job to QUEUE, due in N seconds; the worker answers
  ``ok <id>`` or ``fail <reason>`` on fd 4 (the only two-way exchange).

``StatusReader`` splits the bytes read from fd 3 into parsed lines, and turns anything else
(an unknown verb, a malformed ``resend``/``dup``, an empty line, a line longer than
``MAX_LINE_BYTES``) into a ``Violation``: the run then fails and its script is stopped, so a
mistake in a script shows at once with the offending line as the reason. A last line without
its newline at the end of the pipe still counts.

``decide`` gives the verdict of a run from what happened: the first final line (``done``,
``err``, ``resend``), the exit status, and whether the worker stopped the script (time limit,
violation, worker shutdown) or could not start it. The verdict names the state recorded with
the run (``broker.runs``'s states), the action on the job and a reason a human can act on: ack
(done), resend, nack (stopped by the worker's shutdown: it goes back at once) or fail (every
failure, a time limit included: the runner retries it with ``--retries``, or parks it).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Final, NamedTuple

MAX_LINE_BYTES: Final = 1024  # the node's limit for one status line (broker/runs.py)
MAX_DELAY_SECONDS: Final = (1 << 32) - 1  # ADDJOB's largest DELAY
FINAL_VERBS: Final = ("done", "err", "resend")


class Line(NamedTuple):
    """One well-formed status line. ``raw`` is the line as recorded (verb included)."""

    verb: str
    text: str
    raw: str
    seconds: int = 0  # resend, dup: the delay
    queue: bytes = b""  # dup: the target queue


class Violation(NamedTuple):
    reason: str


def _delay(word: str) -> int | None:
    if not word.isdigit() or len(word) > 10:
        return None
    value = int(word)
    return value if value <= MAX_DELAY_SECONDS else None


def parse_line(data: bytes) -> Line | Violation:
    raw = data.decode("utf-8", "replace")
    shown = raw if len(raw) <= 80 else raw[:80] + "..."
    verb, _, text = raw.partition(" ")
    if verb in ("run", "done", "err"):
        return Line(verb, text, raw)
    if verb == "resend":
        word, dash, rest = text.partition("-")
        seconds = _delay(word)
        if seconds is None:
            return Violation(f"malformed status line {shown!r}: resend needs "
                             "'resend <seconds>-<text>'")
        return Line(verb, rest if dash else "", raw, seconds)
    if verb == "dup":
        parts = text.split("-", 2)
        seconds = _delay(parts[0]) if len(parts) == 3 else None
        if seconds is None or parts[1] != "X" or not parts[2]:
            return Violation(f"malformed status line {shown!r}: dup needs "
                             "'dup <seconds>-X-<queue>'")
        return Line(verb, text, raw, seconds, parts[2].encode("utf-8", "surrogateescape"))
    if not raw:
        return Violation("empty status line")
    return Violation(f"unknown status line {shown!r} (the verbs are run, done, err, resend, "
                     "dup)")


class StatusReader:
    """Bytes from fd 3 in, lines out (``feed``/``end``)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Line | Violation]:
        self._buf += data
        out: list[Line | Violation] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > MAX_LINE_BYTES:
                    out.append(Violation(f"status line longer than {MAX_LINE_BYTES} bytes"))
                    self._buf.clear()
                return out
            line = bytes(self._buf[:nl]).removesuffix(b"\r")
            del self._buf[:nl + 1]
            if len(line) > MAX_LINE_BYTES:
                out.append(Violation(f"status line longer than {MAX_LINE_BYTES} bytes"))
                return out
            out.append(parse_line(line))

    def end(self) -> list[Line | Violation]:
        """The pipe is closed: a last line without its newline still counts."""
        if not self._buf:
            return []
        line, self._buf = bytes(self._buf).removesuffix(b"\r"), bytearray()
        return [parse_line(line)]


# ---------------------------------------------------------------------------------------------
# The verdict

ACK: Final = "ack"
NACK: Final = "nack"
RESEND: Final = "resend"
FAIL: Final = "fail"


@dataclass(frozen=True)
class Verdict:
    state: str  # done, failed, resent, timeout, stopped (broker/runs.py)
    action: str  # ack, nack, resend, fail
    reason: str
    seconds: int = 0  # resend: the delay


def describe_exit(code: int) -> str:
    if code >= 0:
        return f"exit status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"killed by {name}"


@dataclass
class Outcome:
    """What happened to one run, as the runner saw it."""

    final: Line | None = None  # the first done/err/resend line
    exit_code: int | None = None  # negative: killed by that signal; None: never started
    spawn_error: str = ""  # why it never ran: the whole reason
    violation: str = ""
    timed_out_after: float | None = None  # the time limit, when it was reached
    stopped: str = ""  # the worker stopped it (shutdown): why
    signalled: bool = False  # the worker sent SIGTERM to its group (limit, violation, stop)
    notes: tuple[str, ...] = ()  # facts worth adding to the reason (leftover processes, ...)


def decide(o: Outcome) -> Verdict:
    verdict = _decide(o)
    if o.notes:
        return Verdict(verdict.state, verdict.action,
                       "; ".join((verdict.reason, *o.notes)), verdict.seconds)
    return verdict


def _with(head: str, text: str) -> str:
    return f"{head}: {text}" if text else head


def _decide(o: Outcome) -> Verdict:
    if o.spawn_error:
        return Verdict("failed", FAIL, o.spawn_error)
    ended = describe_exit(o.exit_code) if o.exit_code is not None else "no exit status"
    if o.violation:
        stopped = "; the script was stopped" if o.signalled else ""
        return Verdict("failed", FAIL, f"{o.violation}{stopped} ({ended})")
    if o.timed_out_after is not None:
        return Verdict("timeout", FAIL,
                       f"time limit of {o.timed_out_after:g} s reached; the script was "
                       f"stopped ({ended})")
    if o.stopped:
        return Verdict("stopped", NACK, f"{o.stopped} ({ended})")
    final = o.final
    if final is not None and final.verb == "resend":
        return Verdict("resent", RESEND, _with(f"resend in {final.seconds} s", final.text),
                       final.seconds)
    if final is not None and final.verb == "err":
        return Verdict("failed", FAIL, f"err: {final.text} ({ended})")
    if final is not None and o.exit_code == 0:
        return Verdict("done", ACK, _with("done", final.text))
    if final is not None:
        return Verdict("failed", FAIL, f"{ended} after 'done: {final.text}'")
    if o.exit_code == 0:
        return Verdict("failed", FAIL, "exit status 0 without a 'done' line on fd 3")
    return Verdict("failed", FAIL, ended)
