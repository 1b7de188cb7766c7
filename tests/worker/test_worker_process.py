"""`trisque worker` end to end: real bash and Python scripts run by real
worker processes against a real ``trisque-server``; what is checked is what a user sees - the
job's fate on the node, its run record (JOBRUN), its log file and the worker's exit."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import wait_until
from tests.support.server import REPO, ServerProcess, repo_env, send_command
from tests.support.worker import (
    WorkerProcess,
    add_job,
    kill_group,
    process_gone,
    run_output,
    run_record,
    script,
    wait_state,
)


@pytest.fixture(scope="module")
def node() -> Iterator[ServerProcess]:
    with ServerProcess() as proc:
        yield proc


def _dead_letter_nacks(node: ServerProcess, queue: str) -> str:
    """A redrive policy whose dead-letter queue, ``<queue>-dead``, is where the worker parks
    a failed job of ``queue`` (docs/worker.md)."""
    dlq = f"{queue}-dead"
    assert isinstance(node.call("QPOLICY", "CREATE", dlq), list)
    assert isinstance(node.call("QPOLICY", "CREATE", queue, "REDRIVE", "1", dlq), list)
    return dlq



def _why(run: dict) -> str:
    """A failed run's reason without where the job was parked."""
    return run["reason"].split("; parked in ", 1)[0]


def _worker(node: ServerProcess, tmp_path: Path, queues: list[str], command: list[str | Path],
            *options: str) -> WorkerProcess:
    return WorkerProcess([node.port], queues, command, log_dir=tmp_path / "logs",
                         options=options)


STATUS_SH = """\
    #!/bin/bash
    echo "body=$TRISQUE_BODY attempt=$TRISQUE_ATTEMPT queue=$TRISQUE_QUEUE"
    echo "to stderr" >&2
    echo "run step 1" >&3
    case "$TRISQUE_BODY" in
      done) echo "done all good" >&3 ;;
      err) echo "err by design" >&3 ;;
      exit3) exit 3 ;;
      silent) ;;
      resend:*)
        marker=${TRISQUE_BODY#resend:}
        if [ -e "$marker" ]; then echo "done second time" >&3
        else touch "$marker"; echo "resend 1-try later" >&3; fi ;;
      dup:*)
        echo "dup 0-X-${TRISQUE_BODY#dup:}" >&3
        read -u 4 answer
        echo "answer=$answer"
        echo "done duped" >&3 ;;
    esac
"""


def test_each_status_command_decides_the_jobs_fate(node: ServerProcess, tmp_path: Path) -> None:
    q, other, paused = "st-q", "st-other", "st-paused"
    dlq = _dead_letter_nacks(node, q)
    node.call("PAUSE", paused, "in")
    marker = tmp_path / "resent-once"
    bodies = ["done", "err", "exit3", "silent", f"resend:{marker}", f"dup:{other}",
              f"dup:{paused}"]
    ids = {b: add_job(node.port, q, b, "RETRY", "30") for b in bodies}
    cmd = script(tmp_path / "status.sh", STATUS_SH)
    with _worker(node, tmp_path, [q], [cmd], "--concurrency", "3"):
        runs = {b: wait_state(node.port, i) for b, i in ids.items()}
        copy_id = runs[f"resend:{marker}"]["reason"].rsplit(" ", 1)[1]
        copy = wait_state(node.port, copy_id)

    done = runs["done"]
    assert (done["state"], done["exit-code"], done["reason"]) == ("done", 0, "done: all good")
    assert [line for _, line in done["status"]] == [b"run step 1", b"done all good"]
    assert done["attempt"] == 1 and done["pid"] > 0 and done["ended-ms"] >= done["started-ms"]
    _, size, out = run_output(node.port, ids["done"])
    assert out == b"body=done attempt=1 queue=st-q\nto stderr\n" and size == len(out)
    assert node.call("SHOW", ids["done"]) is None  # acknowledged

    assert runs["err"]["state"] == "failed"
    assert _why(runs["err"]) == "err: by design (exit status 0)"
    assert (runs["exit3"]["exit-code"], _why(runs["exit3"])) == (3, "exit status 3")
    assert _why(runs["silent"]) == "exit status 0 without a 'done' line on fd 3"
    # The three failures were parked in the queue's dead-letter queue.
    dead = [j[2] for j in node.call("QPEEK", dlq, "10")]
    assert sorted(dead) == [b"err", b"exit3", b"silent"]

    resent = runs[f"resend:{marker}"]
    assert resent["state"] == "resent" and resent["reason"].startswith("resend in 1 s: try later")
    assert copy["state"] == "done" and copy["reason"] == "done: second time"
    assert copy["started-ms"] - resent["ended-ms"] >= 900  # DELAY 1, not at once
    assert send_command(node.port, "SHOW", ids[f"resend:{marker}"]) is None  # original acked

    queued = node.call("QPEEK", other, "10")
    assert [(j[0], j[2]) for j in queued] == [(other.encode(), f"dup:{other}".encode())]
    assert run_output(node.port, ids[f"dup:{other}"])[2].endswith(
        b"answer=ok " + queued[0][1] + b"\n")
    assert b"answer=fail PAUSED" in run_output(node.port, ids[f"dup:{paused}"])[2]
    assert runs[f"dup:{paused}"]["state"] == "done"  # the script decides what a fail means
    log_file = tmp_path / "logs" / f"{ids['done'].replace('/', '%2F')}.1.log"
    assert log_file.read_bytes() == out


