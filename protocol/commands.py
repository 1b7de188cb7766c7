"""Client commands parsed once into small immutable objects.

Theory of operation
-------------------
Each command's parser, ``parse_<command>(argv)``, takes argv (the name included, its arity
already checked) and returns either a command object (immutable and cheap to build on the hot
path) or an ``Error`` reply. The one command table, ``broker/command_table.py``, names each
command's parser next to its arity, flags and handler (the broker's layer: this one may not
import it). All argument validation and its exact error text live here, next to the parser, so
a command that reaches the broker is well formed and the broker only decides things that need
its state. Validation order follows Disque's, since clients see the first failing check.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from protocol import errors
from protocol.jobid import is_valid
from protocol.resp import Error

# ---------------------------------------------------------------------------------------------
# Numbers, as Redis's string2ll reads them: no spaces, no '+', no leading zeros, 64-bit.

# Final here and below: compiled, a Final module global is a C static, any other a dictionary
# lookup by name each time it is read.
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1


def parse_int(raw: bytes) -> int | None:
    # One pass over the bytes (compiled, a byte is a C int): bytes.isdigit() and int(bytes)
    # are each a Python-level call, and every ADDJOB reads at least its timeout.
    n = len(raw)
    if n == 0 or n > 20:
        return None
    negative = raw[0] == 0x2D  # '-'
    i = 1 if negative else 0
    if i == n:
        return None
    if raw[i] == 0x30:  # '0': only "0" itself ("-0" and leading zeros are refused)
        return 0 if n == 1 else None
    value = 0
    while i < n:
        c = raw[i]
        if c < 0x30 or c > 0x39:
            return None
        value = value * 10 + (c - 0x30)
        i += 1
    if negative:
        value = -value
    if value < _INT64_MIN or value > _INT64_MAX:
        return None
    return value


def _timeout(raw: bytes) -> int | Error:
    value = parse_int(raw)
    if value is None:
        return errors.BAD_TIMEOUT
    if value < 0:
        return errors.NEGATIVE_TIMEOUT
    return value


MAX_PARENTS: Final = 1024  # AFTER options of one ADDJOB
DEFAULT_TTL: Final = 24 * 3600  # seconds, when ADDJOB gives no TTL
# The largest DELAY, RETRY and TTL (seconds): what Disque's job structure can hold (uint32).
MAX_JOB_SECONDS: Final = (1 << 32) - 1

# ---------------------------------------------------------------------------------------------
# Command objects


# AddJob and GetJob, the commands of every job's life, are plain (compiled: native) classes
# whose attributes are set once: building a NamedTuple runs its interpreted __new__, about
# 0.4 us per command. Nothing assigns their attributes after __init__ (Final: mypy refuses it).


class AddJob:
    __slots__ = ("queue", "body", "timeout_ms", "replicate", "delay", "retry", "ttl", "maxlen",
                 "async_", "delay_given", "id_key", "priority", "after")

    def __init__(self, queue: bytes, body: bytes, timeout_ms: int, replicate: int | None,
                 delay: int, retry: int | None, ttl: int | None, maxlen: int | None,
                 async_: bool, delay_given: bool = False,
                 id_key: tuple[str, bytes] | None = None, priority: int = 0,
                 after: tuple[bytes, ...] = ()) -> None:
        self.queue: Final = queue
        self.body: Final = body
        self.timeout_ms: Final = timeout_ms
        self.replicate: Final = replicate
        self.delay: Final = delay
        self.retry: Final = retry
        self.ttl: Final = ttl
        self.maxlen: Final = maxlen
        self.async_: Final = async_
        # DELAY given explicitly (even 0): a queue policy's message_delay must not override it.
        self.delay_given: Final = delay_given
        # Set only by a periodic timer's fire (broker/periodic.py), never by a client: the job
        # ID is derived from (node ID for its node field, key) instead of being random, so the
        # fire of one due time has one ID whichever node adds it.
        self.id_key: Final = id_key
        # PRIORITY n (0 to 9, higher served first): a trisque extension (docs/semantics.md).
        self.priority: Final = priority
        # AFTER id ...: held until these jobs are acked or resolved (broker/chains.py).
        self.after: Final = after

    def __repr__(self) -> str:
        return (f"AddJob(queue={self.queue!r}, body={self.body!r}, "
                f"timeout_ms={self.timeout_ms}, replicate={self.replicate}, "
                f"delay={self.delay}, retry={self.retry}, ttl={self.ttl}, "
                f"maxlen={self.maxlen}, async_={self.async_}, "
                f"delay_given={self.delay_given}, id_key={self.id_key!r}, "
                f"priority={self.priority}, after={self.after!r})")


class GetJob:
    __slots__ = ("queues", "timeout_ms", "max_jobs", "nohang", "withcounters")

    def __init__(self, queues: tuple[bytes, ...], timeout_ms: int, max_jobs: int, nohang: bool,
                 withcounters: bool) -> None:
        self.queues: Final = queues
        self.timeout_ms: Final = timeout_ms  # 0: wait forever
        self.max_jobs: Final = max_jobs
        self.nohang: Final = nohang
        self.withcounters: Final = withcounters

    def __repr__(self) -> str:
        return (f"GetJob(queues={self.queues!r}, timeout_ms={self.timeout_ms}, "
                f"max_jobs={self.max_jobs}, nohang={self.nohang}, "
                f"withcounters={self.withcounters})")


class JobsCommand(NamedTuple):
    """ACKJOB, FASTACK, NACK, ENQUEUE, DEQUEUE, DELJOB, WORKING, SHOW: a verb and job IDs."""

    name: str
    ids: tuple[bytes, ...]


_new_tuple: Final = tuple.__new__


class QueueCommand(NamedTuple):
    """QLEN, QSTAT: one queue name."""

    name: str
    queue: bytes


class QPeek(NamedTuple):
    queue: bytes
    n: int  # negative: the newest jobs


class QScan(NamedTuple):
    cursor: int
    hint: int  # COUNT: how many slots to visit per call
    busyloop: bool
    minlen: int | None
    maxlen: int | None
    importrate: int | None


class JScan(NamedTuple):
    cursor: int
    hint: int
    busyloop: bool
    queue: bytes | None
    states: frozenset[str]
    reply_all: bool


class Pause(NamedTuple):
    queue: bytes
    options: tuple[str, ...]  # subset of in, out, all, none, state, bcast


class Generic(NamedTuple):
    """Administrative commands whose arguments the broker reads itself (HELLO, INFO, ...)."""

    name: str
    args: tuple[bytes, ...]


class QPolicy(NamedTuple):
    """QPOLICY CREATE|UPDATE|SET|GET|DEL|LIST|ORIGIN|REDRIVE|PARK (queue policies,
    broker/policies.py; PARK: broker/parking.py).

    ``changes`` holds only the fields given (name -> value; ``redrive`` is ``(max_receives,
    dead_letter_queue)`` or None for NOREDRIVE; ``backoff`` ``(base, max)`` or None;
    REDRIVE's ``job``; PARK's ``exit``, ``log``, ``reason``); ``target`` is the queue name,
    or the job ID for ORIGIN and PARK; ``limit`` is LIST's LIMIT and REDRIVE's COUNT (None:
    no limit)."""

    sub: str
    target: bytes
    changes: tuple[tuple[str, Any], ...] = ()
    offset: int = 0
    limit: int | None = None


class JobRun(NamedTuple):
    """JOBRUN: run records of script workers (broker/runs.py, docs/worker.md).

    Writes (the worker): ``START job-id queue attempt worker pid`` (replies the run token),
    ``STATUS token line``, ``APPEND token offset bytes`` (replies the output size), ``END token
    state exit-code|none reason``. Reads: ``GET job-id``, ``OUTPUT job-id [offset]``, ``LIST
    [RUNNING] [COUNT n]``. Only the fields of the subcommand given are set."""

    sub: str
    job_id: bytes = b""
    token: bytes = b""
    queue: bytes = b""
    text: str = ""  # START: the worker's name; STATUS: the line; END: the reason
    attempt: int = 0
    pid: int = 0
    offset: int = 0
    chunk: bytes = b""
    state: str = ""
    exit_code: int | None = None
    running_only: bool = False
    limit: int = 100


class Timer(NamedTuple):
    """TIMER ADD|DEL|GET|LIST|PAUSE|RESUME|FIRE|HELP (periodic timers, broker/periodic.py).

    ``names`` holds the timer names the subcommand acts on (several for DEL, none for LIST
    and HELP); ADD's fields follow."""

    sub: str
    names: tuple[bytes, ...] = ()
    period: int = 0  # seconds
    queue: bytes = b""
    body: bytes = b""
    params: tuple[bytes, ...] = ()  # ADDJOB options after the timeout, validated
    start_ms: int | None = None  # the first due time (Unix ms); None: now
    replace: bool = False


