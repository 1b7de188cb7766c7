"""What `trisque worker` does with a failed job (docs/worker.md, "States and what happens to
the job"): real bash scripts, real worker processes, a real node. A failure is parked out of
its queue with why, unless ``--retries`` asks for more runs, which come after a backoff
without holding a slot; no failing job delays the others of its queue."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import wait_until
from tests.support.server import ServerProcess
from tests.support.worker import WorkerProcess, add_job, run_record, script, wait_state

FAIL_SH = """\
    #!/bin/bash
    echo "$TRISQUE_JOB_ID $TRISQUE_ATTEMPT $(date +%s%N)" >> {runs}
    echo "output of attempt $TRISQUE_ATTEMPT"
    case "$TRISQUE_BODY" in
      good*) echo "done fine" >&3 ;;
      err) echo "err by design" >&3 ;;
      exit3) echo "run about to fail" >&3; exit 3 ;;
      silent) ;;
      done-exit4) echo "done too early" >&3; exit 4 ;;
      malformed) echo "progress 50%" >&3; sleep 10 ;;
      killed) kill -9 $$ ;;
      hang) sleep 30 ;;
      flaky)
        if [ "$TRISQUE_ATTEMPT" -lt 3 ]; then echo "err attempt $TRISQUE_ATTEMPT" >&3
        else echo "done at last" >&3; fi ;;
    esac
"""


@pytest.fixture(scope="module")
def node() -> Iterator[ServerProcess]:
    with ServerProcess() as proc:
        yield proc


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    runs = tmp_path / "runs.txt"
    runs.touch()
    return script(tmp_path / "fail.sh", FAIL_SH.format(runs=runs)), runs


def _worker(node: ServerProcess, tmp_path: Path, queues: list[str], cmd: Path,
            *options: str) -> WorkerProcess:
    return WorkerProcess([node.port], queues, [cmd], log_dir=tmp_path / "logs",
                         options=("--kill-after", "0.5", *options))


def _runs(runs: Path) -> dict[str, list[tuple[int, float]]]:
    """Job ID -> [(attempt, start time in s)] in the order they ran."""
    out: dict[str, list[tuple[int, float]]] = {}
    for line in runs.read_text().splitlines():
        job, attempt, ns = line.split()
        out.setdefault(job, []).append((int(attempt), int(ns) / 1e9))
    return out


def _wait_parked(node: ServerProcess, job: str) -> dict:
    """The job's last run record, once the job was parked (after its retries)."""
    record, _ = wait_until(
        lambda: (r := run_record(node.port, job)) is not None and "; parked in " in r["reason"]
        and r, 30, f"{job} to be parked")
    return record  # type: ignore[no-any-return]


def _parked(node: ServerProcess, run: dict, queue: str) -> tuple[str, list]:
    """The parked job's ID from the run record's reason, and QPOLICY ORIGIN's answer."""
    head, sep, parked = run["reason"].rpartition(f"; parked in {queue} as ")
    assert sep, run["reason"]
    origin = node.call("QPOLICY", "ORIGIN", parked)
    assert origin is not None and origin[2].decode() == head, (origin, head)
    return parked, origin


def test_every_failure_leaves_the_queue_with_why(node: ServerProcess, tmp_path: Path) -> None:
    q = "fail-q"
    cmd, runs = _setup(tmp_path)
    want = {  # body -> (state, exit status, reason)
        "err": ("failed", 0, "err: by design (exit status 0)"),
        "exit3": ("failed", 3, "exit status 3"),
        "silent": ("failed", 0, "exit status 0 without a 'done' line on fd 3"),
        "done-exit4": ("failed", 4, "exit status 4 after 'done: too early'"),
        "malformed": ("failed", -signal.SIGTERM,
                      "unknown status line 'progress 50%' (the verbs are run, done, err, resend, "
                      "dup); the script was stopped (killed by SIGTERM)"),
        "killed": ("failed", -signal.SIGKILL, "killed by SIGKILL"),
        "hang": ("timeout", -signal.SIGTERM,
                 "time limit of 1 s reached; the script was stopped (killed by SIGTERM)"),
    }
    ids = {body: add_job(node.port, q, body, "RETRY", "30") for body in want}
    with _worker(node, tmp_path, [q], cmd, "--concurrency", "4", "--time-limit", f"{q}=1"):
        got = {body: wait_state(node.port, job) for body, job in ids.items()}
        cmd.chmod(0o644)  # the command cannot be executed any more
        unrunnable = add_job(node.port, q, "good", "RETRY", "30")
        got["unrunnable"] = wait_state(node.port, unrunnable)
        cmd.chmod(0o755)
    want["unrunnable"] = ("failed", None, "cannot execute the command: Permission denied "
                                          "(EACCES)")
    ids["unrunnable"] = unrunnable
    for body, (state, code, reason) in want.items():
        run = got[body]
        assert (run["state"], run["exit-code"]) == (state, code), body
        parked, origin = _parked(node, run, f"{q}.err")
        # ORIGIN: the original and its queue, then why, the exit status and the log file.
        assert origin[:4] == [ids[body].encode(), q.encode(), reason.encode(), code], body
        log_file = Path(origin[4].decode())
        assert log_file.parent == tmp_path / "logs" and log_file.exists(), body
        if body != "unrunnable":
            assert b"output of attempt 1" in log_file.read_bytes()
        assert node.call("SHOW", ids[body]) is None  # the original is acknowledged
    # Each ran once (never again by itself), and each waits in the error queue.
    assert Counter(job for job in _runs(runs)) == Counter(
        {job: 1 for body, job in ids.items() if body != "unrunnable"})
    assert node.call("QLEN", q) == 0 and node.call("QLEN", f"{q}.err") == len(want)
    assert node.call("QPOLICY", "GET", q) is None  # the job's own queue got no policy


