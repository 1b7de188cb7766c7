"""Option parsing for the trisque data sources, done at planning time.

Spark hands a data source its options as a case-insensitive mapping of strings. Every option
is parsed here, in the driver, when the source is planned, so a missing or malformed option
fails the query before any task runs, with a message that names the option.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from client.tls import TlsOptions

DEFAULT_NODES = "127.0.0.1:7711"


class OptionError(ValueError):
    """A data source option is missing or malformed; the message names it."""


def _get(options: Mapping[str, str], name: str) -> str | None:
    # Spark's mapping is case-insensitive already; a plain dict (tests, direct use) is not.
    for key, value in options.items():
        if key.lower() == name.lower():
            return None if value is None else str(value)
    return None


def _int(options: Mapping[str, str], name: str, default: int | None,
         low: int = 0, high: int | None = None) -> int | None:
    raw = _get(options, name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option '{name}' must be an integer, got {raw!r}") from None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise OptionError(f"option '{name}' must be {bound}, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("true", "yes", "1"):
        return True
    if raw.lower() in ("false", "no", "0"):
        return False
    raise OptionError(f"option '{name}' must be true or false, got {raw!r}")


def parse_nodes(options: Mapping[str, str]) -> list[str]:
    raw = _get(options, "nodes") or DEFAULT_NODES
    nodes = [n.strip() for n in raw.split(",") if n.strip()]
    for node in nodes:
        host, sep, port = node.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise OptionError(f"option 'nodes' must be host:port[,host:port...], got {node!r}")
    if not nodes:
        raise OptionError("option 'nodes' is empty")
    return nodes


def _queues(options: Mapping[str, str], required: bool) -> list[str]:
    raw = _get(options, "queue")
    names = [q.strip() for q in (raw or "").split(",") if q.strip()]
    if required and not names:
        raise OptionError("option 'queue' is required (one queue name, or several comma-separated)")
    return names


@dataclass(frozen=True)
class Common:
    nodes: list[str]
    password: str | None
    timeout_s: float
    tls: TlsOptions | None = None  # TLS to the nodes' tls-port


def _tls(options: Mapping[str, str]) -> TlsOptions | None:
    files = {name: _get(options, name) or None for name in ("cacert", "cacertdir", "cert", "key")}
    insecure = _bool(options, "insecure", False)
    if not (_bool(options, "tls", False) or insecure or any(files.values())):
        return None
    if bool(files["cert"]) != bool(files["key"]):
        raise OptionError("options 'cert' and 'key' go together (the client certificate)")
    return TlsOptions(files["cacert"], files["cacertdir"], files["cert"], files["key"], insecure)


def _common(options: Mapping[str, str]) -> Common:
    timeout_ms = _int(options, "socketTimeoutMs", 10_000, low=1)
    assert timeout_ms is not None
    return Common(parse_nodes(options), _get(options, "password"), timeout_ms / 1000,
                  _tls(options))


@dataclass(frozen=True)
class WriteOptions:
    common: Common
    queue: str | None           # default queue when the row has no `queue` column/value
    replicate: int | None
    retry: int | None
    ttl: int | None
    delay: int | None
    timeout_ms: int             # ADDJOB's synchronous replication timeout
    batchsize: int              # ADDJOB commands sent ahead of their replies
    async_: bool
    max_body_bytes: int
    on_bad_row: str             # "count" or "fail"


def write_options(options: Mapping[str, str]) -> WriteOptions:
    queues = _queues(options, required=False)
    if len(queues) > 1:
        raise OptionError("option 'queue' names one queue for writes, got several")
    on_bad = (_get(options, "onBadRow") or "count").lower()
    if on_bad not in ("count", "fail"):
        raise OptionError(f"option 'onBadRow' must be count or fail, got {on_bad!r}")
    return WriteOptions(
        common=_common(options),
        queue=queues[0] if queues else None,
        replicate=_int(options, "replicate", None, low=1),
        retry=_int(options, "retry", None),
        ttl=_int(options, "ttl", None, low=1),
        delay=_int(options, "delay", None),
        timeout_ms=_int(options, "timeout", 0) or 0,
        batchsize=_int(options, "batchsize", 1000, low=1, high=1_000_000) or 1000,
        async_=_bool(options, "async", False),
        max_body_bytes=_int(options, "maxBodyBytes", 64 * 1024 * 1024, low=1) or 1,
        on_bad_row=on_bad,
    )


@dataclass(frozen=True)
class SnapshotOptions:
    common: Common
    queues: list[str]           # empty: every queue


def snapshot_options(options: Mapping[str, str]) -> SnapshotOptions:
    return SnapshotOptions(_common(options), _queues(options, required=False))


@dataclass(frozen=True)
class StreamOptions:
    common: Common
    queues: list[str]
    max_jobs_per_batch: int
    getjob_count: int           # jobs asked for per GETJOB round trip
    keepalive_s: float          # how often claimed, uncommitted jobs get WORKING
    bodies_in_offset_bytes: int  # bodies up to this total are kept in the offset for replay
    partitions: int


def stream_options(options: Mapping[str, str]) -> StreamOptions:
    keepalive_ms = _int(options, "keepaliveMs", 1000, low=50)
    assert keepalive_ms is not None
    return StreamOptions(
        common=_common(options),
        queues=_queues(options, required=True),
        max_jobs_per_batch=_int(options, "maxJobsPerBatch", 10_000, low=1) or 1,
        getjob_count=_int(options, "getjobCount", 1000, low=1) or 1,
        keepalive_s=keepalive_ms / 1000,
        bodies_in_offset_bytes=_int(options, "bodiesInOffsetBytes", 16 * 1024 * 1024) or 0,
        partitions=_int(options, "partitions", 2, low=1, high=1024) or 1,
    )