def test_resend_on_a_deduplicating_queue_still_brings_the_job_back(node: ServerProcess,
                                                                    tmp_path: Path) -> None:
    q = "dedup-q"
    assert isinstance(node.call("QPOLICY", "CREATE", q, "DEDUP", "yes"), list)
    marker = tmp_path / "resent-once"
    job = add_job(node.port, q, f"resend:{marker}")
    cmd = script(tmp_path / "status.sh", STATUS_SH)
    with _worker(node, tmp_path, [q], [cmd]):
        resent = wait_state(node.port, job)
        copy_id = resent["reason"].rsplit(" ", 1)[1]
        copy = wait_state(node.port, copy_id)
    # An ADDJOB of the same body would have named the original itself: the worker acked the
    # original first, so the copy is a new job.
    assert resent["state"] == "resent" and copy_id != job
    assert copy["state"] == "done" and copy["reason"] == "done: second time"


ENV_PY = """\
    #!{python}
    import os, sys
    body = open(os.environ["TRISQUE_BODY_FILE"], "rb").read()
    status = os.fdopen(3, "w", buffering=1)
    keys = sorted(k for k in os.environ if k.startswith("TRISQUE_"))
    print(" ".join(keys))
    print("body-env", repr(os.environ.get("TRISQUE_BODY")), "len", len(body), flush=True)
    print("node", os.environ["TRISQUE_NODE"], "log", os.environ["TRISQUE_LOG_FILE"])
    print(f"run read {{len(body)}} bytes", file=status)
    print("done", body[:4].hex(), file=status)
"""


def test_a_python_script_gets_the_job_in_its_environment(node: ServerProcess,
                                                         tmp_path: Path) -> None:
    q = "env-q"
    cmd = script(tmp_path / "env.py", ENV_PY.format(python=sys.executable))
    text_id = add_job(node.port, q, "héllo")
    binary_id = add_job(node.port, q, b"\x00\xff binary")
    with _worker(node, tmp_path, [q], [cmd]):
        text, binary = wait_state(node.port, text_id), wait_state(node.port, binary_id)
    assert text["state"] == "done" and text["reason"] == "done: 68c3a96c"
    assert binary["reason"] == "done: 00ff2062"
    out = run_output(node.port, text_id)[2].decode()
    assert out.splitlines()[0].split() == [
        "TRISQUE_ADDITIONAL_DELIVERIES", "TRISQUE_ATTEMPT", "TRISQUE_BODY", "TRISQUE_BODY_FILE",
        "TRISQUE_JOB_ID", "TRISQUE_LOG_FILE", "TRISQUE_NACKS", "TRISQUE_NODE", "TRISQUE_QUEUE",
        "TRISQUE_READ", "TRISQUE_WORKER", "TRISQUE_WRITE"]
    assert "body-env 'héllo' len 6" in out
    assert f"node 127.0.0.1:{node.port} log {tmp_path / 'logs'}" in out
    assert "body-env None len 9" in run_output(node.port, binary_id)[2].decode()


