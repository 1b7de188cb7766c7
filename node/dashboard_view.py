"""What the dashboard shows, read from a node's state: plain dicts for the templates.

Theory of operation
-------------------
Each function here reads the running node (``node.server.Server``: its broker, membership
table, run and timer tables) in one go, between two awaits, so a page shows one consistent
moment. Nothing is changed and nothing is escaped here: bytes are decoded for display
(``text``) and the templates escape every value (Jinja2 autoescape, node/dashboard.py).

Queue rates come from ``RateTracker``: each overview render records the queues' jobs-in and
jobs-out counters, and a rate is the difference to a sample ``RATE_WINDOW_MS`` old or less
(at least ``RATE_MIN_SPAN_MS``), so rates need two renders a second apart (the page refreshes
itself every 2 s) and cost nothing while nobody watches. Only the queues shown are sampled.
A counter that went down (the queue was evicted and came back) restarts its samples.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

from broker import throttle
from broker.parking import ERROR_QUEUE_SUFFIX
from broker.policy_table import Policy
from broker.queue import PAUSE_NAMES, Queue
from cluster.nodes_file import show_flags
from node.bodies import BodyError, body_of

if TYPE_CHECKING:
    from broker.core import Broker
    from node.server import Server

MAX_QUEUES_SHOWN: Final = 500
MAX_DEAD_LETTERS_SHOWN: Final = 20
RECENT_RUNS: Final = 20
PREVIEW_CHARS: Final = 200
RATE_WINDOW_MS: Final = 30_000
RATE_MIN_SPAN_MS: Final = 1_000


def _body(job: Any) -> bytes:
    """The job's body, read back if the append log holds it (a damaged one: a note)."""
    try:
        return body_of(job.content)
    except BodyError as exc:
        return f"<{exc}>".encode()


def text(data: bytes | None, limit: int | None = None) -> str:
    """Bytes shown as text (invalid UTF-8 as U+FFFD), cut to ``limit`` characters with an
    ellipsis."""
    if data is None:
        return ""
    shown = data[: limit * 4 if limit else None].decode("utf-8", "replace")
    if limit is not None and (len(shown) > limit or len(data) > limit * 4):
        return shown[:limit] + "…"
    return shown


class RateTracker:
    def __init__(self) -> None:
        self._samples: dict[bytes, deque[tuple[int, int, int]]] = {}

    def observe(self, now_ms: int, counters: dict[bytes, tuple[int, int]]) -> None:
        """Record (jobs_in, jobs_out) of the queues shown; forget the others."""
        for name in list(self._samples):
            if name not in counters:
                del self._samples[name]
        for name, (jobs_in, jobs_out) in counters.items():
            samples = self._samples.setdefault(name, deque())
            if samples and (jobs_in < samples[-1][1] or jobs_out < samples[-1][2]):
                samples.clear()  # the queue was evicted and created again
            if samples and now_ms - samples[-1][0] < RATE_MIN_SPAN_MS // 2:
                continue  # a burst of renders: one sample is enough
            samples.append((now_ms, jobs_in, jobs_out))
            while len(samples) > 2 and now_ms - samples[1][0] >= RATE_WINDOW_MS:
                samples.popleft()

    def rates(self, name: bytes) -> tuple[float, float] | None:
        """Jobs in and out per second over the window, or None while there is too little."""
        samples = self._samples.get(name)
        if not samples or len(samples) < 2:
            return None
        t0, in0, out0 = samples[0]
        t1, in1, out1 = samples[-1]
        if t1 - t0 < RATE_MIN_SPAN_MS:
            return None
        span = (t1 - t0) / 1000
        return (in1 - in0) / span, (out1 - out0) / span


def short_id(node_id: str) -> str:
    return node_id[:8]


# =============================================================================================
# The overview page


Visible = Callable[[bytes], bool]


def everything(queue: bytes) -> bool:
    return True


def overview(server: Server, rates: RateTracker, visible: Visible = everything) -> dict[str, Any]:
    """The overview's data, of the queues ``visible`` lets the page's user see (an ACL user's
    queue patterns: what they could read over RESP); outcomes of jobs no longer held name no
    queue, so only a user who sees every queue sees them."""
    now = server.clock.now_ms()
    broker = server.broker
    results = _results(broker, now, visible) if visible is everything else {
        "results": [], "results_total": 0, "waiting": [], "waiting_parents": 0}
    return {
        "now_ms": now,
        "node": _node(server, now),
        "nodes": _nodes(server),
        **_queues(broker, rates, now, visible),
        "dead_letter_queues": _dead_letter_queues(broker, visible),
        "timers": [t for t in _timers(broker, now) if visible(t.pop("_queue"))],
        **results,
        "running": [run_row(r, now) for r in broker.runs.running() if visible(r.queue)],
        "recent": [run_row(r, now) for r in broker.runs.recent(RECENT_RUNS)
                   if r.state != "running" and visible(r.queue)],
    }