# ---------------------------------------------------------------------------------------------
# Parsers. Each takes argv (name included) and returns a command or an Error.


# The option words of ADDJOB and GETJOB as clients usually spell them, to their lower case:
# a dictionary lookup instead of a lower() (a Python-level call) per option.
_OPTION_WORDS: Final[dict[bytes, bytes]] = {
    spelling: word
    for word in (b"async", b"replicate", b"delay", b"retry", b"ttl", b"maxlen", b"nohang",
                 b"withcounters", b"timeout", b"count", b"from")
    for spelling in (word, word.upper())}


def _option(raw: bytes) -> bytes:
    word = _OPTION_WORDS.get(raw)
    return word if word is not None else raw.lower()


MAX_PRIORITY: Final = 9


def parse_addjob(argv: list[bytes]) -> AddJob | Error:
    replicate: int | None = None
    delay = 0
    retry: int | None = None
    ttl: int | None = None
    maxlen: int | None = None
    async_ = False
    delay_given = False
    priority = 0
    after: list[bytes] = []
    j = 4
    argc = len(argv)
    while j < argc:
        opt = _option(argv[j])
        last = j == argc - 1
        if opt == b"async":
            async_ = True
            j += 1
            continue
        if last or opt not in (b"replicate", b"delay", b"retry", b"ttl", b"maxlen",
                               b"priority"):
            # trisque's AFTER, after Disque's options (tested here so those pay nothing).
            if opt == b"after" and not last:
                if not is_valid(argv[j + 1]):
                    return errors.BADID
                if argv[j + 1] not in after:
                    after.append(argv[j + 1])
                if len(after) > MAX_PARENTS:
                    return errors.SYNTAX
                j += 2
                continue
            return errors.SYNTAX
        value = parse_int(argv[j + 1])
        # As in Disque, a value that is not a number gets the option's own error text. Disque
        # keeps DELAY, RETRY and TTL in 32-bit fields and silently truncates larger values;
        # trisque refuses them, so nothing out of range reaches the queues or the log.
        if opt == b"replicate":
            if value is None or value <= 0 or value > 65535:
                return errors.BAD_REPLICATE
            replicate = value
        elif opt == b"delay":
            if value is None or value < 0:
                return errors.BAD_DELAY
            if value > MAX_JOB_SECONDS:
                return errors.too_big("DELAY", MAX_JOB_SECONDS)
            delay = value
            delay_given = True
        elif opt == b"retry":
            if value is None or value < 0:
                return errors.BAD_RETRY
            if value > MAX_JOB_SECONDS:
                return errors.too_big("RETRY", MAX_JOB_SECONDS)
            retry = value
        elif opt == b"ttl":
            if value is None or value <= 0:
                return errors.BAD_TTL
            if value > MAX_JOB_SECONDS:
                return errors.too_big("TTL", MAX_JOB_SECONDS)
            ttl = value
        elif opt == b"maxlen":
            if value is None or value <= 0:
                return errors.BAD_MAXLEN
            maxlen = value
        else:
            if value is None or not 0 <= value <= MAX_PRIORITY:
                return errors.BAD_PRIORITY
            priority = value
        j += 2
    timeout = _timeout(argv[3])
    if isinstance(timeout, Error):
        return timeout
    if retry == 0 and replicate is not None and replicate > 1:
        return errors.RETRY0_REPLICATE
    if delay >= (ttl if ttl is not None else DEFAULT_TTL):
        return errors.DELAY_GT_TTL
    if after:
        return AddJob(argv[1], argv[2], timeout, replicate, delay, retry, ttl, maxlen, async_,
                      delay_given, None, priority, tuple(after))
    return AddJob(argv[1], argv[2], timeout, replicate, delay, retry, ttl, maxlen, async_,
                  delay_given, None, priority)


