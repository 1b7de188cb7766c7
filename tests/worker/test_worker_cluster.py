"""`trisque worker` on a two-node cluster of real processes: the node the worker talks to is
killed while a script runs; the worker finishes the job through the other node, which then
holds the run record (replayed: status lines and output from before the kill), and goes on
taking jobs there."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cluster import LocalCluster, local_cluster, wait_until
from tests.support.worker import WorkerProcess, add_job, run_output, run_record, script

__all__ = ["local_cluster"]

pytestmark = pytest.mark.cluster_processes

Factory = Callable[..., LocalCluster]

WAIT_SH = """\
    #!/bin/bash
    echo "before the kill"
    echo "run waiting for $TRISQUE_BODY" >&3
    while [ ! -e "$TRISQUE_BODY" ]; do sleep 0.1; done
    echo "after the kill"
    echo "done through the other node" >&3
"""


def test_the_worker_moves_to_another_node_when_its_node_dies(local_cluster: Factory,
                                                              tmp_path: Path) -> None:
    c = local_cluster(2)
    ids = [c.myid(i) for i in range(2)]
    c.meet(1, 0)
    wait_until(lambda: c.mesh_ok([0, 1], ids), 20, "a mesh of 2")
    go = tmp_path / "go"
    cmd = script(tmp_path / "wait.sh", WAIT_SH)
    job = add_job(c.port(0), "cq", str(go), "REPLICATE", "2", "RETRY", "60")
    with WorkerProcess([c.port(0), c.port(1)], ["cq"], [cmd], log_dir=tmp_path / "logs") as w:

        def holder() -> tuple[int] | None:
            for i in (0, 1):
                r = run_record(c.port(i), job)
                if r and r["state"] == "running" and len(r["status"]) == 1:
                    return (i,)
            return None

        (serving,), _ = wait_until(holder, 20, "the run record on the worker's node")
        survivor = 1 - serving
        c.kill(serving)
        go.touch()
        run, _ = wait_until(
            lambda: (r := run_record(c.port(survivor), job)) and r["state"] == "done" and r,
            30, "the run ended on the surviving node")
        assert [line for _, line in run["status"]] == [
            f"run waiting for {go}".encode(), b"done through the other node"]
        out = run_output(c.port(survivor), job)[2]
        assert out == b"before the kill\nafter the kill\n"
        shown = c.call(survivor, "SHOW", job)
        assert shown is None or shown[shown.index(b"state") + 1] == b"acked"
        # And it goes on taking jobs from the node that is left.
        more = add_job(c.port(survivor), "cq", str(go), "REPLICATE", "1")
        wait_until(lambda: (r := run_record(c.port(survivor), more)) and r["state"] == "done",
                   30, "a new job done after the move")
    print(w.log())
    assert "started pid" in w.log()
