"""``make bench`` case (k): the HTTP API's throughput with 16 concurrent clients, next to RESP's
on the same node in the same run (target: 10,000 messages/s each way over HTTP).

One trisque node (no append log, as cases a-c) with ``http-port``; then, each for ``duration``
seconds, run ``runs`` times and the median reported. A *message* is one job: one request for
produce and consume, two (GET, then DELETE) for consume + delete.

* HTTP produce: 16 clients, ``POST /messages/<queue>`` of a 16-byte body, one request at a time
  each (keep-alive connections);
* HTTP consume: 16 clients, ``GET /messages/<queue>`` on a preloaded queue (receive only, as
  GETJOB NOHANG in the RESP row), and receive + ``DELETE /messages/<id>``;
* RESP produce and consume: trisque-benchmark's ADDJOB and GETJOB NOHANG with 16 connections,
  no pipeline.

The HTTP load generator is a raw-socket HTTP/1.1 client on ``select.epoll`` (the 16
connections split over ``procs`` processes), a few microseconds per request, so that it is not
what is measured (an httpx client on trio capped near 1,500 requests/s itself); its CPU time
is printed.
"""

from __future__ import annotations

import multiprocessing
import resource
import select
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


def _response(buf: bytes) -> tuple[bytes, bytes, int] | None:
    """(status, head, length used) of the first whole response in ``buf``, or None."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buf[:end]
    at = head.lower().find(b"\r\ncontent-length:")
    length = 0
    if at >= 0:
        stop = head.find(b"\r\n", at + 2)
        length = int(head[at + 17:stop if stop > 0 else None])
    if len(buf) < end + 4 + length:
        return None
    return head[9:12], head, end + 4 + length


def _message_id(head: bytes) -> str:
    at = head.lower().find(b"\r\nx-message-id:") + len(b"\r\nx-message-id:")
    return head[at:head.find(b"\r\n", at)].strip().decode()


def _http_load(port: int, kind: str, queue: str, duration: float,
               clients: int) -> tuple[int, int, float]:
    """(messages, error replies, CPU seconds) of ``clients`` keep-alive connections, each with
    one request in flight, for ``duration`` seconds."""
    cpu0 = _cpu()
    host = b"Host: 127.0.0.1:%d\r\n" % port
    path = b"/messages/" + quote(queue, safe="").encode()
    post = b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % (path, host, len(BODY), BODY)
    get = b"GET %s HTTP/1.1\r\n%s\r\n" % (path, host)
    first = post if kind == "produce" else get
    poll = select.epoll()
    socks: dict[int, socket.socket] = {}
    bufs: dict[int, bytes] = {}
    for _ in range(clients):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks[s.fileno()], bufs[s.fileno()] = s, b""
        poll.register(s.fileno(), select.EPOLLIN)
    done = errors = 0
    deleting: set[int] = set()  # connections whose request in flight is a DELETE
    for s in socks.values():
        s.sendall(first)
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        for fd, _ in poll.poll(1):
            s = socks[fd]
            buf = bufs[fd] + s.recv(65536)
            while (got := _response(buf)) is not None:
                status, head, used = got
                buf = buf[used:]
                if kind == "consume+delete" and status == b"200" and fd not in deleting:
                    deleting.add(fd)
                    s.sendall(b"DELETE /messages/%s HTTP/1.1\r\n%s\r\n" % (
                        quote(_message_id(head), safe="").encode(), host))
                    continue
                if fd in deleting:
                    deleting.discard(fd)
                    ok = status == b"204"
                else:
                    ok = status == (b"201" if kind == "produce" else b"200")
                done += ok
                errors += not ok
                s.sendall(first)
            bufs[fd] = buf
    for s in socks.values():
        s.close()
    return done, errors, _cpu() - cpu0


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def http_rate(base: str, kind: str, queue: str, duration: float, procs: int = 2,
              ) -> dict[str, float]:
    port = int(base.rsplit(":", 1)[1])
    shares = [CLIENTS // procs + (i < CLIENTS % procs) for i in range(procs)]
    t0 = time.monotonic()
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        results = pool.starmap(_http_load, [(port, kind, queue, duration, n) for n in shares])
    elapsed = time.monotonic() - t0
    done = sum(r[0] for r in results)
    return {"ops_per_s": done / duration, "errors": sum(r[1] for r in results),
            "client_cpu": sum(r[2] for r in results) / min(elapsed, duration)}


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


def run(runs: int = 3, duration: float = 2.0, procs: int = 2, preload_jobs: int = 80_000,
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
            r = http_rate(base, "produce", f"hp{i}", duration, procs)
            results["http_produce"].append(r["ops_per_s"])
            cpu["http_produce"].append(r["client_cpu"])
            results["resp_produce"].append(_resp(node, "produce", f"rp{i}", duration, procs))
            for q in (f"hc{i}", f"hd{i}"):
                trio.run(preload, [("127.0.0.1", node.port)], [q], preload_jobs, 16, False, None)
            r = http_rate(base, "consume", f"hc{i}", duration, procs)
            results["http_consume"].append(r["ops_per_s"])
            cpu["http_consume"].append(r["client_cpu"])
            r = http_rate(base, "consume+delete", f"hd{i}", duration, procs)
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


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json
    import os

    parser = argparse.ArgumentParser(
        prog="python -m bench.http",
        description="make bench case (k): the HTTP API's messages/s with 16 keep-alive "
                    "clients, next to RESP's on the same node in the same run.")
    parser.add_argument("--quick", action="store_true", help="one 1 s run of each")
    parser.add_argument("--runs", type=int, default=3, help="runs of each (median shown)")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per run")
    args = parser.parse_args(argv)
    runs, duration = (1, 1.0) if args.quick else (args.runs, args.duration)
    out = run(runs=runs, duration=duration, preload_jobs=40_000 if args.quick else 80_000)
    print(render(out))
    print("load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(json.dumps(out["median_ops_per_s"] if "median_ops_per_s" in out else out))


if __name__ == "__main__":
    main()
