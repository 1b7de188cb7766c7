"""One local[2] SparkSession for every pipeline test (the JVM start is the slow part)."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[spark]')")

from tests.support.server import ServerProcess  # noqa: E402

pytestmark = pytest.mark.spark


def _session() -> object:
    from pyspark.sql import SparkSession

    import pipeline

    spark = (SparkSession.builder.master("local[2]").appName("trisque-tests")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    pipeline.register(spark)
    return spark


@pytest.fixture(scope="session")
def spark() -> object:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = _session()
    yield session
    session.stop()  # type: ignore[attr-defined]


@pytest.fixture(params=["memory", "bodies-on-disk"])
def node(request: pytest.FixtureRequest):
    """The bulk writer and the stream reader must work unchanged on a node that keeps bodies
    in its append log (body-memory-max 0: the smallest body past it)."""
    directives = {"appendonly": "yes", "body_memory_max": 1} if request.param != "memory" else {}
    with ServerProcess(**directives) as server:
        yield server


@pytest.fixture
def nodes_opt(node: ServerProcess) -> str:
    return f"127.0.0.1:{node.port}"
