"""Spark's names of declared value columns as ksqlDB's column types (/query's schema, /query-stream's
columnTypes)."""

from __future__ import annotations

import pytest

from hotstate.server.http.queries import ksql_type


@pytest.mark.parametrize(
    ("spark", "ksql"),
    [
        ("bigint", "BIGINT"),
        ("int", "INTEGER"),
        ("smallint", "INTEGER"),
        ("double", "DOUBLE"),
        ("float", "DOUBLE"),
        ("boolean", "BOOLEAN"),
        ("string", "STRING"),
        ("binary", "BYTES"),
        ("date", "DATE"),
        ("timestamp", "TIMESTAMP"),
        ("timestamp_ntz", "TIMESTAMP"),
        ("decimal(10,2)", "DECIMAL(10, 2)"),
        ("array<string>", "ARRAY<STRING>"),
        ("map<string,array<int>>", "MAP<STRING, ARRAY<INTEGER>>"),
        ("struct<a:int,b:decimal(5,1)>", "STRUCT<`a` INTEGER, `b` DECIMAL(5, 1)>"),
        # ksqlDB has no name for these: their values read as text.
        ("interval day", "STRING"),
        ("map<string>", "STRING"),
    ],
)
def test_spark_types_as_ksqldb_names_them(spark: str, ksql: str) -> None:
    assert ksql_type(spark) == ksql
