"""The pure parts of the benchmark: option handling, budget splitting, percentiles, profiles,
the memory breakdown."""

from __future__ import annotations

from array import array

from bench.job_memory import breakdown
from bench.profile import categorize, summarize
from cli.bench import build_parser, options_to_spec, percentiles, split
from cli.bench_load import Budget, jobs_in_reply, stamped_template


def spec_of(*argv: str):  # type: ignore[no-untyped-def]
    return options_to_spec(build_parser().parse_args(list(argv)))


def test_defaults_are_bounded_in_count_and_time() -> None:
    s = spec_of()
    assert (s.workload, s.jobs, s.duration) == ("produce", 100_000, 10.0)
    s = spec_of("--duration", "3")
    assert s.duration == 3.0 and s.jobs > 0  # still a count bound
    s = spec_of("-n", "10")
    assert s.jobs == 10 and 0 < s.duration <= 600


def test_redis_list_maps_workloads_and_nodes_parse() -> None:
    s = spec_of("consume", "--redis-list", "--nodes", "127.0.0.1:7000,localhost:7001")
    assert s.workload == "rpop"
    assert s.nodes == [("127.0.0.1", 7000), ("localhost", 7001)]
    s = spec_of("cycle", "-h", "10.0.0.1", "-p", "7712", "--queues", "3")
    assert s.nodes == [("10.0.0.1", 7712)]
    assert s.queues == ["bench-cycle-0", "bench-cycle-1", "bench-cycle-2"]


def test_split_is_exact() -> None:
    assert split(10, 3) == [4, 3, 3]
    assert sum(split(100_001, 7)) == 100_001


def test_budget_hands_out_exactly_the_count() -> None:
    b = Budget(10, deadline=float("inf"))
    got = [b.claim(4), b.claim(4), b.claim(4), b.claim(4)]
    assert got == [4, 4, 2, 0]
    b.give_back(3)
    assert b.claim(16) == 3
    assert Budget(10, deadline=0.0).claim(1) == 0  # past the deadline


def test_percentiles_are_ordered_and_in_ms() -> None:
    p = percentiles(array("q", [i * 1000 for i in range(1, 1001)]))
    assert p["p50"] == 0.501 and p["max"] == 1.0
    assert p["p50"] <= p["p99"] <= p["p999"] <= p["max"]
    assert percentiles(array("q"))["samples"] == 0


def test_stamped_body_has_the_timestamp_at_its_start() -> None:
    s = spec_of("cycle", "-d", "32")
    prefix, suffix = stamped_template(s, "q")
    cmd = prefix + b"%019d" % 123 + suffix
    assert b"$32\r\n" + b"%019d" % 123 + b"x" * 13 + b"\r\n" in cmd
    assert cmd.startswith(b"*4\r\n$6\r\nADDJOB\r\n")


def test_replies_to_jobs() -> None:
    assert jobs_in_reply(None, "consume") == []
    assert jobs_in_reply([[b"q", b"D-1", b"b"]], "consume") == [[b"q", b"D-1", b"b"]]
    assert jobs_in_reply(b"b", "rpop") == [[None, None, b"b"]]
    assert jobs_in_reply([b"q", b"b"], "lcycle") == [[b"q", None, b"b"]]


def test_profile_summary_charges_the_innermost_known_cost() -> None:
    frames = ["main (cli/server.py:1)", "Broker.addjob_without_policy (broker/core.py:2)",
              "IdGenerator.next_id (protocol/jobid.py:3)"]
    assert categorize(frames) == "job ID generation"
    text = summarize(";".join(frames) + " 3\n" + "main (cli/server.py:1);x (y.py:1) 1\n")
    assert "4 samples" in text and "75.0   job ID generation" in text


def test_memory_breakdown_adds_up_and_rounds_to_the_allocator() -> None:
    rows = dict(breakdown(2_000, 16))
    parts = [v for k, v in rows.items() if k not in ("all but the body", "body (bytes)")]
    assert rows["all but the body"] == sum(parts)
    # bytes objects of 16 and 40 bytes, in pymalloc's 16-byte classes
    assert rows["body (bytes)"] == 64 and rows["ID (bytes)"] == 80
    assert rows["Job object"] % 16 == 0 and rows["Job object"] >= 64
    assert rows["queue (list entry)"] >= 8 and rows["JSCAN list (entry)"] >= 8
