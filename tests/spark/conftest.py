"""One SparkSession (local[2]) for the whole test session, and a real local hotstate cluster per test
(the `start_cluster` fixture of tests/cluster)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from cluster.conftest import pytest_runtest_makereport, start_cluster  # noqa: F401 (fixture and hook)

LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from pyspark.sql import SparkSession

    root = tmp_path_factory.mktemp("spark")
    log4j = root / "log4j2.properties"
    log4j.write_text(LOG4J2)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # Test-only JVM flags (measured: session up in ~8 s instead of ~10): C1 only, serial GC.
    java_options = f"-Dlog4j2.configurationFile=file:{log4j} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    session = (
        SparkSession.builder.master("local[2]")
        .appName("hotstate-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.executor.extraJavaOptions", java_options)
        .config("spark.sql.warehouse.dir", str(root / "warehouse"))
        .config("spark.hotstate.rack", "az-a")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()