def parse_getjob(argv: list[bytes]) -> GetJob | Error:
    timeout = 0
    count = 1
    nohang = withcounters = False
    j = 1
    argc = len(argv)
    while j < argc:
        opt = _option(argv[j])
        last = j == argc - 1
        if opt == b"nohang":
            nohang = True
        elif opt == b"withcounters":
            withcounters = True
        elif opt == b"timeout" and not last:
            t = _timeout(argv[j + 1])
            if isinstance(t, Error):
                return t
            timeout = t
            j += 1
        elif opt == b"count" and not last:
            c = parse_int(argv[j + 1])
            if c is None or c <= 0:
                return errors.COUNT_POSITIVE
            count = c
            j += 1
        elif opt == b"from" and not last:
            return GetJob(tuple(argv[j + 1 :]), timeout, count, nohang, withcounters)
        else:
            return errors.SYNTAX
        j += 1
    return errors.SYNTAX


def parse_jobs(argv: list[bytes]) -> JobsCommand | Error:
    ids = argv[1:]
    for job_id in ids:
        if not is_valid(job_id):
            return errors.BADID
    # Made as NamedTuple's own __new__ makes it, without that interpreted frame: ACKJOB runs
    # once per job consumed.
    return _new_tuple(JobsCommand, (argv[0].decode("latin-1").upper(), tuple(ids)))


