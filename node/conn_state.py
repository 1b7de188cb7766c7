"""A client connection's state and the moves between them: compiled with mypyc as part of the core.

Theory of operation
-------------------
A connection (``node/conn_core.py``) is at any time in exactly one ``ConnState``, and changes
it only through ``node.conn_core.transition``, which asks ``next_state`` here: a move that is
not in ``ALLOWED`` raises ``ConnStateError`` (a bug met by one connection closes that
connection, see ``ConnCore.crashed``), instead of leaving it in a combination nobody meant.

A state combines three things that change together:

* how far the connection is from its end: OPEN (its input is read and run), DRAINING (the
  client shut its sending side and that end was read: what it sent still runs, its replies
  are written, then it closes), CLOSING (it runs nothing more and closes once its replies are
  written: QUIT, a protocol error, CLIENT KILL of itself; Disque's close-after-reply),
  CLOSED;
* HELD: a turn is running its commands, or ran them and their replies wait for the end of the
  reactor's round (the group commit); replies from elsewhere queue behind them meanwhile, and
  no new turn starts;
* what it waits for, if anything: REPLICATING (synchronous ADDJOBs wait for their copies,
  and the next commands run as long as they are ADDJOBs that may pass them, their replies
  queued behind: ``node/conn_core.py``, "Pipelined ADDJOBs") or BLOCKED (a command waits for
  a ``Reply`` effect: GETJOB with nothing to deliver, a synchronous ADDJOB of a client that
  cannot pipeline them, or a command that may not pass the waiting ADDJOBs, or one more
  ADDJOB than ``MAX_ADDJOBS_WAITING``); the commands behind a BLOCKED one wait in the buffer.

HELD, REPLICATING and BLOCKED happen in OPEN and DRAINING alike (a client may send ``PING``
then a GETJOB that blocks and shut down its side, all in one packet), so each combination is
a state. ``ALLOWED`` lists every move by name, and ``tests/server/test_conn_states.py`` tries
every pair of states against it; the moves that add or drop one part (``to_held``,
``to_unheld``, ``to_blocked``, ``to_replicating``, ``to_unblocked``, ``to_draining``) are
looked up in tables made from each state's parts.

What stays a plain field of the connection, because it varies independently of the state:

* ``sending``: a sender task is writing what the socket did not take; output may be pending
  in any state but CLOSED (a blocked client's earlier replies, a draining client's last ones);
* ``parks``: how many tasks hold the connection out of the epoll (a counter, and the sender
  task and the connection's own task may hold it at once);
* the reactor's bookkeeping (``node/reactor_core.py``): ``queued`` (in the run queue),
  ``fresh`` (accepted, not served yet: the accept loop's back-pressure counts it),
  ``registered`` (in the epoll, which follows ``parks`` and the state);
* events reported by the epoll and not yet acted on: ``readable``, ``hup`` (the peer shut its
  sending side: a turn reads to the end rather than once);
* ``backlog``: the buffer holds commands a turn's budget left for the next round;
* the pipelined ADDJOBs' bookkeeping: ``waiting`` (the replies owed, in order), ``awaited``
  (how many of them are ``Reply`` effects still to come) and ``deferred`` (the command that
  may not pass them).

Hot path: a connection changes state twice per turn (HELD at its start, released at the end
of the round). Those two moves and the predicates are pointer compares with the ``Final``
aliases below (C statics, compiled); the other moves look the table up, which is the C code of
dicts and sets because ``ConnState`` hashes by identity (an ``Enum`` hashes its name, in
Python code, even compiled).
"""

from __future__ import annotations

import enum
from typing import Final


class ConnState(enum.Enum):
    OPEN = "open"
    HELD = "held"
    BLOCKED = "blocked"
    BLOCKED_HELD = "blocked-held"
    DRAINING = "draining"
    DRAINING_HELD = "draining-held"
    DRAINING_BLOCKED = "draining-blocked"
    DRAINING_BLOCKED_HELD = "draining-blocked-held"
    REPLICATING = "replicating"
    REPLICATING_HELD = "replicating-held"
    DRAINING_REPLICATING = "draining-replicating"
    DRAINING_REPLICATING_HELD = "draining-replicating-held"
    CLOSING = "closing"
    CLOSING_HELD = "closing-held"
    CLOSED = "closed"

    # By identity, as members compare: C code, where Enum's own hashes the name in Python.
    __hash__ = object.__hash__


class ConnStateError(Exception):
    """A connection was asked to make a move its state does not allow (a bug)."""


_S = ConnState

