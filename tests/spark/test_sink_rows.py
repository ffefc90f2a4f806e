"""The sink's pure parts: rows to dicts, cluster addresses, key columns (no SparkSession, no cluster)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator

import orjson
import pytest
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.keys import encode_key
from hotstate.protocol.rows import decode_row, encode_row
from hotstate.server.http.queries import dumps
from hotstate.spark.api import parse_cluster
from hotstate.spark.reading import converter
from hotstate.spark.sink import SinkConfig, as_dict, config_for_schema
from hotstate.spark.table import TableDefinitionError, key_columns_for

SCHEMA = StructType(
    [
        StructField("user", StringType()),
        StructField("at", TimestampType()),
        StructField("wall", TimestampNTZType()),
        StructField(
            "window", StructType([StructField("start", TimestampType()), StructField("n", LongType())])
        ),
        StructField("tags", ArrayType(StringType())),
        StructField("counts", MapType(StringType(), LongType())),
        StructField("amount", DecimalType(10, 2)),
    ]
)


def config(schema: StructType = SCHEMA) -> SinkConfig:
    return config_for_schema(
        schema, servers=(("h", 1),), table="t", cluster_id="c", secret="s3cret", rack=None, deadline_s=1.0
    )


def test_rows_become_dicts_that_the_row_codec_takes() -> None:
    cfg = config()
    assert cfg.instant_columns == ("at",) and cfg.nested
    assert "s3cret" not in repr(cfg)
    naive_local = dt.datetime(2026, 1, 2, 3, 4, 5, 6)  # how Spark hands a TimestampType to Python
    row = Row(
        user="u1",
        at=naive_local,
        wall=dt.datetime(2026, 1, 2, 3, 4, 5),
        window=Row(start=naive_local, n=3),
        tags=["a", "b"],
        counts={"x": 1},
        amount=None,
    )
    out = as_dict(cfg, row)
    at = out["at"]
    assert isinstance(at, dt.datetime)
    assert at == naive_local.astimezone(dt.UTC) and at.tzinfo is not None
    assert at.timestamp() == naive_local.timestamp()  # the same instant
    assert out["wall"] == dt.datetime(2026, 1, 2, 3, 4, 5)  # TIMESTAMP_NTZ stays wall-clock
    # Structs as dicts (rows.py refuses Row); a TimestampType inside is the same instant as `at`.
    assert out["window"] == {"start": at, "n": 3}
    assert decode_row(encode_row(out))["tags"] == ["a", "b"]
    assert encode_key((at,)) == encode_key((naive_local.astimezone(dt.UTC),))


@pytest.fixture
def far_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone 5 hours west of UTC, where a naive local time is not the UTC one."""
    monkeypatch.setenv("TZ", "EST+05")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


NESTED = StructType(
    [
        StructField("user", StringType()),
        StructField("at", TimestampType()),
        StructField(
            "visit", StructType([StructField("at", TimestampType()), StructField("wall", TimestampNTZType())])
        ),
        StructField("times", ArrayType(TimestampType())),
        StructField("by_time", MapType(TimestampType(), ArrayType(TimestampType()))),
        StructField("walls", ArrayType(TimestampNTZType())),
    ]
)


@pytest.mark.usefixtures("far_from_utc")
def test_nested_timestamps_are_stored_and_read_back_as_the_same_instant_as_top_level_ones() -> None:
    cfg = config(NESTED)
    assert cfg.instant_columns == ("at",)
    assert [name for name, _ in cfg.nested_instants] == ["visit", "times", "by_time"]  # not walls: NTZ
    instant = dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    # How PySpark hands a TimestampType to Python at any depth (Row path and write format alike): naive
    # local time, here 5 hours behind UTC.
    local = instant.astimezone().replace(tzinfo=None)
    assert local.hour == 22
    wall = dt.datetime(2026, 1, 2, 3, 4, 5)
    row = Row(
        user="u1",
        at=local,
        visit=Row(at=local, wall=wall),
        times=[local, None],
        by_time={local: [local]},
        walls=[wall],
    )
    out = as_dict(cfg, row)
    assert out["at"] == instant
    assert out["visit"] == {"at": instant, "wall": wall}
    assert out["times"] == [instant, None]
    assert out["by_time"] == {instant: [instant]}
    assert out["walls"] == [wall]  # TIMESTAMP_NTZ stays wall-clock, nested too
    # Stored, answered by a pull query (the server's JSON) and read by the Spark source: every one of them
    # the same instant as the top-level column.
    answer = orjson.loads(dumps(decode_row(encode_row(out))))
    read = {f.name: converter(f.dataType, f.name, "t")(answer[f.name]) for f in NESTED.fields}
    assert answer["visit"]["at"] == answer["at"] == answer["times"][0] == answer["by_time"][answer["at"]][0]
    assert read["at"] == instant
    assert read["visit"] == (instant, wall)
    assert read["times"] == [instant, None]
    assert read["by_time"] == {instant: [instant]}
    assert read["walls"] == [wall]


def test_flat_rows_take_the_fast_path() -> None:
    schema = StructType([StructField("user", StringType()), StructField("n", LongType())])
    cfg = config(schema)
    assert not cfg.nested
    assert as_dict(cfg, Row(user="u", n=1)) == {"user": "u", "n": 1}
    assert as_dict(cfg, ("u", 2)) == {"user": "u", "n": 2}


def test_cluster_addresses() -> None:
    assert parse_cluster("127.0.0.1:9001, 127.0.0.1:9002") == (("127.0.0.1", 9001), ("127.0.0.1", 9002))
    assert parse_cluster(["a:1", ("b", 2)]) == (("a", 1), ("b", 2))
    assert parse_cluster("[::1]:9001") == (("::1", 9001),)
    for bad in ("nohost", "h:x", ""):
        with pytest.raises(ValueError, match="cluster"):
            parse_cluster(bad)


def test_key_columns_from_the_schema() -> None:
    assert key_columns_for(SCHEMA, ["user", "at"]) == (
        KeyColumn("user", KeyType.STRING),
        KeyColumn("at", KeyType.TIMESTAMP),
    )
    assert key_columns_for(SCHEMA, "wall") == (KeyColumn("wall", KeyType.TIMESTAMP),)
    with pytest.raises(TableDefinitionError, match=r"'amount' has type decimal\(10,2\)"):
        key_columns_for(SCHEMA, "amount")
    with pytest.raises(TableDefinitionError, match="names a column twice"):
        key_columns_for(SCHEMA, ["user", "user"])
    with pytest.raises(TableDefinitionError, match="at least one"):
        key_columns_for(SCHEMA, [])