def _node(server: Server, now: int) -> dict[str, Any]:
    from broker.version import VERSION

    broker = server.broker
    return {
        "id": server.node_id,
        "short": short_id(server.node_id),
        "version": VERSION,
        "addresses": [f"{h}:{p}" for h, p in server.listening],
        "uptime_s": int(now / 1000 - server.start_time),
        "clients": len(server.connections),
        "blocked": broker.blocked_clients,
        "jobs": len(broker.jobs),
        "used_memory": broker.used_memory,
        "maxmemory": broker.config.maxmemory,
        "leaving": broker.leaving,
        "aof": "on" if server.persistence.enabled else "off",
    }


def _nodes(server: Server) -> list[dict[str, Any]]:
    rows = []
    for n in server.cluster.saved_nodes():
        if "handshake" in n.flags:
            continue
        address = f"{n.ip}:{n.port}"
        if "myself" in n.flags and not n.ip:  # no peer told it its IP yet: where it listens
            address = ", ".join(f"{h}:{p}" for h, p in server.listening) or address
        rows.append({
            "id": n.node_id, "short": short_id(n.node_id), "address": address,
            "flags": show_flags(n.flags), "connected": n.connected,
            "failing": bool(n.flags & {"pfail", "fail"}),
            "myself": "myself" in n.flags,
        })
    return rows


def _queues(broker: Broker, rates: RateTracker, now: int, visible: Visible) -> dict[str, Any]:
    policies = broker.policies
    names = {n for n in set(broker.queues) | {p.name for p in policies.policies()}
             if visible(n)}
    ordered = sorted(names)
    shown = ordered[:MAX_QUEUES_SHOWN]
    counters: dict[bytes, tuple[int, int]] = {}
    rows: list[dict[str, Any]] = []
    for name in shown:
        q = broker.queues.get(name)
        p = policies.get(name)
        if q is not None:
            counters[name] = (q.jobs_in, q.jobs_out)
        rows.append({
            "name": text(name), "length": len(q) if q is not None else 0,
            "jobs_in": q.jobs_in if q else 0, "jobs_out": q.jobs_out if q else 0,
            "nacks": q.nacks if q else 0, "blocked": len(q.waiters) if q else 0,
            "paused": PAUSE_NAMES[q.pause] if q else "none",
            "policy": p is not None,
            "redrive": (p.redrive[0], text(p.redrive[1])) if p and p.redrive else None,
            "dead_lettered": policies.dead_lettered.get(name, 0),
            "throttle": _throttle(broker, p, q, now),
            "_key": name,
        })
    rates.observe(now, counters)
    for row in rows:
        rate = rates.rates(row.pop("_key"))
        row["rate_in"], row["rate_out"] = rate if rate is not None else (None, None)
    return {"queues": rows, "queues_hidden": len(ordered) - len(shown)}


def _throttle(broker: Broker, p: Policy | None, q: Queue | None, now: int) -> Any:
    """A throttled queue's limits, its jobs in flight here and whether it is held back now
    (broker/throttle.py); None for the others."""
    if p is None or not (p.max_inflight or p.rate):
        return None
    return {"max_inflight": p.max_inflight, "rate": p.rate,
            "inflight": throttle.inflight(broker, p.name, now),
            "held": q is not None and throttle.holds(broker, q, now)}


def _dead_letter_queues(broker: Broker, visible: Visible) -> list[dict[str, Any]]:
    """Dead-letter queues (named by a redrive policy) and the error queues script workers
    park failed jobs in (``<queue>.err`` with a policy, broker/parking.py)."""
    policies = broker.policies
    sources: dict[bytes, list[bytes]] = {}
    for p in policies.policies():
        if p.redrive is not None and policies.get(p.redrive[1]) is not None:
            sources.setdefault(p.redrive[1], []).append(p.name)
        if p.name.endswith(ERROR_QUEUE_SUFFIX) and len(p.name) > len(ERROR_QUEUE_SUFFIX):
            froms = sources.setdefault(p.name, [])
            source = p.name[:-len(ERROR_QUEUE_SUFFIX)]
            if source not in froms:
                froms.append(source)
    out = []
    for dlq, froms in sorted(sources.items()):
        if not visible(dlq):
            continue
        q = broker.queues.get(dlq)
        redrive_url = "/queues/" + quote(dlq, safe="") + "/redrive"
        letters = []
        for job in q.peek(MAX_DEAD_LETTERS_SHOWN) if q is not None else []:
            origin = policies.origins.get(job.id)
            note = policies.notes.get(job.id)
            job_id = job.id.decode("ascii", "replace")
            letters.append({
                "id": job_id,
                "from": text(origin[1]) if origin else "",
                "original": origin[0].decode("ascii", "replace") if origin else "",
                "body": text(_body(job), PREVIEW_CHARS),
                "nacks": job.nacks, "deliveries": job.deliveries,
                # A failed run parked by a worker: why, its exit status and log file.
                "reason": note[0] if note else "", "exit_code": note[1] if note else None,
                "log_file": note[2] if note else "", "parked_ms": note[3] if note else 0,
                "redrive_url": redrive_url + "?job=" + quote(job_id, safe=""),
                "delete_url": "/messages/" + quote(job_id, safe=""),
            })
        out.append({
            "name": text(dlq), "length": len(q) if q is not None else 0,
            "redrive_url": redrive_url,
            "sources": [text(s) for s in sorted(froms)], "letters": letters,
        })
    return out


