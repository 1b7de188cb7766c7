"""Every trisque command as a function that returns a prepared ``Call``, and the reply models.

Theory of operation
-------------------
A builder checks nothing the server checks (the server's error text is the one users should
see) and only shapes arguments: ``str`` bodies are encoded UTF-8, ``bytes`` go as they are,
optional options are left out when ``None``. Its ``Call.convert`` turns the raw reply
(``protocol.resp.ReplyReader`` values: bulk and status both ``bytes``) into the small
dataclasses below. Error replies never reach a converter: the client raises first.

The blocking client, the trio client and pipelines all call these same builders, so the three
share one definition of every command's arguments, retry safety and reply shape.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from client.core import (
    Call,
    Hello,
    ResponseError,
    check,
    error_from_reply,
    parse_hello,
)
from protocol.resp import Error

Body = bytes | str

# ---------------------------------------------------------------------------------------------
# Models


@dataclass(frozen=True, slots=True)
class Job:
    """A delivered or peeked job. The counters are set only by GETJOB WITHCOUNTERS."""

    queue: str
    id: str
    body: bytes
    nacks: int | None = None
    additional_deliveries: int | None = None


@dataclass(frozen=True, slots=True)
class JobInfo:
    """SHOW's (and JSCAN REPLY all's) description of a job. Times are as the server sends
    them: ``ctime`` in nanoseconds, ``ttl``/``delay``/``retry`` in seconds, ``next_*`` in ms."""

    id: str
    queue: str
    state: str
    repl: int
    ttl: int
    ctime: int
    delay: int
    retry: int
    nacks: int
    additional_deliveries: int
    nodes_delivered: list[str]
    nodes_confirmed: list[str]
    next_requeue_within: int | None
    next_awake_within: int | None
    body: bytes
    #: Fields this client version does not know, as sent.
    extra: dict[str, Any] = field(default_factory=dict)
    #: ADDJOB's PRIORITY (0 to 9; SHOW sends it only when set).
    priority: int = 0


@dataclass(frozen=True, slots=True)
class QueueStats:
    """QSTAT's description of a queue."""

    name: str
    len: int
    age: int
    idle: int
    blocked: int
    import_from: list[str]
    import_rate: int
    jobs_in: int
    jobs_out: int
    pause: str
    extra: dict[str, Any] = field(default_factory=dict)
    #: Jobs delivered and not yet acked, nacked or requeued (None: the queue has no
    #: MAXINFLIGHT or RATE policy, and QSTAT does not send it).
    inflight: int | None = None
    #: The queue's MAXINFLIGHT or RATE holds its deliveries back now.
    throttled: bool = False


def text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def _body(body: Body) -> bytes:
    return body.encode() if isinstance(body, str) else bytes(body)


def _fields(reply: list[Any]) -> dict[str, Any]:
    return {text(reply[i]): reply[i + 1] for i in range(0, len(reply) - 1, 2)}


def parse_job(entry: list[Any]) -> Job:
    """``[queue, id, body]`` or ``[queue, id, body, "nacks", n, "additional-deliveries", n]``."""
    extra = _fields(entry[3:])
    nacks = extra.get("nacks")
    more = extra.get("additional-deliveries")
    return Job(text(entry[0]), text(entry[1]), bytes(entry[2]),
               None if nacks is None else int(nacks), None if more is None else int(more))


def parse_jobs(reply: Any) -> list[Job]:
    # GETJOB answers a null array on timeout or NOHANG with nothing queued.
    if reply is None:
        return []
    return [parse_job(check(e)) for e in reply]


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def parse_job_info(reply: Any) -> JobInfo | None:
    if reply is None:
        return None
    f = _fields(reply)
    known = ("id", "queue", "state", "repl", "ttl", "ctime", "delay", "retry", "nacks",
             "additional-deliveries", "nodes-delivered", "nodes-confirmed",
             "next-requeue-within", "next-awake-within", "body", "priority")
    return JobInfo(
        id=text(f.get("id", b"")), queue=text(f.get("queue", b"")), state=text(f.get("state", b"")),
        repl=int(f.get("repl", 0)), ttl=int(f.get("ttl", 0)), ctime=int(f.get("ctime", 0)),
        delay=int(f.get("delay", 0)), retry=int(f.get("retry", 0)), nacks=int(f.get("nacks", 0)),
        additional_deliveries=int(f.get("additional-deliveries", 0)),
        nodes_delivered=[text(x) for x in f.get("nodes-delivered") or []],
        nodes_confirmed=[text(x) for x in f.get("nodes-confirmed") or []],
        next_requeue_within=_opt_int(f.get("next-requeue-within")),
        next_awake_within=_opt_int(f.get("next-awake-within")),
        body=bytes(f.get("body") or b""),
        extra={k: v for k, v in f.items() if k not in known},
        priority=int(f.get("priority", 0)),
    )


