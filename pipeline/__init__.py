"""trisque for PySpark: ``pipeline.register(spark)`` makes ``format("trisque")`` available.

It also turns on ``spark.sql.python.filterPushdown.enabled`` (off by default in pyspark 4.3):
the snapshot reader pushes a ``queue`` filter down to JSCAN, and pyspark refuses a reader that
implements ``pushFilters`` while that setting is off.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    from pipeline.source import TrisqueDataSource

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(TrisqueDataSource)