def _timers(broker: Broker, now: int) -> list[dict[str, Any]]:
    rows = []
    for t in broker.periodic.list(now):
        rows.append({
            "name": text(t.name), "period_ms": t.period_ms, "queue": text(t.queue),
            "body": text(t.body, PREVIEW_CHARS),
            "params": " ".join(text(p) for p in t.params),
            "next_in_ms": t.next_due_ms - now, "next_due_ms": t.next_due_ms,
            "last_fired_ms": t.last_fired_due_ms,
            "owner": short_id(t.owner) if t.owner else "",
            "owner_is_me": t.owner == broker.node_id, "paused": t.paused,
            "last_error": getattr(t, "last_error", ""), "_queue": t.queue,
        })
    return rows


def _results(broker: Broker, now: int, visible: Visible) -> dict[str, Any]:
    """The newest outcomes kept (RESOLVE, WAITJOB) and the chained jobs still waiting here."""
    outcomes = broker.results.outcomes
    rows = []
    for job_id in list(reversed(outcomes))[:RECENT_RUNS]:
        kind, value, until = outcomes[job_id]
        rows.append({"job_id": job_id.decode("ascii", "replace"), "kind": kind,
                     "result": text(value, PREVIEW_CHARS), "size": len(value),
                     "expires_in_ms": max(0, until - now)})
    waiting: list[dict[str, Any]] = []
    seen: set[bytes] = set()
    for children in broker.results.children.values():
        for child_id in sorted(children):
            job = broker.jobs.get(child_id)
            if job is None or child_id in seen or len(waiting) >= RECENT_RUNS \
                    or not visible(job.queue):
                continue
            seen.add(child_id)
            waiting.append({"job_id": child_id.decode("ascii", "replace"),
                            "queue": text(job.queue),
                            "after": [p.decode("ascii", "replace") for p in job.after]})
    return {"results": rows, "results_total": len(outcomes), "waiting": waiting,
            "waiting_parents": len(broker.results.children)}


def run_row(run: Any, now: int) -> dict[str, Any]:
    end = run.ended_ms or now
    return {
        "job_id": run.job_id.decode("ascii", "replace"), "queue": text(run.queue),
        "worker": run.worker, "pid": run.pid, "attempt": run.attempt, "state": run.state,
        "started_ms": run.started_ms, "ended_ms": run.ended_ms,
        "elapsed_ms": max(0, end - run.started_ms), "exit_code": run.exit_code,
        "reason": run.reason, "last_status": run.last_status,
        "output_size": run.output_size,
    }


# =============================================================================================
# A job's page


def job_page(server: Server, job_id: bytes,
             visible: Visible = everything) -> dict[str, Any] | None:
    """The job (if this node holds it) and its newest run (if one was recorded here); None
    when the node knows neither, or the job's queue is not ``visible`` to the page's user
    (nor, for a job no longer held, every queue)."""
    broker = server.broker
    now = server.clock.now_ms()
    job = broker.jobs.get(job_id)
    run = broker.runs.get(job_id)
    if job is None and run is None and job_id not in broker.results.outcomes:
        return None
    queue = job.queue if job is not None else run.queue if run is not None else None
    if visible is not everything and (queue is None or not visible(queue)):
        return None
    return {
        "job_id": job_id.decode("ascii", "replace"),
        "job": None if job is None else {
            "queue": text(job.queue),
            "state": "waiting" if job.after else job.state.value, "nacks": job.nacks,
            "after": [p.decode("ascii", "replace") for p in job.after],
            "deliveries": job.deliveries, "ttl_s": job.ttl, "retry_s": job.retry,
            "body": text(_body(job), 4096), "body_size": job.body_size,
            "created_ms": job.ctime // 1_000_000,
        },
        "run": None if run is None else run_detail(run, now),
        "result": _result_of(broker, job_id),
    }


def _result_of(broker: Broker, job_id: bytes) -> dict[str, Any] | None:
    outcome = broker.results.outcomes.get(job_id)
    if outcome is None:
        return None
    return {"kind": outcome[0], "result": text(outcome[1], 4096), "size": len(outcome[1])}


def run_detail(run: Any, now: int) -> dict[str, Any]:
    row = run_row(run, now)
    row["status"] = list(run.status)
    row["status_dropped"] = run.status_dropped
    return row