def parse_queue(argv: list[bytes]) -> QueueCommand:
    return QueueCommand(argv[0].decode("latin-1").upper(), argv[1])


def parse_qpeek(argv: list[bytes]) -> QPeek | Error:
    count = parse_int(argv[2])
    if count is None:
        return errors.NOT_INTEGER
    return QPeek(argv[1], count)


def _scan_number(raw: bytes) -> int | Error:
    value = parse_int(raw)
    if value is None:
        return errors.NOT_INTEGER
    return value


class _CursorSlot:
    """Disque takes the first token that is not an option as the cursor; a second is an error."""

    def __init__(self) -> None:
        self.value: int | None = None

    def take(self, raw: bytes) -> Error | None:
        if self.value is not None:
            return errors.SYNTAX
        value = parse_int(raw)
        if value is None or value < 0:
            return errors.BAD_CURSOR
        self.value = value
        return None


def parse_qscan(argv: list[bytes]) -> QScan | Error:
    cursor, count, busyloop = _CursorSlot(), 100, False
    limits: dict[bytes, int | None] = {b"minlen": None, b"maxlen": None, b"importrate": None}
    j = 1
    while j < len(argv):
        opt = argv[j].lower()
        last = j == len(argv) - 1
        if opt == b"busyloop":
            busyloop = True
        elif (opt == b"count" or opt in limits) and not last:  # not (b"count", *limits): mypyc cannot compile it
            value = _scan_number(argv[j + 1])
            if isinstance(value, Error):
                return value
            if opt == b"count":
                count = max(value, 1)
            else:
                limits[opt] = value
            j += 1
        elif (bad := cursor.take(argv[j])) is not None:
            return bad
        j += 1
    return QScan(cursor.value or 0, count, busyloop, limits[b"minlen"], limits[b"maxlen"],
                 limits[b"importrate"])


JOB_STATES = ("wait-repl", "active", "queued", "acked")


def parse_jscan(argv: list[bytes]) -> JScan | Error:
    cursor, count, busyloop = _CursorSlot(), 100, False
    queue: bytes | None = None
    states: set[str] = set()
    reply_all = False
    j = 1
    while j < len(argv):
        opt = argv[j].lower()
        last = j == len(argv) - 1
        if opt == b"busyloop":
            busyloop = True
        elif opt == b"count" and not last:
            value = _scan_number(argv[j + 1])
            if isinstance(value, Error):
                return value
            count = max(value, 1)
            j += 1
        elif opt == b"queue" and not last:
            queue = argv[j + 1]
            j += 1
        elif opt == b"state" and not last:
            state = argv[j + 1].lower().decode("latin-1")
            if state not in JOB_STATES:
                return Error("ERR Invalid job state name")
            states.add(state)
            j += 1
        elif opt == b"reply" and not last:
            kind = argv[j + 1].lower()
            if kind not in (b"all", b"id"):
                return Error("ERR Invalid REPLY type, try ID or ALL")
            reply_all = kind == b"all"
            j += 1
        elif (bad := cursor.take(argv[j])) is not None:
            return bad
        j += 1
    return JScan(cursor.value or 0, count, busyloop, queue, frozenset(states), reply_all)


