"""ADDJOB against ``job-max-body-len``: past it, refused at once with the directive named."""

from __future__ import annotations

from protocol.resp import Error
from tests.broker.harness import Node

MB = 1024 * 1024


def test_a_body_past_job_max_body_len_is_refused_naming_the_directive() -> None:
    n = Node()
    warnings: list[tuple[str, str]] = []
    n.b.warn = lambda key, text: warnings.append((key, text))
    n.b.config.set("job-max-body-len", ["2mb"])
    reply = n("ADDJOB", "q", b"x" * (2 * MB + 1), 0)
    assert isinstance(reply, Error)
    assert str(reply) == ("ERR job body of 2097153 bytes exceeds the job-max-body-len limit of "
                          "2097152 bytes")
    assert warnings == [("job-max-body-len", "ADDJOB refused: a job body of 2097153 bytes is "
                         "over job-max-body-len (2097152 bytes)")]
    assert n("QLEN", "q") == 0 and n.log == []
    assert n("ADDJOB", "q", b"x" * (2 * MB), 0).startswith("D-")  # the limit itself is fine


def test_the_directive_takes_memory_units_within_1mb_and_512mb() -> None:
    n = Node()
    assert n.b.config.job_max_body_len == 128 * MB
    assert n.b.config.config_set("job-max-body-len", "512mb") is None
    assert n.b.config.config_set("job-max-body-len", "513mb") is not None
    assert n.b.config.config_set("job-max-body-len", "1000kb") is not None
    assert n.b.config.job_max_body_len == 512 * MB
