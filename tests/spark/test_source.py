"""format("hotstate") with real Spark (local[2]) against real local clusters: a read equals what was
written (one Spark partition per hotstate partition, in pages, key filters pushed down), also when a
server is killed with SIGKILL in the middle of it; unknown tables, unreachable clusters and unknown
options are clear errors; the streaming write is exactly-once across a restart from its checkpoint."""

from __future__ import annotations

import datetime as dt
import socket
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import Column, DataFrameReader, Row, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

import hotstate
import hotstate.spark as hs
from cluster.conftest import RunningCluster, StartCluster
from hotstate.spark.sink import config_for_schema, write_rows
from hotstate.spark.table import TableDefinition, ensure_table, key_columns_for, value_columns_for
from spark.streams import SCHEMA, clicks, drop_file, recompute, wait_equal

# The second of the two Spark groups, one per xdist worker (tests/spark/conftest.py says why).
pytestmark = pytest.mark.xdist_group("spark-2")


@pytest.fixture(autouse=True)
def _registered(spark: SparkSession) -> None:
    hs.register(spark)  # what `import hotstate.spark` does when a session is active already


WRITTEN_SCHEMA = "user STRING, n BIGINT, x DOUBLE, ok BOOLEAN, ts TIMESTAMP, tags ARRAY<STRING>"
START = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


Written = tuple[str, int, float, bool, dt.datetime, list[str]]
# What DataFrameReader.option and DataStreamWriter.options take.
OptionValue = bool | float | int | str | None


def _written(i: int) -> Written:
    return (f"u{i:05d}", i, i / 4, i % 3 == 0, START + dt.timedelta(seconds=i), [f"t{i % 5}"] * (i % 3))


def _write_table(
    spark: SparkSession,
    running: RunningCluster,
    name: str,
    count: int,
    partitions: int = 6,
    *,
    declare: bool = False,
) -> list[Written]:
    """`count` rows written into a new table with the sink's own code (its Row path: the array column);
    `declare`: its value columns declared as the sink declares them (else none are)."""
    cluster = running.cluster
    schema = spark.createDataFrame([], WRITTEN_SCHEMA).schema
    definition = TableDefinition(name, partitions, 1, key_columns_for(schema, "user"), None)
    values = value_columns_for(schema, "user") if declare else ()
    ensure_table(cluster.addresses(), cluster.cluster_id, cluster.secret, definition, values=values)
    config = config_for_schema(
        schema,
        servers=tuple(cluster.addresses()),
        table=name,
        cluster_id=cluster.cluster_id,
        secret=cluster.secret,
        rack=None,
        deadline_s=20.0,
    )
    rows = [_written(i) for i in range(count)]
    assert write_rows(config, rows) == count
    return rows


def _servers(running: RunningCluster, first: int | None = None) -> str:
    servers = sorted(running.cluster.servers, key=lambda s: s.node_id != first)
    return ",".join(f"127.0.0.1:{s.http_port}" for s in servers)


def _read(spark: SparkSession, running: RunningCluster, name: str, **options: OptionValue) -> DataFrameReader:
    reader = spark.read.format("hotstate").option("table", name).option("servers", _servers(running))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader


def _as_written(row: Row) -> tuple[object, ...]:
    ts = row["ts"]
    return (row["user"], row["n"], row["x"], row["ok"], ts, list(row["tags"]))


