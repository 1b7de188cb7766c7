"""Any sequence of TIMER commands and fires: every record is one replay accepts, and
replaying the records (or a snapshot) rebuilds the same table."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker import periodic
from broker.clients import Client
from broker.config import Config
from broker.core import Broker
from broker.effects import LogRecord

T0 = 1_700_000_000_000
_NAMES = st.sampled_from([b"a", b"b", b"c"])
_OPTIONS = st.lists(st.sampled_from([
    [b"RETRY", b"5"], [b"TTL", b"100"], [b"DELAY", b"1"], [b"REPLICATE", b"1"], [b"ASYNC"],
    [b"START", b"%d" % (T0 + 5_000)], [b"START", b"0"], [b"REPLACE"], [b"RETRY", b"-1"],
]), max_size=3)
_STEP = st.one_of(
    st.tuples(st.just(b"ADD"), _NAMES, st.sampled_from([b"1", b"2", b"7", b"0"]), _OPTIONS),
    st.tuples(st.sampled_from([b"DEL", b"PAUSE", b"RESUME", b"FIRE", b"GET"]), _NAMES),
    st.tuples(st.just(b"fire"), _NAMES),  # what the cluster core does at a due time
    st.tuples(st.just(b"wait"), st.integers(0, 20_000)),
)


def _broker() -> Broker:
    config = Config()
    config.timer_min_period = 1
    return Broker(config, "ab" * 20, b"seed", now_ms=T0)


def _table(b: Broker) -> list[tuple[object, ...]]:
    return sorted((e.name, e.definition, e.stamp, e.progress)
                  for e in b.periodic.entries.values())


@given(st.lists(_STEP, max_size=30))
def test_records_replay_to_the_same_table(steps: list[tuple[object, ...]]) -> None:
    b = _broker()
    client = Client(1)
    now = T0
    records: list[LogRecord] = []
    for step in steps:
        if step[0] == b"wait":
            now += step[1]  # type: ignore[operator]
        elif step[0] == b"fire":
            e = b.periodic.get(step[1])  # type: ignore[arg-type]
            if e is not None and e.definition is not None:
                due = e.definition.next_due(e.progress.done_ms, now)
                if due <= now:
                    periodic.fire(b, e, due, now)
        elif step[0] == b"ADD":
            _, name, period, options = step
            argv = [b"TIMER", b"ADD", name, period, b"q", b"body"]
            for opt in options:  # type: ignore[attr-defined]
                argv += opt
            b.execute(argv, client, now)  # type: ignore[arg-type]
        else:
            b.execute([b"TIMER", step[0], step[1]], client, now)  # type: ignore[list-item]
        for effect in b.take_effects():
            if isinstance(effect, LogRecord):
                assert Broker.validate_record(effect.kind, effect.payload) is None, effect
                records.append(effect)
    replayed = _broker()
    for rec in records:
        replayed.load_record((rec.kind, rec.payload), now)
    assert _table(replayed) == _table(b)
    from_snapshot = _broker()
    for kind, payload in b.snapshot():
        from_snapshot.load_record((kind, payload), now)
    assert _table(from_snapshot) == _table(b)
    assert [v.name for v in b.periodic.list(now)] == sorted(
        n for n, e in b.periodic.entries.items() if e.definition is not None)