RESULT_SH = """\
    #!/bin/bash
    echo "out of $TRISQUE_BODY"
    case "$TRISQUE_BODY" in
      fd4) printf 'from fd 4' >&4 ;;
      dup) echo "dup 0-X-copies" >&3
           read -r answer <&4
           printf 'after %s' "${answer%% *}" >&4 ;;
      big) head -c 250000 /dev/zero >&4 ;;
      over) head -c 300001 /dev/zero >&4 ;;
    esac
    echo "done" >&3
"""


def test_a_jobs_result_is_what_it_writes_to_fd4_or_its_output(node: ServerProcess,
                                                              tmp_path: Path) -> None:
    # A small result-max-size, learned by the worker from the node: 250,000 bytes (more than
    # a socket's buffer, so only a reader running beside the script lets it finish) fit, one
    # byte past it fails the run with why.
    node.call("CONFIG", "SET", "result-max-size", "300000")
    cmd = script(tmp_path / "result.sh", RESULT_SH)
    q = "result-q"
    ids = {body: add_job(node.port, q, body) for body in ("fd4", "dup", "big", "over", "plain")}
    with _worker(node, tmp_path, [q], [cmd]) as w:
        runs = {body: wait_state(node.port, job) for body, job in ids.items()}
    assert send_command(node.port, "WAITJOB", ids["fd4"], "TIMEOUT", "5000") == b"from fd 4"
    # fd 4 carries dup's answer to the script and its result back.
    assert send_command(node.port, "WAITJOB", ids["dup"], "TIMEOUT", "5000") == b"after ok"
    assert send_command(node.port, "WAITJOB", ids["big"], "TIMEOUT", "5000") == bytes(250000)
    over = runs["over"]
    assert over["state"] == "failed"
    assert ("its result on fd 4 was 300001 bytes, over the node's result-max-size of 300000"
            in _why(over))
    assert f"job {ids['over']}: its result on fd 4 was 300001 bytes" in w.log()
    # Nothing on fd 4 and no --result output: a plain ACKJOB (an outcome nobody watched is
    # not kept, docs/semantics.md).
    assert runs["plain"]["state"] == "done"
    assert str(send_command(node.port, "WAITJOB", ids["plain"])).startswith("NOJOB")
    q = "result-out-q"
    out_id, fd4_id = add_job(node.port, q, "output"), add_job(node.port, q, "fd4")
    with _worker(node, tmp_path, [q], [cmd], "--result", "output"):
        wait_state(node.port, out_id), wait_state(node.port, fd4_id)
    assert send_command(node.port, "WAITJOB", out_id, "TIMEOUT", "5000") == b"out of output\n"
    assert send_command(node.port, "WAITJOB", fd4_id, "TIMEOUT", "5000") == b"from fd 4"


def test_a_script_that_hangs_is_stopped_at_its_queues_time_limit(node: ServerProcess,
                                                                 tmp_path: Path) -> None:
    q = "slow-q"
    dlq = _dead_letter_nacks(node, q)
    cmd = script(tmp_path / "hang.sh", """\
        #!/bin/bash
        trap 'echo got TERM, ignoring it' TERM
        echo "run waiting forever" >&3
        while true; do sleep 0.1; done
    """)
    job = add_job(node.port, q, "x", "RETRY", "60")
    with _worker(node, tmp_path, [q], [cmd], "--time-limit", "100", "--time-limit", f"{q}=1",
                 "--kill-after", "0.5"):
        run = wait_state(node.port, job)
    assert run["state"] == "timeout" and run["exit-code"] == -signal.SIGKILL
    assert _why(run) == ("time limit of 1 s reached; the script was stopped (killed by "
                         "SIGKILL)")
    assert 1400 <= run["ended-ms"] - run["started-ms"] < 6000
    assert b"got TERM, ignoring it" in run_output(node.port, job)[2]
    assert [j[2] for j in node.call("QPEEK", dlq, "10")] == [b"x"]  # parked


def test_working_keeps_a_long_job_from_being_delivered_again(node: ServerProcess,
                                                             tmp_path: Path) -> None:
    q = "long-q"
    cmd = script(tmp_path / "long.sh", """\
        #!/bin/bash
        for i in 1 2 3; do echo "run $i" >&3; sleep 1; done
        echo done >&3
    """)
    job = add_job(node.port, q, "x", "RETRY", "1")
    with _worker(node, tmp_path, [q], [cmd], "--concurrency", "2") as w:
        run = wait_state(node.port, job)
    assert run["state"] == "done" and run["attempt"] == 1
    assert w.log().count(f"job {job} (queue") == 1  # started once: never queued again
    assert send_command(node.port, "SHOW", job) is None


