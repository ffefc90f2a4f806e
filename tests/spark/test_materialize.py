"""materialize() with real Spark (local[2]) against real local clusters: the table equals a batch
recomputation, a query stopped or crashed mid-batch resumes from its checkpoint without double counting,
a server killed with SIGKILL loses no committed update and the stream keeps going."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

import hotstate
import hotstate.spark as hs
from cluster.conftest import RunningCluster, StartCluster
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.keys import encode_key, partition_for
from hotstate.protocol.rows import encode_row
from hotstate.spark import sink
from hotstate.spark.api import writer_rack
from hotstate.spark.sink import AfterWrite, config_for_schema, write_arrow, write_rows
from hotstate.spark.table import TableDefinition, TableDefinitionError, ensure_table, key_columns_for
from spark.streams import SCHEMA, clicks, drop_file, recompute, table, wait_equal

# The second of the two Spark groups, one per xdist worker (tests/spark/conftest.py says why).
pytestmark = pytest.mark.xdist_group("spark-2")


def _materialize(
    running: RunningCluster, df: DataFrame, name: str, checkpoint: Path, **kwargs: Any
) -> StreamingQuery:
    cluster = running.cluster
    options: dict[str, Any] = {"partitions": 4, "standby_replicas": 1}
    options.update(kwargs)
    return hs.materialize(
        df,
        table=name,
        key="user",
        cluster=",".join(f"{h}:{p}" for h, p in cluster.addresses()),
        checkpoint=str(checkpoint),
        cluster_id=cluster.cluster_id,
        secret=cluster.secret,
        **options,
    )


def _round(source: Path, round_: int, size: int = 300) -> None:
    """Users seen in this round only (u<round>-*) and users seen in every round (s*)."""
    events = [{"user": f"u{round_}-{i % 20}", "n": i} for i in range(size // 3)]
    events += [
        {"user": f"s{(i * 7 + round_) % 60}", "n": round_ * 1000 + i} for i in range(size - len(events))
    ]
    drop_file(source, events)


def test_materialized_table_equals_a_batch_recomputation(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    running = start_cluster(3)
    source = tmp_path / "in"
    _round(source, 0)
    query = _materialize(running, clicks(spark, source), "clicks", tmp_path / "chk")
    try:
        query.processAllAvailable()
        for round_ in range(1, 4):
            _round(source, round_)
            query.processAllAvailable()
        expected = recompute(spark, source)
        assert len(expected) == 4 * 20 + 60
        assert wait_equal(running, "clicks", expected) == expected
        assert query.exception() is None
    finally:
        query.stop()


def test_the_same_definition_is_a_no_op_and_another_is_an_error(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    running = start_cluster(1)
    cluster = running.cluster
    schema = spark.readStream.schema(SCHEMA + ", tags ARRAY<STRING>").json(str(tmp_path)).schema
    assert key_columns_for(schema, ["n", "user"]) == (
        KeyColumn("n", KeyType.INT),
        KeyColumn("user", KeyType.STRING),
    )
    wanted = TableDefinition("defs", 3, 0, key_columns_for(schema, "user"), 10)
    args = (cluster.addresses(), cluster.cluster_id, cluster.secret)
    ensure_table(*args, wanted)
    ensure_table(*args, wanted)  # the same again: nothing to do

    async def in_a_notebook() -> None:  # an event loop already running in the caller's thread
        ensure_table(*args, wanted)

    asyncio.run(in_a_notebook())
    with pytest.raises(TableDefinitionError) as error:
        ensure_table(*args, TableDefinition("defs", 6, 0, wanted.key_columns, 10))
    text = str(error.value)
    assert "'defs'" in text and "partitions=3" in text and "partitions=6" in text, text
    with pytest.raises(TableDefinitionError, match="key: n INT"):
        ensure_table(*args, TableDefinition("defs", 3, 0, key_columns_for(schema, "n"), 10))

    (tmp_path / "in").mkdir()
    stream = spark.readStream.schema(SCHEMA + ", tags ARRAY<STRING>").json(str(tmp_path / "in"))
    before = len(spark.streams.active)
    with pytest.raises(TableDefinitionError, match=r"key column 'tags' has type array<string>"):
        hs.materialize(
            stream,
            "bad",
            "tags",
            2,
            cluster=cluster.addresses(),
            checkpoint=str(tmp_path / "c"),
            cluster_id=cluster.cluster_id,
            secret=cluster.secret,
        )
    with pytest.raises(TableDefinitionError, match="'nope' is not a column"):
        hs.materialize(
            stream,
            "bad",
            "nope",
            2,
            cluster=cluster.addresses(),
            checkpoint=str(tmp_path / "c"),
            cluster_id=cluster.cluster_id,
            secret=cluster.secret,
        )
    assert len(spark.streams.active) == before
    assert "bad" not in [
        t["name"] for t in hotstate.Client(f"127.0.0.1:{cluster.servers[0].http_port}").tables()
    ]


def test_the_sinks_rack_reaches_the_tables_writer_racks(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    running = start_cluster(1)
    cluster = running.cluster
    (tmp_path / "in").mkdir()
    session_rack = spark.conf.get("spark.hotstate.rack", None)
    spark.conf.set("spark.hotstate.rack", "az-b")
    try:
        query = _materialize(running, clicks(spark, tmp_path / "in"), "racked", tmp_path / "chk")
        query.stop()
    finally:
        # Back to the session's rack (the other tests expect it), not to no rack at all.
        if session_rack is None:
            spark.conf.unset("spark.hotstate.rack")
        else:
            spark.conf.set("spark.hotstate.rack", session_rack)
    schema = spark.readStream.schema(SCHEMA).json(str(tmp_path / "in")).schema
    # A second job, elsewhere, writing the same table: the rack is added once, however often it starts.
    again = TableDefinition("racked", 4, 1, key_columns_for(schema, "user"), None)
    for _ in range(2):
        ensure_table(cluster.addresses(), cluster.cluster_id, cluster.secret, again, rack="az-c")
    with hotstate.Client(f"127.0.0.1:{cluster.servers[0].http_port}") as client:
        deadline = time.monotonic() + 10
        while True:
            found = [t for t in client.tables() if t["name"] == "racked"]
            if (found and found[0]["writer_racks"] == ["az-b", "az-c"]) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert found[0]["writer_racks"] == ["az-b", "az-c"]


def test_a_bad_row_fails_the_batch_naming_table_column_and_value(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    running = start_cluster(1)
    cluster = running.cluster
    source = tmp_path / "in"
    # One small file, no shuffle: one Spark task holds every row, the null key last.
    drop_file(source, [{"user": f"u{i}", "n": i} for i in range(50)] + [{"n": 99}])
    stream = spark.readStream.schema(SCHEMA).json(str(source))
    query = _materialize(running, stream, "rows", tmp_path / "chk", standby_replicas=0)
    with pytest.raises(Exception) as error:
        query.processAllAvailable()
    text = str(error.value)
    assert (
        "BatchWriteError: hotstate sink, table rows, batch 0: row 50 of rows: key column 'user' is null"
        in text
    )
    assert len(text) < 3000, text  # the executor's error, not pages of JVM stack
    assert not query.isActive
    assert table_rows(running, "rows") == []  # nothing of the task's rows was sent

    # A value the row codec does not carry, after good rows: named with its column, nothing sent.
    config = config_for_schema(
        stream.schema,
        servers=tuple(cluster.addresses()),
        table="rows",
        cluster_id=cluster.cluster_id,
        secret=cluster.secret,
        rack=writer_rack(spark),
        deadline_s=10.0,
    )
    with pytest.raises(hs.WriteError, match=r"table rows.*column 'n': cannot encode \{1, 2\} \(set\)"):
        write_rows(config, [("a", 1), ("b", 2), ("c", {1, 2})])
    assert table_rows(running, "rows") == []
    assert write_rows(config, [("a", 1), ("b", 2)]) == 2
    assert sink._worker is not None and sink._worker.writers[config].rack == "az-a"  # spark.hotstate.rack
    assert sorted(r["user"] for r in table_rows(running, "rows")) == ["a", "b"]

    # The Arrow path (this schema takes it): a null key is named as on the Row path, nothing sent; and
    # the active refuses a row handed to the wrong partition, whatever the writer computed.
    assert config.arrow
    bad = pa.RecordBatch.from_pydict({"user": ["c", None], "n": [3, 4]})
    with pytest.raises(hs.WriteError, match=r"table rows, batch 7: row 1 of rows: key column 'user' is null"):
        write_arrow(config, [bad], batch_id=7)
    assert write_arrow(config, [pa.RecordBatch.from_pydict({"user": ["c", "d"], "n": [3, 4]})]) == 2
    assert sorted(r["user"] for r in table_rows(running, "rows")) == ["a", "b", "c", "d"]
    writer = sink._worker.writers[config]
    wrong = {(partition_for(encode_key(("e",)), 4) + 1) % 4: [encode_row({"user": "e", "n": 5})]}
    with pytest.raises(hs.WriteError, match="row 0 of rows: its key belongs to partition"):
        sink._worker.loop.run_until_complete(writer.upsert_encoded(wrong))


def table_rows(running: RunningCluster, name: str) -> list[dict[str, Any]]:
    with hotstate.Client(f"127.0.0.1:{running.cluster.servers[0].http_port}") as client:
        return client.query(f"SELECT * FROM {name}").dicts()


def test_a_query_killed_mid_batch_resumes_from_its_checkpoint(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    """Batch 1 fails in one Spark task after the other's rows were acked (the cluster holds part of it);
    batch 2 is stopped by query.stop() from another thread while one task hangs after its write. Each
    time the query restarted from its checkpoint re-runs the interrupted batch, and the table ends equal
    to the recomputation: nothing lost, nothing counted twice."""
    running = start_cluster(1)
    source = tmp_path / "in"
    markers = {1: str(tmp_path / "crashed"), 2: str(tmp_path / "stopped")}

    def interrupt_once(batch_id: int, partition: int, written: int) -> None:
        import os
        import time

        marker = markers.get(batch_id)
        if partition != 0 or marker is None or os.path.exists(marker):
            return
        time.sleep(0.5)  # let the other task write too
        with open(marker, "w") as out:
            out.write(str(written))
        if batch_id == 1:
            raise RuntimeError("injected failure in the middle of batch 1")
        time.sleep(120)  # until query.stop() kills the task

    def start(hook: AfterWrite | None = None) -> StreamingQuery:
        return _materialize(
            running, clicks(spark, source), "resume", tmp_path / "chk", standby_replicas=0, _after_write=hook
        )

    _round(source, 0)
    query = start(interrupt_once)
    query.processAllAvailable()
    committed = table(running, "resume")

    _round(source, 1)  # batch 1: crashes
    with pytest.raises(Exception, match="injected failure in the middle of batch 1"):
        query.processAllAvailable()
    assert not query.isActive
    assert table(running, "resume") != committed  # part of batch 1 reached the cluster

    query = start(interrupt_once)  # re-runs batch 1
    query.processAllAvailable()
    assert query.recentProgress[0]["batchId"] == 1
    committed = table(running, "resume")
    assert committed == recompute(spark, source)

    _round(source, 2)  # batch 2: stopped mid-batch
    end = time.monotonic() + 60
    while not Path(markers[2]).exists():
        assert time.monotonic() < end and query.isActive, query.exception()
        time.sleep(0.05)
    query.stop()
    assert not query.isActive
    assert table(running, "resume") != committed  # part of batch 2 reached the cluster

    query = start()  # re-runs batch 2
    try:
        query.processAllAvailable()
        assert query.recentProgress[0]["batchId"] == 2
        _round(source, 3)
        query.processAllAvailable()
        expected = recompute(spark, source)
        assert wait_equal(running, "resume", expected) == expected
    finally:
        query.stop()


def _batch_id(query: StreamingQuery) -> int:
    progress = query.lastProgress
    return -1 if progress is None else int(progress["batchId"])


def _batches_past(query: StreamingQuery, batch: int, more: int, timeout_s: float = 60.0) -> int:
    """Waits until the query has run `more` batches past `batch` (the fed rounds keep it busy); the last."""
    deadline = time.monotonic() + timeout_s
    while (at := _batch_id(query)) < batch + more:
        assert query.isActive and query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"batch {at} after {timeout_s} s, waiting for {batch + more}"
        time.sleep(0.1)
    return at


def test_kill_9_of_a_server_loses_no_committed_update_and_the_stream_goes_on(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    running = start_cluster(3)
    source = tmp_path / "in"
    _round(source, 0)
    query = _materialize(
        running, clicks(spark, source), "ha", tmp_path / "chk", partitions=6, trigger="0.2 seconds"
    )
    stop = threading.Event()
    rounds = [1]

    def feed() -> None:
        while not stop.is_set():
            _round(source, rounds[0], size=150)
            rounds[0] += 1
            time.sleep(0.25)

    feeder = threading.Thread(target=feed, daemon=True)
    try:
        query.processAllAvailable()
        feeder.start()
        first = _batches_past(query, _batch_id(query), 3)  # the stream runs on the fed rounds
        placement = hotstate.Client(f"127.0.0.1:{running.cluster.servers[0].http_port}").tables()
        actives = Counter(p["active"] for t in placement if t["name"] == "ha" for p in t["placement"])
        victim = actives.most_common(1)[0][0]
        batch_at_kill = max(first, _batch_id(query))
        running.kill(victim)
        _batches_past(query, batch_at_kill, 4)  # it goes on past the kill
        stop.set()
        feeder.join()
        query.processAllAvailable()
        assert query.isActive and query.exception() is None
        progress = query.lastProgress
        assert progress is not None and progress["batchId"] > batch_at_kill + 3, progress
        expected = recompute(spark, source)
        assert len(expected) == rounds[0] * 20 + 60
        assert wait_equal(running, "ha", expected) == expected
    finally:
        stop.set()
        query.stop()


def test_min_batch_after_process_all_available_sees_the_batch_from_every_server(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    """A notebook runs a batch and queries its results with a guarantee, not a sleep: each server, asked
    with `min_batch` = the batch Spark just completed, answers with that batch's rows, never an older
    value (no retry loop here, unlike wait_equal)."""
    running = start_cluster(3)
    source = tmp_path / "in"
    _round(source, 0)
    query = _materialize(running, clicks(spark, source), "batches", tmp_path / "chk")
    servers = [f"127.0.0.1:{s.http_port}" for s in running.cluster.servers]
    try:
        for round_ in range(3):
            if round_:
                _round(source, round_)
            query.processAllAvailable()
            batch = hs.last_batch(query)
            assert batch is not None
            expected = recompute(spark, source)
            for server in servers:
                with hotstate.Client(server, timeout_s=10.0) as client:
                    result = client.query("SELECT * FROM batches", min_batch=batch)
                got = {row["user"]: (row["clicks"], row["total"], row["largest"]) for row in result.dicts()}
                assert got == expected, (server, round_)
        with hotstate.Client(servers[0], timeout_s=10.0) as client:
            tables = {t["name"]: t for t in client.tables()}
            assert tables["batches"]["last_batch"] == hs.last_batch(query)
            # A batch not committed (yet) is a 503 naming the last one, after the query's timeout.
            with pytest.raises(hotstate.Unavailable, match="not committed yet"):
                client.query("SELECT * FROM batches", min_batch=10**6, timeout_ms=300)
            with pytest.raises(hotstate.QueryFailed, match="min_batch"):
                client.query("SELECT * FROM batches", min_batch=-1)
    finally:
        query.stop()


def test_with_http_auth_on_the_table_check_still_reads_the_standby_count(
    start_cluster: StartCluster, tmp_path: Path
) -> None:
    """The sink reads GET /v1/tables with the cluster's own token (docs/security.md), so a table made with
    another standby count is still told apart."""
    from hotstate.server.http.credentials import new_token

    _, digest = new_token()
    credentials = tmp_path / "credentials.toml"
    credentials.write_text(f'[tokens.someone]\nrole = "read"\nsha256 = "{digest}"\n')
    running = start_cluster(2, http_auth_credentials_file=credentials)
    cluster = running.cluster
    args = (cluster.addresses(), cluster.cluster_id, cluster.secret)
    keys = (KeyColumn("user", KeyType.STRING),)
    ensure_table(*args, TableDefinition("guarded", 2, 1, keys, None))
    with pytest.raises(TableDefinitionError, match="standby_replicas=1"):
        ensure_table(*args, TableDefinition("guarded", 2, 0, keys, None))
