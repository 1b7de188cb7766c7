"""Prometheus metrics at ``/metrics``, read from the node's own counters.

Theory of operation
-------------------
Nothing is counted twice. A scrape reads (``NodeReading``) what the node keeps anyway: each
queue's length and QSTAT counters (``broker/queue.py``, plus its NACK and requeue counters),
the dead letters per original queue (``broker/policies.py``), the broker's
replication-latency histogram and job table, the append log's fsync-latency and batch-size
histograms (``node/persistence.py``), the cluster bus's frames by type (``node/bus.py``), the
membership table, the connections, the worker runs and timers; the process's memory, CPU and
open files come from prometheus_client's ``ProcessCollector``. The histograms are
``broker.stats.Histogram`` objects that the hot paths update with one bisect; this module
turns them into Prometheus histograms.

A scrape walks the queues once (O(queues), not O(jobs)) on the event loop, copying a tuple per
queue. Building the metric families and the text from them, many times that work (0.8 s for
11,000 queues on a busy machine, when it was done on the loop), happens in a worker thread
(``render``), so the node keeps serving meanwhile: it shares the interpreter lock with that
thread in 5 ms turns. Queue counters live in the queue object, so a queue evicted after being
idle and empty (``QUEUE_IDLE_EVICT_MS``) starts from zero when it comes back: Prometheus's
``rate()`` treats that as a counter reset.

Label values are text: a queue name that is not UTF-8 shows its bytes as ``\\xNN``.
Two names that would show the same (a name spelling another's escapes) share one series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector
from starlette.requests import Request
from starlette.responses import Response

from broker.queue import PAUSE_IN, PAUSE_OUT
from broker.stats import Histogram
from broker.version import VERSION

if TYPE_CHECKING:
    from node.dashboard import Dashboard
    from node.server import Server

RENDER_THREADS: Final = 2  # scrapes formatted at once (a third waits)


def label(name: bytes) -> str:
    return name.decode("utf-8", "backslashreplace")


def _histogram(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
    buckets = [("+Inf" if b == float("inf") else repr(b), n) for b, n in h.cumulative()]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=h.sum)


class _PerQueue:
    """Metric families with one ``queue`` label, summed where two names share a label."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, float]] = {}

    def add(self, metric: str, queue: bytes, value: float) -> None:
        per = self.values.setdefault(metric, {})
        key = label(queue)
        per[key] = per.get(key, 0) + value


QUEUE_METRICS: dict[str, tuple[str, str]] = {
    # name: (type, help)
    "trisque_queue_length": ("gauge", "Jobs queued (ready for delivery) on this node"),
    "trisque_queue_jobs_in": (
        "counter", "Jobs put in the queue: new jobs and jobs queued again (QSTAT jobs-in)"),
    "trisque_queue_jobs_out": (
        "counter", "Jobs delivered to consumers from the queue (QSTAT jobs-out)"),
    "trisque_queue_nacks": ("counter", "Jobs queued again by NACK"),
    "trisque_queue_requeues": (
        "counter", "Jobs queued again after their RETRY elapsed or by ENQUEUE (redeliveries)"),
    "trisque_queue_dead_lettered": (
        "counter", "Jobs of the queue moved to its dead-letter or error queue (by this node)"),
    "trisque_queue_blocked_clients": ("gauge", "Clients blocked in GETJOB on the queue"),
}


class NodeReading:
    """One scrape's numbers: read on the event loop (the node's tables are not thread-safe,
    and reading them is quick), turned into metric families and text in a worker thread
    (``render``), which is where the time goes with many queues."""

    def __init__(self, server: Server, dashboard: Dashboard | None = None) -> None:
        broker = server.broker
        self.queues = [(q.name, len(q), q.jobs_in, q.jobs_out, q.nacks, q.requeues,
                        len(q.waiters), q.pause) for q in broker.queues.values()]
        self.dead_lettered = list(broker.policies.dead_lettered.items())
        # The node-wide families: a few dozen, built here from values read now.
        self.families = [*_jobs(server), *_persistence(server), *_cluster(server),
                         *_workers(server, dashboard)]

    def collect(self) -> Iterator[Metric]:
        yield from _queue_families(self.queues, self.dead_lettered)
        yield from self.families


