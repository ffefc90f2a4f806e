"""An export (`hotstate table export`) loaded back by the Spark batch writer, `spark.read.parquet(dir)` then
`write.format("hotstate")`, as docs/spark.md shows: every declared type comes back as it was, and the
value columns the writer declares are the exported table's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

import hotstate
import hotstate.spark as hs
from cluster.conftest import StartCluster
from cluster.test_backup import KEYS, ROWS, VALUES
from hotstate.cli.main import app
from hotstate.client.writer import TableWriter
from hotstate.controller.requests import ControllerError

pytestmark = pytest.mark.xdist_group("spark")


def test_an_export_loads_back_through_the_spark_batch_writer(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    hs.register(spark)
    cluster = start_cluster(1).cluster

    async def fill() -> None:
        async with cluster.admin() as admin:
            made = await admin.create_table("typed", partitions=2, standby_replicas=0, key_columns=KEYS)
            assert made.error is ControllerError.NONE, made
            declared = await admin.set_value_columns("typed", VALUES)
            assert declared.error is ControllerError.NONE, declared
        async with TableWriter(
            cluster.addresses(), "typed", cluster_id=cluster.cluster_id, secret=cluster.secret
        ) as writer:
            await writer.upsert(ROWS)

    asyncio.run(fill())
    out = tmp_path / "export"
    exported = CliRunner().invoke(app, ["table", "export", "typed", str(out), "--dir", str(cluster.root)])
    assert exported.exit_code == 0, exported.output

    (
        spark.read.parquet(str(out))
        .write.format("hotstate")
        .mode("append")
        .option("table", "typed_from_spark")
        .option("key", ",".join(c.name for c in KEYS))
        .option("partitions", 2)
        .option("cluster", ",".join(f"{h}:{p}" for h, p in cluster.addresses()))
        .option("clusterId", cluster.cluster_id)
        .option("secret", cluster.secret)
        .save()
    )

    with hotstate.Client(cluster.http_addresses(), timeout_s=10.0) as client:
        tables = {t["name"]: t for t in client.tables()}
        original = client.query("SELECT * FROM typed", max_lag=0)
        loaded = client.query("SELECT * FROM typed_from_spark", max_lag=0)
    assert tables["typed_from_spark"]["value_columns"] == tables["typed"]["value_columns"]
    assert len(loaded.rows) == len(ROWS)
    assert loaded.columns == original.columns
    # Timestamps nested in a struct, array or map come back as the same instants as top-level ones.
    differ = [
        (column, a, b)
        for x, y in zip(sorted(loaded.rows, key=repr), sorted(original.rows, key=repr), strict=True)
        for column, a, b in zip(original.columns, x, y, strict=True)
        if a != b
    ]
    assert not differ, differ[:5]