_PAUSE_OPTIONS = frozenset(("in", "out", "all", "none", "state", "bcast"))


def parse_pause(argv: list[bytes]) -> Pause | Error:
    options = tuple(a.lower().decode("latin-1") for a in argv[2:])
    if any(o not in _PAUSE_OPTIONS for o in options):
        return errors.SYNTAX
    return Pause(argv[1], options)


# mqs's bounds (INT32_MAX) for the policy numbers; each also fits Disque's uint32 job fields.
INT32_MAX = (1 << 31) - 1
_QPOLICY_SUBS = ("CREATE", "UPDATE", "SET", "GET", "DEL", "LIST", "ORIGIN", "REDRIVE", "PARK")


def _policy_number(raw: bytes, name: str, low: int) -> int | Error:
    value = parse_int(raw)
    if value is None or value < low or value > INT32_MAX:
        return errors.err(f"{name} must be an integer between {low} and {INT32_MAX}")
    return value


def _qpolicy_park(argv: list[bytes]) -> QPolicy | Error:
    """QPOLICY PARK job-id exit-code|none log-file reason (a script worker's failed job)."""
    if len(argv) != 6:
        return errors.wrong_arity("qpolicy")
    if not is_valid(argv[2]):
        return errors.BADID
    exit_code: int | None = None
    if argv[3].lower() != b"none":
        exit_code = parse_int(argv[3])
        if exit_code is None or not -INT32_MAX <= exit_code <= INT32_MAX:
            return errors.err("exit code must be an integer or none")
    if len(argv[4]) > 4096 or len(argv[5]) > 4096:
        return errors.err("log file and reason are limited to 4096 bytes")
    return QPolicy("PARK", argv[2], (("exit", exit_code),
                                     ("log", argv[4].decode("utf-8", "replace")),
                                     ("reason", argv[5].decode("utf-8", "replace"))))


def parse_qpolicy(argv: list[bytes]) -> QPolicy | Error:
    sub = argv[1].decode("latin-1").upper()
    if sub not in _QPOLICY_SUBS:
        return errors.unknown_subcommand("QPOLICY", argv[1].decode("utf-8", "replace"))
    if sub == "LIST":
        offset, limit, j = 0, None, 2
        while j < len(argv):
            opt = argv[j].lower()
            if opt not in (b"offset", b"limit") or j + 1 >= len(argv):
                return errors.SYNTAX
            n = parse_int(argv[j + 1])
            if n is None or n < 0:
                return errors.err("OFFSET and LIMIT must be non negative integers")
            if opt == b"offset":
                offset = n
            else:
                limit = n
            j += 2
        return QPolicy(sub, b"", (), offset, limit)
    if len(argv) < 3:
        return errors.wrong_arity("qpolicy")
    target = argv[2]
    if sub == "REDRIVE":
        if len(argv) == 3:
            return QPolicy(sub, target)
        if len(argv) == 5 and argv[3].lower() == b"job":
            if not is_valid(argv[4]):
                return errors.BADID
            return QPolicy(sub, target, (("job", argv[4]),))
        if len(argv) != 5 or argv[3].lower() != b"count":
            return errors.SYNTAX
        n = parse_int(argv[4])
        if n is None or n < 1:
            return errors.err("COUNT must be a positive integer")
        return QPolicy(sub, target, limit=n)
    if sub == "PARK":
        return _qpolicy_park(argv)
    if sub in ("GET", "DEL", "ORIGIN"):
        if len(argv) != 3:
            return errors.SYNTAX
        if sub == "ORIGIN" and not is_valid(target):
            return errors.BADID
        return QPolicy(sub, target)
    changes: dict[str, Any] = {}
    j = 3
    while j < len(argv):
        opt = argv[j].lower()
        left = len(argv) - j - 1
        value: Any
        if opt == b"noredrive":
            changes["redrive"] = None
            j += 1
            continue
        if opt == b"redrive" and left >= 2:
            value = _policy_number(argv[j + 1], "max_receives", 1)
            if isinstance(value, Error):
                return value
            changes["redrive"] = (value, argv[j + 2])
            j += 3
            continue
        if opt == b"backoff" and left >= 2:
            # BACKOFF base max (seconds); BACKOFF 0 0 turns it off (docs/semantics.md).
            base = _policy_number(argv[j + 1], "backoff base", 0)
            if isinstance(base, Error):
                return base
            top = _policy_number(argv[j + 2], "backoff max", base)
            if isinstance(top, Error):
                return top
            changes["backoff"] = (base, top) if base else None
            j += 3
            continue
        if left < 1:
            return errors.SYNTAX
        if opt == b"retention":
            value = _policy_number(argv[j + 1], "retention_timeout", 1)
            field = "retention_timeout"
        elif opt == b"visibility":
            value = _policy_number(argv[j + 1], "visibility_timeout", 0)
            field = "visibility_timeout"
        elif opt == b"delay":
            value = _policy_number(argv[j + 1], "message_delay", 0)
            field = "message_delay"
        elif opt == b"maxinflight":
            value = _policy_number(argv[j + 1], "MAXINFLIGHT", 0)
            field = "max_inflight"
        elif opt == b"rate":
            value = _policy_number(argv[j + 1], "RATE", 0)
            field = "rate"
        elif opt == b"dedup":
            flag = argv[j + 1].lower()
            if flag not in (b"yes", b"no"):
                return errors.err("DEDUP must be yes or no")
            value, field = flag == b"yes", "message_deduplication"
        else:
            return errors.SYNTAX
        if isinstance(value, Error):
            return value
        changes[field] = value
        j += 2
    return QPolicy(sub, target, tuple(changes.items()))


