"""``make bench`` case (k): the HTTP API's throughput with 16 concurrent clients, next to RESP's
on the same node in the same run (no target yet: measured and recorded).

One trisque node (no append log, as cases a-c) with ``http-port``; then, each for ``duration``
seconds, run ``runs`` times and the median reported:

* HTTP produce: 16 clients, ``POST /messages/<queue>`` of a 16-byte body, one request at a time
  each (keep-alive connections);
* HTTP consume: 16 clients, ``GET /messages/<queue>`` on a preloaded queue (receive only, as
  GETJOB NOHANG in the RESP row), and receive + ``DELETE /messages/<id>``;
* RESP produce and consume: trisque-benchmark's ADDJOB and GETJOB NOHANG with 16 connections,
  no pipeline.

The HTTP load generator is httpx on trio in one process: at these rates it may be a bottleneck
itself, which the printed client CPU time shows.
"""

from __future__ import annotations

import resource
import socket
import statistics
import time
from typing import Any
from urllib.parse import quote

import httpx
import trio

from bench.servers import BenchServer
from cli.bench import run_benchmark
from cli.bench_load import BenchError, Spec, preload

CLIENTS = 16
BODY = b"x" * 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _http_load(base: str, kind: str, queue: str, duration: float) -> tuple[int, int]:
    done = 0
    errors = 0
    deadline = trio.current_time() + duration

    async def worker() -> None:
        nonlocal done, errors
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=base, limits=limits, timeout=10) as c:
            while trio.current_time() < deadline:
                if kind == "produce":
                    r = await c.post(f"/messages/{queue}", content=BODY)
                    ok = r.status_code == 201
                else:
                    r = await c.get(f"/messages/{queue}")
                    ok = r.status_code == 200
                    if ok and kind == "consume+delete":
                        d = await c.delete("/messages/" + quote(r.headers["x-message-id"],
                                                                safe=""))
                        ok = d.status_code == 204
                if ok:
                    done += 1
                else:
                    errors += 1

    async with trio.open_nursery() as nursery:
        for _ in range(CLIENTS):
            nursery.start_soon(worker)
    return done, errors


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def http_rate(base: str, kind: str, queue: str, duration: float) -> dict[str, float]:
    cpu0, t0 = _cpu(), time.monotonic()
    done, errors = trio.run(_http_load, base, kind, queue, duration)
    elapsed = time.monotonic() - t0
    return {"ops_per_s": done / elapsed, "errors": errors,
            "client_cpu": (_cpu() - cpu0) / elapsed}


def _resp(node: BenchServer, workload: str, queue: str, duration: float, procs: int,
          jobs: int = 50_000_000, preload_jobs: int | None = None) -> float:
    """trisque-benchmark's rate with CLIENTS connections, no pipeline (as bench.table's rows)."""
    spec = Spec(workload=workload, nodes=[("127.0.0.1", node.port)], clients=CLIENTS,
                pipeline=1, body_size=len(BODY), jobs=jobs, duration=duration, queues=[queue],
                ack="none", producers=CLIENTS // 2)
    result = run_benchmark(spec, procs=procs, preload_jobs=preload_jobs)
    if result["errors"]:
        raise BenchError(f"{result['errors']} error replies, first: {result['first_error']}")
    return float(result["ops_per_sec"])


def run(runs: int = 3, duration: float = 2.0, procs: int = 2, preload_jobs: int = 60_000,
        ) -> dict[str, Any]:
    http_port = _free_port()
    results: dict[str, list[float]] = {k: [] for k in (
        "http_produce", "http_consume", "http_consume_delete", "resp_produce", "resp_consume")}
    cpu: dict[str, list[float]] = {k: [] for k in results if k.startswith("http")}
    with BenchServer("trisque", "trisque", **{"http-port": str(http_port)}) as node:
        if not node.ok:
            return {"error": node.failure}
        base = f"http://127.0.0.1:{http_port}"
        with httpx.Client(base_url=base, timeout=10) as c:
            for i in range(runs):
                for q in (f"hp{i}", f"hc{i}", f"hd{i}"):
                    c.put(f"/queues/{q}", json={})
        for i in range(runs):
            r = http_rate(base, "produce", f"hp{i}", duration)
            results["http_produce"].append(r["ops_per_s"])
            cpu["http_produce"].append(r["client_cpu"])
            results["resp_produce"].append(_resp(node, "produce", f"rp{i}", duration, procs))
            for q in (f"hc{i}", f"hd{i}"):
                trio.run(preload, [("127.0.0.1", node.port)], [q], preload_jobs, 16, False, None)
            r = http_rate(base, "consume", f"hc{i}", duration)
            results["http_consume"].append(r["ops_per_s"])
            cpu["http_consume"].append(r["client_cpu"])
            r = http_rate(base, "consume+delete", f"hd{i}", duration)
            results["http_consume_delete"].append(r["ops_per_s"])
            cpu["http_consume_delete"].append(r["client_cpu"])
            results["resp_consume"].append(_resp(node, "consume", f"rc{i}", duration, procs,
                                                 jobs=preload_jobs, preload_jobs=preload_jobs))
    return {"runs": runs, "duration_s": duration, "clients": CLIENTS,
            "median_ops_per_s": {k: round(statistics.median(v)) for k, v in results.items()},
            "http_client_cpu": {k: round(statistics.median(v), 2) for k, v in cpu.items()},
            "all": results}


def render(res: dict[str, Any]) -> str:
    if "error" in res:
        return f"(k) HTTP API: n/a: {res['error']}"
    m = res["median_ops_per_s"]
    cpu = res["http_client_cpu"]
    lines = [f"(k) HTTP API vs RESP on one node, {res['clients']} clients, no pipeline "
             f"(median of {res['runs']} x {res['duration_s']:g} s)",
             f"    produce:  HTTP POST /messages {m['http_produce']:>8} /s   RESP ADDJOB "
             f"{m['resp_produce']:>8} /s   (HTTP client CPU {cpu['http_produce']:.2f})",
             f"    consume:  HTTP GET /messages  {m['http_consume']:>8} /s   RESP GETJOB "
             f"{m['resp_consume']:>8} /s   (HTTP client CPU {cpu['http_consume']:.2f})",
             f"    consume + delete (GET, DELETE): {m['http_consume_delete']:>8} msgs/s "
             f"(HTTP client CPU {cpu['http_consume_delete']:.2f})"]
    return "\n".join(lines)


if __name__ == "__main__":
    import json
    import sys

    quick = "--quick" in sys.argv
    out = run(runs=1 if quick else 3, duration=1.0 if quick else 2.0,
              preload_jobs=20_000 if quick else 60_000)
    print(render(out))
    print(json.dumps(out["median_ops_per_s"] if "median_ops_per_s" in out else out))
