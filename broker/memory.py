"""Memory accounting: what the node holds, counted, as Redis counts its allocator's bytes.

``used_memory`` (INFO, ``maxmemory``) is the sum of counted structures, not the process RSS: an
interpreter's fixed footprint (about 40 MB) is not data and would leave a small ``maxmemory``
no room at all. The RSS is reported beside it (``used_memory_rss``, and
``used_memory_startup`` for the footprint once started).

Counted, and how:

* jobs: body length plus ``job_overhead()`` each (the job object, its ID, its table, scan list,
  timer and queue entries, the body's object), or ``disk_job()`` for a job whose body the
  append log holds, added and removed as jobs are registered and freed, so a burst of
  ADDJOBs is judged before the next sample; a job replicated to other nodes (``repl`` > 1)
  ``CLUSTER_JOB_BYTES`` more (its own lists of the nodes holding and confirming a copy);
* queues: ``QUEUE_BYTES`` each; ADDJOBs waiting for their replication: ``REPL_WAIT_BYTES`` each;
* job outcomes kept (RESOLVE, WAITJOB: broker/results.py): the result plus ``OUTCOME_BYTES``;
* what the runtime holds (``Broker.runtime_bytes``, set by the node once a second, at INFO and
  before a body of 1 MB or more is judged): client query and output buffers plus
  ``CLIENT_BYTES`` per connection, and the append log's open batch and rewrite buffer.

The constants were measured with ``python -m bench.job_memory`` (tracemalloc on the pure
core, RSS growth on the compiled one) and rounded up; docs/limits.md gives the figures.
"""

from __future__ import annotations

from typing import Final

from protocol import core_build

# A job's cost beyond its body's length while the body is in memory (the body's bytes object
# adds its header and the allocator's rounding, about 45 B): traced 417 B queued / 441 B
# active on the pure core, 323 / 315 on the compiled one (RSS growth 351-374 B compiled, 452
# pure; 100,000 jobs of 100 bytes).
JOB_OVERHEAD_PURE: Final = 450
JOB_OVERHEAD_COMPILED: Final = 350
# A job whose body the append log holds (body-memory-max), its body's place included (two
# words of the job's own compiled, two int objects interpreted): traced 290 B queued / 282 B
# active compiled (RSS growth 301 / 334), 448 / 472 pure (RSS 471); 100,000 jobs. The job
# table's share per job shrinks as it fills, so 10 million such jobs take less each.
DISK_JOB_PURE: Final = 470
DISK_JOB_COMPILED: Final = 300
# A queue: the object, its name, its list, waiters deque, table and scan entries (traced
# about 1,030 B for a 12-byte name, either core).
QUEUE_BYTES: Final = 1_030
# A replicated job holds its own tuples of the nodes that have a copy and that confirmed one,
# and a copy received from a peer its own queue name (the holders' node IDs are strings the
# node shares: cluster/job_messages.py): 3-node cluster, REPLICATE 3, traced 687 B per copy
# of a 200-byte job in the pure core and 561 compiled, 650 and 550 counted without this
# (tests/cluster/jobsim.py).
CLUSTER_JOB_BYTES: Final = 40
# An ADDJOB blocked until its job is replicated: its wait record and table entry.
REPL_WAIT_BYTES: Final = 200
# A job outcome kept (broker/results.py): its list, table entry and ID, without the result:
# traced 145 B on the pure core (20,000 outcomes) plus the 73 B of an ID no job holds any more.
OUTCOME_BYTES: Final = 240
# A client connection's objects (socket, parser, client record, reply lists, epoll entry),
# without its buffers: RSS growth per idle connection 680 B compiled, 975 B pure (500 clients).
CLIENT_BYTES: Final = 1_000


def job_overhead() -> int:
    """The per-job constant of the core that runs (the compiled core's objects are smaller)."""
    return JOB_OVERHEAD_COMPILED if core_build.kind() == "compiled" else JOB_OVERHEAD_PURE


def disk_job() -> int:
    """What a job whose body the log holds costs, on the core that runs."""
    return DISK_JOB_COMPILED if core_build.kind() == "compiled" else DISK_JOB_PURE


def warning_level(used: int, limit: int) -> int:
    """Disque's getMemoryWarningLevel: 0 fine, 1 above 75 % of ``limit``, 2 above 95 % (0
    with no limit). Disque's level 3 (above 95 % and above the RSS) never happens here: the
    RSS includes the interpreter, which ``used`` does not count."""
    if not limit:
        return 0
    if used > limit // 100 * 95:
        return 2
    if used > limit // 100 * 75:
        return 1
    return 0
