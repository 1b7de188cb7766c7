"""The sans-IO parts of the client: reply parsing, command building, node choice, rebalance."""

from __future__ import annotations

import random

import pytest

from client import commands as cmd
from client.core import (
    AuthError,
    BadIdError,
    LeavingError,
    MaxLenError,
    NodeSelector,
    NoJobError,
    NoReplicationError,
    PausedError,
    ProducerTracker,
    ResponseError,
    error_from_reply,
    parse_address,
    parse_hello,
)
from client.typed_reply import TypedReplyParser
from protocol.resp import NEED_DATA, Error, Status


def parse_all(data: bytes) -> list[object]:
    p = TypedReplyParser()
    p.feed(data)
    out = []
    while (v := p.next()) is not NEED_DATA:
        out.append(v)
    return out


def test_typed_parser_keeps_status_bulk_and_error_apart() -> None:
    values = parse_all(b"+OK\r\n$2\r\nOK\r\n-ERR no\r\n:-3\r\n$-1\r\n*-1\r\n*0\r\n")
    assert values == [Status("OK"), b"OK", Error("ERR no"), -3, None, None, []]
    assert type(values[0]) is Status and type(values[1]) is bytes and type(values[2]) is Error


def test_typed_parser_waits_for_every_split_point() -> None:
    data = b"*3\r\n+D-1\r\n*2\r\n$3\r\na\r\n\r\n$-1\r\n-ERR x\r\n:5\r\n"
    expected = [[Status("D-1"), [b"a\r\n", None], Error("ERR x")], 5]
    for cut in range(len(data) + 1):
        p = TypedReplyParser()
        p.feed(data[:cut])
        got = []
        while (v := p.next()) is not NEED_DATA:
            got.append(v)
        p.feed(data[cut:])
        while (v := p.next()) is not NEED_DATA:
            got.append(v)
        assert got == expected, cut


def test_typed_parser_binary_bulk() -> None:
    assert parse_all(b"$3\r\n\xff\x00\r\r\n") == [b"\xff\x00\r"]


@pytest.mark.parametrize(
    ("text", "cls"),
    [
        ("NOREPL Not enough reachable nodes", NoReplicationError),
        ("PAUSED Queue paused in input, try later", PausedError),
        ("LEAVING This node is leaving the cluster", LeavingError),
        ("BADID Invalid Job ID format.", BadIdError),
        ("NOJOB Job not known in the context of this node.", NoJobError),
        ("MAXLEN Queue is already longer", MaxLenError),
        ("NOAUTH Authentication required.", AuthError),
        ("WRONGPASS invalid username-password pair", AuthError),
        ("ERR syntax error", ResponseError),
    ],
)
def test_error_codes_map_to_types(text: str, cls: type) -> None:
    exc = error_from_reply(Error(text))
    assert type(exc) is cls
    assert str(exc) == text and exc.code == text.split()[0]


def test_add_job_arguments() -> None:
    call = cmd.add_job("q", "héllo", replicate=2, delay=1, retry=0, ttl=60, maxlen=5,
                       async_=True, timeout_ms=100)
    assert call.payload == (
        b"*15\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$6\r\nh\xc3\xa9llo\r\n$3\r\n100\r\n"
        b"$9\r\nREPLICATE\r\n$1\r\n2\r\n$5\r\nDELAY\r\n$1\r\n1\r\n$5\r\nRETRY\r\n$1\r\n0\r\n"
        b"$3\r\nTTL\r\n$2\r\n60\r\n$6\r\nMAXLEN\r\n$1\r\n5\r\n$5\r\nASYNC\r\n"
    )
    assert not call.retry_safe


def test_get_job_arguments_and_waits() -> None:
    call = cmd.get_job("a", "b", count=3, timeout_ms=1500, with_counters=True)
    assert call.payload == (
        b"*9\r\n$6\r\nGETJOB\r\n$7\r\nTIMEOUT\r\n$4\r\n1500\r\n$5\r\nCOUNT\r\n$1\r\n3\r\n"
        b"$12\r\nWITHCOUNTERS\r\n$4\r\nFROM\r\n$1\r\na\r\n$1\r\nb\r\n"
    )
    assert call.retry_safe and call.extra_wait == 1.5
    assert cmd.get_job("a").extra_wait is None  # blocks until a job comes
    assert cmd.get_job("a", nohang=True).extra_wait == 0.0


def test_job_replies_become_models() -> None:
    plain = [[b"q1", b"D-80c616e9-j2MnJ+DMTFQUlA7Dg+bu7vUL-05a1", b"body-1"]]
    counted = [[b"q1", b"D-1", b"\xff", b"nacks", 2, b"additional-deliveries", 1]]
    assert cmd.parse_jobs(plain)[0] == cmd.Job("q1", "D-80c616e9-j2MnJ+DMTFQUlA7Dg+bu7vUL-05a1",
                                               b"body-1")
    assert cmd.parse_jobs(counted)[0] == cmd.Job("q1", "D-1", b"\xff", 2, 1)
    assert cmd.parse_jobs(None) == []


