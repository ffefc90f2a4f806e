"""Windowed tables with real Spark (local[2]) against a real local cluster: a tumbling and a sliding window
with a watermark and late data; the rows served equal a batch groupBy(window, user) over the input Spark
accepted; a key's windows come back in start order from one partition; WINDOWSTART ranges; the data source
reads the window back as Spark's struct; the write format in append mode, with a tumbling and a session
window; a struct key that is not a window refused naming it."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import hotstate
import hotstate.spark as hs
from cluster.conftest import RunningCluster, StartCluster
from hotstate.spark.table import TableDefinitionError
from spark.streams import drop_file

pytestmark = pytest.mark.xdist_group("spark")

EVENTS = "user STRING, ts TIMESTAMP, n BIGINT"
T0 = dt.datetime(2026, 1, 1)
# Window key -> (count, total): the user, then the window's start.
Windows = dict[tuple[str, dt.datetime], tuple[int, int]]


def _at(minute: float) -> str:
    return (T0 + dt.timedelta(minutes=minute)).isoformat() + "Z"


def _events(rows: list[tuple[str, float, int]]) -> list[dict[str, Any]]:
    return [{"user": user, "ts": _at(minute), "n": n} for user, minute, n in rows]


# Round 1: minutes 0-20, so the watermark (10 minutes behind the newest event) is 00:10 in round 2.
ROUND_1 = [(f"u{i % 3}", i * 1.3 % 20 + 0.5, i) for i in range(40)] + [("u0", 20.0, 100)]
# Round 2: on time (00:21-00:29), late but within the watermark (00:12), and too late (00:02: every window
# that holds it ended by 00:10, so Spark drops it).
ON_TIME = [(f"u{i % 3}", 21 + i % 8, 1000 + i) for i in range(12)]
LATE_BUT_KEPT = [("u1", 12.0, 5000), ("u2", 12.5, 5001)]
TOO_LATE = [("u0", 2.0, 9000), ("u1", 2.5, 9001)]


def _windowed(events: DataFrame, slide: str | None) -> DataFrame:
    window = F.window("ts", "10 minutes", slide) if slide else F.window("ts", "5 minutes")
    return events.groupBy(window, "user").agg(F.count("*").alias("clicks"), F.sum("n").alias("total"))


def _batch(spark: SparkSession, rows: list[tuple[str, float, int]], slide: str | None) -> Windows:
    """What a batch groupBy(window, user) computes over `rows`."""
    df = spark.createDataFrame(_events(rows)).select(
        "user", F.to_timestamp("ts").alias("ts"), F.col("n").cast("bigint").alias("n")
    )
    return {
        (row["user"], _naive_utc(row["window"]["start"])): (row["clicks"], row["total"])
        for row in _windowed(df, slide).collect()
    }


def _naive_utc(value: dt.datetime) -> dt.datetime:
    """Spark hands TimestampType values to Python as naive local time."""
    return value.astimezone(dt.UTC).replace(tzinfo=None)


def _servers(running: RunningCluster) -> list[str]:
    return [f"127.0.0.1:{s.http_port}" for s in running.cluster.servers]


def _query(running: RunningCluster, sql: str) -> list[dict[str, Any]]:
    with hotstate.Client(_servers(running), timeout_s=10.0) as client:
        return client.query(sql, max_lag=0).dicts()


def _instant(value: object) -> dt.datetime:
    assert isinstance(value, str), value
    parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed.astimezone(dt.UTC).replace(tzinfo=None) if parsed.tzinfo else parsed


def _served(running: RunningCluster, name: str) -> Windows:
    return {
        (row["user"], _instant(row["WINDOWSTART"])): (row["clicks"], row["total"])
        for row in _query(running, f"SELECT * FROM {name}")
    }


def _wait_equal(running: RunningCluster, name: str, expected: Windows) -> Windows | None:
    end = time.monotonic() + 15.0
    while True:
        try:
            got: Windows | None = _served(running, name)
        except Exception:
            got = None
        if got == expected or time.monotonic() > end:
            return got
        time.sleep(0.2)


@pytest.mark.parametrize(("slide", "kind"), [(None, "TUMBLING"), ("5 minutes", "HOPPING")])
def test_windowed_table_equals_a_batch_group_by_window_with_late_data(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path, slide: str | None, kind: str
) -> None:
    running = start_cluster(3)
    cluster = running.cluster
    source = tmp_path / "in"
    name = f"clicks_{kind.lower()}"
    drop_file(source, _events(ROUND_1))
    events = spark.readStream.schema(EVENTS).json(str(source)).withWatermark("ts", "10 minutes")
    query = hs.materialize(
        _windowed(events, slide),
        table=name,
        key=["window", "user"],
        partitions=4,
        cluster=",".join(f"{h}:{p}" for h, p in cluster.addresses()),
        checkpoint=str(tmp_path / "chk"),
        cluster_id=cluster.cluster_id,
        secret=cluster.secret,
    )
    try:
        query.processAllAvailable()
        drop_file(source, _events(ON_TIME + LATE_BUT_KEPT + TOO_LATE))
        query.processAllAvailable()
        assert query.exception() is None
        expected = _batch(spark, ROUND_1 + ON_TIME + LATE_BUT_KEPT, slide)
        assert _wait_equal(running, name, expected) == expected
        # The too-late rows would change what a batch over all the input computes: Spark dropped them.
        assert _batch(spark, ROUND_1 + ON_TIME + LATE_BUT_KEPT + TOO_LATE, slide) != expected
    finally:
        query.stop()

    with hotstate.Client(_servers(running), timeout_s=10.0) as client:
        [described] = [t for t in client.tables() if t["name"] == name]
    size = 10 if slide else 5
    assert described["window"] == {
        "column": "window",
        "kind": kind,
        "size_us": size * 60_000_000,
        "slide_us": 5 * 60_000_000,
        "retention_us": None,
    }
    assert [c["name"] for c in described["key_columns"]] == ["user", "WINDOWSTART", "WINDOWEND"]

    # A key alone: all its windows, in start order, from the one partition that holds them.
    mine = _query(running, f"SELECT * FROM {name} WHERE user = 'u1'")
    starts = [_instant(row["WINDOWSTART"]) for row in mine]
    assert starts == sorted(start for user, start in expected if user == "u1")
    assert all(
        _instant(r["WINDOWEND"]) - _instant(r["WINDOWSTART"]) == dt.timedelta(minutes=size) for r in mine
    )

    # ksqlDB's range on WINDOWSTART, and Spark's name for it.
    sql = (
        f"SELECT * FROM {name} WHERE user = 'u1' AND WINDOWSTART >= '{_at(10)}' AND WINDOWSTART < '{_at(25)}'"
    )
    ranged = _query(running, sql)
    wanted = sorted(
        s
        for u, s in expected
        if u == "u1" and T0 + dt.timedelta(minutes=10) <= s < T0 + dt.timedelta(minutes=25)
    )
    assert [_instant(row["WINDOWSTART"]) for row in ranged] == wanted
    assert _query(running, sql.replace("WINDOWSTART", "window.start")) == ranged
    # Every user's windows that end by 00:15: a scan filtered on the window's end.
    ended = _query(running, f"SELECT user, WINDOWSTART FROM {name} WHERE WINDOWEND <= '{_at(15)}'")
    assert sorted((r["user"], _instant(r["WINDOWSTART"])) for r in ended) == sorted(
        (u, s) for u, s in expected if s + dt.timedelta(minutes=size) <= T0 + dt.timedelta(minutes=15)
    )

    # The data source reads the window back as Spark's struct.
    hs.register(spark)
    read = (
        spark.read.format("hotstate")
        .option("table", name)
        .option("servers", ",".join(_servers(running)))
        .load()
    )
    assert read.schema["window"].dataType.simpleString() == "struct<start:timestamp,end:timestamp>"
    back = {
        (row["user"], _naive_utc(row["window"]["start"])): (row["clicks"], row["total"])
        for row in read.collect()
    }
    assert back == expected


def test_a_struct_key_that_is_not_a_window_is_refused_naming_the_column(
    spark: SparkSession, tmp_path: Path
) -> None:
    events = spark.readStream.schema("user STRING, n BIGINT").json(str(tmp_path))
    df = events.select(F.struct("user", "n").alias("pair"), "n")
    with pytest.raises(TableDefinitionError, match="key column 'pair' has type struct<user:string,n:bigint>"):
        hs.materialize(
            df,
            table="t",
            key="pair",
            partitions=2,
            cluster="127.0.0.1:1",
            checkpoint=str(tmp_path / "chk"),
            cluster_id="c",
            secret="s",
        )


def test_the_write_format_takes_a_window_key_in_append_mode(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    hs.register(spark)
    running = start_cluster(3)
    cluster = running.cluster
    source = tmp_path / "in"
    drop_file(source, _events(ROUND_1))
    events = spark.readStream.schema(EVENTS).json(str(source)).withWatermark("ts", "10 minutes")
    query = (
        _windowed(events, None)
        .writeStream.format("hotstate")
        .outputMode("append")  # each window once, when the watermark has passed its end
        .option("table", "finished")
        .option("key", "user,window")
        .option("partitions", 2)
        .option("cluster", ",".join(f"{h}:{p}" for h, p in cluster.addresses()))
        .option("clusterId", cluster.cluster_id)
        .option("secret", cluster.secret)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start()
    )
    try:
        query.processAllAvailable()
        drop_file(source, _events(ON_TIME + LATE_BUT_KEPT + TOO_LATE))
        query.processAllAvailable()
        drop_file(
            source, _events([("u9", 60.0, 1)])
        )  # moves the watermark to 00:50: every window before ends
        query.processAllAvailable()
        assert query.exception() is None
        expected = _batch(spark, ROUND_1 + ON_TIME + LATE_BUT_KEPT, None)
        assert _wait_equal(running, "finished", expected) == expected
    finally:
        query.stop()
    with hotstate.Client(_servers(running), timeout_s=10.0) as client:
        [described] = [t for t in client.tables() if t["name"] == "finished"]
    # The write format sees the schema, not the query: the window's size is not known.
    assert described["window"]["kind"] == "TIME" and described["window"]["size_us"] is None
    rows = _query(running, f"SELECT * FROM finished WHERE user = 'u0' AND WINDOWEND = '{_at(5)}'")
    assert [(r["user"], _instant(r["WINDOWSTART"])) for r in rows] == [("u0", T0)]


def test_a_session_window_table_is_queried_by_its_end(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    hs.register(spark)
    running = start_cluster(3)
    cluster = running.cluster
    source = tmp_path / "in"
    # u0: a session 00:00-00:07 (gap 5 minutes after 00:02), then one from 00:20; u1: one from 00:01.
    drop_file(source, _events([("u0", 0, 1), ("u0", 2, 2), ("u0", 20, 3), ("u1", 1, 4)]))
    events = spark.readStream.schema(EVENTS).json(str(source)).withWatermark("ts", "10 minutes")
    sessions = events.groupBy(F.session_window("ts", "5 minutes"), "user").agg(F.count("*").alias("clicks"))
    # Spark refuses update mode for session windows: the write format in append mode writes each session
    # once the watermark has passed its end.
    query = (
        sessions.writeStream.format("hotstate")
        .outputMode("append")
        .option("table", "sessions")
        .option("key", "user,session_window")
        .option("partitions", 2)
        .option("cluster", ",".join(f"{h}:{p}" for h, p in cluster.addresses()))
        .option("clusterId", cluster.cluster_id)
        .option("secret", cluster.secret)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start()
    )
    try:
        query.processAllAvailable()
        drop_file(source, _events([("u9", 60.0, 5)]))  # the watermark passes every session above
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()
    with hotstate.Client(_servers(running), timeout_s=10.0) as client:
        [described] = [t for t in client.tables() if t["name"] == "sessions"]
        assert described["window"]["kind"] == "SESSION" and described["window"]["column"] == "session_window"
    rows = _query(running, "SELECT * FROM sessions WHERE user = 'u0'")
    assert [(_instant(r["WINDOWSTART"]), _instant(r["WINDOWEND"]), r["clicks"]) for r in rows] == [
        (T0, T0 + dt.timedelta(minutes=7), 2),
        (T0 + dt.timedelta(minutes=20), T0 + dt.timedelta(minutes=25), 1),
    ]
    # A session's end is no fixed distance from its start: WINDOWEND filters the key's sessions.
    sql = f"SELECT user, clicks FROM sessions WHERE user = 'u0' AND session_window.end <= '{_at(10)}'"
    assert _query(running, sql) == [{"user": "u0", "clicks": 2}]