def test_concurrency_is_respected(node: ServerProcess, tmp_path: Path) -> None:
    q = "conc-q"
    cmd = script(tmp_path / "nap.sh", """\
        #!/bin/bash
        sleep 0.6
        echo done >&3
    """)
    ids = [add_job(node.port, q, str(i)) for i in range(6)]
    with _worker(node, tmp_path, [q], [cmd], "--concurrency", "2"):
        runs = [wait_state(node.port, i) for i in ids]
    assert all(r["state"] == "done" for r in runs)
    edges = sorted([(r["started-ms"], 1) for r in runs] + [(r["ended-ms"], -1) for r in runs])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    assert peak == 2


def test_a_job_of_a_worker_killed_mid_job_is_delivered_again_after_retry(
        node: ServerProcess, tmp_path: Path) -> None:
    q = "crash-q"
    cmd = script(tmp_path / "crash.sh", """\
        #!/bin/bash
        echo "run attempt $TRISQUE_ATTEMPT" >&3
        if [ "$TRISQUE_ATTEMPT" = 1 ]; then sleep 30; fi
        echo "done on attempt $TRISQUE_ATTEMPT" >&3
    """)
    job = add_job(node.port, q, "x", "RETRY", "2")
    first = _worker(node, tmp_path, [q], [cmd]).start()
    orphan = 0
    try:
        running = wait_state(node.port, job, states=("running",))
        orphan = running["pid"]
        wait_until(lambda: (r := run_record(node.port, job)) and len(r["status"]) == 1, 10,
                   "the first status line")
        first.kill()
        killed_at = time.time() * 1000
        with _worker(node, tmp_path, [q], [cmd]):
            again, _ = wait_until(
                lambda: (r := run_record(node.port, job)) and r["state"] == "done" and r, 20,
                "the job done by the second worker")
    finally:
        kill_group(orphan)  # the first worker's script, if its death signal missed it
    assert again["attempt"] == 2 and again["reason"] == "done: on attempt 2"
    assert again["started-ms"] - killed_at >= 1000  # after RETRY, not at once


def test_bad_commands_are_refused_at_start(tmp_path: Path) -> None:
    plain = tmp_path / "plain.sh"
    plain.write_text("echo hi\n")
    for command, why in ([str(tmp_path / "missing.sh")], "no such file"), \
            ([str(plain)], "not executable (chmod +x?)"), \
            (["no-such-program-anywhere"], "not found in PATH"):
        proc = subprocess.run([sys.executable, "-m", "cli.main", "worker", "--queue", "q",
                               "--", *command], cwd=REPO, env=repo_env(), capture_output=True,
                              timeout=30)
        assert proc.returncode == 2 and why in proc.stderr.decode(), proc.stderr
    proc = subprocess.run([sys.executable, "-m", "cli.main", "worker", "--queue", "q", "true"],
                          cwd=REPO, env=repo_env(), capture_output=True, timeout=30)
    assert proc.returncode == 2 and b"goes after '--'" in proc.stderr


BAD_SH = """\
    #!/bin/bash
    case "$TRISQUE_BODY" in
      malformed) echo "progress 50%" >&3; sleep 30 ;;
      huge) head -c 5000 /dev/zero | tr '\\0' x >&3; sleep 30 ;;
      flood) head -c 67108864 /dev/zero; echo "done flooded" >&3 ;;
      forks) sleep 300 & echo "child $!"; echo "done left a child" >&3 ;;
      closes3) exec 3>&-; sleep 0.6; exit 0 ;;
      closes4) exec 4<&-; echo "dup 0-X-bad-other" >&3; echo "done anyway" >&3 ;;
      *) echo "done fine" >&3 ;;
    esac
"""


