"""The load loops of ``trisque-benchmark``: one trio task per connection, raw sockets.

Theory of operation
-------------------
A worker (one OS process) opens all its connections first, then waits for the "go" signal so
that connecting is not measured. Every connection runs one loop of the chosen workload: it
claims a batch of operations from a shared budget (``Budget``), writes the whole batch with one
send (pipelining), and reads replies until the batch is answered. The budget says no once the
job count is spent or the deadline has passed, so every loop ends by itself.

Latency is the time from the send of a batch to the read that completed each reply; in the
``cycle`` workload it is end to end, from the producer's send (a nanosecond timestamp at the
start of the job body) to the consumer's read of the job. ``time.perf_counter_ns`` is
CLOCK_MONOTONIC on Linux, the same clock in every process of the machine.

Counters that other processes must see (jobs done, producers still running) live in a shared
array of 64-bit integers written by one process each; the parent sums them for the progress
line and the cycle consumers read them to know when to stop.
"""

from __future__ import annotations

import os
import socket as _stdsocket
import ssl
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from time import perf_counter, perf_counter_ns
from typing import Any

import trio
from trio.lowlevel import wait_readable, wait_writable

from client.tls import TlsOptions
from protocol.resp import NEED_DATA, Error, ReplyReader, encode_command

RECV_SIZE = 256 * 1024
TS_DIGITS = 19  # perf_counter_ns fits in 19 decimal digits for ~300 years of uptime

# Slots of the shared counter array, per worker: [done, produced, consumed, producers_running]
SLOT_DONE, SLOT_PRODUCED, SLOT_CONSUMED, SLOT_PRODUCERS = range(4)
SLOTS = 4

WORKLOADS = ("produce", "consume", "cycle", "lpush", "rpop", "lcycle")
REDIS_WORKLOADS = {"lpush", "rpop", "lcycle"}


@dataclass
class Spec:
    """What one worker does. Built by the CLI, pickled to worker processes."""

    workload: str
    nodes: list[tuple[str, int]]
    clients: int
    pipeline: int = 1
    body_size: int = 16
    jobs: int = 100_000
    duration: float = 10.0
    queues: list[str] = field(default_factory=lambda: ["bench"])
    count: int = 1  # GETJOB COUNT / RPOP count
    ack: str = "fastack"  # fastack | ackjob | none
    replicate: int | None = None
    retry: int | None = None
    timeout_ms: int = 0  # ADDJOB timeout argument
    getjob_timeout_ms: int = 100  # cycle consumers: GETJOB TIMEOUT
    rate: float = 0.0  # producers: jobs per second in all (0: as fast as they can)
    password: str | None = None
    producers: int = 0  # cycle: how many of the clients produce (the rest consume)
    # cycle: where producers / consumers connect (round robin); None: ``nodes`` for both.
    produce_nodes: list[tuple[str, int]] | None = None
    consume_nodes: list[tuple[str, int]] | None = None
    index: int = 0  # worker number, for the shared counters
    nworkers: int = 1
    tls: TlsOptions | None = None  # --tls: every connection speaks TLS to a tls-port


class BenchError(Exception):
    """The server refused the workload (wrong command, auth, ...): stop and say why."""


class Budget:
    """Operations left to hand out, and the deadline after which no more are handed out."""

    __slots__ = ("remaining", "deadline")

    def __init__(self, jobs: int, deadline: float) -> None:
        self.remaining = jobs
        self.deadline = deadline

    def claim(self, n: int) -> int:
        if self.remaining <= 0 or perf_counter() >= self.deadline:
            return 0
        n = min(n, self.remaining)
        self.remaining -= n
        return n

    def give_back(self, n: int) -> None:
        self.remaining += n


class Stats:
    """What one worker measured."""

    def __init__(self, shared: Any, index: int) -> None:
        self.lat_ns = array("q")  # request latencies
        self.e2e_ns = array("q")  # cycle: producer send -> consumer read
        self.errors = 0
        self.first_error: str | None = None
        self.produced = 0
        self.consumed = 0
        self.empty_replies = 0
        self.shared = shared
        self.base = index * SLOTS

    def error(self, reply: Any) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = str(reply)

    def add(self, slot: int, n: int) -> None:
        if self.shared is not None:
            self.shared[self.base + slot] += n


# ---------------------------------------------------------------------------------------------
# Connections


