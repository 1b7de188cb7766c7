"""nodes.conf on disk (node/nodes_store.py): atomic replacement, coalesced writes that never
hold the event loop, write errors retried and logged once, corrupt files refused by line."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import trio

from node import nodes_store
from node.nodes_store import NodesFileWriter, NodesStoreError

ME = "0123456789abcdef0123456789abcdef01234567"


def test_write_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "nodes.conf"
    path.write_text("old\n")
    nodes_store.write_atomic(str(path), f"{ME} :7711 myself 0 0 connected\n")
    assert os.listdir(tmp_path) == ["nodes.conf"]
    saved = nodes_store.load(str(path))
    assert saved is not None and saved.myself_id == ME


def test_load_missing_and_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "nodes.conf"
    assert nodes_store.load(str(path)) is None
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(NodesStoreError, match="not UTF-8"):
        nodes_store.load(str(path))
    path.write_text(f"{ME} :7711 myself 0 0 connected\n{ME} :7712 noflags 0 0 connected\n")
    with pytest.raises(NodesStoreError, match=r"nodes\.conf: .*line 2"):
        nodes_store.load(str(path))
    path.write_text("")
    with pytest.raises(NodesStoreError, match="myself"):
        nodes_store.load(str(path))


async def test_writes_are_coalesced_and_the_newest_wins(tmp_path: Path) -> None:
    path = tmp_path / "nodes.conf"
    writer = NodesFileWriter(str(path))
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i in range(200):
            writer.submit(f"{ME} :{i} myself 0 0 connected\n")
            if i % 50 == 0:
                await trio.sleep(0)  # let a write start: later ones pile up behind it
        with trio.fail_after(10):
            while writer.pending is not None or path.read_text().split()[1] != ":199":
                await trio.sleep(0.01)
        assert writer.writes <= 10, writer.writes
        writer.submit(path.read_text())  # unchanged: nothing to write
        assert writer.pending is None
        nursery.cancel_scope.cancel()


async def test_a_failed_write_is_logged_once_and_retried(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # Real clock: the writes run in a thread, which a mock clock would jump past.
    monkeypatch.setattr(nodes_store, "RETRY_AFTER_ERROR_S", 0.02)
    caplog.set_level(logging.INFO, logger="trisque")
    missing = tmp_path / "gone"
    writer = NodesFileWriter(str(missing / "nodes.conf"))
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        writer.submit(f"{ME} :1 myself 0 0 connected\n")
        with trio.fail_after(10):
            while not any("No such file" in r.getMessage() for r in caplog.records):
                await trio.sleep(0.1)
        await trio.sleep(0.3)  # retried again and again, into a directory that does not exist
        assert writer.writes == 0 and writer.pending is not None
        missing.mkdir()
        with trio.fail_after(10):
            while writer.writes == 0:
                await trio.sleep(0.1)
        assert (missing / "nodes.conf").read_text().startswith(ME)
        nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records if "cluster config file" in r.getMessage()]
    assert len(lines) == 1, lines