def parse_qstat(reply: Any) -> QueueStats | None:
    if reply is None:
        return None
    f = _fields(reply)
    known = ("name", "len", "age", "idle", "blocked", "import-from", "import-rate", "jobs-in",
             "jobs-out", "pause", "inflight", "throttled")
    return QueueStats(
        name=text(f.get("name", b"")), len=int(f.get("len", 0)), age=int(f.get("age", 0)),
        idle=int(f.get("idle", 0)), blocked=int(f.get("blocked", 0)),
        import_from=[text(x) for x in f.get("import-from") or []],
        import_rate=int(f.get("import-rate", 0)), jobs_in=int(f.get("jobs-in", 0)),
        jobs_out=int(f.get("jobs-out", 0)), pause=text(f.get("pause", b"none")),
        extra={k: v for k, v in f.items() if k not in known},
        inflight=_opt_int(f.get("inflight")), throttled=bool(f.get("throttled", 0)),
    )


def parse_info(reply: Any) -> dict[str, str | int | float]:
    """INFO text as one flat dict; numbers become int/float, ``# Section`` lines are skipped."""
    out: dict[str, str | int | float] = {}
    for line in text(reply).splitlines():
        if not line or line.startswith("#") or ":" not in line:
            continue
        key, _, value = line.partition(":")
        out[key] = _number(value)
    return out


def _number(value: str) -> str | int | float:
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value) if any(c.isdigit() for c in value) and "." in value else value
    except ValueError:
        return value


