"""The batch read: a non-destructive snapshot of the jobs on every node.

One partition per node HELLO reports; each runs JSCAN ... REPLY all on its node (one call per
pushed-down queue, or every job). The same job may be held by several nodes (replication), so
rows are deduplicated by ID: a job is emitted only by the first node in the partition list that
holds it (a partition checks each page of its JSCAN against the nodes before it with pipelined
SHOWs, one connection per earlier node, so one round trip per 1,000 jobs and earlier node).
Tested against a real 3-node cluster in tests/pipeline/test_cluster.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, EqualTo, In, InputPartition

from client import commands as cmd
from pipeline.connect import cluster_nodes, open_client
from pipeline.options import SnapshotOptions

SNAPSHOT_SCHEMA = (
    "id string, queue string, state string, ctime timestamp, ttl int, retry int, "
    "nacks long, additional_deliveries long, body binary"
)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class NodePartition(InputPartition):
    def __init__(self, node: str, earlier_nodes: list[str]) -> None:
        super().__init__(node)
        self.node = node
        self.earlier_nodes = earlier_nodes


class SnapshotReader(DataSourceReader):
    def __init__(self, opts: SnapshotOptions) -> None:
        self.opts = opts
        self.queues = list(opts.queues)

    def pushFilters(self, filters: list[Any]) -> Any:  # noqa: N802 - Spark's name
        for f in filters:
            if isinstance(f, EqualTo) and f.attribute == ("queue",) and not self.queues:
                self.queues = [str(f.value)]
            elif isinstance(f, In) and f.attribute == ("queue",) and not self.queues:
                self.queues = [str(v) for v in f.value]
            else:
                yield f

    def partitions(self) -> Sequence[InputPartition]:
        nodes = cluster_nodes(self.opts.common)
        return [NodePartition(n, nodes[:i]) for i, n in enumerate(nodes)]

    def read(self, partition: NodePartition) -> Iterator[tuple[Any, ...]]:  # type: ignore[override]
        client = open_client(self.opts.common, [partition.node])
        earlier = [open_client(self.opts.common, [n]) for n in partition.earlier_nodes]
        try:
            queues: list[str | None] = list(self.queues) or [None]
            for queue in queues:
                page: list[Any] = []
                for info in client.jscan_jobs(queue=queue, count=1000):
                    page.append(info)
                    if len(page) >= 1000:
                        yield from _rows(_not_held_earlier(earlier, page))
                        page = []
                yield from _rows(_not_held_earlier(earlier, page))
        finally:
            client.close()
            for c in earlier:
                c.close()


def _rows(infos: list[Any]) -> Iterator[tuple[Any, ...]]:
    for info in infos:
        yield (info.id, info.queue, info.state,
               _EPOCH + dt.timedelta(microseconds=info.ctime // 1000),
               info.ttl, info.retry, info.nacks, info.additional_deliveries, info.body)


def _not_held_earlier(earlier: list[Any], page: list[Any]) -> list[Any]:
    """Dedupe by ID across nodes: the first node in the list that holds a job emits it. One
    pipelined SHOW per job of the page on each earlier node (one connection per node)."""
    for client in earlier:
        if not page:
            break
        replies = client.run_many([cmd.show(info.id) for info in page], raise_on_error=False)
        for shown in replies:
            if isinstance(shown, Exception):
                raise shown
        page = [info for info, shown in zip(page, replies, strict=True) if shown is None]
    return page
