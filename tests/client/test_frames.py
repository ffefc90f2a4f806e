"""QueryResult.to_arrow / to_pandas on answers as the server writes them (JSON), without a server."""

from __future__ import annotations

import datetime as dt
import math

import pyarrow as pa
import pytest

from hotstate.client.frames import FrameError, arrow_table
from hotstate.client.query import QueryResult


def _result(columns: list[str], rows: list[list[object]], keys: list[dict[str, str]]) -> QueryResult:
    body = {"query_id": "q", "table": "t", "columns": columns, "rows": rows, "key_columns": keys}
    return QueryResult.from_json(body, "127.0.0.1:1")


def test_key_columns_take_the_tables_types_and_values_their_json_types() -> None:
    keys = [
        {"name": "at", "type": "TIMESTAMP"},
        {"name": "blob", "type": "BYTES"},
        {"name": "n", "type": "BIGINT"},
    ]
    result = _result(
        ["at", "blob", "n", "score", "name", "tags"],
        [
            ["2024-03-01T12:30:00", "aGk=", 1, 1.5, "a", ["x"]],
            ["2024-03-01T13:00:00+01:00", "AAE=", 2, "NaN", None, []],
            [None, None, None, None, "c", None],
        ],
        keys,
    )
    table = result.to_arrow()
    assert table.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert table.schema.field("blob").type == pa.binary()
    assert table.schema.field("n").type == pa.int64()
    assert table.schema.field("score").type == pa.float64()
    assert table.schema.field("name").type == pa.string()
    assert table.schema.field("tags").type == pa.list_(pa.string())
    at = table.column("at").to_pylist()
    assert at[0] == dt.datetime(2024, 3, 1, 12, 30, tzinfo=dt.UTC)
    assert at[1] == dt.datetime(2024, 3, 1, 12, 0, tzinfo=dt.UTC)  # +01:00 is 12:00 UTC
    assert table.column("blob").to_pylist() == [b"hi", b"\x00\x01", None]
    assert math.isnan(table.column("score").to_pylist()[1])

    frame = result.to_pandas()
    assert list(frame.columns) == ["at", "blob", "n", "score", "name", "tags"]
    assert str(frame["at"].dtype) == "datetime64[us, UTC]"
    assert frame["n"].tolist()[:2] == [1, 2]


def test_an_empty_answer_still_has_its_columns_and_key_types() -> None:
    table = _result(["user", "clicks"], [], [{"name": "user", "type": "STRING"}]).to_arrow()
    assert table.num_rows == 0
    assert table.schema.names == ["user", "clicks"]
    assert table.schema.field("user").type == pa.string()
    assert table.schema.field("clicks").type == pa.null()


def test_a_string_column_that_holds_nan_as_text_stays_text() -> None:
    table = arrow_table(["word"], [["NaN"], ["bread"]], {})
    assert table.column("word").to_pylist() == ["NaN", "bread"]
    floats = arrow_table(["x"], [["Infinity"], [2], ["-Infinity"], [None]], {})
    assert floats.column("x").to_pylist() == [math.inf, 2.0, -math.inf, None]


def test_a_key_value_that_does_not_fit_its_type_is_a_clear_error() -> None:
    with pytest.raises(FrameError, match="bytes value 'not base64!' is not base64"):
        arrow_table(["b"], [["not base64!"]], {"b": "BYTES"})
    with pytest.raises(FrameError, match="timestamp value 'yesterday'"):
        arrow_table(["t"], [["yesterday"]], {"t": "TIMESTAMP"})
    with pytest.raises(FrameError, match="decimal value 'ten' is not a number"):
        arrow_table(["d"], [["ten"]], {"d": "decimal(10,2)"})


def test_value_columns_take_the_types_their_writer_declared() -> None:
    body = {
        "query_id": "q",
        "columns": ["k", "price", "day", "seen", "local", "n", "ratio", "raw", "tags"],
        "rows": [
            [
                "a",
                "12.50",
                "2024-03-01",
                "2024-03-01T12:00:00+02:00",
                "2024-03-01T12:00:00",
                7,
                0.5,
                "aGk=",
                ["x"],
            ]
        ],
        "key_columns": [{"name": "k", "type": "STRING"}],
        "value_columns": [
            {"name": "price", "type": "decimal(10,2)"},
            {"name": "day", "type": "date"},
            {"name": "seen", "type": "timestamp"},
            {"name": "local", "type": "timestamp_ntz"},
            {"name": "n", "type": "int"},
            {"name": "ratio", "type": "float"},
            {"name": "raw", "type": "binary"},
            {"name": "tags", "type": "array<string>"},
        ],
    }
    table = QueryResult.from_json(body, "127.0.0.1:1").to_arrow()
    types = {f.name: f.type for f in table.schema}
    assert types["price"] == pa.decimal128(10, 2) and types["day"] == pa.date32()
    assert types["seen"] == pa.timestamp("us", tz="UTC") and types["local"] == pa.timestamp("us")
    assert types["n"] == pa.int32() and types["ratio"] == pa.float32() and types["raw"] == pa.binary()
    assert types["tags"] == pa.list_(pa.string())  # nested: inferred
    row = table.to_pylist()[0]
    assert str(row["price"]) == "12.50" and row["day"] == dt.date(2024, 3, 1)
    assert row["seen"] == dt.datetime(2024, 3, 1, 10, 0, tzinfo=dt.UTC)
    assert row["local"] == dt.datetime(2024, 3, 1, 12, 0) and row["raw"] == b"hi"
