"""Replay the reference Disque server's one-node session against a real trisque-server.

The fixture (tests/fixtures/disque-reference-replies.md, "One node") was recorded on a fresh
Disque 1.0-rc1. The whole sequence is sent in order on one connection to one fresh server, once
per module; then each exchange is its own test, so a failure names the command, the reply the
reference gave and the one we gave.

What differs from run to run is masked, and only that:

* job IDs: the n-th distinct ID of the recording stands for the n-th distinct ID we returned,
  and later commands that name a recorded ID (SHOW, ACKJOB, ...) are sent with ours. Ours are
  checked for their format: ``D-`` + the first 8 hex digits of our node ID + 24 base64 chars +
  4 hex digits of TTL in minutes, even for RETRY 0 and odd otherwise.
* node IDs (40 hex) stand for ours, as learnt from HELLO; the recorded port stands for ours.
* ``ctime`` must be a nanosecond timestamp of this run; ``next-requeue-within`` and
  ``next-awake-within`` (ms), ``ttl``, ``age`` and ``idle`` (s) must be within a tolerance of
  the recorded value, since the replay and the recording run at their own pace.

QSCAN and JSCAN list what Disque found walking its hash tables, in bucket order, which depends on
hash seeds and table sizes, not on anything a client can rely on; so when the recorded cursor
is "0" (a complete scan) the items are compared as multisets, and the cursor and each item's
shape exactly. A scan the recording left unfinished (``JSCAN COUNT 2``) is checked for shape
and then resumed with its cursors until "0": every job must come back at least once.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.e2e.rawclient import RawConnection, ServerClosed
from tests.e2e.reference import Exchange, one_node
from tests.support.server import ServerProcess

JOB_ID = re.compile(r"D-([0-9a-f]{8})-([A-Za-z0-9+/]{24})-([0-9a-f]{4})")
NODE_ID = re.compile(r"[0-9a-f]{40}")

# field name -> allowed distance from the recorded value
TOLERANCE = {
    "next-requeue-within": 2000,  # ms
    "next-awake-within": 2000,  # ms
    "ttl": 2,  # s: the recording shows 86400 and 86401 for fresh jobs
    "age": 2,  # s
    "idle": 2,  # s
}

EXCHANGES = one_node()
# The recorded node's port, as its HELLO told it.
REF_PORT = next(e.expected[2][2] for e in EXCHANGES if e.argv == ("HELLO",)).decode()


def expected_ttl_field(argv: tuple[str, ...]) -> str:
    """The last 4 hex digits of the ID ADDJOB must return for these arguments."""
    opts = [a.upper() for a in argv]
    ttl = int(argv[opts.index("TTL") + 1]) if "TTL" in opts else 86400
    retry = int(argv[opts.index("RETRY") + 1]) if "RETRY" in opts else 1  # default is not 0
    minutes = min(ttl // 60, 0xFFFF)
    return "%04x" % ((minutes & ~1) | (1 if retry > 0 else 0))


@dataclass
class Outcome:
    sent: list[str]
    got: Any = None
    problems: list[str] = field(default_factory=list)


class Replay:
    def __init__(self, server: ServerProcess) -> None:
        self.port = server.port
        self.ids: dict[str, str] = {}  # recorded job ID -> ours
        self.nodes: dict[str, str] = {}  # recorded node ID -> ours
        self.our_node = ""
        self.started_ns = time.time_ns()

    # ---- masking -----------------------------------------------------------------------

    def rewrite(self, argv: tuple[str, ...]) -> list[str]:
        return [self.ids.get(a, a) for a in argv]

    def compare(self, exp: Any, act: Any, where: str, key: str | None = None) -> list[str]:
        if isinstance(exp, tuple):
            if not (isinstance(act, tuple) and act[0] == exp[0]):
                kind = "status" if exp[0] == "+" else "error"
                return [f"{where}: expected a {kind} reply {exp!r}, got {act!r}"]
            return self.compare_text(exp[1], act[1], where)
        if isinstance(exp, bytes):
            if not isinstance(act, bytes):
                return [f"{where}: expected a bulk string {exp!r}, got {act!r}"]
            return self.compare_text(exp.decode("latin-1"), act.decode("latin-1"), where)
        if isinstance(exp, int):
            if type(act) is not int:
                return [f"{where}: expected an integer {exp!r}, got {act!r}"]
            return self.compare_int(exp, act, where, key)
        if exp is None:
            return [] if act is None else [f"{where}: expected a null, got {act!r}"]
        assert isinstance(exp, list)
        if not isinstance(act, list):
            return [f"{where}: expected an array, got {act!r}"]
        if len(exp) != len(act):
            return [f"{where}: expected {len(exp)} elements, got {len(act)}"]
        problems = []
        for i, (e, a) in enumerate(zip(exp, act, strict=True)):
            # In a field/value list (SHOW, QSTAT), a value is judged by the field before it.
            k = exp[i - 1].decode() if i and isinstance(exp[i - 1], bytes) else None
            problems += self.compare(e, a, f"{where}[{i}]", k)
        return problems

    def compare_int(self, exp: int, act: int, where: str, key: str | None) -> list[str]:
        if key == "ctime":
            now = time.time_ns()
            if not self.started_ns - 60 * 10**9 <= act <= now + 60 * 10**9:
                return [f"{where} (ctime): {act} is not a nanosecond timestamp of this run "
                        f"(between {self.started_ns} and {now})"]
            return []
        if key in TOLERANCE:
            if abs(act - exp) > TOLERANCE[key]:
                return [f"{where} ({key}): {act} is not within {TOLERANCE[key]} of {exp}"]
            return []
        return [] if act == exp else [f"{where}{f' ({key})' if key else ''}: expected {exp}, got {act}"]

    def compare_text(self, exp: str, act: str, where: str) -> list[str]:
        if JOB_ID.fullmatch(exp):
            return self.match_id(exp, act, where)
        if NODE_ID.fullmatch(exp):
            if not NODE_ID.fullmatch(act):
                return [f"{where}: expected a node ID (40 hex digits), got {act!r}"]
            mapped = self.nodes.setdefault(exp, act)
            if mapped != act:
                return [f"{where}: expected our node ID {mapped}, got {act}"]
            return []
        if exp == REF_PORT:
            exp = str(self.port)
        for ref, ours in self.nodes.items():
            exp = exp.replace(ref, ours)
        exp = exp.replace(f":{REF_PORT} ", f":{self.port} ")
        return [] if exp == act else [f"{where}: expected {exp!r}, got {act!r}"]

    def match_id(self, exp: str, act: str, where: str) -> list[str]:
        m = JOB_ID.fullmatch(act)
        if not m:
            return [f"{where}: expected a job ID like {exp}, got {act!r}"]
        problems = []
        if self.our_node and m.group(1) != self.our_node[:8]:
            problems.append(f"{where}: job ID {act} does not start with our node ID "
                            f"prefix D-{self.our_node[:8]}-")
        if exp in self.ids:
            if self.ids[exp] != act:
                problems.append(f"{where}: expected the job ID {self.ids[exp]} (recorded "
                                f"as {exp}), got {act}")
        elif act in self.ids.values():
            problems.append(f"{where}: {act} was already returned for another job")
        else:
            self.ids[exp] = act
        return problems

    # ---- scans -------------------------------------------------------------------------

    def item_key(self, item: Any, recorded: bool) -> str:
        """What identifies a scan item: a queue name, a job ID, a job's 'id' field."""
        if isinstance(item, list) and b"id" in item[0::2]:
            item = item[item.index(b"id") + 1]
        text = item[1] if isinstance(item, tuple) else item.decode("latin-1")
        return self.ids.get(text, text) if recorded else text

    def compare_complete_scan(self, exp: list[Any], act: Any, where: str) -> list[str]:
        if not (isinstance(act, list) and len(act) == 2 and isinstance(act[1], list)):
            return [f"{where}: expected [cursor, [items]], got {act!r}"]
        problems = self.compare(exp[0], act[0], f"{where}[0] (cursor)")
        want = {self.item_key(e, True): e for e in exp[1]}
        have = Counter(self.item_key(a, False) for a in act[1])
        for key, n in have.items():
            if n > 1:
                problems.append(f"{where}: {key!r} listed {n} times in one page")
        if set(want) != set(have):
            problems.append(f"{where}: expected the items {sorted(want)} in any order, "
                            f"got {sorted(have)} (missing {sorted(set(want) - set(have))}, "
                            f"unexpected {sorted(set(have) - set(want))})")
        for a in act[1]:
            key = self.item_key(a, False)
            if key in want:
                problems += self.compare(want[key], a, f"{where}[1] item {key}")
        return problems

    def check_partial_jscan(self, conn: RawConnection, exchange: Exchange, act: Any) -> list[str]:
        where = "reply"
        argv = [a.upper() for a in exchange.argv]
        count = int(exchange.argv[argv.index("COUNT") + 1])
        if not (isinstance(act, list) and len(act) == 2 and isinstance(act[0], bytes)
                and isinstance(act[1], list)):
            return [f"{where}: expected [cursor, [job IDs]], got {act!r}"]
        problems = []
        cursor, page = act
        if not cursor.isdigit() or cursor == b"0":
            # Seven jobs, COUNT 2: the recorded scan stops early, so must ours.
            problems.append(f"{where}[0]: expected a non-zero cursor (as recorded: "
                            f"{exchange.expected[0]!r}), got {cursor!r}")
        if not 1 <= len(page) <= 2 * count:
            problems.append(f"{where}[1]: COUNT {count} gave {len(page)} IDs")
        seen: list[str] = []
        for i, item in enumerate(page):
            # The recording answers IDs as status replies.
            if not (isinstance(item, tuple) and item[0] == "+"):
                problems.append(f"{where}[1][{i}]: expected a job ID status reply, got {item!r}")
                continue
            seen.append(item[1])
        if problems:
            return problems
        for _ in range(100):
            if cursor == b"0":
                break
            nxt = conn.call("JSCAN", cursor, "COUNT", str(count))
            if not (isinstance(nxt, list) and len(nxt) == 2 and isinstance(nxt[1], list)):
                return [f"JSCAN {cursor.decode()} COUNT {count}: expected [cursor, [IDs]], "
                        f"got {nxt!r}"]
            cursor = nxt[0]
            seen += [i[1] if isinstance(i, tuple) else i.decode() for i in nxt[1]]
        else:
            return [f"JSCAN with COUNT {count} did not reach cursor 0 in 100 calls"]
        full = conn.call("JSCAN", "BUSYLOOP")
        everything = {i[1] if isinstance(i, tuple) else i.decode() for i in full[1]}
        known = set(self.ids.values())
        if set(seen) != everything or not everything <= known:
            problems.append(f"resuming JSCAN COUNT {count} until cursor 0 returned {sorted(set(seen))}; "
                            f"JSCAN BUSYLOOP returns {sorted(everything)}; jobs added: {sorted(known)}")
        return problems

    # ---- one exchange --------------------------------------------------------------------

    def run(self, conn: RawConnection, exchange: Exchange) -> Outcome:
        sent = self.rewrite(exchange.argv)
        outcome = Outcome(sent)
        act = outcome.got = conn.call(*sent)
        exp = exchange.expected
        name = exchange.argv[0].upper()
        if exchange.argv == ("HELLO",) and isinstance(act, list) and len(act) > 1:
            if isinstance(act[1], bytes):
                self.our_node = act[1].decode("latin-1")
        if name in ("QSCAN", "JSCAN") and isinstance(exp, list) and exp[0] == b"0":
            outcome.problems = self.compare_complete_scan(exp, act, "reply")
        elif name == "JSCAN":
            outcome.problems = self.check_partial_jscan(conn, exchange, act)
        else:
            outcome.problems = self.compare(exp, act, "reply")
        if name == "ADDJOB" and isinstance(exp, tuple) and exp[0] == "+":
            want = expected_ttl_field(exchange.argv)
            # Guard against a wrong formula here: it must explain the recording first.
            assert exp[1].endswith("-" + want), (exchange, want)
            if isinstance(act, tuple) and not act[1].endswith("-" + want):
                outcome.problems.append(f"reply: job ID {act[1]} must end in -{want} (TTL in "
                                        "minutes, even for RETRY 0, odd otherwise)")
        return outcome