def _queue_families(queues: list[tuple[Any, ...]],
                    dead_lettered: list[tuple[bytes, int]]) -> Iterator[Metric]:
    per = _PerQueue()
    paused = GaugeMetricFamily("trisque_queue_paused",
                               "1 when the queue is paused in this direction (PAUSE)",
                               labels=["queue", "direction"])
    for name, length, jobs_in, jobs_out, nacks, requeues, blocked, pause in queues:
        per.add("trisque_queue_length", name, length)
        per.add("trisque_queue_jobs_in", name, jobs_in)
        per.add("trisque_queue_jobs_out", name, jobs_out)
        per.add("trisque_queue_nacks", name, nacks)
        per.add("trisque_queue_requeues", name, requeues)
        per.add("trisque_queue_blocked_clients", name, blocked)
        if pause:
            for bit, direction in ((PAUSE_IN, "in"), (PAUSE_OUT, "out")):
                if pause & bit:
                    paused.add_metric([label(name), direction], 1)
    for name, n in dead_lettered:
        per.add("trisque_queue_dead_lettered", name, n)
    for metric, (kind, doc) in QUEUE_METRICS.items():
        family: Metric
        if kind == "counter":
            family = CounterMetricFamily(metric, doc, labels=["queue"])
        else:
            family = GaugeMetricFamily(metric, doc, labels=["queue"])
        for queue, value in sorted(per.values.get(metric, {}).items()):
            family.add_metric([queue], value)
        yield family
    yield paused


# -- jobs, clients, memory ----------------------------------------------------------------------

def _jobs(server: Server) -> Iterator[Metric]:
    broker = server.broker
    yield _gauge("trisque_jobs", "Jobs this node holds (any state, copies included)",
                 len(broker.jobs))
    yield _gauge("trisque_job_bytes",
                 "Memory the jobs take by the broker's estimate (bodies + overhead)",
                 broker.job_bytes)
    yield _gauge("trisque_connected_clients", "RESP client connections",
                 len(server.connections))
    yield _gauge("trisque_blocked_clients",
                 "Clients waiting in GETJOB or in a replicating ADDJOB", broker.blocked_clients)
    yield _counter("trisque_commands_processed", "Commands run (RESP and HTTP)",
                   server.commands)
    yield _counter("trisque_connections_received", "Client connections accepted",
                   server.connections_received)
    yield _counter("trisque_rejected_connections",
                   "Client connections refused (maxclients)", server.rejected)
    yield _counter("trisque_net_input_bytes", "Bytes read from RESP clients", server.stats_in)
    yield _counter("trisque_net_output_bytes", "Bytes written to RESP clients",
                   server.stats_out)
    yield _gauge("trisque_used_memory_bytes",
                 "Memory the node holds as maxmemory counts it: jobs, queues, client and "
                 "log buffers (INFO's used_memory)", broker.used_memory)
    yield _gauge("trisque_maxmemory_bytes", "The maxmemory directive (0: no limit)",
                 broker.config.maxmemory)
    yield _histogram(
        "trisque_replication_latency_seconds",
        "Synchronous ADDJOB: from its REPLJOBs to the replication level reached",
        broker.repl_latency)
    info = GaugeMetricFamily("trisque_node_info", "The node's ID and version (always 1)",
                             labels=["node_id", "version"])
    info.add_metric([server.node_id, VERSION], 1)
    yield info


# -- append log ---------------------------------------------------------------------------------

