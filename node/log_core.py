"""The append log's per-command path, without trio: compiled with mypyc as part of the core.

Theory of operation
-------------------
``node/persistence.py`` explains the group commit. This module holds the part of it that runs
for every command that logs, and the bookkeeping its readers consult per reply:

* ``route`` (``Server.route`` is this object's bound ``route``): a command's effects sorted
  into log records, handed to ``submit``, and replies for other clients, handed back;
* ``submit``: the records encoded straight into the *open batch*'s buffer with the loop's own
  msgpack packer, kept for the undo, and the batch's ticket returned (0: nothing to wait for);
* the tickets: ``done_ticket`` (every batch up to it finished), ``failure(ticket)``,
  ``last_ticket`` (the newest batch a reply waits for), and ``take_open_batch``.

``LogCore`` is the compiled base of the interpreted ``Persistence``, which adds everything that
waits or writes (the writer task, the fdatasync thread, the rewrite, trio's events). Compiled
code calls a method of an object of an interpreted subclass through Python, so the hot code is
in module functions (``route``, ``submit``, ``finish``) that read the declared attributes
directly; the methods only forward to them for the interpreted callers. The one call out of
this module on the hot path is ``wake_writer`` (the interpreted ``Persistence`` sets trio's
event), and only for records made outside a reactor round: a round commits its own batch at
its end (``Persistence.commit_now``).

A batch holds no ``trio.Event``: ``Persistence`` makes one only for a ticket someone awaits
(``wait_durable``), so the common case (the reactor's round, which reads ``done_ticket`` right
after its commit) builds none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from mypy_extensions import mypyc_attr

from broker import aof
from broker.effects import Effect, LogRecord, Reply

_ADVISORY: Final = aof.ADVISORY_KINDS
# Failures remembered for ``failure(ticket)``: a reply asks right after its batch finished.
MAX_FAILURES_KEPT: Final = 256


class Batch:
    """Records waiting to be written together: the frames in ``data``, the ``LogRecord``s in
    ``entries`` (for the undo of a failed write)."""

    def __init__(self, ticket: int) -> None:
        self.ticket = ticket
        self.entries: list[Any] = []
        self.data = bytearray()
        self.error: str | None = None


@mypyc_attr(allow_interpreted_subclasses=True)
class LogCore:
    """The open batch and the tickets (``node.persistence.Persistence`` is the whole log)."""

    def __init__(self) -> None:
        self.log_on = False  # records are kept and written (Persistence.enabled)
        # True while a reactor round runs: the round commits at its end (``commit_now``), so
        # its records do not wake the writer task.
        self.round_open = False
        self.next_ticket = 1
        self.open_batch = Batch(self.next_ticket)
        self.in_flight: Batch | None = None  # being written by the writer task
        self.done_ticket = 0  # every ticket up to this one is finished
        self.last_ticket = 0  # the newest batch submitted with a record a reply waits for
        self.failed: dict[int, str] = {}  # recent failed tickets -> error (bounded)
        self.pack = aof.new_packer()  # the event loop's own: no pool, no lock

    def wake_writer(self) -> None:
        """Records wait outside a round: the interpreted subclass wakes its writer task."""

    def route(self, effects: list[Effect], replies: list[Reply]) -> int:
        return route(self, effects, replies)

    def submit(self, records: Sequence[Any]) -> int:
        return submit(self, records)

    def failure(self, ticket: int) -> str | None:
        """The error of a finished batch whose write failed, None if it succeeded (asked right
        after it finished: only the last ``MAX_FAILURES_KEPT`` failures are kept)."""
        return self.failed.get(ticket)

    def take_open_batch(self) -> Batch:
        """The open batch, replaced by a new empty one."""
        self.next_ticket += 1
        taken = self.open_batch
        self.open_batch = Batch(self.next_ticket)
        return taken


def route(core: LogCore, effects: list[Effect], replies: list[Reply]) -> int:
    """The one place the broker's effects go where they belong: log records to the open batch
    (dropped while the log is off), replies to other clients into ``replies`` for the caller
    to deliver. The log ticket to wait for, or 0."""
    if len(effects) == 1 and type(effects[0]) is LogRecord:
        return submit(core, effects)  # an ADDJOB's or a GETJOB's one record: the common case
    records: list[Any] = []
    for effect in effects:
        if type(effect) is LogRecord:
            records.append(effect)
        elif type(effect) is Reply:
            replies.append(effect)
    return submit(core, records)


def submit(core: LogCore, records: Sequence[Any]) -> int:
    """Add ``records`` (``LogRecord``s) to the open batch; the ticket to wait for, 0 when there
    is nothing to wait for (no records, only advisory ones, or the log is off: they are
    dropped). Raises what msgpack raises for a record it cannot encode, adding nothing."""
    if not records or not core.log_on:
        return 0
    batch = core.open_batch
    aof.append_records(batch.data, records, core.pack)
    batch.entries.extend(records)
    # Never written here, per command: the reactor's round (commit_now) or the writer task
    # joins the records of every connection served meanwhile into one write(2). Writing per
    # command was measured at about half the ADDJOB throughput (12-13k vs 22-23k ops/s, 50
    # conns).
    if not core.round_open:
        core.wake_writer()
    for record in records:
        if record[0] not in _ADVISORY:
            core.last_ticket = batch.ticket
            return batch.ticket
    return 0  # a GETJOB's dlv: its reply does not wait for the disk


def all_advisory(entries: list[Any]) -> bool:
    """A batch of advisory records only (dlv): no one waits for it, so under ``always`` it is
    written without its own fdatasync; the next batch's fdatasync covers it."""
    for entry in entries:
        if entry[0] not in _ADVISORY:
            return False
    return True


def finish(core: LogCore, batch: Batch, error: str | None) -> None:
    """``batch`` is written (``error`` None) or failed and undone: its ticket is done."""
    batch.error = error
    if batch.ticket > core.done_ticket:
        core.done_ticket = batch.ticket
    if error is not None:
        failed = core.failed
        failed[batch.ticket] = error
        if len(failed) > MAX_FAILURES_KEPT:
            del failed[min(failed)]