@pytest.fixture(scope="module")
def replay() -> Iterator[tuple[dict[int, Outcome], str]]:
    """Run the whole recorded sequence once; map fixture line -> outcome, and why it stopped."""
    outcomes: dict[int, Outcome] = {}
    stopped = ""
    with ServerProcess() as server:
        r = Replay(server)
        with RawConnection(server.port, timeout=10) as conn:
            for exchange in EXCHANGES:
                try:
                    outcomes[exchange.line] = r.run(conn, exchange)
                except (ServerClosed, TimeoutError, OSError) as exc:
                    stopped = f"the replay stopped at {exchange}: {exc!r}\n{server.log()[-3000:]}"
                    break
        yield outcomes, stopped


@pytest.mark.parametrize("exchange", EXCHANGES, ids=lambda e: f"L{e.line}-{' '.join(e.argv)}")
def test_reply_matches_reference(replay: tuple[dict[int, Outcome], str], exchange: Exchange) -> None:
    outcomes, stopped = replay
    if exchange.line not in outcomes:
        pytest.fail(f"not reached: {stopped}", pytrace=False)
    out = outcomes[exchange.line]
    if out.problems:
        pytest.fail(
            f"command:  {' '.join(exchange.argv)}\n"
            f"sent:     {' '.join(out.sent)}\n"
            f"expected: {exchange.expected!r}\n"
            f"got:      {out.got!r}\n" + "\n".join(f"  - {p}" for p in out.problems),
            pytrace=False,
        )


def test_ttl_field_formula() -> None:
    assert expected_ttl_field(("ADDJOB", "q", "b", "0")) == "05a1"
    assert expected_ttl_field(("ADDJOB", "q", "b", "0", "RETRY", "0")) == "05a0"
    assert expected_ttl_field(("ADDJOB", "q", "b", "0", "TTL", "100", "RETRY", "200")) == "0001"
    assert expected_ttl_field(("ADDJOB", "q", "b", "0", "TTL", "100", "RETRY", "0")) == "0000"
    assert expected_ttl_field(("ADDJOB", "q", "b", "0", "TTL", "3600")) == "003d"
