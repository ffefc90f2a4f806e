"""Batch writes with real Spark (local[2]) against real local clusters: `df.write.format("hotstate")` in
append mode creates the table and upserts (again: nothing changes), and in overwrite mode replaces the table
atomically while readers query it without pause: every answer is the old table or the new one in full,
never a mix. An overwrite with other key columns, or whose load fails, leaves the old table serving and
nothing of the new generation behind."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

import hotstate
import hotstate.spark as hs
from cluster.conftest import RunningCluster, StartCluster

pytestmark = pytest.mark.xdist_group("spark")


@pytest.fixture(autouse=True)
def _registered(spark: SparkSession) -> None:
    hs.register(spark)


def _servers(running: RunningCluster) -> list[str]:
    return [f"127.0.0.1:{s.http_port}" for s in running.cluster.servers]


def _rows(running: RunningCluster, name: str) -> dict[str, dict[str, object]]:
    with hotstate.Client(_servers(running), timeout_s=10.0) as client:
        return {row["k"]: row for row in client.query(f"SELECT * FROM {name}", max_lag=0).dicts()}


def _write(running: RunningCluster, df: DataFrame, mode: str, key: str = "k", **options: Any) -> None:
    cluster = running.cluster
    writer = (
        df.write.format("hotstate")
        .mode(mode)
        .option("table", "t")
        .option("key", key)
        .option("partitions", 4)
        .option("standbyReplicas", 1 if len(cluster.servers) > 1 else 0)
        .option("cluster", ",".join(f"{h}:{p}" for h, p in cluster.addresses()))
        .option("clusterId", cluster.cluster_id)
        .option("secret", cluster.secret)
    )
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


def _generations(running: RunningCluster) -> set[int]:
    """The table ids (generations) whose replica directories some server holds."""
    found = set()
    for path in running.cluster.root.rglob("*"):
        match = re.fullmatch(r"(\d+)-(\d+)", path.name)
        if match and path.is_dir():
            found.add(int(match.group(1)))
    return found


def _eventually(check: Any, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


def test_append_creates_the_table_and_a_repeated_write_changes_nothing(
    spark: SparkSession, start_cluster: StartCluster
) -> None:
    running = start_cluster(1)
    df = spark.createDataFrame([(f"k{i}", i, "a") for i in range(50)], "k STRING, n BIGINT, v STRING")
    _write(running, df.repartition(3), "append")
    expected = {f"k{i}": {"k": f"k{i}", "n": i, "v": "a"} for i in range(50)}
    assert _rows(running, "t") == expected
    # Spark re-running a task (or the whole job) upserts the same rows again: the table is the same.
    _write(running, df.repartition(2), "append")
    assert _rows(running, "t") == expected
    # Appending upserts: new keys are added, existing ones take the new values.
    more = spark.createDataFrame([("k1", 100, "b"), ("z", 0, "b")], "k STRING, n BIGINT, v STRING")
    _write(running, more, "append")
    expected |= {"k1": {"k": "k1", "n": 100, "v": "b"}, "z": {"k": "z", "n": 0, "v": "b"}}
    assert _rows(running, "t") == expected
    # Nested columns take the Row path; a delete column deletes, as in the stream writer.
    gone = spark.createDataFrame([("k2", 2, "a", True)], "k STRING, n BIGINT, v STRING, _deleted BOOLEAN")
    _write(running, gone, "append", deleteColumn="_deleted")
    del expected["k2"]
    assert _rows(running, "t") == expected


def test_modes_spark_refuses_for_python_data_sources_fail_before_anything_is_written(
    spark: SparkSession, start_cluster: StartCluster
) -> None:
    running = start_cluster(1)
    df = spark.createDataFrame([("k", "a")], "k STRING, v STRING")
    for mode in ("errorifexists", "ignore"):
        with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
            _write(running, df, mode)
    with hotstate.Client(_servers(running)) as client:
        assert client.tables() == []


def test_overwrite_replaces_the_table_atomically_under_concurrent_readers(
    spark: SparkSession, start_cluster: StartCluster
) -> None:
    running = start_cluster(3)
    old_keys = {f"k{i}" for i in range(0, 600)}
    new_keys = {f"k{i}" for i in range(300, 1000)}  # overlapping: some keys stay, some go, some arrive
    old = spark.createDataFrame([(k, "old") for k in sorted(old_keys)], "k STRING, v STRING")
    _write(running, old.repartition(2), "append")
    assert set(_rows(running, "t")) == old_keys
    [old_generation] = _generations(running)

    answers: list[tuple[frozenset[object], frozenset[object]]] = []
    errors: list[str] = []
    stop = threading.Event()

    def read() -> None:
        with hotstate.Client(_servers(running), timeout_s=10.0) as client:
            while not stop.is_set():
                try:
                    rows = client.query("SELECT * FROM t").dicts()
                except Exception as error:  # a refusal is allowed; a mixed answer is not
                    errors.append(str(error))
                    continue
                answers.append((frozenset(r["v"] for r in rows), frozenset(r["k"] for r in rows)))

    readers = [threading.Thread(target=read) for _ in range(2)]
    for reader in readers:
        reader.start()
    try:
        _eventually(lambda: len(answers) >= 5)
        new = spark.createDataFrame([(k, "new") for k in sorted(new_keys)], "k STRING, v STRING")
        _write(running, new.repartition(3), "overwrite")
        seen = len(answers)
        _eventually(lambda: len(answers) >= seen + 20)
    finally:
        stop.set()
        for reader in readers:
            reader.join()

    whole: list[tuple[frozenset[object], frozenset[object]]] = [
        (frozenset({"old"}), frozenset(old_keys)),
        (frozenset({"new"}), frozenset(new_keys)),
    ]
    mixed = [a for a in answers if a not in whole]
    assert not mixed, f"{len(mixed)} of {len(answers)} answers were neither the old table nor the new one"
    kinds = [next(iter(values)) for values, _ in answers]
    assert kinds[0] == "old" and kinds[-1] == "new"
    assert len(errors) <= len(answers) // 10, errors[:5]
    assert {r["v"] for r in _rows(running, "t").values()} == {"new"}
    assert set(_rows(running, "t")) == new_keys
    # The old generation's replicas are dropped on every server; only the new one's remain.
    _eventually(lambda: len(_generations(running)) == 1 and old_generation not in _generations(running))


def test_an_overwrite_with_other_key_columns_fails_before_anything_is_written(
    spark: SparkSession, start_cluster: StartCluster
) -> None:
    running = start_cluster(1)
    df = spark.createDataFrame([("k1", 1, "old")], "k STRING, n BIGINT, v STRING")
    _write(running, df, "append")
    generations = _generations(running)
    other = spark.createDataFrame([("k1", 5, "new")], "k STRING, n BIGINT, v STRING")
    with pytest.raises(Exception, match=r"cannot overwrite table 't'.*key \(k STRING\).*\(n INT\)"):
        _write(running, other, "overwrite", key="n")
    assert _rows(running, "t") == {"k1": {"k": "k1", "n": 1, "v": "old"}}
    assert _generations(running) == generations


def test_a_failed_overwrite_leaves_the_old_table_serving_and_drops_the_new_generation(
    spark: SparkSession, start_cluster: StartCluster
) -> None:
    running = start_cluster(1)
    df = spark.createDataFrame([(f"k{i}", "old") for i in range(20)], "k STRING, v STRING")
    _write(running, df, "append")
    generations = _generations(running)
    # A null key fails its task, and with it the job, after the other task may have loaded its rows.
    bad = spark.createDataFrame([("k1", "new"), ("k2", "new"), (None, "new")], "k STRING, v STRING")
    with pytest.raises(Exception, match="key"):
        _write(running, bad.repartition(2), "overwrite")
    assert {r["v"] for r in _rows(running, "t").values()} == {"old"}
    assert len(_rows(running, "t")) == 20
    _eventually(lambda: _generations(running) == generations)
    # The table takes an overwrite again afterwards.
    good = spark.createDataFrame([("k1", "new")], "k STRING, v STRING")
    _write(running, good, "overwrite")
    assert _rows(running, "t") == {"k1": {"k": "k1", "v": "new"}}
