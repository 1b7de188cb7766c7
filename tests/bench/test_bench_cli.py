"""Short real runs of ``trisque-benchmark --json`` against real servers.

Each run is bounded by a small ``--jobs`` count and a ``--duration`` cap, and the subprocess by a
timeout. The checks are what a user reading the numbers relies on: every requested job was done
and is really on the server (QLEN/LLEN), nothing failed, and the percentiles are ordered.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from bench.servers import BenchServer, command
from tests.support.server import REPO, ServerProcess

JOBS = 2000


def bench(port: int, *args: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "cli.bench", "-p", str(port), "--duration", "20", "--json", *args]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def check_sane(r: dict[str, Any], ops: int) -> None:
    assert r["errors"] == 0, r["first_error"]
    assert r["ops"] == ops
    assert r["ops_per_sec"] > 0
    for key in ("latency_ms", "e2e_latency_ms"):
        if key in r:
            lat = r[key]
            assert lat["samples"] > 0
            assert 0 <= lat["p50"] <= lat["p99"] <= lat["p999"] <= lat["max"]
            assert lat["max"] < 20_000  # milliseconds; a run is capped at 20 s


@pytest.fixture(scope="module")
def trisque() -> Iterator[ServerProcess]:
    with ServerProcess(appendonly="no") as proc:
        yield proc


@pytest.fixture(scope="module")
def redis() -> Iterator[BenchServer]:
    if not shutil.which("redis-server"):
        pytest.skip("redis-server is not installed: the yardstick half of the benchmark cannot run")
    with BenchServer("redis", "redis") as server:
        assert server.ok, server.failure
        yield server


def test_produce_counts_every_job_and_they_are_queued(trisque: ServerProcess) -> None:
    r = bench(trisque.port, "produce", "-c", "4", "-P", "8", "-n", str(JOBS), "--queue-prefix", "tp")
    check_sane(r, JOBS)
    assert r["produced"] == JOBS
    assert trisque.call("QLEN", "tp") == JOBS


def test_produce_split_over_processes_and_queues_is_exact(trisque: ServerProcess) -> None:
    r = bench(trisque.port, "produce", "-c", "6", "--procs", "2", "--queues", "3",
              "-n", str(JOBS), "--queue-prefix", "tm")
    check_sane(r, JOBS)
    assert r["procs"] == 2
    assert sum(trisque.call("QLEN", f"tm-{i}") for i in range(3)) == JOBS


def test_consume_preloads_then_takes_and_acks_every_job(trisque: ServerProcess) -> None:
    r = bench(trisque.port, "consume", "-c", "4", "-P", "4", "--count", "5", "-n", str(JOBS),
              "--queue-prefix", "tc")
    check_sane(r, JOBS)
    assert r["preloaded"] == JOBS
    assert r["consumed"] == JOBS
    assert trisque.call("QLEN", "tc") == 0


def test_cycle_delivers_every_produced_job_with_end_to_end_latency(trisque: ServerProcess) -> None:
    r = bench(trisque.port, "cycle", "-c", "4", "-n", "1000", "--queue-prefix", "ty")
    check_sane(r, 1000)
    assert r["produced"] == r["consumed"] == 1000
    assert r["e2e_latency_ms"]["samples"] == 1000
    assert trisque.call("QLEN", "ty") == 0


def test_redis_list_yardstick_lpush_then_rpop(redis: BenchServer) -> None:
    r = bench(redis.port, "produce", "--redis-list", "-c", "4", "-P", "8", "-n", str(JOBS),
              "--queue-prefix", "rl")
    check_sane(r, JOBS)
    assert r["workload"] == "lpush"
    assert command(redis.port, "LLEN", "rl") == JOBS
    r = bench(redis.port, "rpop", "-c", "4", "-n", str(JOBS), "--queue-prefix", "rr")
    check_sane(r, JOBS)
    assert command(redis.port, "LLEN", "rr") == 0


def test_redis_list_cycle_end_to_end(redis: BenchServer) -> None:
    r = bench(redis.port, "lcycle", "-c", "4", "-n", "1000", "--queue-prefix", "rc")
    check_sane(r, 1000)
    assert r["produced"] == r["consumed"] == 1000


def test_refused_command_is_reported_not_counted(redis: BenchServer) -> None:
    """ADDJOB against redis-server: every reply is an error, so the run fails and says why."""
    argv = [sys.executable, "-m", "cli.bench", "-p", str(redis.port), "--json", "produce",
            "-c", "2", "-n", "10"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    r = json.loads(proc.stdout)
    assert r["ops"] == 0 and r["errors"] == 10
    assert "unknown command" in r["first_error"]


def test_unreachable_node_fails_fast() -> None:
    from tests.support.server import free_port

    argv = [sys.executable, "-m", "cli.bench", "-p", str(free_port()), "-n", "10"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "cannot connect" in proc.stderr


def test_duration_bounds_a_run_with_a_large_job_count(redis: BenchServer) -> None:
    r = bench(redis.port, "lpush", "-c", "4", "-n", "50000000", "--duration", "0.5",
              "--queue-prefix", "rd")
    assert r["errors"] == 0
    assert 0 < r["ops"] < 50_000_000
    assert r["elapsed_s"] < 3.0
    assert command(redis.port, "LLEN", "rd") == r["ops"]
