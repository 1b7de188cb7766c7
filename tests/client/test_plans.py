"""The client's rules as plans (client/plans.py), driven here by a scripted performer:
no sockets, every request the plan makes is asserted. Both real flavours drive these plans."""

from __future__ import annotations

from typing import Any

import pytest

from client import commands as cmd
from client.core import (
    NodeSelector,
    ProducerTracker,
    TrisqueConnectionError,
    TrisqueTimeoutError,
)
from client.plans import (
    Acquire,
    Close,
    Exchange,
    Forget,
    Open,
    Release,
    connect_plan,
    run_many_plan,
    run_plan,
)
from protocol.resp import Error


class Conn:
    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address

    def __repr__(self) -> str:
        return f"Conn{self.address}"


class Rules:
    def __init__(self, *seeds: str, password: str | None = None) -> None:
        self.selector = NodeSelector(list(seeds))
        self.tracker = ProducerTracker()
        self.password = password
        self.socket_timeout = 5.0
        self.cluster_aware = True
        self.rebalance_consumers = False
        self.hello_reply = None
        self.net_errors = (OSError,)
        self.acquire_errors = (OSError,)


def drive(plan, respond) -> tuple[list[Any], Any]:
    """Run ``plan``; ``respond(request)`` returns a result or an exception to throw in."""
    seen: list[Any] = []
    try:
        request = next(plan)
        while True:
            seen.append(request)
            outcome = respond(request)
            request = plan.throw(outcome) if isinstance(outcome, BaseException) else plan.send(outcome)
    except StopIteration as stop:
        return seen, stop.value


NODE_A = "a" * 40
NODE_B = "b" * 40


def hello_reply(current: str) -> list[Any]:
    return [1, current.encode(), [NODE_A.encode(), b"127.0.0.1", b"7001", b"10"],
            [NODE_B.encode(), b"127.0.0.1", b"7002", b"1"]]


def test_connect_skips_a_dead_seed_then_moves_to_the_better_node_hello_names() -> None:
    rules = Rules("127.0.0.1:7009", "127.0.0.1:7001")
    rules.selector.rng.seed(0)

    def respond(req: Any) -> Any:
        if isinstance(req, Open):
            return ConnectionRefusedError(111, "Connection refused") if req.address[1] == 7009 \
                else Conn(req.address)
        if isinstance(req, Exchange):
            return [hello_reply(NODE_A)]
        return None

    seen, conn = drive(connect_plan(rules), respond)
    opened = [r.address for r in seen if isinstance(r, Open)]
    assert ("127.0.0.1", 7002) in opened and conn.address == ("127.0.0.1", 7002)
    assert any(isinstance(r, Close) and r.conn.address == ("127.0.0.1", 7001) for r in seen)
    assert rules.selector.current_id == NODE_B


def test_no_node_reachable_names_every_address_tried() -> None:
    rules = Rules("127.0.0.1:7009")
    with pytest.raises(TrisqueConnectionError, match="7009.*refused"):
        drive(connect_plan(rules), lambda r: ConnectionRefusedError(111, "Connection refused"))


def test_a_wrong_password_closes_the_connection_and_raises() -> None:
    rules = Rules("127.0.0.1:7001", password="nope")
    closed = []

    def respond(req: Any) -> Any:
        if isinstance(req, Open):
            return Conn(req.address)
        if isinstance(req, Exchange):
            return [Error("WRONGPASS invalid username-password pair")]
        closed.append(req)
        return None

    with pytest.raises(Exception, match="WRONGPASS"):
        drive(connect_plan(rules), respond)
    assert closed and isinstance(closed[0], Close)


def _run(call, outcomes: list[Any]) -> tuple[list[Any], Any]:
    rules = Rules("127.0.0.1:7001")
    rules.selector.current = ("127.0.0.1", 7001)
    replies = iter(outcomes)

    def respond(req: Any) -> Any:
        if isinstance(req, Acquire):
            return Conn(("127.0.0.1", 7001))
        if isinstance(req, Exchange):
            return next(replies)
        return None

    return drive(run_plan(rules, call), respond)


def test_a_safe_command_is_sent_again_after_a_broken_connection() -> None:
    seen, result = _run(cmd.qlen("q"), [ConnectionResetError(104, "reset"), [7]])
    assert result == 7
    kinds = [type(r) for r in seen]
    assert kinds == [Acquire, Exchange, Close, Forget, Acquire, Exchange, Release]


def test_addjob_is_never_sent_twice_after_a_broken_connection() -> None:
    with pytest.raises(TrisqueConnectionError):
        _run(cmd.add_job("q", b"x"), [ConnectionResetError(104, "reset"), [b"D-..."]])


def test_leaving_moves_to_another_node_and_sends_again() -> None:
    seen, result = _run(cmd.add_job("q", b"x"), [
        [Error("LEAVING This node is leaving the cluster")],
        [b"D-00000000-000000000000000000000000-05a1"]])
    assert result == "D-00000000-000000000000000000000000-05a1"
    assert Forget(("127.0.0.1", 7001), leaving=True) in seen


def test_a_timeout_is_not_a_failover() -> None:
    with pytest.raises(TrisqueTimeoutError, match="QLEN"):
        _run(cmd.qlen("q"), [TimeoutError("timed out")])


def test_a_pipeline_fails_over_when_its_node_died_between_two_commands() -> None:
    # The pooled connection's node is gone: acquiring fails before anything is sent, so even a
    # pipeline holding an ADDJOB may go to another node.
    rules = Rules("127.0.0.1:7001")
    rules.selector.current = ("127.0.0.1", 7001)
    acquires = iter([ConnectionRefusedError(111, "refused"), Conn(("127.0.0.1", 7002))])

    def respond(req: Any) -> Any:
        if isinstance(req, Acquire):
            return next(acquires)
        if isinstance(req, Exchange):
            return [b"D-00000000-000000000000000000000000-05a1", 3]
        return None

    calls = [cmd.add_job("q", b"x"), cmd.qlen("q")]
    seen, result = drive(run_many_plan(rules, calls, True), respond)
    assert result == ["D-00000000-000000000000000000000000-05a1", 3]
    assert [type(r) for r in seen] == [Acquire, Forget, Acquire, Exchange, Release]
    assert Forget(("127.0.0.1", 7001)) in seen


def test_a_pipeline_gives_up_when_no_node_can_be_acquired_twice() -> None:
    rules = Rules("127.0.0.1:7001")
    rules.selector.current = ("127.0.0.1", 7001)

    def respond(req: Any) -> Any:
        if isinstance(req, Acquire):
            return ConnectionRefusedError(111, "refused")
        return None

    with pytest.raises(TrisqueConnectionError):
        drive(run_many_plan(rules, [cmd.qlen("q")], True), respond)
