"""Run records: the JOBRUN command and the RunTable the dashboard reads, on
a broker driven by a fake clock."""

from __future__ import annotations

from broker import runs
from protocol.resp import OK, Error
from tests.broker.harness import T0, Node


def _start(n: Node, job: bytes, *, queue: str = "q", attempt: int = 1, worker: str = "w:1",
           pid: int = 42) -> bytes:
    token = n("JOBRUN", "START", job, queue, attempt, worker, pid)
    assert isinstance(token, bytes), token
    return token


def _fields(reply: list[object]) -> dict[bytes, object]:
    return dict(zip(reply[::2], reply[1::2], strict=True))  # type: ignore[arg-type]


def test_a_run_from_start_to_end_through_the_command() -> None:
    n = Node()
    job = n.add()
    token = _start(n, job, attempt=2, worker="host:99", pid=1234)
    assert token.startswith(b"abababab-")
    n.now += 10
    assert n("JOBRUN", "STATUS", token, "run 1 of 3") == OK
    assert n("JOBRUN", "APPEND", token, 0, "hello ") == 6
    assert n("JOBRUN", "APPEND", token, 6, "world\n") == 12
    running = n.b.runs.running()
    assert [r.job_id for r in running] == [job]
    assert running[0].last_status == "run 1 of 3"
    n.now += 90
    assert n("JOBRUN", "END", token, "done", 0, "finished") == OK
    f = _fields(n("JOBRUN", "GET", job))
    assert f[b"state"] == b"done" and f[b"exit-code"] == 0 and f[b"reason"] == b"finished"
    assert f[b"worker"] == b"host:99" and f[b"pid"] == 1234 and f[b"attempt"] == 2
    assert f[b"started-ms"] == T0 and f[b"ended-ms"] == T0 + 100
    assert f[b"status"] == [[T0 + 10, b"run 1 of 3"]]
    assert n("JOBRUN", "OUTPUT", job) == [0, 12, b"hello world\n"]
    assert n("JOBRUN", "OUTPUT", job, 6) == [6, 12, b"world\n"]
    assert n.b.runs.running() == []
    # An ended run is never written again.
    assert n("JOBRUN", "STATUS", token, "run late") == runs.NORUN
    assert n("JOBRUN", "END", token, "failed", 1, "x") == runs.NORUN


def test_list_is_newest_first_and_running_filters() -> None:
    n = Node()
    a, b = n.add(body="a"), n.add(body="b")
    ta = _start(n, a)
    n.now += 1
    _start(n, b)
    n("JOBRUN", "END", ta, "failed", 3, "exit code 3")
    every = n("JOBRUN", "LIST")
    assert [_fields(e)[b"id"] for e in every] == [b, a]
    assert [_fields(e)[b"id"] for e in n("JOBRUN", "LIST", "RUNNING")] == [b]
    assert len(n("JOBRUN", "LIST", "COUNT", 1)) == 1
    assert [r.job_id for r in n.b.runs.recent(10)] == [b, a]


def test_a_second_run_of_a_job_keeps_its_own_record() -> None:
    n = Node()
    job = n.add()
    first = _start(n, job, worker="w:1")
    second = _start(n, job, worker="w:2", attempt=2)
    n("JOBRUN", "STATUS", first, "run from the first")
    assert n.b.runs.get(job).worker == "w:2"  # type: ignore[union-attr]
    assert n.b.runs.get(job).status == []  # type: ignore[union-attr]
    assert n.b.runs.by_token(first).last_status == "run from the first"  # type: ignore[union-attr]
    assert second != first


def test_output_keeps_a_bounded_tail_with_absolute_offsets() -> None:
    n = Node()
    job = n.add()
    token = _start(n, job)
    chunk = b"x" * 100_000
    for i in range(4):
        n("JOBRUN", "APPEND", token, i * len(chunk), chunk)
    run = n.b.runs.get(job)
    assert run is not None
    assert run.output_size == 400_000
    assert run.output_start == 400_000 - runs.OUTPUT_TAIL_BYTES
    data, nxt = run.read_output(0)  # a reader from the start learns it skipped bytes
    assert nxt == 400_000 and len(data) == runs.OUTPUT_TAIL_BYTES
    # A retried chunk is not added twice; a gap moves the offset on.
    assert n("JOBRUN", "APPEND", token, 300_000, chunk) == 400_000
    assert n("JOBRUN", "APPEND", token, 1_000_000, b"end") == 1_000_003
    assert run.read_output(0) == (b"end", 1_000_003)