def test_bad_scripts_end_in_a_defined_state_and_the_worker_goes_on(
        node: ServerProcess, tmp_path: Path) -> None:
    q = "bad-q"
    dlq = _dead_letter_nacks(node, q)
    cmd = script(tmp_path / "bad.sh", BAD_SH)
    ids = {b: add_job(node.port, q, b, "RETRY", "60")
           for b in ("malformed", "huge", "flood", "forks", "closes3", "closes4")}
    with _worker(node, tmp_path, [q], [cmd], "--concurrency", "3", "--kill-after", "0.5",
                 "--log-max-bytes", "1M") as w:
        runs = {b: wait_state(node.port, i, 60) for b, i in ids.items()}
        # Not executable any more: the run fails with the reason, the worker goes on.
        cmd.chmod(0o644)
        gone = add_job(node.port, q, "fine", "RETRY", "60")
        not_exec = wait_state(node.port, gone)
        cmd.chmod(0o755)
        last = wait_state(node.port, add_job(node.port, q, "fine"))
        assert w.proc is not None and w.proc.poll() is None

    assert runs["malformed"]["state"] == "failed"
    assert _why(runs["malformed"]) == (
        "unknown status line 'progress 50%' (the verbs are run, done, err, resend, dup); the "
        "script was stopped (killed by SIGTERM)")
    assert _why(runs["huge"]).startswith("status line longer than 1024 bytes; the script "
                                             "was stopped")

    flood = runs["flood"]
    assert flood["state"] == "done" and flood["output-size"] == 64 << 20
    assert flood["reason"] == "done: flooded; log rotated 63 time(s) at 1048576 bytes"
    start, size, tail = run_output(node.port, ids["flood"])
    assert size == 64 << 20 and len(tail) == 256 << 10 and start == size - len(tail)
    log_file = tmp_path / "logs" / f"{ids['flood'].replace('/', '%2F')}.1.log"
    assert log_file.stat().st_size <= 1 << 20
    assert Path(str(log_file) + ".1").stat().st_size == 1 << 20

    forks = runs["forks"]
    assert forks["state"] == "done"
    assert forks["reason"] == "done: left a child; processes it left in its group were killed"
    child = int(run_output(node.port, ids["forks"])[2].split()[1])
    assert process_gone(child)

    assert _why(runs["closes3"]) == ("exit status 0 without a 'done' line on fd 3; it "
                                         "closed its status pipe (fd 3) and went on running")
    assert runs["closes4"]["state"] == "done"
    assert runs["closes4"]["reason"] == ("done: anyway; it did not read the answer to dup on "
                                         "fd 4 (closed or full)")

    assert sorted(j[2] for j in node.call("QPEEK", dlq, "10")) == [
        b"closes3", b"fine", b"huge", b"malformed"]
    assert not_exec["state"] == "failed" and not_exec["exit-code"] is None
    assert _why(not_exec) == "cannot execute the command: Permission denied (EACCES)"
    assert last["state"] == "done"


def test_sigterm_lets_running_jobs_finish_within_the_grace(node: ServerProcess,
                                                           tmp_path: Path) -> None:
    q = "grace-q"
    cmd = script(tmp_path / "grace.sh", """\
        #!/bin/bash
        echo "run sleeping" >&3
        sleep "$TRISQUE_BODY"
        echo "done slept" >&3
    """)
    job = add_job(node.port, q, "1.5")
    w = _worker(node, tmp_path, [q], [cmd]).start()
    wait_state(node.port, job, states=("running",))
    w.signal(signal.SIGTERM)
    assert w.wait(20) == 0
    assert run_record(node.port, job)["state"] == "done"  # type: ignore[index]
    later = add_job(node.port, q, "0")  # taken by nobody: the worker stopped taking jobs
    assert node.call("QLEN", q) == 1
    node.call("DELJOB", later)
    assert "stopping: no more jobs taken; 1 running, 30 s to finish" in w.log()


def test_sigterm_stops_and_nacks_jobs_still_running_after_the_grace(
        node: ServerProcess, tmp_path: Path) -> None:
    q = "stop-q"
    cmd = script(tmp_path / "forever.sh", """\
        #!/bin/bash
        echo "run sleeping" >&3
        sleep 60
    """)
    job = add_job(node.port, q, "x", "RETRY", "60")
    w = _worker(node, tmp_path, [q], [cmd], "--grace", "0.5", "--kill-after", "1").start()
    wait_state(node.port, job, states=("running",))
    signalled = time.monotonic()
    w.signal(signal.SIGTERM)
    assert w.wait(20) == 0
    assert time.monotonic() - signalled < 8
    run = run_record(node.port, job)
    assert run is not None and run["state"] == "stopped"
    assert run["reason"] == ("the worker was stopped and its grace period of 0.5 s ran out "
                             "(killed by SIGTERM)")
    assert node.call("QLEN", q) == 1  # NACKed: queued again for another worker
