"""A client connection's state machine, table-driven: every allowed move succeeds, every other
one raises and leaves the state as it was (h11's test_state.py style, as
tests/broker/test_job_states.py does for jobs). The table is written out here again, so a
wrong edit of ``node.conn_state.ALLOWED`` fails too."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from node import conn_state
from node.conn_core import ConnCore, transition
from node.conn_state import ConnState, ConnStateError

S = ConnState
ALLOWED = {
    (S.OPEN, S.HELD), (S.DRAINING, S.DRAINING_HELD),  # a turn starts
    # the held replies are written
    (S.HELD, S.OPEN), (S.BLOCKED_HELD, S.BLOCKED), (S.DRAINING_HELD, S.DRAINING),
    (S.DRAINING_BLOCKED_HELD, S.DRAINING_BLOCKED), (S.CLOSING_HELD, S.CLOSING),
    (S.HELD, S.BLOCKED_HELD), (S.DRAINING_HELD, S.DRAINING_BLOCKED_HELD),  # a command blocks
    # its Reply came
    (S.BLOCKED, S.OPEN), (S.BLOCKED_HELD, S.HELD),
    (S.DRAINING_BLOCKED, S.DRAINING), (S.DRAINING_BLOCKED_HELD, S.DRAINING_HELD),
    # a synchronous ADDJOB waits, the ADDJOBs behind it may pass it
    (S.HELD, S.REPLICATING_HELD), (S.DRAINING_HELD, S.DRAINING_REPLICATING_HELD),
    (S.REPLICATING, S.REPLICATING_HELD), (S.DRAINING_REPLICATING, S.DRAINING_REPLICATING_HELD),
    (S.REPLICATING_HELD, S.REPLICATING), (S.DRAINING_REPLICATING_HELD, S.DRAINING_REPLICATING),
    # a command that may not pass them, or the bound
    (S.REPLICATING_HELD, S.BLOCKED_HELD), (S.DRAINING_REPLICATING_HELD, S.DRAINING_BLOCKED_HELD),
    # room again under the bound
    (S.BLOCKED, S.REPLICATING), (S.BLOCKED_HELD, S.REPLICATING_HELD),
    (S.DRAINING_BLOCKED, S.DRAINING_REPLICATING),
    (S.DRAINING_BLOCKED_HELD, S.DRAINING_REPLICATING_HELD),
    # their last reply came
    (S.REPLICATING, S.OPEN), (S.REPLICATING_HELD, S.HELD),
    (S.DRAINING_REPLICATING, S.DRAINING), (S.DRAINING_REPLICATING_HELD, S.DRAINING_HELD),
    (S.OPEN, S.DRAINING), (S.HELD, S.DRAINING_HELD),  # the client's end was read
    (S.HELD, S.CLOSING_HELD), (S.DRAINING_HELD, S.CLOSING_HELD),  # QUIT, protocol error
} | {(state, S.CLOSED) for state in S if state is not S.CLOSED}
REFUSED = sorted(set(itertools.product(S, S)) - ALLOWED, key=str)


@pytest.fixture
def conn() -> ConnCore:
    """A bare ConnCore: the state is all transition() reads or writes (the constructor would
    want a node's reactor, broker and log, typed, when compiled)."""
    return ConnCore.__new__(ConnCore)


def test_the_module_table_is_this_one() -> None:
    assert conn_state.ALLOWED == ALLOWED


@pytest.mark.parametrize("old, new", sorted(ALLOWED, key=str))
def test_allowed(conn: ConnCore, old: ConnState, new: ConnState) -> None:
    conn.state = old
    transition(conn, new)
    assert conn.state is new


@pytest.mark.parametrize("old, new", REFUSED)
def test_refused(conn: ConnCore, old: ConnState, new: ConnState) -> None:
    conn.state = old
    with pytest.raises(ConnStateError, match=f"{old.name} -> {new.name} is not allowed"):
        transition(conn, new)
    assert conn.state is old


@pytest.mark.parametrize("state", list(S))
def test_the_variants_agree_with_the_names(state: ConnState) -> None:
    """The predicates and the variant moves read the member's value: they must say what its
    name says."""
    name = state.name
    assert conn_state.is_held(state) == name.endswith("HELD")
    assert conn_state.is_blocked(state) == ("BLOCKED" in name)
    assert conn_state.is_replicating(state) == ("REPLICATING" in name)
    assert conn_state.is_waiting(state) == ("BLOCKED" in name or "REPLICATING" in name)
    assert conn_state.is_draining(state) == name.startswith("DRAINING")
    assert conn_state.is_closing(state) == (name.startswith("CLOSING") or state is S.CLOSED)
    if (state, conn_state.to_unheld(state)) in ALLOWED:
        assert conn_state.to_unheld(state).name == (name.removesuffix("_HELD")
                                                    if name != "HELD" else "OPEN")
    if (state, conn_state.to_unblocked(state)) in ALLOWED:
        assert conn_state.to_unblocked(state).name == name.replace("BLOCKED_", "").replace(
            "_BLOCKED", "").replace("BLOCKED", "OPEN").replace("REPLICATING_", "").replace(
            "_REPLICATING", "").replace("REPLICATING", "OPEN")
    if (state, conn_state.to_replicating(state)) in ALLOWED:
        assert conn_state.to_replicating(state).name == (
            name.replace("BLOCKED", "REPLICATING") if "BLOCKED" in name
            else name.replace("HELD", "REPLICATING_HELD"))


def test_no_state_is_assigned_outside_the_transition_function() -> None:
    """Every change of a connection's state goes through conn_core.transition (the
    constructor sets the first)."""
    root = Path(__file__).resolve().parents[2]
    offenders = []
    for path in (root / "node").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Attribute) and t.attr == "state":
                        offenders.append(f"{path.name}:{node.lineno}")
    assert sorted(offenders) == ["conn_core.py:" + str(_line_of("self.state: ConnState = OPEN")),
                         "conn_core.py:" + str(_line_of("conn.state = next_state("))], offenders


def _line_of(text: str) -> int:
    path = Path(__file__).resolve().parents[2] / "node" / "conn_core.py"
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} is not in node/conn_core.py")


@pytest.mark.parametrize("state", list(S))
def test_the_predicates_agree_with_the_parts(state: ConnState) -> None:
    """The predicates are written out as compares for speed: they must match the sets."""
    assert conn_state.is_held(state) == (state in conn_state._HELD_STATES)
    assert conn_state.is_blocked(state) == (state in conn_state._BLOCKED_STATES)
    assert conn_state.is_replicating(state) == (state in conn_state._REPLICATING_STATES)
    assert conn_state.is_draining(state) == (state in conn_state._DRAINING_STATES)