def test_the_output_budget_drops_finished_tails_first() -> None:
    n = Node()
    per = runs.OUTPUT_TAIL_BYTES
    count = runs.MAX_OUTPUT_BYTES // per + 1
    tokens = []
    for i in range(count):
        job = n.add(body=str(i))
        t = _start(n, job)
        n("JOBRUN", "APPEND", t, 0, b"y" * per)
        if i < count - 1:
            n("JOBRUN", "END", t, "done", 0, "")
        tokens.append(t)
    assert n.b.runs.output_bytes <= runs.MAX_OUTPUT_BYTES
    first = n.b.runs.by_token(tokens[0])
    last = n.b.runs.by_token(tokens[-1])
    assert first is not None and first.output_size == per and first.read_output(0)[0] == b""
    assert last is not None and len(last.read_output(0)[0]) == per


def test_finished_runs_are_capped() -> None:
    n = Node()
    job = n.add()
    for _ in range(runs.MAX_FINISHED + 5):
        n("JOBRUN", "END", _start(n, job), "failed", 1, "")
    assert len(n.b.runs.recent(10_000)) == runs.MAX_FINISHED


def test_running_runs_are_capped() -> None:
    n = Node()
    job = n.add()
    for _ in range(runs.MAX_RUNNING):
        _start(n, job)
    assert n("JOBRUN", "START", job, "q", 1, "w", 1) == runs.TOO_MANY


def test_status_lines_are_capped_newest_kept() -> None:
    n = Node()
    token = _start(n, n.add())
    for i in range(runs.MAX_STATUS_LINES + 7):
        n("JOBRUN", "STATUS", token, f"run {i}")
    run = n.b.runs.by_token(token)
    assert run is not None
    assert len(run.status) == runs.MAX_STATUS_LINES and run.status_dropped == 7
    assert run.last_status == f"run {runs.MAX_STATUS_LINES + 6}"


def test_a_silent_worker_makes_its_run_lost() -> None:
    n = Node()
    job = n.add()
    token = _start(n, job)
    n.run_until(T0 + runs.LEASE_MS - 2000)
    n("JOBRUN", "APPEND", token, 0, "")  # an empty append is the worker's heartbeat
    n.run_until(T0 + runs.LEASE_MS + 1500)
    assert n.b.runs.get(job).state == "running"  # type: ignore[union-attr]
    n.run_until(T0 + 2 * runs.LEASE_MS + 1000)
    run = n.b.runs.get(job)
    assert run is not None and run.state == "lost" and "sent nothing" in run.reason
    assert n("JOBRUN", "STATUS", token, "run again") == runs.NORUN


def test_bad_input_gets_clear_errors() -> None:
    n = Node()
    job = n.add()
    token = _start(n, job)
    assert n("JOBRUN") == Error("ERR wrong number of arguments for 'jobrun' command")
    assert n("JOBRUN", "NOPE") == Error("ERR Unknown JOBRUN subcommand 'NOPE'")
    assert n("JOBRUN", "START", job) == Error(
        "ERR wrong number of arguments for 'jobrun|start' command")
    assert n("JOBRUN", "START", "nope", "q", 1, "w", 1) == Error(
        "BADID Invalid Job ID format.")
    assert n("JOBRUN", "START", job, "q", 0, "w", 1) == Error(
        "ERR attempt must be a positive integer")
    assert n("JOBRUN", "START", job, "q", 1, "", 1) == Error(
        "ERR worker name must not be empty")
    assert n("JOBRUN", "STATUS", token, "a\nb") == Error("ERR status line must be one line")
    assert n("JOBRUN", "STATUS", token, "x" * 1025) == Error(
        "ERR status line longer than 1024 bytes")
    assert n("JOBRUN", "APPEND", token, -1, "x") == Error(
        "ERR offset must be a non negative integer")
    assert n("JOBRUN", "END", token, "great", 0, "") == Error(
        "ERR state must be one of done, failed, resent, timeout, stopped")
    assert n("JOBRUN", "END", token, "done", "zero", "") == Error(
        "ERR exit code must be an integer or none")
    assert n("JOBRUN", "STATUS", b"nope-1", "x") == runs.NORUN
    assert n("JOBRUN", "GET", "nope") == Error("BADID Invalid Job ID format.")
    assert n("JOBRUN", "GET", n.add(body="never run")) is None
    assert n("JOBRUN", "LIST", "COUNT", 0) == Error(
        "ERR COUNT must be a number greater than zero")
    assert n("JOBRUN", "LIST", "SIDEWAYS") == Error("ERR syntax error")
    # END with no exit code (the script never ran).
    assert n("JOBRUN", "END", token, "failed", "none", "cannot execute") == OK
    assert n.b.runs.get(job).exit_code is None  # type: ignore[union-attr]