def parse_config(reply: Any) -> dict[str, str]:
    return {text(reply[i]): text(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}


def _page(reply: Any) -> tuple[str, list[Any]]:
    return text(reply[0]), list(reply[1])


def _ok(reply: Any) -> None:
    return None


# ---------------------------------------------------------------------------------------------
# Builders


def add_job(queue: str, body: Body, *, replicate: int | None = None, delay: int | None = None,
            retry: int | None = None, ttl: int | None = None, maxlen: int | None = None,
            async_: bool = False, timeout_ms: int = 0, priority: int | None = None,
            after: Iterable[str] = ()) -> Call[str]:
    """``after``: job IDs that must be acked or resolved before this job is queued."""
    args: list[bytes | str | int] = ["ADDJOB", queue, _body(body), timeout_ms]
    for name, value in (("REPLICATE", replicate), ("DELAY", delay), ("RETRY", retry),
                        ("TTL", ttl), ("MAXLEN", maxlen), ("PRIORITY", priority)):
        if value is not None:
            args += [name, value]
    if async_:
        args.append("ASYNC")
    for parent in after:
        args += ["AFTER", parent]
    # The node answers once the job is replicated, which may take up to timeout_ms.
    wait = timeout_ms / 1000 if timeout_ms and not async_ else 0.0
    return Call.make(*args, convert=text, extra_wait=wait)


def get_job(*queues: str, count: int = 1, timeout_ms: int | None = None, nohang: bool = False,
            with_counters: bool = False) -> Call[list[Job]]:
    if not queues:
        raise ValueError("get_job needs at least one queue")
    args: list[bytes | str | int] = ["GETJOB"]
    if nohang:
        args.append("NOHANG")
    if timeout_ms is not None:
        args += ["TIMEOUT", timeout_ms]
    if count != 1:
        args += ["COUNT", count]
    if with_counters:
        args.append("WITHCOUNTERS")
    args += ["FROM", *queues]
    # Without NOHANG the node holds the reply until a job comes or TIMEOUT (0/none: forever).
    wait: float | None = 0.0 if nohang else (timeout_ms / 1000 if timeout_ms else None)
    return Call.make(*args, convert=parse_jobs, retry_safe=True, extra_wait=wait,
                     delivers_jobs=True)


def _ids_command(name: str, ids: Iterable[str]) -> Call[int]:
    ids = list(ids)
    if not ids:
        raise ValueError(f"{name} needs at least one job ID")
    return Call.make(name, *ids, convert=int)


def ack_job(*ids: str) -> Call[int]:
    return _ids_command("ACKJOB", ids)


def fast_ack(*ids: str) -> Call[int]:
    return _ids_command("FASTACK", ids)


def nack(*ids: str) -> Call[int]:
    return _ids_command("NACK", ids)


def enqueue(*ids: str) -> Call[int]:
    return _ids_command("ENQUEUE", ids)


def dequeue(*ids: str) -> Call[int]:
    return _ids_command("DEQUEUE", ids)


def del_job(*ids: str) -> Call[int]:
    return _ids_command("DELJOB", ids)


def resolve(job_id: str, result: Body) -> Call[int]:
    """Acknowledge the job and keep ``result`` for WAITJOB (1, or 0 for a job not known)."""
    return Call.make("RESOLVE", job_id, _body(result), convert=int)


def _result(reply: Any) -> bytes | None:
    return None if reply is None else bytes(reply)


def wait_job(job_id: str, *, timeout_ms: int | None = None) -> Call[bytes | None]:
    """The job's result once it is resolved (``b""`` if acked without one); None when
    ``timeout_ms`` passes first. A job that expired, was deleted or dead-lettered, or that no
    node knows, raises ``ResponseError``."""
    args: list[bytes | str | int] = ["WAITJOB", job_id]
    if timeout_ms:
        args += ["TIMEOUT", timeout_ms]
    wait: float | None = timeout_ms / 1000 if timeout_ms else None
    return Call.make(*args, convert=_result, retry_safe=True, extra_wait=wait)


def working(job_id: str) -> Call[int]:
    return Call.make("WORKING", job_id, convert=int)


def show(job_id: str) -> Call[JobInfo | None]:
    return Call.make("SHOW", job_id, convert=parse_job_info, retry_safe=True)


def qlen(queue: str) -> Call[int]:
    return Call.make("QLEN", queue, convert=int, retry_safe=True)


def qstat(queue: str) -> Call[QueueStats | None]:
    return Call.make("QSTAT", queue, convert=parse_qstat, retry_safe=True)


def qpolicy_set(queue: str, *, backoff: tuple[int, int] | None = None,
                max_inflight: int | None = None, rate: int | None = None) -> Call[dict[str, Any]]:
    """QPOLICY SET: create or change a queue's policy; only the settings given change.
    ``backoff`` is ``(base, max)`` seconds, ``(0, 0)`` turns it off; ``max_inflight`` and
    ``rate`` 0 lift the limit (docs/semantics.md). Replies the policy's fields."""
    args: list[bytes | str | int] = ["QPOLICY", "SET", queue]
    if backoff is not None:
        args += ["BACKOFF", backoff[0], backoff[1]]
    for name, value in (("MAXINFLIGHT", max_inflight), ("RATE", rate)):
        if value is not None:
            args += [name, value]
    return Call.make(*args, convert=_fields)


def qpeek(queue: str, count: int) -> Call[list[Job]]:
    return Call.make("QPEEK", queue, count, convert=parse_jobs, retry_safe=True)


def qscan_page(cursor: str = "0", *, count: int | None = None, busyloop: bool = False,
               minlen: int | None = None, maxlen: int | None = None,
               importrate: int | None = None) -> Call[tuple[str, list[str]]]:
    args: list[bytes | str | int] = ["QSCAN", cursor]
    for name, value in (("COUNT", count), ("MINLEN", minlen), ("MAXLEN", maxlen),
                        ("IMPORTRATE", importrate)):
        if value is not None:
            args += [name, value]
    if busyloop:
        args.append("BUSYLOOP")

    def convert(reply: Any) -> tuple[str, list[str]]:
        cur, items = _page(reply)
        return cur, [text(q) for q in items]

    return Call.make(*args, convert=convert, retry_safe=True)


def _jscan_args(cursor: str, count: int | None, busyloop: bool, queue: str | None,
                states: Iterable[str], reply: str) -> list[bytes | str | int]:
    args: list[bytes | str | int] = ["JSCAN", cursor]
    if count is not None:
        args += ["COUNT", count]
    if busyloop:
        args.append("BUSYLOOP")
    if queue is not None:
        args += ["QUEUE", queue]
    for state in states:
        args += ["STATE", state]
    args += ["REPLY", reply]
    return args


def jscan_page(cursor: str = "0", *, count: int | None = None, busyloop: bool = False,
               queue: str | None = None, states: Iterable[str] = ()) -> Call[tuple[str, list[str]]]:
    def convert(reply: Any) -> tuple[str, list[str]]:
        cur, items = _page(reply)
        return cur, [text(i) for i in items]

    return Call.make(*_jscan_args(cursor, count, busyloop, queue, states, "id"),
                     convert=convert, retry_safe=True)


def jscan_jobs_page(cursor: str = "0", *, count: int | None = None, busyloop: bool = False,
                    queue: str | None = None,
                    states: Iterable[str] = ()) -> Call[tuple[str, list[JobInfo]]]:
    def convert(reply: Any) -> tuple[str, list[JobInfo]]:
        cur, items = _page(reply)
        infos = [parse_job_info(i) for i in items]
        return cur, [i for i in infos if i is not None]

    return Call.make(*_jscan_args(cursor, count, busyloop, queue, states, "all"),
                     convert=convert, retry_safe=True)


def pause(queue: str, option: str = "state", *, bcast: bool = False) -> Call[str]:
    """Returns the queue's pause state after the command (``in``/``out``/``all``/``none``)."""
    args: list[bytes | str | int] = ["PAUSE", queue, option]
    if bcast:
        args.append("BCAST")
    return Call.make(*args, convert=text, retry_safe=option == "state")


def hello() -> Call[Hello]:
    return Call.make("HELLO", convert=parse_hello, retry_safe=True)


def info(section: str | None = None) -> Call[dict[str, str | int | float]]:
    args = ["INFO"] if section is None else ["INFO", section]
    return Call.make(*args, convert=parse_info, retry_safe=True)


def ping() -> Call[str]:
    return Call.make("PING", convert=text, retry_safe=True)


def config_get(pattern: str) -> Call[dict[str, str]]:
    return Call.make("CONFIG", "GET", pattern, convert=parse_config, retry_safe=True)


def config_set(name: str, value: str | int) -> Call[None]:
    return Call.make("CONFIG", "SET", name, value, convert=_ok)


def cluster_leaving(flag: bool | None = None) -> Call[str]:
    """``CLUSTER LEAVING yes|no``, or the current state (``yes``/``no``) without a flag."""
    if flag is None:
        return Call.make("CLUSTER", "LEAVING", convert=text, retry_safe=True)
    return Call.make("CLUSTER", "LEAVING", "yes" if flag else "no", convert=text)


def auth(password: str) -> Call[None]:
    return Call.make("AUTH", password, convert=_ok)


def execute(*args: bytes | str | int) -> Call[Any]:
    """Any command; the raw reply (bulk and status replies both as ``bytes``)."""
    if not args:
        raise ValueError("execute needs a command")
    return Call.make(*args)


# What a pipeline may collect: the builders above by name.
BUILDERS: dict[str, Any] = {
    name: obj for name, obj in globals().items()
    if callable(obj) and getattr(obj, "__module__", None) == __name__
    and not name.startswith("_") and not name.startswith("parse_")
    and name not in ("text", "Job", "JobInfo", "QueueStats")
}
# In a pipeline ``execute()`` sends the batch, so a raw command is ``execute_command(...)``.
BUILDERS["execute_command"] = BUILDERS.pop("execute")



class PipelineCalls:
    """Collects calls for one write: ``pipe.add_job(...)``, ``pipe.qlen(...)``... take the
    arguments of the builder of the same name and return the pipeline, so calls chain. The
    flavours add ``execute()``."""

    def __init__(self) -> None:
        self.calls: list[Call[Any]] = []

    def __getattr__(self, name: str) -> Any:
        builder = BUILDERS.get(name)
        if builder is None:
            raise AttributeError(name)

        def collect(*args: Any, **kwargs: Any) -> PipelineCalls:
            self.calls.append(builder(*args, **kwargs))
            return self

        return collect

    def __len__(self) -> int:
        return len(self.calls)


def pipeline_results(calls: list[Call[Any]], replies: list[Any],
                     raise_on_error: bool) -> list[Any]:
    """Convert pipeline replies in order; errors become exceptions (raised: the first one)."""
    results: list[Any] = []
    for call, reply in zip(calls, replies, strict=True):
        if isinstance(reply, Error):
            results.append(error_from_reply(reply))
        else:
            results.append(call.convert(reply))
    if raise_on_error:
        for r in results:
            if isinstance(r, ResponseError):
                raise r
    return results


__all__ = ["Job", "JobInfo", "QueueStats", "Hello", "ResponseError", "BUILDERS",
           "PipelineCalls", "pipeline_results"]
