"""node/dashboard_view.py's pure parts: queue rates from counters sampled at render time, and
bytes shown as text."""

from __future__ import annotations

from node.dashboard_view import RATE_WINDOW_MS, RateTracker, text

T0 = 1_700_000_000_000


def test_rates_need_a_second_and_follow_the_counters() -> None:
    r = RateTracker()
    r.observe(T0, {b"q": (100, 40)})
    assert r.rates(b"q") is None  # one sample: no rate yet
    r.observe(T0 + 300, {b"q": (130, 40)})  # a burst of renders adds no sample
    assert r.rates(b"q") is None
    r.observe(T0 + 2000, {b"q": (120, 50)})
    assert r.rates(b"q") == (10.0, 5.0)  # 20 in and 10 out in 2 s


def test_rates_forget_queues_no_longer_shown_and_restart_after_eviction() -> None:
    r = RateTracker()
    r.observe(T0, {b"a": (0, 0), b"b": (0, 0)})
    r.observe(T0 + 1000, {b"a": (5, 0)})
    assert r.rates(b"b") is None and r.rates(b"a") == (5.0, 0.0)
    r.observe(T0 + 2000, {b"a": (1, 0)})  # evicted and created again: counters went down
    assert r.rates(b"a") is None
    r.observe(T0 + 3000, {b"a": (4, 0)})
    assert r.rates(b"a") == (3.0, 0.0)


def test_the_rate_window_slides() -> None:
    r = RateTracker()
    for i in range(100):  # 1 job/s for 50 s, then 10 jobs/s
        n = i if i < 50 else 50 + (i - 50) * 10
        r.observe(T0 + i * 1000, {b"q": (n, 0)})
    rate = r.rates(b"q")
    assert rate is not None and rate[0] == 10.0  # only the last 30 s count
    assert len(r._samples[b"q"]) <= RATE_WINDOW_MS // 1000 + 2  # bounded


def test_text_cuts_and_replaces() -> None:
    assert text(b"caf\xc3\xa9") == "café"
    assert text(b"\xff") == "\ufffd"
    assert text(b"abcdef", 3) == "abc…"
    assert text(b"abc", 3) == "abc"
    assert text(None) == ""
    assert text("漢".encode() * 300, 5) == "漢" * 5 + "…"
