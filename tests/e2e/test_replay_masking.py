"""The replay's masking, without a server: it must accept the recording itself with every
run-dependent value changed (IDs, node ID, port, times, scan order) and refuse a real change.

A fake connection answers each recorded command with its recorded reply, rewritten the way a
different, correct run would differ.
"""

from __future__ import annotations

import copy
import re
import time
from typing import Any

import pytest

from tests.e2e import test_reference_replies as ref
from tests.e2e.reference import Exchange

OUR_NODE = "0123456789abcdef0123456789abcdef01234567"
OUR_PORT = 40001
REF_NODE = ref.EXCHANGES[2].expected[1].decode()


def their_id_to_ours(text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(1) != REF_NODE[:8]:
            return m.group(0)  # a made-up ID the recording sends, not one of its jobs
        return f"D-{OUR_NODE[:8]}-{m.group(2)[::-1]}-{m.group(3)}"

    return ref.JOB_ID.sub(sub, text)


def convert(value: Any, key: str | None = None) -> Any:
    """The recorded value as a faithful run on another node and port would give it."""
    if isinstance(value, tuple):
        return (value[0], convert(value[1]))
    if isinstance(value, bytes):
        return convert(value.decode("latin-1")).encode("latin-1")
    if isinstance(value, str):
        text = their_id_to_ours(value.replace(REF_NODE, OUR_NODE))
        return text.replace(ref.REF_PORT, str(OUR_PORT))
    if isinstance(value, int):
        if key == "ctime":
            return time.time_ns()
        if key == "next-requeue-within":
            return value - 1500  # slower run, within tolerance
        return value
    if isinstance(value, list):
        return [convert(v, value[i - 1].decode() if i and isinstance(value[i - 1], bytes) else None)
                for i, v in enumerate(value)]
    return value


class FakeConnection:
    """Answers the recorded commands (with our IDs) by the converted recorded replies."""

    def __init__(self, exchanges: list[Exchange], tamper: dict[int, Any] | None = None) -> None:
        self.replies: dict[tuple[str, ...], list[Any]] = {}
        for e in exchanges:
            key = tuple(their_id_to_ours(a) for a in e.argv)
            reply = tamper[e.line] if tamper and e.line in tamper else convert(e.expected)
            if e.argv[0] == "QSCAN" and isinstance(reply, list):
                reply = [reply[0], reply[1][::-1]]  # another hash order
            self.replies.setdefault(key, []).append(reply)  # a command may recur (ACKJOB)
        # The complete job list, for resuming the partial JSCAN.
        full = next(convert(e.expected) for e in exchanges
                    if e.argv[:3] == ("JSCAN", "BUSYLOOP", "STATE"))
        self.all_ids = full[1]

    def call(self, *argv: Any) -> Any:
        argv = tuple(a.decode() if isinstance(a, bytes) else a for a in argv)
        if argv == ("JSCAN", "BUSYLOOP"):
            return [b"0", self.all_ids]
        if argv[0] == "JSCAN" and argv[1] == "2":
            return [b"0", self.all_ids[2:]]
        if not self.replies.get(argv):
            return ("-", "ERR the fake server has no reply for this")  # after a tampered reply
        return copy.deepcopy(self.replies[argv].pop(0))


def run(tamper: dict[int, Any] | None = None) -> dict[int, list[str]]:
    server = type("S", (), {"port": OUR_PORT})()
    replay = ref.Replay(server)  # type: ignore[arg-type]
    conn = FakeConnection(ref.EXCHANGES, tamper)
    return {e.line: replay.run(conn, e).problems for e in ref.EXCHANGES}  # type: ignore[arg-type]


def line_of(*argv: str) -> int:
    return next(e.line for e in ref.EXCHANGES if e.argv == argv)


def test_faithful_transcript_passes() -> None:
    problems = {line: p for line, p in run().items() if p}
    assert problems == {}


def changed(line: int, edit: Any) -> dict[int, Any]:
    e = next(e for e in ref.EXCHANGES if e.line == line)
    return {line: edit(convert(e.expected))}


SHOW = line_of("SHOW", "D-80c616e9-j2MnJ+DMTFQUlA7Dg+bu7vUL-05a1")


@pytest.mark.parametrize(
    "name, tamper, bad_line",
    [
        ("status instead of bulk", lambda: changed(line_of("PING"), lambda r: b"PONG"), "PING"),
        ("bulk ID instead of status",
         lambda: changed(line_of("ADDJOB", "q1", "body-1", "0"), lambda r: r[1].encode()), "ADDJOB"),
        ("wrong TTL field",
         lambda: changed(line_of("ADDJOB", "q1", "body-2", "0", "RETRY", "0"),
                         lambda r: ("+", r[1][:-4] + "05a1")), "ADDJOB"),
        ("wrong node prefix",
         lambda: changed(line_of("ADDJOB", "q1", "body-1", "0"),
                         lambda r: ("+", "D-ffffffff" + r[1][10:])), "ADDJOB"),
        ("error text", lambda: changed(line_of("ADDJOB", "q1", "b", "abc"),
                                       lambda r: ("-", "ERR bad timeout")), "ADDJOB"),
        ("port in HELLO", lambda: changed(line_of("HELLO"),
                                          lambda r: [r[0], r[1], [r[2][0], r[2][1], b"1", r[2][3]]]),
         "HELLO"),
        ("ctime in ms", lambda: changed(SHOW, lambda r: r[:11] + [time.time_ns() // 10**6] + r[12:]),
         "SHOW"),
        ("requeue far off", lambda: changed(SHOW, lambda r: r[:-4] + [1000] + r[-3:]), "SHOW"),
        ("queue order", lambda: changed(line_of("QPEEK", "q1", "2"), lambda r: r[::-1]), "QPEEK"),
        ("missing queue in QSCAN", lambda: changed(line_of("QSCAN", "COUNT", "100"),
                                                   lambda r: [r[0], r[1][1:]]), "QSCAN"),
        ("unfinished QSCAN", lambda: changed(line_of("QSCAN", "COUNT", "100"),
                                             lambda r: [b"3", r[1]]), "QSCAN"),
        ("JSCAN COUNT ignored", lambda: changed(line_of("JSCAN", "COUNT", "2"),
                                                lambda r: [b"0", r[1] * 4]), "JSCAN"),
        ("CLUSTER NODES port", lambda: changed(line_of("CLUSTER", "NODES"),
                                               lambda r: r.replace(b":%d" % OUR_PORT, b":7711")),
         "CLUSTER"),
    ],
)
def test_deviation_is_reported(name: str, tamper: Any, bad_line: str) -> None:
    problems = {line: p for line, p in run(tamper()).items() if p}
    assert problems, name
    lines = {next(e.argv[0] for e in ref.EXCHANGES if e.line == line) for line in problems}
    assert bad_line in lines, problems
