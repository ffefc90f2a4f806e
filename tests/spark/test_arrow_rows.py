"""The Arrow path of the sink encodes exactly what the Row path does: the same row bytes, keys and
partitions for every supported type, nulls and edge values included (no SparkSession, no cluster)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.keys import encode_key, key_from_row, partition_for
from hotstate.protocol.rows import decode_row, encode_row
from hotstate.spark.arrow_rows import NotEncodable, arrow_encodable, encode_arrow_batch

# Years 2 to 9998: a day off the ends of Python datetime, so every time zone can show the instant.
# Edges of msgpack's three timestamp forms (32-bit whole seconds, 64-bit, 96-bit).
TIMESTAMP_EDGES = [0, 1, -1, 10**6, -(10**6), (2**32 - 1) * 10**6, 2**32 * 10**6, (2**32 - 1) * 10**6 + 1]
TIMESTAMP_EDGES += [(2**34 - 1) * 10**6 + 999_999, 2**34 * 10**6, 1_700_000_000 * 10**6]
MICROS = st.integers(-62104060800 * 10**6, 253370764800 * 10**6) | st.sampled_from(TIMESTAMP_EDGES)
INT64 = st.integers(-(2**63), 2**63 - 1)
# Each msgpack int form's bounds, on both sides.
EDGE_INTS = st.sampled_from(
    [
        0,
        127,
        128,
        255,
        256,
        65535,
        65536,
        2**32 - 1,
        2**32,
        -1,
        -32,
        -33,
        -128,
        -129,
        -32768,
        -32769,
        -(2**31),
    ]
)
TEXT = st.text(max_size=40) | st.sampled_from(["x" * 31, "x" * 32, "é" * 128, "y" * 255, "z" * 256, "a\x00b"])

COLUMNS: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "s": (pa.string(), TEXT),
    "i": (pa.int64(), INT64 | EDGE_INTS),
    "i32": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "i8": (pa.int8(), st.integers(-128, 127)),
    "f": (pa.float64(), st.floats()),
    "f32": (pa.float32(), st.floats(width=32)),
    "b": (pa.bool_(), st.booleans()),
    "t": (pa.timestamp("us", tz="America/New_York"), MICROS),
    "w": (pa.timestamp("us"), MICROS),
    "d": (pa.date32(), st.integers(-719162, 2932896)),
    "y": (pa.binary(), st.binary(max_size=300)),
}


def reference(batch: pa.RecordBatch, key: tuple[KeyColumn, ...], partitions: int) -> dict[int, list[bytes]]:
    """The Row path: each row a dict (an instant as an aware datetime in UTC), encoded one by one."""
    out: dict[int, list[bytes]] = {}
    for row in batch.to_pylist():
        for name, value in row.items():
            if isinstance(value, dt.datetime) and value.tzinfo is not None:
                row[name] = value.astimezone(dt.UTC)
        encoded_key = encode_key(key_from_row(row, key))
        out.setdefault(partition_for(encoded_key, partitions), []).append(encode_row(row))
    return out


@st.composite
def batches(draw: st.DrawFn) -> pa.RecordBatch:
    names = draw(st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=6, unique=True))
    count = draw(st.integers(1, 12))
    arrays = {"k": pa.array([f"k{i}" for i in range(count)])}
    for name in names:
        kind, values = COLUMNS[name]
        cells = draw(st.lists(st.none() | values, min_size=count, max_size=count))
        arrays[name] = pa.array(cells, pa.int32() if pa.types.is_date32(kind) else kind).cast(kind)
    return pa.RecordBatch.from_pydict(arrays)


@settings(max_examples=300, deadline=None)
@given(batches(), st.integers(1, 5))
def test_rows_and_partitions_equal_the_row_path(batch: pa.RecordBatch, partitions: int) -> None:
    key = (KeyColumn("k", KeyType.STRING),)
    assert encode_arrow_batch(batch, key, partitions) == reference(batch, key, partitions)


KEY_COLUMNS = {
    KeyType.STRING: (pa.string(), TEXT),
    KeyType.INT: (pa.int64(), INT64 | EDGE_INTS),
    KeyType.FLOAT: (pa.float64(), st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0])),
    KeyType.BOOL: (pa.bool_(), st.booleans()),
    KeyType.BYTES: (pa.binary(), st.binary(max_size=8) | st.just(b"\x00\xff\x00")),
    KeyType.TIMESTAMP: (pa.timestamp("us", tz="UTC"), MICROS),
}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(sorted(KEY_COLUMNS, key=lambda k: k.value)), min_size=1, max_size=3), st.data()
)
def test_keys_of_every_type_equal_the_row_path(types: list[KeyType], data: st.DataObject) -> None:
    count = data.draw(st.integers(1, 8))
    arrays = {}
    for index, kind in enumerate(types):
        arrow_type, values = KEY_COLUMNS[kind]
        arrays[f"c{index}"] = pa.array(
            data.draw(st.lists(values, min_size=count, max_size=count)), arrow_type
        )
    batch = pa.RecordBatch.from_pydict(arrays)
    key = tuple(KeyColumn(f"c{index}", kind) for index, kind in enumerate(types))
    assert encode_arrow_batch(batch, key, 7) == reference(batch, key, 7)


def test_a_null_or_nan_key_is_left_to_the_row_path() -> None:
    for values, kind, key_type in (
        (["a", None], pa.string(), KeyType.STRING),
        ([1.0, float("nan")], pa.float64(), KeyType.FLOAT),
    ):
        batch = pa.RecordBatch.from_pydict({"k": pa.array(values, kind)})
        with pytest.raises(NotEncodable):
            encode_arrow_batch(batch, (KeyColumn("k", key_type),), 2)


def test_values_decode_as_the_row_codec_reads_them() -> None:
    at = dt.datetime(2026, 3, 29, 1, 30, tzinfo=dt.UTC)
    batch = pa.RecordBatch.from_pydict(
        {"k": ["a"], "at": pa.array([at], pa.timestamp("us", tz="Europe/Berlin")), "n": [None]}
    )
    (rows,) = encode_arrow_batch(batch, (KeyColumn("k", KeyType.STRING),), 1).values()
    assert decode_row(rows[0]) == {"k": "a", "at": at, "n": None}


def test_nested_and_decimal_columns_are_not_encoded_here() -> None:
    assert not arrow_encodable(pa.struct([("a", pa.int64())]))
    assert not arrow_encodable(pa.list_(pa.int64()))
    assert not arrow_encodable(pa.decimal128(10, 2))
    assert not arrow_encodable(pa.timestamp("ns"))
    assert arrow_encodable(pa.timestamp("us", tz="UTC")) and arrow_encodable(pa.large_string())
