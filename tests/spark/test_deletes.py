"""Deletes from Spark, with real Spark (local[2]) against real local clusters: a delete column's marked rows
delete their keys (the column never stored), through both the Arrow and the Row paths; a delete column of
the wrong type fails before the table is created; and format("hotstate") in complete mode deletes the keys
that left the result table (groups filtered out after an aggregation), so the table equals Spark's result
after every batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

import hotstate
import hotstate.spark as hs
from cluster.conftest import RunningCluster, StartCluster
from spark.streams import drop_file

pytestmark = pytest.mark.xdist_group("spark")


@pytest.fixture(autouse=True)
def _registered(spark: SparkSession) -> None:
    hs.register(spark)


def _servers(running: RunningCluster) -> list[str]:
    return [f"127.0.0.1:{s.http_port}" for s in running.cluster.servers]


def _rows(running: RunningCluster, name: str) -> dict[str, dict[str, object]]:
    with hotstate.Client(_servers(running), timeout_s=10.0) as client:
        return {row["user"]: row for row in client.query(f"SELECT * FROM {name}", max_lag=0).dicts()}


def _materialize(
    running: RunningCluster, df: DataFrame, name: str, checkpoint: Path, **kwargs: Any
) -> StreamingQuery:
    cluster = running.cluster
    return hs.materialize(
        df,
        table=name,
        key="user",
        partitions=3,
        standby_replicas=0,
        cluster=cluster.addresses(),
        checkpoint=str(checkpoint),
        cluster_id=cluster.cluster_id,
        secret=cluster.secret,
        **kwargs,
    )


@pytest.mark.parametrize("nested", [False, True], ids=["arrow", "rows"])
def test_rows_marked_by_the_delete_column_delete_their_keys(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path, nested: bool
) -> None:
    running = start_cluster(1)
    source = tmp_path / "in"
    # An array column sends the batch down the Row path (foreachPartition); flat columns take mapInArrow.
    schema = "user STRING, v BIGINT, _deleted BOOLEAN" + (", tags ARRAY<STRING>" if nested else "")
    drop_file(source, [{"user": f"u{i}", "v": i, "_deleted": False, "tags": ["a"]} for i in range(8)])
    stream = spark.readStream.schema(schema).json(str(source))
    query = _materialize(running, stream, "marked", tmp_path / "chk", delete_column="_deleted")
    try:
        query.processAllAvailable()
        assert sorted(_rows(running, "marked")) == [f"u{i}" for i in range(8)]
        drop_file(
            source,
            [{"user": f"u{i}", "v": 0, "_deleted": True} for i in range(3)]  # deleted
            + [{"user": "u3", "v": 33}]  # a null marker: an upsert
            + [{"user": "u9", "v": 9, "_deleted": True}],  # never written: deleting it is no error
        )
        query.processAllAvailable()
        table = _rows(running, "marked")
        assert query.exception() is None
    finally:
        query.stop()
    assert sorted(table) == [f"u{i}" for i in range(3, 8)]
    assert table["u3"]["v"] == 33 and table["u4"]["v"] == 4
    assert all("_deleted" not in row for row in table.values())  # never stored
    with hotstate.Client(_servers(running)) as client:
        [described] = [t for t in client.tables() if t["name"] == "marked"]
    assert "_deleted" not in [c["name"] for c in described["value_columns"]]


def test_a_delete_column_of_the_wrong_type_fails_before_anything_is_created(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    running = start_cluster(1)
    # A batch to write: Spark asks the data source for its writer only then.
    drop_file(tmp_path / "in", [{"user": "u0", "v": 1, "op": "c"}])
    stream = spark.readStream.schema("user STRING, v BIGINT, op STRING").json(str(tmp_path / "in"))
    before = len(spark.streams.active)
    with pytest.raises(hs.DeleteColumnError, match="delete column 'op' has type string: it must be boolean"):
        _materialize(running, stream, "typed", tmp_path / "chk", delete_column="op")
    query = (
        stream.writeStream.format("hotstate")
        .option("table", "typed")
        .option("key", "user")
        .option("partitions", 2)
        .option("deleteColumn", "v")
        .option("deleteValue", "d")
        .option("cluster", ",".join(f"{h}:{p}" for h, p in running.cluster.addresses()))
        .option("clusterId", running.cluster.cluster_id)
        .option("secret", running.cluster.secret)
        .option("checkpointLocation", str(tmp_path / "chk2"))
        .start()
    )
    try:
        with pytest.raises(Exception, match="delete column 'v' has type bigint: it must be string"):
            query.processAllAvailable()
    finally:
        query.stop()
    assert len(spark.streams.active) == before
    with hotstate.Client(_servers(running)) as client:
        assert [t for t in client.tables() if t["name"] == "typed"] == []  # nothing created


def test_complete_mode_deletes_the_keys_that_left_the_result(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    """Users with fewer than 3 clicks: a user's group leaves the result as its third click arrives, and
    the table must lose it too."""
    from pyspark.sql import functions as F

    running = start_cluster(1)
    cluster = running.cluster
    source = tmp_path / "in"
    drop_file(source, [{"user": u} for u in ["a", "b", "b", "c"]])
    events = spark.readStream.schema("user STRING").json(str(source))
    result = events.groupBy("user").agg(F.count("*").alias("clicks")).where("clicks < 3")

    def expected() -> dict[str, int]:
        rows = spark.read.schema("user STRING").json(str(source)).groupBy("user").count().collect()
        return {row["user"]: row["count"] for row in rows if row["count"] < 3}

    query = (
        result.writeStream.format("hotstate")
        .outputMode("complete")
        .option("table", "few")
        .option("key", "user")
        .option("partitions", 3)
        .option("standbyReplicas", 0)
        .option("cluster", ",".join(f"{h}:{p}" for h, p in cluster.addresses()))
        .option("clusterId", cluster.cluster_id)
        .option("secret", cluster.secret)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start()
    )
    try:
        query.processAllAvailable()
        assert (
            {u: r["clicks"] for u, r in _rows(running, "few").items()}
            == expected()
            == {"a": 1, "b": 2, "c": 1}
        )
        drop_file(source, [{"user": u} for u in ["b", "d", "a"]])  # b reaches 3: gone from the result
        query.processAllAvailable()
        assert (
            {u: r["clicks"] for u, r in _rows(running, "few").items()}
            == expected()
            == {"a": 2, "c": 1, "d": 1}
        )
        drop_file(source, [{"user": u} for u in ["a", "c", "c"]])  # a and c reach 3
        query.processAllAvailable()
        with hotstate.Client(_servers(running)) as client:
            answer = client.query("SELECT * FROM few", min_batch=hs.last_batch(query))
        assert {r["user"]: r["clicks"] for r in answer.dicts()} == expected() == {"d": 1}
        assert query.exception() is None
    finally:
        query.stop()