#: Every legal move, grouped by what causes it.
ALLOWED: Final[frozenset[tuple[ConnState, ConnState]]] = frozenset({
    # A turn starts: its commands run, their replies are held.
    (_S.OPEN, _S.HELD), (_S.DRAINING, _S.DRAINING_HELD),
    # The round ended (or the connection's own task finished): the held replies are written.
    (_S.HELD, _S.OPEN), (_S.BLOCKED_HELD, _S.BLOCKED), (_S.DRAINING_HELD, _S.DRAINING),
    (_S.DRAINING_BLOCKED_HELD, _S.DRAINING_BLOCKED), (_S.CLOSING_HELD, _S.CLOSING),
    # A command blocks (it runs in a turn or in the connection's task: always HELD).
    (_S.HELD, _S.BLOCKED_HELD), (_S.DRAINING_HELD, _S.DRAINING_BLOCKED_HELD),
    # The Reply it waited for came (or CLIENT REPLY OFF dropped it).
    (_S.BLOCKED, _S.OPEN), (_S.BLOCKED_HELD, _S.HELD),
    (_S.DRAINING_BLOCKED, _S.DRAINING), (_S.DRAINING_BLOCKED_HELD, _S.DRAINING_HELD),
    # A synchronous ADDJOB waits for its copies, the commands behind it may pass it.
    (_S.HELD, _S.REPLICATING_HELD), (_S.DRAINING_HELD, _S.DRAINING_REPLICATING_HELD),
    # A turn runs the ADDJOBs behind them (or its held replies are written).
    (_S.REPLICATING, _S.REPLICATING_HELD), (_S.DRAINING_REPLICATING, _S.DRAINING_REPLICATING_HELD),
    (_S.REPLICATING_HELD, _S.REPLICATING),
    (_S.DRAINING_REPLICATING_HELD, _S.DRAINING_REPLICATING),
    # A command that may not pass them, or one ADDJOB too many: it waits for their replies.
    (_S.REPLICATING_HELD, _S.BLOCKED_HELD),
    (_S.DRAINING_REPLICATING_HELD, _S.DRAINING_BLOCKED_HELD),
    # Some of their replies came: room for more ADDJOBs (none waits that may not pass).
    (_S.BLOCKED, _S.REPLICATING), (_S.BLOCKED_HELD, _S.REPLICATING_HELD),
    (_S.DRAINING_BLOCKED, _S.DRAINING_REPLICATING),
    (_S.DRAINING_BLOCKED_HELD, _S.DRAINING_REPLICATING_HELD),
    # The last of their replies came.
    (_S.REPLICATING, _S.OPEN), (_S.REPLICATING_HELD, _S.HELD),
    (_S.DRAINING_REPLICATING, _S.DRAINING), (_S.DRAINING_REPLICATING_HELD, _S.DRAINING_HELD),
    # The client's end was read, with commands left to run (before a turn or within one).
    (_S.OPEN, _S.DRAINING), (_S.HELD, _S.DRAINING_HELD),
    # QUIT, a protocol error, CLIENT KILL of itself: in the turn that ran it.
    (_S.HELD, _S.CLOSING_HELD), (_S.DRAINING_HELD, _S.CLOSING_HELD),
    # Closed: from any state but CLOSED (a client gone, a kill, an error, the end).
    *((state, _S.CLOSED) for state in ConnState if state is not _S.CLOSED),
})

_NEXT: Final[dict[ConnState, frozenset[ConnState]]] = {
    state: frozenset(new for old, new in ALLOWED if old is state) for state in ConnState}

# Each state's parts: how far from its end, what it waits for, held.
_PARTS: Final[dict[ConnState, tuple[str, str, bool]]] = {
    _S.OPEN: ("open", "", False), _S.HELD: ("open", "", True),
    _S.BLOCKED: ("open", "blocked", False), _S.BLOCKED_HELD: ("open", "blocked", True),
    _S.REPLICATING: ("open", "replicating", False),
    _S.REPLICATING_HELD: ("open", "replicating", True),
    _S.DRAINING: ("draining", "", False), _S.DRAINING_HELD: ("draining", "", True),
    _S.DRAINING_BLOCKED: ("draining", "blocked", False),
    _S.DRAINING_BLOCKED_HELD: ("draining", "blocked", True),
    _S.DRAINING_REPLICATING: ("draining", "replicating", False),
    _S.DRAINING_REPLICATING_HELD: ("draining", "replicating", True),
    _S.CLOSING: ("closing", "", False), _S.CLOSING_HELD: ("closing", "", True),
    _S.CLOSED: ("closed", "", False),
}
_BY_PARTS: Final = {parts: state for state, parts in _PARTS.items()}


def _variants(end: str | None = None, wait: str | None = None,
              held: bool | None = None) -> dict[ConnState, ConnState]:
    """Each state that has a variant with these parts changed -> that variant."""
    found = {}
    for state, (old_end, old_wait, old_held) in _PARTS.items():
        parts = (old_end if end is None else end, old_wait if wait is None else wait,
                 old_held if held is None else held)
        variant = _BY_PARTS.get(parts)
        if variant is not None and variant is not state:
            found[state] = variant
    return found