# TLS: what a non-blocking ssl.SSLSocket raises where a socket would raise BlockingIOError.
_WANT_READ = (BlockingIOError, ssl.SSLWantReadError)
_WANT_WRITE = (BlockingIOError, ssl.SSLWantWriteError)
_contexts: dict[TlsOptions, ssl.SSLContext] = {}


def tls_context(options: TlsOptions) -> ssl.SSLContext:
    """One context per process and options (a context loads its files once)."""
    context = _contexts.get(options)
    if context is None:
        context = _contexts[options] = options.context()
    return context


async def connect(host: str, port: int, password: str | None,
                  tls: TlsOptions | None = None) -> tuple[_stdsocket.socket, ReplyReader]:
    """A non-blocking stdlib socket (see ``send_all``/``recv`` for why not ``trio.socket``),
    or an ``ssl.SSLSocket`` over one with ``tls``."""
    sock = _stdsocket.socket(_stdsocket.AF_INET, _stdsocket.SOCK_STREAM)
    sock.setsockopt(_stdsocket.IPPROTO_TCP, _stdsocket.TCP_NODELAY, 1)
    sock.setblocking(False)
    try:
        sock.connect((host, port))
    except BlockingIOError:
        await wait_writable(sock)
        err = sock.getsockopt(_stdsocket.SOL_SOCKET, _stdsocket.SO_ERROR)
        if err:
            sock.close()
            raise OSError(err, os.strerror(err)) from None
    if tls is not None:
        sock = await _handshake(sock, tls, host)
    reader = ReplyReader()
    if password is not None:
        await send_all(sock, encode_command("AUTH", password))
        reply = await read_one(sock, reader)
        if isinstance(reply, Error):
            raise BenchError(f"AUTH refused by {host}:{port}: {reply}")
    return sock, reader


async def _handshake(sock: _stdsocket.socket, tls: TlsOptions, host: str) -> ssl.SSLSocket:
    secure = tls_context(tls).wrap_socket(sock, server_hostname=tls.sni or host,
                                          do_handshake_on_connect=False)
    try:
        while True:
            try:
                secure.do_handshake()
                return secure
            except ssl.SSLWantReadError:
                await wait_readable(secure)
            except ssl.SSLWantWriteError:
                await wait_writable(secure)
    except BaseException:
        secure.close()
        raise


# trio.socket yields to the scheduler after every call, even one that did not block: two
# scheduler passes per request. A load generator that must outrun redis-server on one core
# cannot afford that, so these helpers call the socket first and park in trio only when the
# kernel says it would block. ``wait_readable`` is a checkpoint, so cancellation still works.


async def send_all(sock: _stdsocket.socket, data: bytes) -> None:
    try:
        n = sock.send(data)
    except _WANT_WRITE:
        n = 0
    if n == len(data):
        return
    view = memoryview(data)[n:]
    while view:
        await wait_writable(sock)
        try:
            n = sock.send(view)
        except _WANT_WRITE:
            continue
        view = view[n:]


async def recv(sock: _stdsocket.socket) -> bytes:
    try:
        data = sock.recv(RECV_SIZE)
    except _WANT_READ:
        while True:
            await wait_readable(sock)
            try:
                data = sock.recv(RECV_SIZE)
                break
            except _WANT_READ:
                continue
    else:
        # The data was already there: let the other connections run now and then.
        await trio.lowlevel.checkpoint()
    if not data:
        raise ConnectionError("server closed the connection")
    return data


async def read_one(sock: _stdsocket.socket, reader: ReplyReader) -> Any:
    while True:
        reply = reader.next()
        if reply is not NEED_DATA:
            return reply
        reader.feed(await recv(sock))


async def call(sock: _stdsocket.socket, reader: ReplyReader, *args: bytes | str | int) -> Any:
    await send_all(sock, encode_command(*args))
    return await read_one(sock, reader)


# ---------------------------------------------------------------------------------------------
# Commands


def body_of(size: int) -> bytes:
    return (b"x" * size) if size > 0 else b""


def produce_command(spec: Spec, queue: str, body: bytes) -> bytes:
    if spec.workload in REDIS_WORKLOADS:
        return encode_command("LPUSH", queue, body)
    args: list[bytes | str | int] = ["ADDJOB", queue, body, spec.timeout_ms]
    if spec.replicate is not None:
        args += ["REPLICATE", spec.replicate]
    if spec.retry is not None:
        args += ["RETRY", spec.retry]
    return encode_command(*args)


