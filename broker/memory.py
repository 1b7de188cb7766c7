"""Memory accounting: what the node holds, counted, as Redis counts its allocator's bytes.

``used_memory`` (INFO, ``maxmemory``) is the sum of counted structures, not the process RSS: an
interpreter's fixed footprint (about 40 MB) is not data and would leave a small ``maxmemory``
no room at all. The RSS is reported beside it (``used_memory_rss``, and
``used_memory_startup`` for the footprint once started).

Counted, and how:

* jobs: body length plus ``job_overhead()`` each (the job object, its ID, its table, scan list,
  timer and queue entries), added and removed as jobs are registered and freed, so a burst of
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

# A job's cost beyond its body: traced 451 B queued / 474 B active on the pure core, 325 / 316
# on the compiled one (RSS growth 360-400 B compiled, 495 pure; 50,000 jobs).
JOB_OVERHEAD_PURE: Final = 480
JOB_OVERHEAD_COMPILED: Final = 350
# A queue: the object, its name, its list, waiters deque, table and scan entries (traced
# about 1,030 B for a 12-byte name, either core).
QUEUE_BYTES: Final = 1_030
# A replicated job holds its own tuples of the nodes that have a copy and that confirmed one,
# and a copy received from a peer its own queue name: 3-node cluster, REPLICATE 3, pure core,
# traced 918 B per copy of a 200-byte job, 810 without this (tests/cluster/jobsim.py).
CLUSTER_JOB_BYTES: Final = 240
# A job whose body the append log holds (body-memory-max): the int holding the body's length
# and CRC-32 in place of the body (its place in the log is a word the job has anyway).
BODY_REF_BYTES: Final = 32
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
