"""A bounded random run: five nodes, REPLICATE 3, producers and consumers on any
node, frames dropped, duplicated and reordered, partitions that heal, kill -9 and restart
from the append log. Nothing raises; every job whose ADDJOB was answered and that nobody
acked still exists somewhere; every acked job is gone everywhere once the cluster heals."""

from __future__ import annotations

import random

import pytest

from broker.clients import BLOCKED
from cluster.sim import Faults
from tests.cluster.jobsim import JobCluster


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_faults_lose_no_acknowledged_job(seed: int) -> None:
    rng = random.Random(seed)
    c = JobCluster(5, seed=seed, node_timeout=1500)
    for a in range(5):
        for b in range(5):
            if a != b:
                c.sim.faults[(a, b)] = Faults(drop=0.02, jitter_ms=30, duplicate=0.05)
    added: list[bytes] = []
    acked: set[bytes] = set()
    pending: list[tuple[int, object]] = []
    down: set[int] = set()
    for step in range(150):
        up = [i for i in range(5) if i not in down]
        node = rng.choice(up)
        action = rng.random()
        if action < 0.35:
            client = c.client()
            reply = c.cmd(node, "ADDJOB", "q", f"j{step}", "2000", "RETRY", "3",
                          client=client)
            if reply is BLOCKED:
                pending.append((node, client))
            elif isinstance(reply, str) and reply.startswith("D-"):
                added.append(reply.encode())
        elif action < 0.7:
            reply = c.cmd(node, "GETJOB", "NOHANG", "FROM", "q")
            if isinstance(reply, list):
                job_id = reply[0][1]
                if rng.random() < 0.7:
                    c.cmd(rng.choice(up), "ACKJOB", job_id)
                    acked.add(job_id)
        elif action < 0.8 and len(down) < 2:
            victim = rng.choice(up)
            c.sim.kill(victim)
            down.add(victim)
            pending = [(n, cl) for n, cl in pending if n != victim]
        elif action < 0.9 and down:
            back = rng.choice(sorted(down))
            c.sim.restart(back)
            down.discard(back)
        elif action < 0.95:
            c.sim.partition(set(rng.sample(range(5), 2)))
        else:
            c.sim.heal()
        c.run_for(rng.randrange(20, 300))
        for n, cl in list(pending):
            value = c.reply_to(n, cl)
            if value is not None:
                pending.remove((n, cl))
                if isinstance(value, str) and value.startswith("D-"):
                    added.append(value.encode())
    c.sim.heal()
    for i in sorted(down):
        c.sim.restart(i)
    c.run_for(1000)
    for n, cl in pending:
        value = c.reply_to(n, cl)
        if isinstance(value, str) and value.startswith("D-"):
            added.append(value.encode())
    for job_id in added:
        if job_id not in acked:
            assert c.holders(job_id), f"{job_id!r} was answered to ADDJOB and is lost"
    # With the cluster whole again, every ACK reaches every copy (GC backs off up to a few
    # tens of seconds after the failures above).
    assert c.run_until(lambda: all(c.holders(j) == [] for j in acked), 240_000), [
        (j, c.holders(j)) for j in acked if c.holders(j)]
    assert len(added) > 10