def test_show_and_qstat_models_from_reference_shapes() -> None:
    show = [b"id", b"D-80c616e9-9dOJ-05a1", b"queue", b"qd", b"state", b"active", b"repl", 1,
            b"ttl", 86400, b"ctime", 1795315892054000003, b"delay", 60, b"retry", 300,
            b"nacks", 0, b"additional-deliveries", 0, b"nodes-delivered", [b"80c616e9aa"],
            b"nodes-confirmed", [], b"next-requeue-within", 60000, b"next-awake-within",
            60000, b"body", b"delayed"]
    info = cmd.parse_job_info(show)
    assert info is not None
    assert (info.queue, info.state, info.delay, info.body) == ("qd", "active", 60, b"delayed")
    assert info.nodes_delivered == ["80c616e9aa"] and info.extra == {}
    qstat = [b"name", b"fedq2", b"len", 0, b"age", 0, b"idle", 0, b"blocked", 0,
             b"import-from", [b"4008"], b"import-rate", 20, b"jobs-in", 1, b"jobs-out", 1,
             b"pause", b"none"]
    stats = cmd.parse_qstat(qstat)
    assert stats is not None and stats.import_from == ["4008"] and stats.jobs_out == 1
    assert cmd.parse_qstat(None) is None and cmd.parse_job_info(None) is None


def test_info_is_flattened_with_numbers() -> None:
    info = cmd.parse_info(b"# Jobs\r\nregistered_jobs:7\r\n\r\n# Server\r\nos:Linux 6\r\n"
                          b"mem_fragmentation_ratio:1.07\r\n")
    assert info == {"registered_jobs": 7, "os": "Linux 6", "mem_fragmentation_ratio": 1.07}


HELLO = [1, b"f40828bf73a52c2e0b5cab55ff87d922125efa0c",
         [b"400829d951af0958873146eb42fa11e52ee3d098", b"127.0.0.1", b"27714", b"1"],
         [b"f40828bf73a52c2e0b5cab55ff87d922125efa0c", b"127.0.0.1", b"27712", b"100"],
         [b"1c168fd9e69b18088e4eb336ed45af494ff6e2b2", b"127.0.0.1", b"27713", b"1"]]


def test_hello_on_a_leaving_node_points_to_a_best_one() -> None:
    sel = NodeSelector(["127.0.0.1:27712"], random.Random(1))
    hello = parse_hello(HELLO)
    better = sel.learn(hello, ("127.0.0.1", 27712))
    assert better in {("127.0.0.1", 27713), ("127.0.0.1", 27714)}
    # Known nodes come before seeds, best priority first; the leaving one last.
    assert sel.candidates()[-1] == ("127.0.0.1", 27712)


def test_hello_with_empty_ip_means_the_host_we_dialled() -> None:
    hello = parse_hello([1, b"80c6", [b"80c6", b"", b"27711", b"1"]], "10.0.0.5")
    assert hello.nodes[0].address == ("10.0.0.5", 27711)


def test_failed_nodes_go_last_and_come_back_when_all_failed() -> None:
    sel = NodeSelector(["a:1", "b:2", "c:3"], random.Random(3))
    sel.mark_failed(("a", 1))
    assert sel.candidates()[-1] == ("a", 1)
    sel.mark_failed(("b", 2))
    sel.mark_failed(("c", 3))
    assert sorted(sel.candidates()) == [("a", 1), ("b", 2), ("c", 3)]
    assert not sel.failed


def test_parse_address_forms() -> None:
    assert parse_address("h:1") == ("h", 1)
    assert parse_address("h") == ("h", 7711)
    assert parse_address("[::1]:9") == ("::1", 9)
    assert parse_address(("h", 3)) == ("h", 3)


def test_tracker_names_a_dominant_other_producer_only() -> None:
    t = ProducerTracker(window=10, min_samples=5, share=0.6)
    t.observe(["D-aaaaaaaa-x", "D-bbbbbbbb-x"] * 2)
    assert t.dominant("cccccccc00") is None  # too few samples
    t.observe(["D-aaaaaaaa-x"] * 6)
    assert t.dominant("cccccccc00") == "aaaaaaaa"
    assert t.dominant("aaaaaaaa11") is None  # already on the producer
    t.observe(["D-bbbbbbbb-x"] * 5)
    assert t.dominant("cccccccc00") is None  # 5 of 10: not clear


def test_pipeline_collects_builders_by_name() -> None:
    p = cmd.PipelineCalls()
    p.qlen("a").execute_command("PING")
    assert [c.name for c in p.calls] == ["QLEN", "PING"]
    with pytest.raises(AttributeError):
        p.no_such_command()
    results = cmd.pipeline_results(p.calls, [3, Error("ERR x")], raise_on_error=False)
    assert results[0] == 3 and isinstance(results[1], ResponseError)
    with pytest.raises(ResponseError):
        cmd.pipeline_results(p.calls, [3, Error("ERR x")], raise_on_error=True)