def stamped_template(spec: Spec, queue: str) -> tuple[bytes, bytes]:
    """(prefix, suffix) of a produce command whose body starts with a 19-digit timestamp."""
    marker = b"\x00" * TS_DIGITS
    body = marker + body_of(max(0, spec.body_size - TS_DIGITS))
    cmd = produce_command(spec, queue, body)
    i = cmd.index(marker)
    return cmd[:i], cmd[i + TS_DIGITS :]


def consume_command(spec: Spec, count: int) -> bytes:
    if spec.workload in REDIS_WORKLOADS:
        if spec.workload == "lcycle":
            return encode_command("BRPOP", *spec.queues, "%.3f" % (spec.getjob_timeout_ms / 1000))
        if count == 1:
            return encode_command("RPOP", spec.queues[0])
        return encode_command("RPOP", spec.queues[0], count)
    if spec.workload == "cycle":
        wait: list[str | int] = ["TIMEOUT", spec.getjob_timeout_ms]
    else:
        wait = ["NOHANG"]
    return encode_command("GETJOB", *wait, "COUNT", count, "FROM", *spec.queues)


def jobs_in_reply(reply: Any, workload: str) -> list[Any]:
    """The jobs of one GETJOB/RPOP/BRPOP reply, as [queue, id, body] (redis: [queue, None, body])."""
    if reply is None:
        return []
    if workload in REDIS_WORKLOADS:
        if workload == "lcycle":
            return [[reply[0], None, reply[1]]]
        if isinstance(reply, list):
            return [[None, None, b] for b in reply]
        return [[None, None, reply]]
    return list(reply)


# ---------------------------------------------------------------------------------------------
# Loops


async def produce_loop(spec: Spec, conn_no: int, sock: Any, reader: ReplyReader, budget: Budget,
                       stats: Stats, stamped: bool = False) -> None:
    queues = spec.queues
    body = body_of(spec.body_size)
    cmds = [produce_command(spec, q, body) for q in queues]
    templates = [stamped_template(spec, q) for q in queues]
    full_batch = [c * spec.pipeline for c in cmds]
    lat = stats.lat_ns
    qi = conn_no % len(queues)

    ok = [0]  # this connection's jobs added (stats is shared by the worker's tasks)

    def on_reply(index: int, r: Any, t: int) -> None:
        if type(r) is Error:
            stats.error(r)
        else:
            stats.produced += 1
            ok[0] += 1
        lat.append(t)

    # --rate: each producer connection its share of the jobs per second, evenly spaced
    # (a steady load, for latency that is not queueing behind a saturated node).
    producers = max(1, spec.producers * spec.nworkers if spec.producers else spec.clients)
    interval = spec.pipeline * producers / spec.rate if spec.rate > 0 else 0.0
    next_send = perf_counter()
    while True:
        if interval:
            next_send += interval
            wait = next_send - perf_counter()
            if wait > 0:
                await trio.sleep(wait)
        n = budget.claim(spec.pipeline)
        if not n:
            return
        if stamped:
            prefix, suffix = templates[qi]
            ts = b"%019d" % perf_counter_ns()
            payload = (prefix + ts + suffix) * n
        elif n == spec.pipeline:
            payload = full_batch[qi]
        else:
            payload = cmds[qi] * n
        qi = (qi + 1) % len(queues)
        before = ok[0]
        await exchange(sock, reader, payload, n, on_reply)
        stats.add(SLOT_DONE, n)
        stats.add(SLOT_PRODUCED, ok[0] - before)  # jobs added, not error replies


async def exchange(sock: Any, reader: ReplyReader, payload: bytes, need: int,
                   on_reply: Callable[[int, Any, int], None]) -> None:
    """The skeleton every load loop shares: send ``payload``, then read ``need`` replies,
    calling ``on_reply(n, reply, latency_ns)`` for each (n counts from 1; the latency is from
    the send to the read that brought the reply)."""
    t0 = perf_counter_ns()
    await send_all(sock, payload)
    got = 0
    while got < need:
        reader.feed(await recv(sock))
        t = perf_counter_ns() - t0
        while True:
            r = reader.next()
            if r is NEED_DATA:
                break
            got += 1
            on_reply(got, r, t)


def _ack_command(spec: Spec, ids: Sequence[bytes]) -> bytes:
    return encode_command("ACKJOB" if spec.ack == "ackjob" else "FASTACK", *ids)


