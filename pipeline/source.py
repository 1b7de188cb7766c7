"""The ``trisque`` data source: planning-time option checks, then the reader/writer modules."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource

from pipeline import options


class TrisqueDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "trisque"

    def schema(self) -> str:
        from pipeline.reader import SNAPSHOT_SCHEMA

        # One schema for the snapshot and the stream (Spark asks before it knows which); a
        # streamed row has state "active" and null ctime/ttl/retry (GETJOB does not tell them).
        return SNAPSHOT_SCHEMA

    def reader(self, schema: Any) -> Any:
        from pipeline.reader import SnapshotReader

        return SnapshotReader(options.snapshot_options(self.options))

    def writer(self, schema: Any, overwrite: bool) -> Any:
        from pipeline.writer import TrisqueArrowWriter

        return TrisqueArrowWriter(options.write_options(self.options))

    def streamReader(self, schema: Any) -> Any:  # noqa: N802
        from pipeline.stream import TrisqueStreamReader

        return TrisqueStreamReader(options.stream_options(self.options))

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:  # noqa: N802
        from pipeline.writer import TrisqueStreamWriter

        return TrisqueStreamWriter(options.write_options(self.options))
