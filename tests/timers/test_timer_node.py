"""A whole node in-process on trio's mock clock: the runtime fires a timer at each due time
(node/server.py's CoreAlarm ticks the periodic core at its deadline), twenty minutes pass in
seconds, and the jobs carry the fire times."""

from __future__ import annotations

from typing import Any

import trio

from tests.server.test_inprocess import connect, node


async def test_a_node_fires_every_due_time_on_the_mock_clock(tmp_path: Any,
                                                             autojump_clock: Any) -> None:
    async with node(tmp_path) as (server, port):
        c = await connect(port)
        assert await c.call("TIMER", "ADD", "minutely", 60, "q", "tick", "TTL", 7200) == b"OK"
        start = server.clock.now_ms()
        await trio.sleep(1200.5)
        jobs = await c.call("GETJOB", "NOHANG", "COUNT", 100, "FROM", "q")
        assert isinstance(jobs, list) and len(jobs) == 21  # at 0, 60, ..., 1200 s
        late = []
        for _, job_id, body in jobs:
            assert body == b"tick"
            shown = await c.call("SHOW", job_id)
            assert isinstance(shown, list)
            ctime_ms = shown[shown.index(b"ctime") + 1] // 1_000_000
            late.append((ctime_ms - start) % 60_000)
        assert max(late) < 5, late  # each at its due time, not at the next 100 ms tick
        got = await c.call("TIMER", "GET", "minutely")
        assert isinstance(got, list)
        info = dict(zip(got[::2], got[1::2], strict=True))
        assert info[b"fires"] == 21 and info[b"owner"] == server.node_id.encode()
        assert info[b"last-fired-due"] == start + 1200 * 1000