class _ConsumeBatch:
    """What one consume round counts from its replies: jobs taken, whether the queue ran
    empty, and the IDs to acknowledge with the next round (the first ``n_ack`` replies are the
    previous round's acknowledgement)."""

    __slots__ = ("stats", "n_ack", "redis", "ack", "pending_ack", "jobs", "empty")

    def __init__(self, stats: Stats, n_ack: int, redis: bool, ack: bool,
                 pending_ack: list[bytes]) -> None:
        self.stats, self.n_ack, self.redis, self.ack = stats, n_ack, redis, ack
        self.pending_ack = pending_ack
        self.jobs = 0
        self.empty = False

    def on_reply(self, index: int, r: Any, t: int) -> None:
        if type(r) is Error:
            self.stats.error(r)
            return
        if index <= self.n_ack:
            return
        self.stats.lat_ns.append(t)
        if r is None:
            self.empty = True
            self.stats.empty_replies += 1
        elif self.redis:
            self.jobs += len(r) if type(r) is list else 1
        else:
            self.jobs += len(r)
            if self.ack:
                self.pending_ack.extend(j[1] for j in r)


async def consume_loop(spec: Spec, sock: Any, reader: ReplyReader, budget: Budget,
                       stats: Stats) -> None:
    """GETJOB NOHANG (or RPOP) until the budget is spent or the queue is empty."""
    workload = spec.workload
    redis = workload in REDIS_WORKLOADS
    k = spec.count
    full = consume_command(spec, k) * spec.pipeline
    pending_ack: list[bytes] = []
    while True:
        want = budget.claim(spec.pipeline * k)
        if not want:
            break
        reqs = [min(k, want - i) for i in range(0, want, k)]
        if len(reqs) == spec.pipeline and reqs[-1] == k:
            payload = full
        else:
            payload = b"".join(consume_command(spec, c) for c in reqs)
        n_ack = 0
        if pending_ack:
            payload = _ack_command(spec, pending_ack) + payload
            pending_ack = []
            n_ack = 1
        batch = _ConsumeBatch(stats, n_ack, redis, spec.ack != "none", pending_ack)
        await exchange(sock, reader, payload, n_ack + len(reqs), batch.on_reply)
        jobs, empty = batch.jobs, batch.empty
        stats.consumed += jobs
        stats.add(SLOT_DONE, jobs)
        stats.add(SLOT_CONSUMED, jobs)
        if jobs < want:
            budget.give_back(want - jobs)
        if empty:
            break
    if pending_ack:
        r = await call_raw(sock, reader, _ack_command(spec, pending_ack))
        if type(r) is Error:
            stats.error(r)


async def call_raw(sock: Any, reader: ReplyReader, payload: bytes) -> Any:
    await send_all(sock, payload)
    return await read_one(sock, reader)


def producers_running(shared: Any, nworkers: int) -> int:
    return slot_total(shared, nworkers, SLOT_PRODUCERS)


def slot_total(shared: Any, nworkers: int, slot: int) -> int:
    return sum(shared[i * SLOTS + slot] for i in range(nworkers))


async def cycle_consumer(spec: Spec, sock: Any, reader: ReplyReader, stats: Stats,
                         hard_deadline: float) -> None:
    """GETJOB TIMEOUT (or BRPOP) until producers are done everywhere and a wait comes back empty."""
    workload = spec.workload
    k = spec.count if workload == "cycle" else 1
    getcmd = consume_command(spec, k)
    e2e = stats.e2e_ns
    lat = stats.lat_ns
    shared = stats.shared
    pending_ack: list[bytes] = []
    while perf_counter() < hard_deadline:
        payload = getcmd
        n_ack = 0
        if pending_ack:
            payload = _ack_command(spec, pending_ack) + payload
            pending_ack = []
            n_ack = 1
        t0 = perf_counter_ns()
        await send_all(sock, payload)
        got = 0
        reply: Any = None
        while got < n_ack + 1:
            reader.feed(await recv(sock))
            now = perf_counter_ns()
            while True:
                r = reader.next()
                if r is NEED_DATA:
                    break
                got += 1
                if type(r) is Error:
                    stats.error(r)
                elif got > n_ack:
                    reply = r
        lat.append(now - t0)
        jobs = jobs_in_reply(reply, workload)
        if not jobs:
            stats.empty_replies += 1
            # Done once no producer runs and every job produced was consumed (by any
            # consumer): across a cluster, jobs still travelling (NEEDJOBS/YOURJOBS) may
            # make a wait come back empty before the last ones arrive.
            if (producers_running(shared, spec.nworkers) == 0
                    and slot_total(shared, spec.nworkers, SLOT_CONSUMED)
                    >= slot_total(shared, spec.nworkers, SLOT_PRODUCED)):
                break
            continue
        for job in jobs:
            body = job[2]
            try:
                e2e.append(now - int(body[:TS_DIGITS]))
            except ValueError:
                pass  # a job not written by this benchmark (a shared queue): count it, no latency
            if workload == "cycle" and spec.ack != "none":
                pending_ack.append(job[1])
        stats.consumed += len(jobs)
        stats.add(SLOT_DONE, len(jobs))
        stats.add(SLOT_CONSUMED, len(jobs))
    if pending_ack:
        r = await call_raw(sock, reader, _ack_command(spec, pending_ack))
        if type(r) is Error:
            stats.error(r)


