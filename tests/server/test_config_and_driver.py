"""The shipped config file, the directive table and driver-level behaviour of a real node."""

from __future__ import annotations

import re
from pathlib import Path

from broker.config import DIRECTIVES
from node import config_file
from tests.support.server import ServerProcess

REPO = Path(__file__).resolve().parents[2]


def test_conf_file_documents_every_directive_and_loads() -> None:
    text = (REPO / "conf" / "trisque.conf").read_text()
    mentioned = set(re.findall(r"^#? ?([a-z][a-z0-9-]+) ", text, re.M))
    missing = [name for name in DIRECTIVES if name not in mentioned]
    assert not missing, f"conf/trisque.conf does not document: {missing}"
    cfg = config_file.load([str(REPO / "conf" / "trisque.conf")])
    assert cfg.appendonly is True and cfg.appendfsync in ("always", "everysec")
    assert cfg.bind == "127.0.0.1"


def test_config_rewrite_persists_a_runtime_change(tmp_path: Path) -> None:
    conf = tmp_path / "node.conf"
    conf.write_text("# my node\nhz 10\n")
    with ServerProcess(config_file=str(conf)) as node:
        assert node.call("CONFIG", "SET", "hz", "20") == b"OK"
        assert node.call("CONFIG", "REWRITE") == b"OK"
    text = conf.read_text()
    assert "# my node" in text and "hz 20" in text and "hz 10" not in text


def _restart_keeps_queue(tmp_path: Path, **directives: object) -> tuple[int, int]:
    with ServerProcess(directory=str(tmp_path), appendonly="yes", **directives) as node:
        for i in range(3):
            node.call("ADDJOB", "rq", f"job-{i}", "0")
        delivered = node.call("GETJOB", "FROM", "rq")
        assert delivered[0][2] == b"job-0"
        node.restart()  # SIGTERM, then start again on the same directory
        return node.call("QLEN", "rq"), node.call("INFO", "jobs").count(b"registered_jobs:3")


def test_a_signalled_restart_keeps_queues_exactly(tmp_path: Path) -> None:
    qlen, all_jobs_back = _restart_keeps_queue(tmp_path)
    assert (qlen, all_jobs_back) == (2, 1)  # the two undelivered jobs are queued at once


def test_without_rewrite_on_shutdown_queues_come_back_after_retry(tmp_path: Path) -> None:
    qlen, all_jobs_back = _restart_keeps_queue(tmp_path, aof_rewrite_on_shutdown="no")
    assert (qlen, all_jobs_back) == (0, 1)  # Disque's way: known, queued after RETRY
