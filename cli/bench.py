"""``trisque-benchmark``: job workloads against one node or many, with throughput and latency.

Workloads (``--workload``, or the first positional argument):

* ``produce``  ADDJOB queue body TIMEOUT [REPLICATE n] [RETRY s]
* ``consume``  the queues are preloaded (not measured), then GETJOB NOHANG COUNT k FROM queues,
               with the IDs acknowledged (FASTACK, ACKJOB, or not at all) in the next write
* ``cycle``    half the clients produce, half consume with GETJOB TIMEOUT; the latency reported
               is end to end, from the ADDJOB send (a timestamp in the body) to the delivery;
               ``--produce-nodes``/``--consume-nodes`` put them on different nodes of a cluster
* ``lpush`` / ``rpop`` / ``lcycle``: the same three with LPUSH, RPOP and BRPOP, so that the same
               load generator measures redis-server as the yardstick (``--redis-list`` maps the
               first three names to these)

Every run is bounded by ``--jobs`` and ``--duration`` (whichever comes first). Clients can be
spread over several processes (``--procs``); each process runs trio with raw non-blocking
sockets, one task per connection, and pipelines ``--pipeline`` commands per write.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from array import array
from collections.abc import Sequence
from typing import Any

import trio

from cli.bench_load import (
    SLOT_CONSUMED,
    SLOT_DONE,
    SLOT_PRODUCED,
    SLOTS,
    WORKLOADS,
    BenchError,
    Spec,
    connect,
    preload,
    read_one,
    run_worker,
    send_all,
)
from client.tls import TlsOptions
from protocol.resp import encode_command

DEFAULT_JOBS = 100_000
DEFAULT_DURATION = 10.0
MAX_JOBS = 50_000_000  # a --duration run without --jobs still has a count bound
MAX_DURATION = 600.0  # and a --jobs run a time bound
MAX_PRELOAD = 1_000_000  # consume without --jobs/--preload: jobs put in the queues first
REDIS_NAME = {"produce": "lpush", "consume": "rpop", "cycle": "lcycle"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trisque-benchmark", add_help=False,
        description="Load generator for trisque (or any server speaking Disque's protocol).")
    p.add_argument("--help", action="help", help="show this help and exit")
    p.add_argument("workload_pos", nargs="?", choices=WORKLOADS, metavar="WORKLOAD",
                   help="produce | consume | cycle | lpush | rpop | lcycle")
    p.add_argument("--workload", "-t", choices=WORKLOADS, help="same as the positional argument")
    p.add_argument("-h", "--host", default="127.0.0.1")
    p.add_argument("-p", "--port", type=int, default=7711)
    p.add_argument("--nodes", help="host:port,host:port,... (clients are spread round robin)")
    p.add_argument("--produce-nodes", metavar="NODES",
                   help="cycle: host:port,... where the producers connect (round robin; "
                        "default --nodes). With --consume-nodes on other nodes, every job "
                        "reaches its consumer through the cluster (NEEDJOBS/YOURJOBS)")
    p.add_argument("--consume-nodes", metavar="NODES",
                   help="cycle: host:port,... where the consumers connect (default --nodes)")
    p.add_argument("-a", "--password", help="sent with AUTH on every connection")
    p.add_argument("-c", "--clients", type=int, default=50, help="connections (default 50)")
    p.add_argument("-P", "--pipeline", type=int, default=1, help="commands per write (default 1)")
    p.add_argument("-d", "--body-size", type=int, default=16, help="job body bytes (default 16)")
    p.add_argument("-n", "--jobs", type=int,
                   help=f"operations in all (default {DEFAULT_JOBS} if --duration is not given)")
    p.add_argument("--duration", type=float,
                   help=f"seconds (default {DEFAULT_DURATION} if --jobs is not given)")
    p.add_argument("--queues", type=int, default=1, help="number of queues (default 1)")
    p.add_argument("--queue-prefix",
                   help="queue names: PREFIX, or PREFIX-i with --queues (default bench, and "
                        "bench-cycle for cycle runs so that jobs left by other runs do not mix in)")
    p.add_argument("--replicate", type=int, help="ADDJOB ... REPLICATE N")
    p.add_argument("--retry", type=int, help="ADDJOB ... RETRY S")
    p.add_argument("--timeout", type=int, default=0, help="ADDJOB ms-timeout argument (default 0)")
    p.add_argument("--rate", type=float, default=0.0,
                   help="produce/cycle: jobs per second in all, spread evenly over the "
                        "producers (default 0: as fast as they can); a steady load for "
                        "latency figures")
    p.add_argument("--count", type=int, default=1, help="GETJOB COUNT / RPOP count (default 1)")
    p.add_argument("--ack", choices=("fastack", "ackjob", "none"), default="fastack",
                   help="how consumers acknowledge (default fastack)")
    p.add_argument("--preload", type=int,
                   help="consume: jobs put in the queues first (default: the --jobs budget)")
    p.add_argument("--procs", type=int, default=1, help="client processes (default 1)")
    p.add_argument("--redis-list", action="store_true",
                   help="use LPUSH/RPOP/BRPOP instead of ADDJOB/GETJOB (redis-server yardstick)")
    p.add_argument("--tls", action="store_true",
                   help="connect over TLS (the nodes' tls-port); as redis-benchmark, the "
                   "certificate chain is checked, not the node's name")
    p.add_argument("--sni", help="server name indication for TLS")
    p.add_argument("--cacert", help="CA certificate file to verify the nodes with")
    p.add_argument("--cacertdir", help="directory of trusted CA certificates (named by hash)")
    p.add_argument("--insecure", action="store_true", help="skip the certificate check")
    p.add_argument("--cert", help="client certificate (tls-auth-clients yes)")
    p.add_argument("--key", help="the client certificate's private key")
    p.add_argument("--tls-ciphers", help="OpenSSL cipher list for TLSv1.2 and below")
    p.add_argument("--json", action="store_true", help="print one JSON object, nothing else")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress line")
    return p


def parse_nodes(text: str) -> list[tuple[str, int]]:
    nodes = []
    for item in text.split(","):
        host, _, port = item.strip().rpartition(":")
        nodes.append((host or "127.0.0.1", int(port)))
    return nodes


def options_to_spec(opts: argparse.Namespace) -> Spec:
    workload = opts.workload or opts.workload_pos or "produce"
    if opts.redis_list:
        workload = REDIS_NAME.get(workload, workload)
    nodes = parse_nodes(opts.nodes) if opts.nodes else [(opts.host, opts.port)]
    produce_nodes = parse_nodes(opts.produce_nodes) if opts.produce_nodes else None
    consume_nodes = parse_nodes(opts.consume_nodes) if opts.consume_nodes else None
    if (produce_nodes or consume_nodes) and workload not in ("cycle", "lcycle"):
        raise SystemExit("trisque-benchmark: --produce-nodes/--consume-nodes apply to cycle only")
    if not opts.nodes and (produce_nodes or consume_nodes):
        nodes = list(dict.fromkeys((produce_nodes or []) + (consume_nodes or [])))
    if opts.jobs is None and opts.duration is None:
        jobs, duration = DEFAULT_JOBS, DEFAULT_DURATION
    else:
        jobs = opts.jobs if opts.jobs is not None else MAX_JOBS
        duration = opts.duration if opts.duration is not None else MAX_DURATION
    prefix = opts.queue_prefix or ("bench-cycle" if workload in ("cycle", "lcycle") else "bench")
    if opts.queues <= 1:
        queues = [prefix]
    else:
        queues = [f"{prefix}-{i}" for i in range(opts.queues)]
    if workload in ("cycle", "lcycle") and opts.clients < 2:
        raise SystemExit("trisque-benchmark: cycle needs at least 2 clients (producers + consumers)")
    for name in ("clients", "pipeline", "count", "procs"):
        if getattr(opts, name) < 1:
            raise SystemExit(f"trisque-benchmark: --{name} must be at least 1")
    return Spec(
        workload=workload, nodes=nodes, clients=opts.clients, pipeline=opts.pipeline,
        body_size=opts.body_size, jobs=max(0, min(jobs, MAX_JOBS)),
        duration=max(0.0, min(duration, MAX_DURATION)), queues=queues, count=opts.count,
        ack=opts.ack, replicate=opts.replicate, retry=opts.retry, timeout_ms=opts.timeout,
        password=opts.password, producers=opts.clients // 2,
        produce_nodes=produce_nodes, consume_nodes=consume_nodes, rate=max(0.0, opts.rate),
        tls=tls_options(opts),
    )


def tls_options(opts: argparse.Namespace) -> TlsOptions | None:
    if not opts.tls:
        return None
    if bool(opts.cert) != bool(opts.key):
        raise SystemExit("trisque-benchmark: --cert and --key go together")
    return TlsOptions(opts.cacert, opts.cacertdir, opts.cert, opts.key, opts.insecure,
                      opts.sni, opts.tls_ciphers, check_hostname=False)


def split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


# ---------------------------------------------------------------------------------------------
# Running


def _worker_process(spec: Spec, shared: Any, ready: Any, go: Any, out: Any) -> None:
    released = False

    async def wait_go() -> None:
        nonlocal released
        ready.release()
        released = True
        await trio.to_thread.run_sync(go.wait, 60.0)

    try:
        out.send(trio.run(run_worker, spec, shared, wait_go))
    except BaseException as exc:  # report, the parent decides
        if not released:
            ready.release()  # do not keep the parent waiting for a worker that failed to connect
        while isinstance(exc, BaseExceptionGroup):
            exc = exc.exceptions[0]
        out.send({"exception": f"{type(exc).__name__}: {exc}"})
    finally:
        out.close()


def run_benchmark(spec: Spec, procs: int = 1, progress: bool = False,
                  preload_jobs: int | None = None) -> dict[str, Any]:
    """Run one workload; the aggregated numbers as a JSON-friendly dict."""
    procs = max(1, min(procs, spec.clients))
    preloaded = 0
    if spec.workload in ("consume", "rpop"):
        n = min(spec.jobs, MAX_PRELOAD) if preload_jobs is None else preload_jobs
        preloaded = trio.run(preload, spec.nodes, spec.queues[:1] if spec.workload == "rpop"
                             else spec.queues, n, spec.body_size, spec.workload == "rpop",
                             spec.password, 8, 200, spec.tls)
    clients = split(spec.clients, procs)
    jobs = split(spec.jobs, procs)
    producers = split(spec.producers, procs)
    ctx = mp.get_context("fork")
    shared = ctx.RawArray("q", procs * SLOTS)
    specs = []
    for i in range(procs):
        s = Spec(**{**spec.__dict__, "clients": clients[i], "jobs": jobs[i], "index": i,
                    "nworkers": procs, "producers": producers[i]})
        specs.append(s)
    results: list[dict[str, Any]] = []
    if procs == 1:
        async def go_now() -> None:
            return None

        t0 = time.perf_counter()
        stop = {"flag": False}
        if progress:
            results.append(_run_with_progress(specs[0], shared, stop, t0))
        else:
            results.append(trio.run(run_worker, specs[0], shared, go_now))
    else:
        ready = ctx.Semaphore(0)
        go = ctx.Event()
        workers = []
        for s in specs:
            rx, tx = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker_process, args=(s, shared, ready, go, tx), daemon=True)
            proc.start()
            tx.close()
            workers.append((proc, rx))
        try:
            for _ in specs:
                if not ready.acquire(timeout=30.0):
                    raise BenchError("a client process did not connect within 30 s")
            go.set()
            t0 = time.perf_counter()
            pending = list(workers)
            last = 0.0
            limit = t0 + spec.duration + 30.0
            while pending and time.perf_counter() < limit:
                for item in list(pending):
                    proc, rx = item
                    if rx.poll(0.05):
                        try:
                            results.append(rx.recv())
                        except EOFError:
                            results.append({"exception": f"client process exited ({proc.exitcode})"})
                        pending.remove(item)
                now = time.perf_counter()
                if progress and now - last >= 0.25:
                    last = now
                    _print_progress(spec, shared, procs, now - t0)
            if pending:
                raise BenchError("client processes did not finish in time")
        finally:
            for proc, rx in workers:
                proc.join(5.0)
                if proc.is_alive():
                    proc.terminate()
                    proc.join(5.0)
                rx.close()
    if progress:
        sys.stdout.write("\r\x1b[K")
        sys.stdout.flush()
    for r in results:
        if "exception" in r:
            raise BenchError(r["exception"])
    out = aggregate(spec, procs, results)
    if preloaded:
        out["preloaded"] = preloaded
    return out


def _run_with_progress(spec: Spec, shared: Any, stop: dict[str, bool], t0: float) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        async def go_now() -> None:
            return None

        async with trio.open_nursery() as nursery:
            async def ticker() -> None:
                while True:
                    await trio.sleep(0.25)
                    _print_progress(spec, shared, 1, time.perf_counter() - t0)

            nursery.start_soon(ticker)
            result = await run_worker(spec, shared, go_now)
            nursery.cancel_scope.cancel()
        return result

    return trio.run(main)


def _print_progress(spec: Spec, shared: Any, procs: int, elapsed: float) -> None:
    done = sum(shared[i * SLOTS + SLOT_DONE] for i in range(procs))
    extra = ""
    if spec.workload in ("cycle", "lcycle"):
        produced = sum(shared[i * SLOTS + SLOT_PRODUCED] for i in range(procs))
        consumed = sum(shared[i * SLOTS + SLOT_CONSUMED] for i in range(procs))
        extra = f" (produced {produced}, consumed {consumed})"
    rate = done / elapsed if elapsed > 0 else 0.0
    sys.stdout.write(f"\r\x1b[K{spec.workload}: {done} ops in {elapsed:.1f}s, {rate:,.0f} ops/s{extra}")
    sys.stdout.flush()


def percentiles(samples_ns: array[int]) -> dict[str, float]:
    if not samples_ns:
        return {"p50": 0.0, "p99": 0.0, "p999": 0.0, "max": 0.0, "mean": 0.0, "samples": 0}
    s = sorted(samples_ns)
    n = len(s)

    def at(q: float) -> float:
        return s[min(n - 1, int(q * n))] / 1e6

    return {"p50": at(0.50), "p99": at(0.99), "p999": at(0.999), "max": s[-1] / 1e6,
            "mean": sum(s) / n / 1e6, "samples": n}


def aggregate(spec: Spec, procs: int, results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    lat: array[int] = array("q")
    e2e: array[int] = array("q")
    for r in results:
        lat.frombytes(r["lat_ns"])
        e2e.frombytes(r["e2e_ns"])
    t_start = min(r["t_start"] for r in results)
    t_end = max(r["t_end"] for r in results)
    elapsed = max(t_end - t_start, 1e-9)
    produced = sum(r["produced"] for r in results)
    consumed = sum(r["consumed"] for r in results)
    errors = sum(r["errors"] for r in results)
    first_error = next((r["first_error"] for r in results if r["first_error"]), None)
    if spec.workload in ("produce", "lpush"):
        ops = produced
    elif spec.workload in ("consume", "rpop"):
        ops = consumed
    else:
        ops = consumed  # a cycle is done when the job is delivered
    out: dict[str, Any] = {
        "workload": spec.workload,
        "nodes": [f"{h}:{p}" for h, p in spec.nodes],
        "clients": spec.clients,
        "procs": procs,
        "pipeline": spec.pipeline,
        "body_size": spec.body_size,
        "queues": spec.queues,
        "count": spec.count,
        "jobs_requested": spec.jobs,
        "duration_limit_s": spec.duration,
        "ops": ops,
        "produced": produced,
        "consumed": consumed,
        "errors": errors,
        "first_error": first_error,
        "elapsed_s": round(elapsed, 6),
        "ops_per_sec": round(ops / elapsed, 1),
        "latency_ms": percentiles(lat),
    }
    if spec.workload in ("cycle", "lcycle"):
        out["e2e_latency_ms"] = percentiles(e2e)
        for key in ("produce_nodes", "consume_nodes"):
            where = getattr(spec, key)
            if where:
                out[key] = [f"{h}:{p}" for h, p in where]
    return out


def format_result(r: dict[str, Any]) -> str:
    lines = [
        f"{r['workload']}: {r['ops']} ops in {r['elapsed_s']:.2f} s = {r['ops_per_sec']:,.0f} ops/s",
        f"  {r['clients']} clients in {r['procs']} process(es), pipeline {r['pipeline']}, "
        f"body {r['body_size']} B, nodes {','.join(r['nodes'])}",
    ]
    if r["workload"] in ("cycle", "lcycle"):
        lines.append(f"  produced {r['produced']}, consumed {r['consumed']}")
        if r.get("produce_nodes") or r.get("consume_nodes"):
            lines.append(f"  producers on {','.join(r.get('produce_nodes') or r['nodes'])}, "
                         f"consumers on {','.join(r.get('consume_nodes') or r['nodes'])}")
    if r.get("preloaded"):
        lines.append(f"  preloaded {r['preloaded']} jobs")
    for key, label in (("latency_ms", "request latency"), ("e2e_latency_ms", "end-to-end latency")):
        if key in r:
            lat = r[key]
            lines.append(f"  {label} ms: p50 {lat['p50']:.3f}  p99 {lat['p99']:.3f}  "
                         f"p99.9 {lat['p999']:.3f}  max {lat['max']:.3f}  ({lat['samples']} samples)")
    if r["errors"]:
        lines.append(f"  errors: {r['errors']}, first: {r['first_error']}")
    return "\n".join(lines)


async def _check_server(spec: Spec) -> None:
    """Fail fast with a clear message when a node is down or refuses the workload's commands."""
    for host, port in spec.nodes:
        try:
            sock, reader = await connect(host, port, spec.password, spec.tls)
        except OSError as exc:
            raise BenchError(f"cannot connect to {host}:{port}: {exc}") from exc
        with sock:
            await send_all(sock, encode_command("PING"))
            reply = await read_one(sock, reader)
            if isinstance(reply, Exception) or isinstance(reply, str) and reply.startswith("NOAUTH"):
                raise BenchError(f"{host}:{port} answered PING with {reply}")


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    spec = options_to_spec(opts)
    progress = sys.stdout.isatty() and not opts.json and not opts.quiet
    try:
        trio.run(_check_server, spec)
        result = run_benchmark(spec, procs=opts.procs, progress=progress, preload_jobs=opts.preload)
    except (BenchError, OSError) as exc:
        print(f"trisque-benchmark: {exc}", file=sys.stderr)
        return 2
    except BaseExceptionGroup as group:
        leaf = _first_leaf(group)
        print(f"trisque-benchmark: {type(leaf).__name__}: {leaf}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    try:
        print(json.dumps(result) if opts.json else format_result(result), flush=True)
    except BrokenPipeError:  # e.g. piped into head: exit quietly, also at interpreter shutdown
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if result["errors"] and result["ops"] == 0:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
