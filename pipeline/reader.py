"""The batch read: a non-destructive snapshot of the jobs on every node.

One partition per node HELLO reports; each runs JSCAN ... REPLY all on its node (one call per
pushed-down queue, or every job). The same job may be held by several nodes (replication), so
rows are deduplicated by ID: a job is emitted only by the first node in the partition list that
holds it (a partition checks each job against the nodes before it with SHOW; that is a round
trip per job and per earlier node, paid only with several nodes). Against one node, the only
setup that exists today, there is nothing to check: this path is untested.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, EqualTo, In, InputPartition

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
        try:
            for queue in self.queues or [None]:
                for info in client.jscan_jobs(queue=queue, count=1000):
                    if partition.earlier_nodes and _held_earlier(self, partition, info.id):
                        continue
                    yield (info.id, info.queue, info.state,
                           _EPOCH + dt.timedelta(microseconds=info.ctime // 1000),
                           info.ttl, info.retry, info.nacks, info.additional_deliveries,
                           info.body)
        finally:
            client.close()


def _held_earlier(reader: SnapshotReader, partition: NodePartition, job_id: str) -> bool:
    """Dedupe by ID across nodes: the first node in the list that holds a job emits it."""
    for node in partition.earlier_nodes:
        client = open_client(reader.opts.common, [node])
        try:
            if client.show(job_id) is not None:
                return True
        finally:
            client.close()
    return False
