"""Configuration: Disque's directives, its file format, CONFIG GET/SET/REWRITE.

Theory of operation
-------------------
``DIRECTIVES`` is the one table of every directive: its kind (how a value is read and
shown), default, whether ``CONFIG SET`` may change it at run time, and a one-line help text
that ``conf/trisque.conf`` repeats. ``Config`` holds the current values as attributes named
after the directive (``cluster-node-timeout`` -> ``cluster_node_timeout``) so the hot path reads
plain attributes. Files are read like Redis reads them: one directive per line, arguments
split with Redis's quoting rules, ``#`` comments; command-line ``--name value`` options are
applied after the file, as extra lines. An unknown directive or a bad value stops the start
with the line that caused it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protocol.resp import ProtocolError, split_args


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Directive:
    name: str
    kind: str  # bool | int | memory | enum:a,b,c | string | list | obuf
    default: Any
    runtime: bool  # may CONFIG SET change it?
    help: str


_D = Directive
DIRECTIVES: dict[str, Directive] = {
    d.name: d
    for d in [
        _D("port", "int", 7711, False, "TCP port for clients (0: none, with tls-port); the cluster bus uses port + 10000."),
        _D("bind", "list", "", False, "Addresses to listen on (default: all interfaces)."),
        _D("http-port", "int", 0, False, "TCP port of the HTTP API (docs/http.md), the dashboard (/) and Prometheus metrics (/metrics, docs/dashboard.md) on the bind addresses; 0: off."),
        _D("tcp-backlog", "int", 511, False, "listen() backlog."),
        _D("timeout", "int", 0, True, "Close a client idle this many seconds, unless blocked in GETJOB (0: never)."),
        _D("tcp-keepalive", "int", 0, True, "Send TCP keepalives to clients every this many seconds (0: off)."),
        _D("unixsocket", "string", "", False, "Accepted for compatibility; trisque listens on TCP only."),
        _D("unixsocketperm", "int", 0, False, "Accepted for compatibility (unix socket permissions)."),
        _D("daemonize", "bool", False, False, "Accepted for compatibility; trisque runs in the foreground."),
        _D("pidfile", "string", "", False, "Write the process ID to this file (empty: none)."),
        _D("loglevel", "enum:debug,verbose,notice,warning", "notice", True, "Log verbosity."),
        _D("logfile", "string", "", False, "Log file name (empty: standard output)."),
        _D("syslog-enabled", "bool", False, False, "Accepted for compatibility; not used."),
        _D("syslog-ident", "string", "disque", False, "Accepted for compatibility; not used."),
        _D("syslog-facility", "string", "local0", False, "Accepted for compatibility; not used."),
        _D("databases", "int", 16, False, "Accepted for compatibility; jobs have no databases."),
        _D("dir", "string", ".", False, "Working directory: the append log and cluster file live here."),
        _D("requirepass", "string", "", True, "Password clients must give with AUTH (empty: none)."),
        _D("aclfile", "string", "", False, "File of ACL users (docs/security.md), one 'user <name> <rules>' per line, read at start and by ACL LOAD, rewritten by ACL SAVE and whenever users change (empty: users live in memory and the cluster only)."),
        _D("protected-mode", "bool", True, True, "With no password for the default user and no ACL user with a password, answer clients from non-loopback addresses with DENIED, and let the cluster bus accept only loopback peers unless cluster-secret is set (docs/security.md)."),
        _D("maxclients", "int", 10000, True, "Maximum number of connected clients."),
        _D("maxmemory", "memory", 1073741824, True, "Memory limit in bytes (units: kb mb gb)."),
        _D("maxmemory-policy", "enum:acks,noeviction", "acks", True, "Disque's values: acks (acknowledged jobs are collected first under memory pressure) or noeviction."),
        _D("maxmemory-samples", "int", 5, True, "Accepted for compatibility."),
        _D("appendonly", "bool", False, True, "Keep an append log of jobs so they survive restarts."),
        _D("appendfilename", "string", "trisque.aof", False, "Name of the append log in dir."),
        _D("appendfsync", "enum:always,everysec,no", "everysec", True, "When the log is fsynced: always (group commit), everysec, no."),
        _D("body-memory-max", "memory", 256, False, "With appendonly, bodies longer than this are kept in the log, not in memory (0: all in memory)."),
        _D("maxdisk", "memory", 0, True, "Refuse ADDJOB and copies from other nodes once the append log is this big (0: no limit)."),
        _D("no-appendfsync-on-rewrite", "bool", False, True, "Skip fsync while a rewrite runs."),
        _D("auto-aof-rewrite-percentage", "int", 100, True, "Rewrite the log when it grew by this percentage (0: never)."),
        _D("auto-aof-rewrite-min-size", "memory", 67108864, True, "Do not rewrite automatically below this size."),
        _D("aof-load-truncated", "bool", True, True, "Load a log whose last record is torn (truncating it)."),
        _D("aof-enqueue-jobs-once", "bool", False, True, "Restore queues exactly at next start (set by a controlled restart)."),
        _D("aof-rewrite-incremental-fsync", "bool", True, True, "fsync the rewritten log every 32 MB while writing it."),
        _D("aof-rewrite-on-shutdown", "bool", True, True, "On SIGTERM/SIGINT with appendonly yes, end with a snapshot that restores queues exactly at the next start, as SHUTDOWN REWRITE-AOF does (no: Disque's way, queued jobs come back after their retry time)."),
        _D("slowlog-log-slower-than", "int", 10000, True, "Accepted for compatibility."),
        _D("slowlog-max-len", "int", 128, True, "Accepted for compatibility."),
        _D("latency-monitor-threshold", "int", 0, True, "Accepted for compatibility."),
        _D("hz", "int", 10, True, "Background task frequency (timers, eviction) per second."),
        _D("watchdog-period", "int", 0, True, "Accepted for compatibility."),
        _D("activerehashing", "bool", True, True, "Accepted for compatibility."),
        _D("client-output-buffer-limit", "obuf", "normal 0 0 0", True, "Output buffer limits of clients as Redis's normal class: 'normal <hard> <soft> <soft-seconds>' (units: kb mb gb; 0: no limit). A client whose unsent replies pass the hard limit, or stay past the soft limit that many seconds, is closed."),
        _D("client-query-buffer-limit", "memory", 1073741824, True, "Largest input a client may have pending (unparsed bytes plus a command read in part); past it the client is closed, as Redis does. At least 1mb."),
        _D("job-max-body-len", "memory", 134217728, True, "The largest job body ADDJOB accepts (units: kb mb gb; 1mb to 512mb, the client port's own limit for one argument). Every job must fit in one cluster bus frame to be replicated or moved to another node; past it ADDJOB answers an error naming this directive. Give every node of a cluster the same value: a node refuses bus frames too big for its own."),
        _D("cluster-node-timeout", "int", 15000, True, "Milliseconds after which an unreachable node is failing."),
        _D("needjobs-adhoc-min-delay", "int", 25, True, "Federation: milliseconds between NEEDJOBS to a queue's recent sources, doubling after each one sent without a reply, from this (Disque's 25)."),
        _D("needjobs-adhoc-max-delay", "int", 2000, True, "Federation: the largest delay between NEEDJOBS to a queue's recent sources, in milliseconds (Disque's 2000)."),
        _D("needjobs-bcast-min-delay", "int", 2000, True, "Federation: milliseconds between NEEDJOBS broadcasts to the whole cluster, doubling after each one, from this (Disque's 2000); reset when a new source answers."),
        _D("needjobs-bcast-max-delay", "int", 30000, True, "Federation: the largest delay between NEEDJOBS broadcasts to the whole cluster, in milliseconds (Disque's 30000)."),
        _D("timer-min-period", "int", 60, True, "The shortest period TIMER ADD accepts, in seconds (rq's rule: at least 60). A default, not a limit: lower it to 1 for timers of a few seconds."),
        _D("result-max-size", "memory", 1048576, True, "The largest result RESOLVE accepts (units: kb mb gb). Results are kept in memory (counted in used_memory) and in the append log on every node that holds the job, and travel in one bus frame: keep it below job-max-body-len."),
        _D("result-ttl", "int", 3600, True, "Seconds a job's outcome (RESOLVE's result, or how a watched job ended) is kept for WAITJOB and chained jobs."),
        _D("cluster-config-file", "string", "nodes.conf", False, "File in dir where the node keeps its ID and peers."),
        _D("cluster-secret", "string", "", False, "Shared secret of the cluster bus: every bus frame carries an HMAC-SHA256 under it, and a frame with a missing or wrong MAC is dropped (empty: no MAC, as Disque's bus). Every node of a cluster needs the same one. CONFIG GET shows whether it is set, never its value."),
        # TLS (docs/security.md): Redis's directive names and defaults; paths relative to dir.
        _D("tls-port", "int", 0, False, "TCP port for TLS clients (0: off), beside port or instead of it (port 0: a TLS-only node, whose cluster bus uses tls-port + 10000)."),
        _D("tls-cert-file", "string", "", True, "The node's certificate (PEM, the chain after it), presented to TLS clients, by the cluster bus (tls-cluster) and by the HTTPS API (http-tls). CONFIG SET loads it again for new connections and links."),
        _D("tls-key-file", "string", "", True, "The certificate's private key (PEM)."),
        _D("tls-key-file-pass", "string", "", True, "The passphrase of an encrypted tls-key-file (CONFIG GET shows whether it is set)."),
        _D("tls-ca-cert-file", "string", "", True, "CA certificates (PEM) that client certificates and peers' certificates are checked against."),
        _D("tls-ca-cert-dir", "string", "", True, "A directory of CA certificates named by hash (openssl rehash), as tls-ca-cert-file."),
        _D("tls-auth-clients", "enum:yes,no,optional", "yes", True, "Mutual TLS: yes (a client must present a certificate signed by the CA), optional (one presented must be valid), no."),
        _D("tls-protocols", "list", "", True, "TLS versions accepted, among TLSv1 TLSv1.1 TLSv1.2 TLSv1.3 (empty: TLSv1.2 TLSv1.3)."),
        _D("tls-ciphers", "string", "", True, "OpenSSL cipher list for TLSv1.2 and below (empty: OpenSSL's default)."),
        _D("tls-ciphersuites", "string", "", True, "TLSv1.3 ciphersuites, colon-separated (empty: OpenSSL's default)."),
        _D("tls-prefer-server-ciphers", "bool", False, True, "Choose the cipher by the node's preference rather than the client's."),
        _D("tls-client-cert-file", "string", "", True, "The certificate the node presents on the bus links it opens to other nodes (empty: tls-cert-file)."),
        _D("tls-client-key-file", "string", "", True, "The private key of tls-client-cert-file."),
        _D("tls-client-key-file-pass", "string", "", True, "The passphrase of tls-client-key-file. CONFIG GET shows whether it is set, never its value."),
        _D("tls-cluster", "bool", False, False, "Mutual TLS on every cluster bus link: a peer must present a certificate signed by the CA, and is shown ours. Every node of a cluster needs it; read at start."),
        _D("http-tls", "bool", False, False, "Serve the HTTP API and the dashboard over HTTPS, with tls-cert-file and tls-key-file."),
    ]
}


# Directives whose value CONFIG GET never shows (CONFIG REWRITE still writes it to the file,
# which is the operator's): the bus secret is a shared key, and anyone who can run CONFIG GET
# could otherwise join a node of their own to the cluster. Shown as "" when unset and as
# HIDDEN_VALUE when set, so an operator can still check that it is configured.
SECRET_DIRECTIVES = frozenset({"cluster-secret", "tls-key-file-pass", "tls-client-key-file-pass"})
HIDDEN_VALUE = "(hidden)"

INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
HZ_MIN, HZ_MAX = 1, 500
# The accepted range of every numeric directive, checked before a value is applied (from a
# file, the command line or CONFIG SET), so no value can break the node later: a keepalive
# past what the kernel takes, maxclients 0, a timeout trio cannot represent. Others: 0 to
# INT32_MAX ("int") or INT64_MAX ("memory").
RANGES: dict[str, tuple[int, int]] = {
    "http-port": (0, 65535),
    "tcp-backlog": (0, 65535),
    "tcp-keepalive": (0, 32767),  # Linux's largest TCP_KEEPIDLE
    "unixsocketperm": (0, 0o777),
    "databases": (1, INT32_MAX),
    "maxclients": (1, INT32_MAX),
    "maxmemory-samples": (1, INT32_MAX),
    "slowlog-log-slower-than": (-1, INT64_MAX),
    "cluster-node-timeout": (1, INT32_MAX),
    "needjobs-adhoc-min-delay": (1, INT32_MAX),
    "needjobs-adhoc-max-delay": (1, INT32_MAX),
    "needjobs-bcast-min-delay": (1, INT32_MAX),
    "needjobs-bcast-max-delay": (1, INT32_MAX),
    "client-query-buffer-limit": (1024 * 1024, INT64_MAX),
    "timer-min-period": (1, INT32_MAX),
    "job-max-body-len": (1024 * 1024, 512 * 1024 * 1024),
    "result-max-size": (0, 512 * 1024 * 1024),
    "result-ttl": (1, INT32_MAX),
}


def value_range(d: Directive) -> tuple[int, int]:
    return RANGES.get(d.name, (0, INT64_MAX if d.kind == "memory" else INT32_MAX))


def attr(name: str) -> str:
    return name.replace("-", "_")


_UNITS = {"b": 1, "k": 1000, "kb": 1024, "m": 1000**2, "mb": 1024**2, "g": 1000**3, "gb": 1024**3}


def _parse_value(d: Directive, args: list[str]) -> Any:
    if d.kind == "list":
        return " ".join(args)
    if len(args) != 1:
        raise ConfigError("wrong number of arguments")
    raw = args[0]
    if d.kind == "bool":
        low = raw.lower()
        if low not in ("yes", "no"):
            raise ConfigError("argument must be 'yes' or 'no'")
        return low == "yes"
    if d.kind in ("int", "memory"):
        low = raw.lower()
        mult = 1
        if d.kind == "memory":
            for unit in ("kb", "mb", "gb", "k", "m", "g", "b"):
                if low.endswith(unit):
                    mult, low = _UNITS[unit], low[: -len(unit)]
                    break
        digits = low[1:] if low.startswith("-") else low
        # isascii: str.isdigit() also accepts digits int() refuses, such as '²'.
        if not (digits.isascii() and digits.isdigit()) or len(low) > 20:
            raise ConfigError("argument must be a number")
        value = int(low) * mult
        if d.name in ("port", "tls-port") and not 0 <= value < 55536:
            raise ConfigError("Invalid port (the cluster bus needs port + 10000 < 65536)")
        if d.name == "hz":
            # As in Disque, hz is a hint: out-of-range values are capped, not refused (above
            # 500 the timer task would spin).
            return min(max(value, HZ_MIN), HZ_MAX)
        least, most = value_range(d)
        if not least <= value <= most:
            raise ConfigError(f"argument must be between {least} and {most}")
        return value
    if d.kind == "obuf":
        return _parse_obuf(" ".join(args))
    if d.kind.startswith("enum:"):
        allowed = d.kind[5:].split(",")
        if raw.lower() not in allowed:
            raise ConfigError(f"argument must be one of: {', '.join(allowed)}")
        return raw.lower()
    return raw


def _parse_obuf(text: str) -> str:
    """``normal <hard> <soft> <seconds>``: only Redis's normal class exists here (trisque has
    no replicas nor pub/sub clients). Returned normalised, sizes in bytes."""
    parts = text.split()
    if len(parts) != 4 or parts[0].lower() != "normal":
        raise ConfigError("Unrecognized client limit class: use 'normal <hard> <soft> <seconds>'")
    memory = DIRECTIVES["maxmemory"]
    hard = _parse_value(memory, [parts[1]])
    soft = _parse_value(memory, [parts[2]])
    seconds = parts[3]
    if not (seconds.isascii() and seconds.isdigit()) or len(seconds) > 9:
        raise ConfigError("Negative number of seconds in soft limit is invalid")
    return f"normal {hard} {soft} {int(seconds)}"


def output_limits(value: str) -> tuple[int, int, int]:
    """(hard bytes, soft bytes, soft seconds) of a ``client-output-buffer-limit`` value."""
    _, hard, soft, seconds = value.split()
    return int(hard), int(soft), int(seconds)


def _show(d: Directive, value: Any) -> str:
    if d.kind == "bool":
        return "yes" if value else "no"
    return str(value)


class Config:
    """Current configuration values, as attributes."""

    # Attributes the runtime also writes (the rest are read through __getattr__'s typing).
    maxclients: int
    appendonly: bool

    def __init__(self) -> None:
        for d in DIRECTIVES.values():
            setattr(self, attr(d.name), d.default)
        self.config_file: str | None = None
        self.explicit: dict[str, str] = {}  # directives set by file/command line/CONFIG SET

    def __getattr__(self, name: str) -> Any:  # for mypy: attributes are set dynamically
        raise AttributeError(name)

    @property
    def client_port(self) -> int:
        """The port the cluster knows this node by, whose + 10000 its bus listens on: ``port``,
        or ``tls-port`` on a TLS-only node (``port 0``)."""
        return int(self.port or self.tls_port)

    def set(self, name: str, args: list[str]) -> None:
        d = DIRECTIVES.get(name.lower())
        if d is None:
            raise ConfigError("Bad directive or wrong number of arguments")
        setattr(self, attr(d.name), _parse_value(d, args))
        self.explicit[d.name] = " ".join(args)

    def get(self, name: str) -> str:
        d = DIRECTIVES[name]
        return _show(d, getattr(self, attr(name)))

    # -- loading ---------------------------------------------------------------------------

    def load_lines(self, lines: list[str], source: str,
                   read_file: Callable[[str], list[str]] | None = None) -> None:
        """Apply configuration lines (a file's or the command line's). ``include FILE`` reads
        FILE with ``read_file``, which the runtime supplies (node/config_file.py): this module
        does no I/O."""
        for lineno, line in enumerate(lines, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                args = [a.decode() for a in split_args(text.encode())]
            except (ProtocolError, UnicodeDecodeError):
                raise ConfigError(_fatal(source, lineno, line, "Unbalanced quotes in configuration line")) from None
            name, values = args[0], args[1:]
            if name.lower() == "include" and len(values) == 1:
                if read_file is None:
                    raise ConfigError(_fatal(source, lineno, line, "include is not allowed here"))
                self.load_lines(read_file(values[0]), values[0], read_file)
                continue
            try:
                self.set(name, values)
            except ConfigError as exc:
                raise ConfigError(_fatal(source, lineno, line, str(exc))) from None

    def load_argv(self, argv: list[str]) -> None:
        """``--directive value ...`` as disque-server takes them, after the file."""
        lines: list[str] = []
        for arg in argv:
            if arg.startswith("--"):
                lines.append(arg[2:])
            elif lines:
                lines[-1] += " " + _quote(arg)
            else:
                raise ConfigError(f"Unexpected argument '{arg}' (directives are given as --name value)")
        self.load_lines(lines, "(command line)")

    # -- CONFIG commands --------------------------------------------------------------------

    def config_get(self, pattern: str) -> list[bytes]:
        out: list[bytes] = []
        for d in DIRECTIVES.values():
            if fnmatch.fnmatchcase(d.name, pattern.lower()):
                value = self.get(d.name)
                if d.name in SECRET_DIRECTIVES and value:
                    value = HIDDEN_VALUE
                out += [d.name.encode(), value.encode()]
        return out

    def config_set(self, name: str, value: str) -> str | None:
        """None on success, else the error text."""
        d = DIRECTIVES.get(name.lower())
        if d is None or not d.runtime:
            return f"Unsupported CONFIG parameter: {name}"
        try:
            args = [a.decode() for a in split_args(value.encode())] if d.kind == "list" else [value]
            self.set(d.name, args)
        except (ConfigError, ProtocolError):
            return f"Invalid argument '{value}' for CONFIG SET '{name}'"
        return None

    def rewritten(self, old: list[str]) -> list[str]:
        """The lines of a config file rewritten with the current settings (CONFIG REWRITE):
        each directive's first line gets its value, repeats go, comments and unknown lines
        stay, explicit settings not in the file are appended."""
        seen: set[str] = set()
        new: list[str] = []
        for line in old:
            text = line.strip()
            if text and not text.startswith("#"):
                try:
                    name = split_args(text.encode())[0].decode().lower()
                except (ProtocolError, IndexError, UnicodeDecodeError):
                    name = ""
                if name in DIRECTIVES:
                    if name in seen:
                        continue
                    seen.add(name)
                    new.append(f"{name} {_quote(self.get(name))}" if DIRECTIVES[name].kind != "list" else f"{name} {self.get(name)}")
                    continue
            new.append(line)
        for name in self.explicit:
            if name not in seen:
                new.append(f"{name} {_quote(self.get(name))}")
        return new


def _quote(value: str) -> str:
    if value and all(c.isprintable() and not c.isspace() and c not in "\"'" for c in value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _fatal(source: str, lineno: int, line: str, reason: str) -> str:
    return (
        "\n*** FATAL CONFIG FILE ERROR ***\n"
        f"Reading the configuration file {source}, at line {lineno}\n"
        f">>> '{line.strip()}'\n{reason}"
    )
