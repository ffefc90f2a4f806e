"""The data source's pure parts: options, key filters as a WHERE, JSON values back to Spark values,
schema inference (no SparkSession, no cluster)."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest
from pyspark.sql.datasource import EqualTo, GreaterThan, In, IsNotNull, LessThanOrEqual, StringStartsWith
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from hotstate.controller.image import TableInfo
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.query.plan import plan
from hotstate.query.sql import parse
from hotstate.spark.reading import HotstateReadError, converter, key_where, merged
from hotstate.spark.source import OptionError, read_settings, write_settings

KEYS = (("user", KeyType.STRING), ("n", KeyType.INT))
SCHEMA = StructType(
    [StructField("user", StringType()), StructField("n", LongType()), StructField("v", DoubleType())]
)


def test_read_options_are_checked_and_unknown_ones_name_the_known() -> None:
    settings = read_settings({"table": "t", "servers": "a:1, b:2", "maxlag": "5", "pagesize": "10"})
    assert settings.servers == ("a:1", "b:2") and settings.max_lag == 5 and settings.page_size == 10
    assert read_settings({"path": "t", "servers": "a:1"}).table == "t"  # load("t")
    with pytest.raises(OptionError, match="unknown option 'key' for reading a hotstate table; known: table"):
        read_settings({"table": "t", "servers": "a:1", "key": "user"})
    with pytest.raises(OptionError, match="option 'maxLag': must be an integer >= 0, got '-1'"):
        read_settings({"table": "t", "servers": "a:1", "maxlag": "-1"})
    with pytest.raises(OptionError, match="option 'standbyReads': must be true or false, got 'maybe'"):
        read_settings({"table": "t", "servers": "a:1", "standbyreads": "maybe"})
    with pytest.raises(OptionError, match="option 'table': name the hotstate table"):
        read_settings({"servers": "a:1"})
    with pytest.raises(OptionError, match="option 'table' is 't' but the path given is 'u'"):
        read_settings({"table": "t", "path": "u", "servers": "a:1"})


def test_write_options_are_checked_and_unknown_ones_name_the_known(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HOTSTATE_CLUSTER", "HOTSTATE_CLUSTER_ID", "HOTSTATE_CLUSTER_SECRET", "HOTSTATE_RACK"):
        monkeypatch.delenv(name, raising=False)
    given = {
        "table": "t",
        "key": "a, b",
        "partitions": "4",
        "cluster": "h:1,h:2",
        "clusterid": "c",
        "secret": "s",
        "checkpointlocation": "/chk",
    }
    settings = write_settings(given)
    assert settings.key == ("a", "b") and settings.partitions == 4 and settings.standby_replicas == 1
    assert settings.servers == (("h", 1), ("h", 2)) and settings.deadline_s == 60.0
    with pytest.raises(OptionError, match="unknown option 'partitons' for writing a hotstate table; known: "):
        write_settings({**given, "partitons": "3"})
    with pytest.raises(OptionError, match="option 'partitions': how many partitions"):
        write_settings({k: v for k, v in given.items() if k != "partitions"})
    with pytest.raises(OptionError, match="option 'key': name the key column"):
        write_settings({**given, "key": " "})
    with pytest.raises(OptionError, match="option cluster: 'h' is not host:port"):
        write_settings({**given, "cluster": "h"})
    with pytest.raises(OptionError, match="'clusterId' and 'secret'"):
        write_settings({k: v for k, v in given.items() if k != "secret"})
    with pytest.raises(OptionError, match=r"options 'tlsCa', 'tlsCert', 'tlsKey': .*'/nowhere/ca\.crt'"):
        write_settings({**given, "tlsCa": "/nowhere/ca.crt"})
    with pytest.raises(OptionError, match="needs both its certificate file and its key file"):
        write_settings({**given, "tlsCert": "/nowhere/client.crt"})


def test_key_filters_become_the_where_the_planner_reads_and_the_rest_stay_with_spark() -> None:
    eq = EqualTo(("user",), "a'b")
    n_range = GreaterThan(("n",), 3)
    n_upper = LessThanOrEqual(("n",), 9)
    other = GreaterThan(("v",), 1.5)
    where, left = key_where([eq, n_range, n_upper, other, IsNotNull(("user",))], KEYS, SCHEMA)
    assert where == " WHERE `user` = 'a''b' AND `n` > 3 AND `n` <= 9"
    assert left == [other, IsNotNull(("user",))]
    table = _table()
    plan(parse(f"SELECT * FROM t{where} LIMIT 5"), table)  # the planner takes it

    # A range on the first key column ends the pushed part: nothing on the next one goes.
    where, left = key_where([GreaterThan(("user",), "m"), EqualTo(("n",), 1)], KEYS, SCHEMA)
    assert where == " WHERE `user` > 'm'" and left == [EqualTo(("n",), 1)]
    where, _ = key_where([In(("user",), ("a", "b")), In(("n",), (1, 2))], KEYS, SCHEMA)
    assert where == " WHERE `user` IN ('a', 'b') AND `n` IN (1, 2)"
    plan(parse(f"SELECT * FROM t{where}"), table)
    # Nothing on the first key column, a value of another type, a filter the planner lacks: Spark's.
    for filters in (
        [EqualTo(("n",), 1)],
        [EqualTo(("user",), 7)],
        [StringStartsWith(("user",), "a")],
        [In(("user",), ())],
    ):
        assert key_where(filters, KEYS, SCHEMA) == ("", filters)
    # A key the user's schema declares with another type is not pushed.
    other_types = StructType([StructField("user", LongType()), StructField("n", LongType())])
    assert key_where([EqualTo(("user",), 1)], KEYS, other_types)[0] == ""
    ints = StructType([StructField("user", StringType()), StructField("n", IntegerType())])
    assert key_where([EqualTo(("user",), "a"), EqualTo(("n",), 2)], KEYS, ints)[0].endswith("`n` = 2")


def _table() -> TableInfo:
    keys = (KeyColumn("user", KeyType.STRING), KeyColumn("n", KeyType.INT))
    return TableInfo("t", 1, 4, 1, keys, acceptable_lag=None)


def test_json_values_come_back_as_the_schema_says() -> None:
    def convert(kind: DataType, value: object) -> object:
        return converter(kind, "c", "t")(value)

    assert convert(TimestampType(), "2026-01-02T03:04:05+00:00") == dt.datetime(
        2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC
    )
    naive = convert(TimestampType(), "2026-01-02T03:04:05")
    assert isinstance(naive, dt.datetime) and naive.tzinfo == dt.UTC  # naive means UTC
    assert convert(TimestampNTZType(), "2026-01-02T04:04:05+01:00") == dt.datetime(2026, 1, 2, 3, 4, 5)
    assert convert(DateType(), "2026-01-02") == dt.date(2026, 1, 2)
    assert convert(BinaryType(), "AAH/") == b"\x00\x01\xff"
    assert convert(DecimalType(10, 2), "12.50") == decimal.Decimal("12.50")
    assert convert(DoubleType(), "-Infinity") == float("-inf") and convert(DoubleType(), 2) == 2.0
    assert convert(StringType(), {"a": [1]}) == '{"a":[1]}'
    assert convert(ArrayType(LongType()), [1, None]) == [1, None]
    assert convert(MapType(StringType(), TimestampType()), {"k": "2026-01-02T00:00:00Z"}) == {
        "k": dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    }
    point = StructType([StructField("x", LongType()), StructField("y", LongType())])
    assert convert(point, {"y": 2, "x": 1}) == (1, 2)
    assert convert(LongType(), None) is None
    for kind, value, shown in (
        (LongType(), "7", '"7"'),
        (LongType(), True, "true"),
        (DoubleType(), "lots", '"lots"'),
        (BinaryType(), "not base64!", '"not base64!"'),
    ):
        with pytest.raises(HotstateReadError, match=f"hotstate table 't', column 'c': {shown} does not fit"):
            convert(kind, value)


def test_value_columns_are_inferred_from_a_sample() -> None:
    assert merged([None, 1, 2]) == LongType()
    assert merged([1, 2.5]) == DoubleType()
    assert merged([1.5, "NaN"]) == StringType()
    boolean = merged([True, None])
    assert boolean is not None and boolean.simpleString() == "boolean"
    assert merged([["a"], [], None]) == ArrayType(StringType(), True)
    assert merged([{"a": 1}, {"b": 2.0}]) == MapType(StringType(), DoubleType(), True)
    assert merged([None, None]) is None
    assert merged(["x", 1]) == StringType()


def test_a_writers_ttl_options_are_checked_against_its_schema_before_anything_is_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hotstate.spark.source import _sink_config

    for name in ("HOTSTATE_CLUSTER", "HOTSTATE_CLUSTER_ID", "HOTSTATE_CLUSTER_SECRET", "HOTSTATE_RACK"):
        monkeypatch.delenv(name, raising=False)
    given = {
        "table": "t",
        "key": "user",
        "partitions": "2",
        "cluster": "h:1",
        "clusterId": "c",
        "secret": "s",
    }
    schema = StructType(
        [
            StructField("user", StringType()),
            StructField("at", TimestampType()),
            StructField("local", TimestampNTZType()),
            StructField("n", LongType()),
        ]
    )
    settings = write_settings({**given, "ttl": "7d", "ttlColumn": "at"})
    assert settings.ttl == "7d" and settings.ttl_column == "at"
    # Refused from the schema alone: nothing is contacted (no server listens at h:1).
    for options, message in [
        ({"ttl": "7d", "ttlColumn": "n"}, "'n': of type bigint, not a timestamp"),
        ({"ttl": "7d", "ttlColumn": "gone"}, "'gone': no such column"),
        ({"ttl": "soon"}, "positive whole number and a unit"),
        ({"ttlColumn": "at"}, "without a ttl"),
    ]:
        with pytest.raises(OptionError, match=message):
            _sink_config(write_settings({**given, **options}), schema)