def _persistence(server: Server) -> Iterator[Metric]:
    p = server.persistence
    yield _gauge("trisque_aof_enabled", "1 when the append log is on (appendonly)",
                 int(p.enabled))
    yield _gauge("trisque_aof_size_bytes", "Size of the append log",
                 p.writer.good_size if p.writer is not None else 0)
    yield _counter("trisque_aof_fsyncs", "fdatasync calls on the append log", p.fsync_count)
    yield _histogram("trisque_aof_fsync_latency_seconds",
                     "Latency of each fdatasync of the append log", p.fsync_latency)
    yield _histogram("trisque_aof_batch_records",
                     "Records per append-log write (group commit batch)", p.batch_records)
    yield _histogram("trisque_aof_batch_bytes",
                     "Bytes per append-log write (group commit batch)", p.batch_bytes)


# -- cluster, workers, timers -------------------------------------------------------------------

def _cluster(server: Server) -> Iterator[Metric]:
    bus = server.bus
    for name, by_type, doc in (
            ("trisque_bus_messages_received", bus.received_by_type,
             "Cluster bus frames received, by message type"),
            ("trisque_bus_messages_sent", bus.sent_by_type,
             "Cluster bus frames queued for sending, by message type")):
        family = CounterMetricFamily(name, doc, labels=["type"])
        for mtype, n in sorted(by_type.items(), key=lambda kv: kv[0].name):
            family.add_metric([mtype.name], n)
        yield family
    yield _counter("trisque_bus_sends_dropped",
                   "Cluster bus frames dropped (no link, link closed, too slow)",
                   bus.counters["sends_dropped"])
    yield _counter("trisque_bus_links_refused_tls",
                   "Inbound cluster bus links refused by TLS (no certificate, one the CA did "
                   "not sign, plaintext, a stalled handshake)", bus.counters["links_refused_tls"])
    yield _counter("trisque_bus_tls_connect_failures",
                   "Cluster bus links to other nodes whose TLS handshake failed",
                   bus.counters["tls_connect_failures"])
    table = server.cluster
    yield _gauge("trisque_cluster_known_nodes", "Nodes in the node table (myself too)",
                 len(table.nodes))
    yield _gauge("trisque_cluster_reachable_nodes", "Other nodes reachable now",
                 table.reachable_nodes())
    fed = server.federation.stats
    yield _counter("trisque_federation_jobs_imported",
                   "Jobs received from other nodes (YOURJOBS)", fed["imported"])
    yield _counter("trisque_federation_jobs_exported",
                   "Jobs sent to other nodes (YOURJOBS)", fed["exported"])


def _workers(server: Server, dashboard: Dashboard | None) -> Iterator[Metric]:
    runs = server.broker.runs
    yield _gauge("trisque_worker_runs_running", "Worker jobs running (JOBRUN) on this node",
                 len(runs.running()))
    yield _counter("trisque_worker_runs_started", "Worker runs started on this node",
                   runs.started)
    yield _counter("trisque_worker_runs_lost",
                   "Worker runs whose worker stopped reporting (lease expired)", runs.lost)
    yield _gauge("trisque_timers", "Periodic timers (TIMER)", server.broker.periodic.live)
    if dashboard is not None:
        yield _gauge("trisque_dashboard_log_streams",
                     "Job logs streamed to dashboard pages now (Server-Sent Events)",
                     dashboard.streams)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def render(reading: NodeReading, encoder: Callable[[CollectorRegistry], bytes]) -> bytes:
    """The exposition of one reading (in a worker thread), with prometheus-client's process
    metrics (CPU, memory, open files). A registry of its own per scrape: not the library's
    global one, which would mix the nodes of a test run in one process."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(reading)
    ProcessCollector(registry=registry)
    return encoder(registry)


def endpoint(server: Server, dashboard: Dashboard | None = None) -> Any:
    threads = trio.CapacityLimiter(RENDER_THREADS)

    async def metrics(request: Request) -> Response:
        reading = NodeReading(server, dashboard)
        # The text format, or OpenMetrics when the scraper asks for it (Accept).
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        body = await trio.to_thread.run_sync(render, reading, encoder, limiter=threads)
        return Response(body, media_type=content_type)

    return metrics
