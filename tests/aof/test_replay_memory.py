"""A replay builds jobs as lean as the running node's: one object per queue name and per set
of holders, shared by every job, not a copy per record."""

from __future__ import annotations

from tests.broker.harness import Node


def test_replayed_jobs_share_their_queue_name_and_holders() -> None:
    n = Node()
    ids = [n.add("orders" if i % 2 else "mail", f"job {i}") for i in range(200)]
    records = [(r.kind, r.payload) for r in n.log]
    fresh = Node(n.now)
    for rec in records:
        fresh.b.load_record(rec, n.now)
    fresh.b.finish_load(n.now, True)
    jobs = [fresh.b.jobs[i] for i in ids]
    by_name: dict[bytes, bytes] = {}
    for job in jobs:
        assert job.queue is by_name.setdefault(job.queue, job.queue)
        assert job.delivered is jobs[0].delivered
    assert sorted(by_name) == [b"mail", b"orders"]
    assert jobs[0].delivered == (fresh.b.node_id,)
    assert fresh.b.loading_shared == {}  # nothing kept once the replay is over