def test_a_read_equals_what_was_written_one_spark_partition_per_partition(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    running = start_cluster(1)
    rows = _write_table(spark, running, "kv", 1000)

    # No schema given: the key's type from the table, the others from a sample (a timestamp column reads
    # as its ISO-8601 text); pages of 100 rows, so every partition takes several.
    df = _read(spark, running, "kv", pageSize=100, maxLag=0).load()
    assert df.rdd.getNumPartitions() == 6
    assert [(f.name, f.dataType.simpleString(), f.nullable) for f in df.schema.fields] == [
        ("user", "string", False),
        ("n", "bigint", True),
        ("x", "double", True),
        ("ok", "boolean", True),
        ("ts", "string", True),
        ("tags", "array<string>", True),
    ]
    got = sorted(df.collect(), key=lambda r: r["user"])
    assert [(r["user"], r["n"], r["x"], r["ok"], list(r["tags"])) for r in got] == [
        (u, n, x, ok, tags) for u, n, x, ok, _, tags in rows
    ]
    assert dt.datetime.fromisoformat(got[7]["ts"]) == rows[7][4]

    # With the schema given, values come back as written (the timestamp an instant again).
    typed = (
        spark.read.format("hotstate").schema(WRITTEN_SCHEMA).options(table="kv", servers=_servers(running))
    )
    assert sorted(_as_written(r) for r in typed.load().collect()) == sorted(
        (u, n, x, ok, ts.astimezone().replace(tzinfo=None), tags) for u, n, x, ok, ts, tags in rows
    )

    # A table whose writer declared its value columns (as materialize() and the write format do) reads
    # with their types without a schema given.
    declared_rows = _write_table(spark, running, "kvd", 50, partitions=2, declare=True)
    declared = _read(spark, running, "kvd").load()
    written = spark.createDataFrame([], WRITTEN_SCHEMA).schema.fields
    assert [(f.name, f.dataType.simpleString(), f.nullable) for f in declared.schema.fields] == [
        (f.name, f.dataType.simpleString(), f.name != "user") for f in written
    ]
    assert sorted(_as_written(r) for r in declared.collect()) == sorted(
        (u, n, x, ok, ts.astimezone().replace(tzinfo=None), tags) for u, n, x, ok, ts, tags in declared_rows
    )

    # Filtered by Spark (every row read), and again after a filtered scan of the same DataFrame.
    assert [r["user"] for r in df.filter(F.col("user") == "u00007").collect()] == ["u00007"]
    assert df.count() == 1000

    # Joined with batch data, as a DataFrame like any other.
    batch = spark.createDataFrame([("u00003", "ana"), ("u00004", "bob")], "user STRING, name STRING")
    joined = sorted((r["name"], r["n"]) for r in df.join(batch, "user").collect())
    assert joined == [("ana", 3), ("bob", 4)]


def test_key_filters_pushed_to_the_cluster_read_the_same_rows(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    running = start_cluster(1)
    rows = _write_table(spark, running, "kf", 600, partitions=4)
    everyone = [r[0] for r in rows]
    hs.register(spark, push_filters=True)

    def users(where: Column) -> list[str]:
        # A new DataFrame per filtered read: Spark 4.3 keeps a pushed-down read on its DataFrame.
        return sorted(
            r["user"] for r in _read(spark, running, "kf", pageSize=50).load().filter(where).collect()
        )

    assert users(F.col("user") == "u00007") == ["u00007"]
    assert users(F.col("user").isin("u00001", "u00599", "nobody")) == ["u00001", "u00599"]
    ranged = (F.col("user") >= "u00100") & (F.col("user") < "u00250") & (F.col("n") % 2 == 0)
    assert users(ranged) == [u for u in everyone if "u00100" <= u < "u00250" and int(u[1:]) % 2 == 0]
    assert users((F.col("user") > "u00590") | (F.col("user") < "u00002")) == everyone[:2] + everyone[591:]
    assert users(F.col("n") > 590) == everyone[591:]  # not a key: Spark filters


def test_a_read_spanning_a_kill_9_of_a_server_returns_every_row(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    """The read's tasks run one after the other (toLocalIterator): the first partition is read, then the
    server holding most actives, first in the reader's server list, is killed with SIGKILL, then every
    other partition is read. Every row comes back."""
    running = start_cluster(3)
    rows = _write_table(spark, running, "ha_read", 1200)
    with hotstate.Client(_servers(running)) as client:
        placement = next(t for t in client.tables() if t["name"] == "ha_read")["placement"]
    victim = Counter(p["active"] for p in placement).most_common(1)[0][0]
    reader = spark.read.format("hotstate").options(
        table="ha_read", servers=_servers(running, first=victim), pageSize=50
    )
    iterator = reader.load().select("user", "n").toLocalIterator()
    got = [next(iterator)]
    running.kill(victim)
    got += list(iterator)
    assert sorted((r["user"], r["n"]) for r in got) == [(r[0], r[1]) for r in rows]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unknown_tables_unreachable_clusters_and_unknown_options_are_clear_errors(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    running = start_cluster(1)
    _write_table(spark, running, "present", 3, partitions=2)
    with pytest.raises(Exception, match=r"hotstate table 'nope' does not exist \(tables: present\)") as error:
        _read(spark, running, "nope").load()
    assert len(str(error.value)) < 3000, str(error.value)
    with pytest.raises(Exception, match=r"cannot reach the hotstate cluster at 127\.0\.0\.1:"):
        spark.read.format("hotstate").options(
            table="present", servers=f"127.0.0.1:{_free_port()}", timeoutMs=500
        ).load()
    with pytest.raises(
        Exception, match="unknown option 'tabel' for reading a hotstate table; known: table, "
    ):
        spark.read.format("hotstate").options(tabel="present", servers=_servers(running)).load()
    with pytest.raises(Exception, match="option 'pageSize': must be an integer from 1 to 100000, got '0'"):
        _read(spark, running, "present", pageSize=0).load().collect()

    cluster = running.cluster
    source = tmp_path / "in"
    # One small file, no shuffle: one Spark task holds every row, the null key last.
    drop_file(source, [{"user": f"u{i}", "n": i} for i in range(5)] + [{"n": 99}])

    def write(**options: OptionValue) -> None:
        writer = (
            spark.readStream.schema(SCHEMA)
            .json(str(source))
            .writeStream.format("hotstate")
            .options(table="w", key="user", partitions=2, standbyReplicas=0)
            .options(cluster=",".join(f"{h}:{p}" for h, p in cluster.addresses()))
            .options(clusterId=cluster.cluster_id, secret=cluster.secret, **options)
            .option("checkpointLocation", str(tmp_path / f"chk-{len(options)}"))
        )
        query = writer.start()
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    with pytest.raises(
        Exception,
        match=r"unknown option 'partitons' for writing a hotstate table; known: table, key, partitions",
    ):
        write(partitons=3)
    with pytest.raises(
        Exception, match=r"WriteError: hotstate sink, table w, batch 0: row 5 of w: key column 'user' is null"
    ):
        write()
    assert _read(spark, running, "w").load().count() == 0  # nothing of the task's rows was sent


def test_the_write_format_is_exactly_once_across_a_restart_from_its_checkpoint(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    """Batch 1 fails in one Spark task after the other's rows were acked (the cluster holds part of it);
    the query restarted from its checkpoint re-runs batch 1, and the table ends equal to the batch
    recomputation: nothing lost, nothing counted twice. Each batch is recorded in the cluster (min_batch)."""
    from pyspark.sql import functions as F

    running = start_cluster(1)
    cluster = running.cluster
    source = tmp_path / "in"
    marker = str(tmp_path / "crashed")

    @F.udf("bigint")
    def crash_once(total: int) -> int:
        import os
        import time

        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None  # on an executor, in a task
        batch = context.getLocalProperty("streaming.sql.batchId")
        if batch == "1" and context.partitionId() == 1 and not os.path.exists(marker):
            time.sleep(1.0)  # the other task writes meanwhile
            open(marker, "w").close()
            raise RuntimeError("injected failure in the middle of batch 1")
        return total

    def start() -> StreamingQuery:
        counts = clicks(spark, source).withColumn("total", crash_once("total"))
        query: StreamingQuery = (  # (DataStreamWriter.start is not annotated)
            counts.writeStream.format("hotstate")
            .outputMode("complete")
            .option("table", "once")
            .option("key", "user")
            .option("partitions", 4)
            .option("standbyReplicas", 0)
            .option("cluster", ",".join(f"{h}:{p}" for h, p in cluster.addresses()))
            .option("clusterId", cluster.cluster_id)
            .option("secret", cluster.secret)
            .option("checkpointLocation", str(tmp_path / "chk"))
            .start()
        )
        return query

    def round_(n: int) -> None:
        events = [{"user": f"u{n}-{i % 20}", "n": i} for i in range(100)]
        events += [{"user": f"s{(i * 7 + n) % 30}", "n": n * 1000 + i} for i in range(200)]
        drop_file(source, events)

    def table() -> dict[str, tuple[int, int, int]]:
        with hotstate.Client(_servers(running)) as client:
            rows = client.query("SELECT * FROM once", max_lag=0).dicts()
        return {r["user"]: (r["clicks"], r["total"], r["largest"]) for r in rows}

    round_(0)
    query = start()
    query.processAllAvailable()
    committed = table()
    assert committed == recompute(spark, source)

    round_(1)  # batch 1: crashes
    with pytest.raises(Exception, match="injected failure in the middle of batch 1"):
        query.processAllAvailable()
    assert not query.isActive
    assert table() != committed  # part of batch 1 reached the cluster

    query = start()  # re-runs batch 1 from the checkpoint
    try:
        query.processAllAvailable()
        assert query.recentProgress[0]["batchId"] == 1
        round_(2)
        query.processAllAvailable()
        expected = recompute(spark, source)
        assert wait_equal(running, "once", expected) == expected
        with hotstate.Client(_servers(running)) as client:
            [described] = [t for t in client.tables() if t["name"] == "once"]
            assert described["last_batch"] == hs.last_batch(query)
            answer = client.query("SELECT * FROM once", min_batch=hs.last_batch(query))
        assert {r["user"]: (r["clicks"], r["total"], r["largest"]) for r in answer.dicts()} == expected
        # The write format declared the DataFrame's value columns: a read needs no schema for them.
        written = clicks(spark, source).withColumn("total", crash_once("total")).schema
        values = [(f.name, f.dataType.simpleString()) for f in written.fields if f.name != "user"]
        assert [(c["name"], c["type"]) for c in described["value_columns"]] == values
        read = _read(spark, running, "once").load()
        assert [(f.name, f.dataType.simpleString()) for f in read.schema.fields[1:]] == values
    finally:
        query.stop()
