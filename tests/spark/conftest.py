"""One SparkSession (local[2]) per test process (each xdist worker), and a real local hotstate cluster per
test (the `start_cluster` fixture of tests/cluster).

The tests using the session are split, by module, into two xdist groups of about equal run time: "spark"
and "spark-2" (test_source.py and test_materialize.py). `--dist loadgroup` sends each group whole to one
worker and, as the two groups hold the most tests, xdist hands them out first, one to each worker: each of
the two workers starts one session, and neither spends the run on every Spark test in series while the
other runs out of work (in one group they were the run's critical path). A new module joins either group,
the one with less time (`--durations` in `make test`'s output)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from cluster.conftest import pytest_runtest_makereport, start_cluster  # noqa: F401 (fixture and hook)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    from hotstate.spark.pipeline import build_session

    root = tmp_path_factory.mktemp("spark")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session, _ = build_session(
        "local[2]",
        2,
        app_name="hotstate-tests",
        conf={
            "spark.default.parallelism": "2",
            "spark.sql.warehouse.dir": str(root / "warehouse"),
            "spark.hotstate.rack": "az-a",
        },
        # Test-only JVM flags (measured: session up in ~8 s instead of ~10): C1 only, serial GC.
        java_options="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    )
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()
