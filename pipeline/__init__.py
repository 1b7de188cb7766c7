"""trisque for PySpark: ``pipeline.register(spark)`` makes ``format("trisque")`` and
``format("trisque-log")`` available.

It also turns on ``spark.sql.python.filterPushdown.enabled`` (off by default in pyspark 4.3):
the snapshot reader pushes a ``queue`` filter down to JSCAN, and pyspark refuses a reader that
implements ``pushFilters`` while that setting is off.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    from pipeline.logsource import TrisqueLogDataSource
    from pipeline.source import TrisqueDataSource

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    for source in (TrisqueDataSource, TrisqueLogDataSource):
        try:
            spark.dataSource.register(source)
        except Exception as exc:
            # Registering again (a second session on the same JVM) is harmless.
            if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
                raise