# The limits of broker/runs.py that a parser can check (the broker's module imports this one).
RUN_LINE_MAX = 1024
RUN_WORKER_MAX = 256
RUN_STATES = ("done", "failed", "resent", "timeout", "stopped")
_JOBRUN_ARITY = {"START": 7, "STATUS": 4, "APPEND": 5, "END": 6, "GET": 3}


def _run_text(raw: bytes, what: str, limit: int) -> str | Error:
    if len(raw) > limit:
        return errors.err(f"{what} longer than {limit} bytes")
    if b"\n" in raw or b"\r" in raw:
        return errors.err(f"{what} must be one line")
    return raw.decode("utf-8", "replace")


def parse_jobrun(argv: list[bytes]) -> JobRun | Error:
    sub = argv[1].decode("latin-1").upper()
    if sub in ("OUTPUT", "LIST"):
        return _jobrun_read(sub, argv)
    arity = _JOBRUN_ARITY.get(sub)
    if arity is None:
        return errors.unknown_subcommand("JOBRUN", argv[1].decode("utf-8", "replace"))
    if len(argv) != arity:
        return errors.err(f"wrong number of arguments for 'jobrun|{sub.lower()}' command")
    if sub == "START":
        _, _, job_id, queue, attempt_raw, worker_raw, pid_raw = argv
        if not is_valid(job_id):
            return errors.BADID
        attempt, pid = parse_int(attempt_raw), parse_int(pid_raw)
        if attempt is None or attempt < 1:
            return errors.err("attempt must be a positive integer")
        if pid is None or pid < 0:
            return errors.err("pid must be a non negative integer")
        worker = _run_text(worker_raw, "worker name", RUN_WORKER_MAX)
        if isinstance(worker, Error):
            return worker
        if not worker:
            return errors.err("worker name must not be empty")
        return JobRun(sub, job_id=job_id, queue=queue, attempt=attempt, text=worker, pid=pid)
    if sub == "GET":
        return JobRun(sub, job_id=argv[2]) if is_valid(argv[2]) else errors.BADID
    token = argv[2]
    if sub == "STATUS":
        line = _run_text(argv[3], "status line", RUN_LINE_MAX)
        return line if isinstance(line, Error) else JobRun(sub, token=token, text=line)
    if sub == "APPEND":
        offset = parse_int(argv[3])
        if offset is None or offset < 0:
            return errors.err("offset must be a non negative integer")
        return JobRun(sub, token=token, offset=offset, chunk=argv[4])
    state = argv[3].decode("latin-1").lower()
    if state not in RUN_STATES:
        return errors.err("state must be one of " + ", ".join(RUN_STATES))
    exit_code = None if argv[4].lower() == b"none" else parse_int(argv[4])
    if exit_code is None and argv[4].lower() != b"none":
        return errors.err("exit code must be an integer or none")
    reason = _run_text(argv[5], "reason", RUN_LINE_MAX)
    if isinstance(reason, Error):
        return reason
    return JobRun(sub, token=token, state=state, exit_code=exit_code, text=reason)


