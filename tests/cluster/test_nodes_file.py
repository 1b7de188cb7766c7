"""nodes.conf: round trip, the legacy one-line file, and every way a line can be corrupt."""

from __future__ import annotations

import pytest

from cluster.nodes_file import NodesFileError, SavedNode, parse, render

A, B, C = "a" * 40, "b" * 40, "c" * 40


def test_round_trip_keeps_every_field() -> None:
    nodes = [
        SavedNode(A, "10.0.0.1", 7711, frozenset({"myself", "leaving"}), 0, 0, True),
        SavedNode(B, "10.0.0.2", 7712, frozenset(), 0, 1795315898269, True),
        SavedNode(C, "10.0.0.3", 7713, frozenset({"pfail", "fail"}), 17, 18, False),
    ]
    text = render(nodes, [("someVar", "1")])
    assert text.splitlines()[:3] == [
        f"{A} 10.0.0.1:7711 myself,leaving 0 0 connected",
        f"{B} 10.0.0.2:7712 noflags 0 1795315898269 connected",
        f"{C} 10.0.0.3:7713 fail?,fail 17 18 disconnected",
    ]
    saved = parse(text)
    assert saved.myself_id == A and list(saved.nodes) == nodes
    assert saved.vars == (("someVar", "1"),)
    assert saved.myself == nodes[0]


def test_handshake_entries_are_not_saved() -> None:
    nodes = [SavedNode(A, "", 7711, frozenset({"myself"}), 0, 0, True),
             SavedNode(B, "10.0.0.2", 7712, frozenset({"handshake"}), 0, 0, False)]
    assert render(nodes) == f"{A} :7711 myself 0 0 connected\n"


def test_the_single_node_file_of_earlier_versions_is_read() -> None:
    saved = parse(f"{A} :7711 myself 0 0 connected\n")
    assert saved.myself_id == A
    assert saved.myself == SavedNode(A, "", 7711, frozenset({"myself"}), 0, 0, True)


def test_blank_lines_are_skipped_and_pfail_is_read_too() -> None:
    saved = parse(f"\n{A} :7711 myself 0 0 connected\n\n{B} 1.2.3.4:1 pfail 0 0 disconnected\n")
    assert saved.nodes[1].flags == {"pfail"}


@pytest.mark.parametrize("text, line, reason", [
    (f"{A} :7711 myself 0 0\n", 1, "expected 6 fields, found 5"),
    (f"{A} :7711 myself 0 0 connected extra\n", 1, "expected 6 fields, found 7"),
    (f"{A[:39]} :7711 myself 0 0 connected\n", 1, "not 40 lowercase hex"),
    (f"{'A' * 40} :7711 myself 0 0 connected\n", 1, "not 40 lowercase hex"),
    (f"{A} 7711 myself 0 0 connected\n", 1, "has no ':port'"),
    (f"{A} :port myself 0 0 connected\n", 1, "port 'port' is not"),
    (f"{A} :70000 myself 0 0 connected\n", 1, "port 70000 is out of range"),
    (f"{A} :7711 myself,master 0 0 connected\n", 1, "unknown flag 'master'"),
    (f"{A} :7711 myself -1 0 connected\n", 1, "ping_sent '-1' is not"),
    (f"{A} :7711 myself 0 x connected\n", 1, "pong_received 'x' is not"),
    (f"{A} :7711 myself 0 0 up\n", 1, "link state 'up'"),
    (f"{A} :7711 myself 0 0 connected\n{A} :7712 noflags 0 0 connected\n", 2, "listed twice"),
    (f"{A} :7711 myself 0 0 connected\n{B} :7712 myself 0 0 connected\n", 2, "second line"),
    (f"{A} :7711 myself 0 0 connected\nvars x\n", 2, "name value pairs"),
    (f"{B} 1.2.3.4:7712 noflags 0 0 connected\n", 0, "no line has the myself flag"),
    ("", 0, "no line has the myself flag"),
    ("\x00\x01garbage\n", 1, "expected 6 fields"),
])
def test_every_corrupt_line_is_refused_with_its_line_and_reason(
        text: str, line: int, reason: str) -> None:
    with pytest.raises(NodesFileError) as caught:
        parse(text)
    assert caught.value.line == line
    assert reason in str(caught.value)
    assert (f"line {line}" if line else "the file") in str(caught.value)