def node_for(spec: Spec, i: int, cycle: bool) -> tuple[str, int]:
    """Connection ``i``'s node: round robin over ``nodes``, or in a cycle over
    ``produce_nodes`` for the producers and ``consume_nodes`` for the consumers."""
    if cycle and i < spec.producers and spec.produce_nodes:
        return spec.produce_nodes[i % len(spec.produce_nodes)]
    if cycle and i >= spec.producers and spec.consume_nodes:
        return spec.consume_nodes[(i - spec.producers) % len(spec.consume_nodes)]
    return spec.nodes[i % len(spec.nodes)]


async def run_worker(spec: Spec, shared: Any, wait_go: Any, drain_grace: float = 5.0) -> dict[str, Any]:
    """Connect, wait for ``wait_go`` (an async callable), run the loops; the worker's numbers."""
    stats = Stats(shared, spec.index)
    conns = []
    cycle = spec.workload in ("cycle", "lcycle")
    for i in range(spec.clients):
        host, port = node_for(spec, i, cycle)
        conns.append(await connect(host, port, spec.password, spec.tls))
    if cycle:
        stats.add(SLOT_PRODUCERS, spec.producers)
    await wait_go()
    t_start = perf_counter()
    budget = Budget(spec.jobs, t_start + spec.duration)
    hard_deadline = t_start + spec.duration + drain_grace

    async def producer(i: int, sock: Any, reader: ReplyReader) -> None:
        try:
            await produce_loop(spec, i, sock, reader, budget, stats, stamped=cycle)
        finally:
            if cycle:
                stats.add(SLOT_PRODUCERS, -1)

    try:
        with trio.move_on_after(spec.duration + drain_grace + 5.0):
            async with trio.open_nursery() as nursery:
                for i, (sock, reader) in enumerate(conns):
                    if spec.workload in ("produce", "lpush") or (cycle and i < spec.producers):
                        nursery.start_soon(producer, i, sock, reader)
                    elif cycle:
                        nursery.start_soon(cycle_consumer, spec, sock, reader, stats, hard_deadline)
                    else:
                        nursery.start_soon(consume_loop, spec, sock, reader, budget, stats)
    finally:
        for sock, _ in conns:
            sock.close()
    t_end = perf_counter()
    return {
        "t_start": t_start,
        "t_end": t_end,
        "lat_ns": stats.lat_ns.tobytes(),
        "e2e_ns": stats.e2e_ns.tobytes(),
        "errors": stats.errors,
        "first_error": stats.first_error,
        "produced": stats.produced,
        "consumed": stats.consumed,
        "empty_replies": stats.empty_replies,
    }


async def preload(nodes: Sequence[tuple[str, int]], queues: Sequence[str], jobs: int, body_size: int,
                  redis: bool, password: str | None, conns: int = 8, pipeline: int = 200,
                  tls: TlsOptions | None = None) -> int:
    """Fill the queues before a consume run (not measured). Returns how many were accepted."""
    spec = Spec(workload="lpush" if redis else "produce", nodes=list(nodes), clients=conns,
                pipeline=pipeline, body_size=body_size, jobs=jobs, duration=600.0,
                queues=list(queues), password=password, tls=tls)
    stats = Stats(None, 0)
    budget = Budget(jobs, perf_counter() + 600.0)
    async with trio.open_nursery() as nursery:
        for i in range(conns):
            host, port = nodes[i % len(nodes)]
            sock, reader = await connect(host, port, password, tls)
            nursery.start_soon(_preload_conn, spec, i, sock, reader, budget, stats)
    if stats.errors:
        raise BenchError(f"preload: {stats.errors} errors, first: {stats.first_error}")
    return stats.produced


async def _preload_conn(spec: Spec, i: int, sock: Any, reader: ReplyReader, budget: Budget,
                        stats: Stats) -> None:
    try:
        await produce_loop(spec, i, sock, reader, budget, stats)
    finally:
        sock.close()