def test_retries_come_after_a_backoff_and_count_with_the_job(node: ServerProcess,
                                                             tmp_path: Path) -> None:
    q, once = "retry-q", "retry-once-q"
    cmd, runs = _setup(tmp_path)
    ids = {body: add_job(node.port, q, body, "RETRY", "30") for body in ("err", "flaky", "hang")}
    single = add_job(node.port, once, "err", "RETRY", "30")
    with _worker(node, tmp_path, [q, once], cmd, "--concurrency", "3", "--retries", "2",
                 "--retries", f"{once}=0", "--backoff", "0.4:0.6", "--time-limit", f"{q}=1"):
        err = _wait_parked(node, ids["err"])
        hang = _wait_parked(node, ids["hang"])
        flaky = wait_state(node.port, ids["flaky"], 30, states=("done",))
        first = _wait_parked(node, single)
    seen = _runs(runs)
    # err: three runs (attempts 1, 2, 3), the gaps at least the backoff (0.4, then 0.6 = MAX).
    assert [a for a, _ in seen[ids["err"]]] == [1, 2, 3]
    (_, t1), (_, t2), (_, t3) = seen[ids["err"]]
    assert t2 - t1 >= 0.4 and t3 - t2 >= 0.6
    parked, origin = _parked(node, err, f"{q}.err")
    assert origin[2].startswith(b"run 3 times; the last: err: by design")
    shown = node.call("SHOW", parked)
    # nacks: the two retries, kept in the error queue
    assert dict(zip(shown[::2], shown[1::2], strict=True))[b"nacks"] == 2
    # A retry that succeeds: acknowledged on its third run.
    assert [a for a, _ in seen[ids["flaky"]]] == [1, 2, 3]
    assert flaky["reason"] == "done: at last" and node.call("SHOW", ids["flaky"]) is None
    # A time limit counts as a failure: retried too, then parked.
    assert hang["state"] == "timeout"
    assert [a for a, _ in seen[ids["hang"]]] == [1, 2, 3]
    # --retries QUEUE=0: that queue's failure is parked at once.
    assert [a for a, _ in seen[single]] == [1]
    _parked(node, first, f"{once}.err")


def test_a_job_waiting_for_its_retry_goes_back_at_once_when_the_worker_stops(
        node: ServerProcess, tmp_path: Path) -> None:
    q = "retry-stop-q"
    cmd, runs = _setup(tmp_path)
    job = add_job(node.port, q, "err", "RETRY", "60")
    w = _worker(node, tmp_path, [q], cmd, "--retries", "1", "--backoff", "60").start()
    run = wait_state(node.port, job)
    assert run["reason"] == "err: by design (exit status 0); run again in 60 s (retry 1 of 1)"
    assert node.call("QLEN", q) == 0  # held by the worker (WORKING), not queued again
    signalled = time.monotonic()
    w.signal(signal.SIGTERM)
    assert w.wait(20) == 0
    assert time.monotonic() - signalled < 5
    assert node.call("QLEN", q) == 1  # NACKed at once: queued for another worker
    got = node.call("GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", q)
    assert got[0][1].decode() == job and got[0][4] == 1  # the failed run counted as a NACK
    node.call("DELJOB", job)


def _run_all(node: ServerProcess, tmp_path: Path, q: str, bad: int, good: int,
             ) -> tuple[float, dict[str, list[tuple[int, float]]], list[str], list[str]]:
    """Add ``bad`` always-failing jobs, then ``good`` ones, run them with --retries 3: the
    seconds until the last good job ran, the runs, and the IDs."""
    cmd, runs = _setup(tmp_path)
    bad_ids = [add_job(node.port, q, "err", "RETRY", "30") for _ in range(bad)]
    good_ids = [add_job(node.port, q, f"good {i}", "RETRY", "30") for i in range(good)]
    with _worker(node, tmp_path, [q], cmd, "--concurrency", "4", "--retries", "3",
                 "--backoff", "0.2"):
        started = time.monotonic()
        wait_until(lambda: sum(1 for j in _runs(runs) if j in set(good_ids)) == good, 60,
                   "every good job to run")
        elapsed = time.monotonic() - started
        wait_until(lambda: node.call("QLEN", f"{q}.err") == bad, 30, "the bad jobs parked")
    return elapsed, _runs(runs), bad_ids, good_ids


@pytest.mark.timing
def test_failing_jobs_do_not_starve_their_queue(node: ServerProcess, tmp_path: Path) -> None:
    good = 200
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    alone, _, _, _ = _run_all(node, tmp_path / "a", "starve-alone-q", 0, good)
    mixed, seen, bad_ids, good_ids = _run_all(node, tmp_path / "b", "starve-q", 4, good)
    # The four failing jobs are the oldest (GETJOB's first pick), yet each ran exactly 4 times
    # (attempts 1-4) and every good job exactly once, at about the speed without them.
    assert {j: [a for a, _ in seen[j]] for j in bad_ids} == {j: [1, 2, 3, 4] for j in bad_ids}
    assert all(len(seen[j]) == 1 for j in good_ids) and len(seen) == good + 4
    assert node.call("QLEN", "starve-q") == 0
    assert mixed <= 1.5 * alone + 2, (mixed, alone)