def _jobrun_read(sub: str, argv: list[bytes]) -> JobRun | Error:
    if sub == "OUTPUT":
        if len(argv) not in (3, 4):
            return errors.err("wrong number of arguments for 'jobrun|output' command")
        if not is_valid(argv[2]):
            return errors.BADID
        offset = parse_int(argv[3]) if len(argv) == 4 else 0
        if offset is None or offset < 0:
            return errors.err("offset must be a non negative integer")
        return JobRun(sub, job_id=argv[2], offset=offset)
    running_only, count, j = False, 100, 2
    while j < len(argv):
        opt = argv[j].lower()
        if opt == b"running":
            running_only = True
        elif opt == b"count" and j + 1 < len(argv):
            n = parse_int(argv[j + 1])
            if n is None or n <= 0:
                return errors.COUNT_POSITIVE
            count = n
            j += 1
        else:
            return errors.SYNTAX
        j += 1
    return JobRun(sub, running_only=running_only, limit=count)


_TIMER_ARITY = {"ADD": -6, "DEL": -3, "GET": 3, "LIST": 2, "PAUSE": 3, "RESUME": 3, "FIRE": 3,
                "HELP": 2}


def parse_timer(argv: list[bytes]) -> Timer | Error:
    sub = argv[1].decode("latin-1").upper()
    arity = _TIMER_ARITY.get(sub)
    if arity is None:
        return errors.unknown_subcommand("TIMER", argv[1].decode("utf-8", "replace"))
    if (arity > 0 and len(argv) != arity) or len(argv) < -arity:
        return errors.wrong_arity("timer|" + sub.lower())
    if sub != "ADD":
        return Timer(sub, tuple(argv[2:]))
    period = parse_int(argv[3])
    if period is None or not 1 <= period <= MAX_JOB_SECONDS:
        return errors.err(f"period must be a number of seconds between 1 and {MAX_JOB_SECONDS}")
    start_ms: int | None = None
    replace = False
    params: list[bytes] = []
    j = 6
    while j < len(argv):
        opt = argv[j].lower()
        if opt == b"replace":
            replace = True
        elif opt == b"start":
            value = parse_int(argv[j + 1]) if j + 1 < len(argv) else None
            if value is None or value < 0:
                return errors.err("START must be a time in Unix milliseconds")
            start_ms = value
            j += 1
        else:  # an ADDJOB option: checked below by ADDJOB's own parser
            params.append(argv[j])
            if opt != b"async" and j + 1 < len(argv):
                params.append(argv[j + 1])
                j += 1
        j += 1
    checked = parse_addjob([b"ADDJOB", argv[4], argv[5], b"0", *params])
    if isinstance(checked, Error):
        return checked
    return Timer(sub, (argv[2],), period, argv[4], argv[5], tuple(params), start_ms, replace)


class Resolve(NamedTuple):
    """RESOLVE id result: ACKJOB that keeps a result (broker/results.py)."""

    job_id: bytes
    result: bytes


class WaitJob(NamedTuple):
    """WAITJOB id [TIMEOUT ms]: the job's result once it is resolved (broker/results.py)."""

    job_id: bytes
    timeout_ms: int  # 0: wait forever


def parse_resolve(argv: list[bytes]) -> Resolve | Error:
    if not is_valid(argv[1]):
        return errors.BADID
    return Resolve(argv[1], argv[2])


def parse_waitjob(argv: list[bytes]) -> WaitJob | Error:
    if not is_valid(argv[1]):
        return errors.BADID
    if len(argv) == 2:
        return WaitJob(argv[1], 0)
    if len(argv) != 4 or _option(argv[2]) != b"timeout":
        return errors.SYNTAX
    timeout = _timeout(argv[3])
    if isinstance(timeout, Error):
        return timeout
    return WaitJob(argv[1], timeout)


def parse_generic(argv: list[bytes]) -> Generic:
    """The node's own commands (HELLO, INFO, CONFIG, ...): their handlers read the arguments."""
    return Generic(argv[0].decode("latin-1").upper(), tuple(argv[1:]))
