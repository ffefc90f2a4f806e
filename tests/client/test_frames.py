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
    with pytest.raises(FrameError, match="BYTES key 'not base64!' is not base64"):
        arrow_table(["b"], [["not base64!"]], {"b": "BYTES"})
    with pytest.raises(FrameError, match="TIMESTAMP key 'yesterday'"):
        arrow_table(["t"], [["yesterday"]], {"t": "TIMESTAMP"})
