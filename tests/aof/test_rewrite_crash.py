"""A process killed at any step of a rewrite leaves a log that loads with every job.

The rewrite runs in a forked child that ``os._exit``s (no cleanup, no flush: a crash) just
before the n-th step; the parent then starts a node on the directory as a restart would.
"""

from __future__ import annotations

import os

import pytest

from broker import aof
from node import logfile
from node.persistence import Persistence
from tests.aof.fakebroker import Config, FakeBroker

STEPS = ["write", "write", "fsync", "rename", "fsync-dir", "done"]


def _history(path: str) -> dict[bytes, list[object]]:
    """An old log with history (acks, nacks); returns the live jobs it stands for."""
    broker = FakeBroker()
    for i in range(200):
        broker.addjob(b"D-%d" % i, body=b"b%d" % i)
        if i % 3 == 0:
            broker.nack(b"D-%d" % i)
        if i % 2 == 0:
            broker.ackjob(b"D-%d" % i)
    logfile.create_log(path)
    with open(path, "ab") as f:
        f.write(aof.encode_records(broker.take_effects()))
    return broker.jobs


@pytest.mark.parametrize("crash_before", range(len(STEPS)))
def test_crash_at_each_rewrite_step_leaves_a_loadable_log(tmp_path, crash_before):
    path = str(tmp_path / "appendonly.aof")
    live = _history(path)
    old_size = os.path.getsize(path)
    pid = os.fork()
    if pid == 0:  # the child: rewrite, dying just before step number `crash_before`
        seen = 0

        def step(name: str) -> None:
            nonlocal seen
            if seen == crash_before:
                os._exit(0)
            seen += 1

        try:
            logfile.write_snapshot(path, [("job", list(v)) for v in live.values()], step=step)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) in (0, 3)
    renamed = crash_before > STEPS.index("rename")
    assert (os.path.getsize(path) < old_size) == renamed
    broker = FakeBroker()
    Persistence(Config(str(tmp_path)), broker).load(0)
    assert {k: v[:3] + v[4:] for k, v in broker.jobs.items()} == \
        {k: v[:3] + v[4:] for k, v in live.items()}
    assert not [f for f in os.listdir(tmp_path) if f.startswith(logfile.TEMP_PREFIX)]