_HELD_OF: Final = _variants(held=True)
_UNHELD_OF: Final = _variants(held=False)
_BLOCKED_OF: Final = _variants(wait="blocked")
_REPLICATING_OF: Final = _variants(wait="replicating")
_UNBLOCKED_OF: Final = _variants(wait="")
_DRAINING_OF: Final = _variants(end="draining")
_HELD_STATES: Final = frozenset(state for state, parts in _PARTS.items() if parts[2])
_BLOCKED_STATES: Final = frozenset(s for s, parts in _PARTS.items() if parts[1] == "blocked")
_REPLICATING_STATES: Final = frozenset(
    s for s, parts in _PARTS.items() if parts[1] == "replicating")
_DRAINING_STATES: Final = frozenset(s for s, parts in _PARTS.items() if parts[0] == "draining")

OPEN: Final = ConnState.OPEN
HELD: Final = ConnState.HELD
BLOCKED: Final = ConnState.BLOCKED
BLOCKED_HELD: Final = ConnState.BLOCKED_HELD
DRAINING: Final = ConnState.DRAINING
DRAINING_HELD: Final = ConnState.DRAINING_HELD
DRAINING_BLOCKED: Final = ConnState.DRAINING_BLOCKED
DRAINING_BLOCKED_HELD: Final = ConnState.DRAINING_BLOCKED_HELD
REPLICATING: Final = ConnState.REPLICATING
REPLICATING_HELD: Final = ConnState.REPLICATING_HELD
DRAINING_REPLICATING: Final = ConnState.DRAINING_REPLICATING
DRAINING_REPLICATING_HELD: Final = ConnState.DRAINING_REPLICATING_HELD
CLOSING: Final = ConnState.CLOSING
CLOSING_HELD: Final = ConnState.CLOSING_HELD
CLOSED: Final = ConnState.CLOSED


# The two moves of every turn (see next_state).
assert (OPEN, HELD) in ALLOWED and (HELD, OPEN) in ALLOWED


def next_state(old: ConnState, new: ConnState) -> ConnState:
    """``new``, if a connection in ``old`` may move to it; otherwise ``ConnStateError``."""
    if (old is OPEN and new is HELD) or (old is HELD and new is OPEN):
        return new  # every turn's two moves: pointer compares, no lookup
    if new not in _NEXT[old]:
        raise ConnStateError(f"connection state {old.name} -> {new.name} is not allowed")
    return new


# The predicates the per-request path asks: pointer compares (the sets spell them for tests).

def is_held(state: ConnState) -> bool:
    return (state is HELD or state is BLOCKED_HELD or state is DRAINING_HELD
            or state is DRAINING_BLOCKED_HELD or state is CLOSING_HELD
            or state is REPLICATING_HELD or state is DRAINING_REPLICATING_HELD)


def is_blocked(state: ConnState) -> bool:
    return (state is BLOCKED or state is BLOCKED_HELD or state is DRAINING_BLOCKED
            or state is DRAINING_BLOCKED_HELD)


def is_replicating(state: ConnState) -> bool:
    """ADDJOBs wait for their copies; more ADDJOBs may run behind them."""
    return (state is REPLICATING or state is REPLICATING_HELD or state is DRAINING_REPLICATING
            or state is DRAINING_REPLICATING_HELD)


def is_waiting(state: ConnState) -> bool:
    """Blocked or replicating: replies this connection has not had yet will come as ``Reply``
    effects (CLIENT LIST's flag ``b``; never closed as idle)."""
    return is_blocked(state) or is_replicating(state)


def is_draining(state: ConnState) -> bool:
    """The client's end was read: nothing more to read (DRAINING with or without the rest)."""
    return (state is DRAINING or state is DRAINING_HELD or state is DRAINING_BLOCKED
            or state is DRAINING_BLOCKED_HELD or state is DRAINING_REPLICATING
            or state is DRAINING_REPLICATING_HELD)


def is_closing(state: ConnState) -> bool:
    """Runs nothing more: closes once its replies are written (or is closed)."""
    return state is CLOSING or state is CLOSING_HELD or state is CLOSED


# The moves to a variant: ``state`` itself when it has none, which transition() refuses.

def to_held(state: ConnState) -> ConnState:
    """The state a turn starting in ``state`` moves to."""
    return _HELD_OF.get(state, state)


def to_unheld(state: ConnState) -> ConnState:
    """``state`` with its held replies written."""
    if state is HELD:
        return OPEN  # every turn's
    return _UNHELD_OF.get(state, state)


def to_blocked(state: ConnState) -> ConnState:
    return _BLOCKED_OF.get(state, state)


def to_replicating(state: ConnState) -> ConnState:
    return _REPLICATING_OF.get(state, state)


def to_unblocked(state: ConnState) -> ConnState:
    """``state`` waiting for nothing (from BLOCKED or REPLICATING alike)."""
    return _UNBLOCKED_OF.get(state, state)


def to_draining(state: ConnState) -> ConnState:
    """``state`` once the client's end was read (OPEN's variants -> DRAINING's)."""
    return _DRAINING_OF.get(state, state)
