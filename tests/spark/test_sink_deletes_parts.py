"""The sink's delete parts without a SparkSession or cluster: the Arrow path puts a tombstone of the row's
key in a deleted row's place (the same entries the Row path's `Delete` gives), and a delete column is
checked on the driver: missing, a key column or of the wrong type is an error naming it and its type."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import BooleanType, IntegerType, LongType, StringType, StructField, StructType

from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.keys import encode_key, key_from_row, partition_for
from hotstate.protocol.rows import encode_row, encode_tombstone
from hotstate.spark.arrow_rows import encode_arrow_batch
from hotstate.spark.sink import (
    DeleteColumnError,
    DeleteMarker,
    config_for_schema,
    delete_marker,
    split_marker,
    without_column,
)

KEY = (KeyColumn("k", KeyType.STRING), KeyColumn("n", KeyType.INT))
SCHEMA = StructType(
    [
        StructField("k", StringType()),
        StructField("n", LongType()),
        StructField("v", StringType()),
        StructField("_deleted", BooleanType()),
        StructField("op", StringType()),
        StructField("code", IntegerType()),
    ]
)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=5), st.integers(-9, 9), st.none() | st.booleans()), max_size=12))
def test_deleted_rows_become_tombstones_of_their_keys_in_place(
    rows: list[tuple[str, int, bool | None]],
) -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "k": pa.array([r[0] for r in rows], pa.string()),
            "n": pa.array([r[1] for r in rows], pa.int64()),
            "v": pa.array([f"v{i}" for i in range(len(rows))], pa.string()),
            "_deleted": pa.array([r[2] for r in rows], pa.bool_()),
        }
    )
    config = config_for_schema(
        SCHEMA,
        servers=(("h", 1),),
        table="t",
        cluster_id="c",
        secret="s",
        rack=None,
        deadline_s=1.0,
        deletes=DeleteMarker("_deleted"),
    )
    stored, deletes = split_marker(config, batch)
    assert stored.schema.names == ["k", "n", "v"]  # the delete column is never stored
    keys: list[bytes] = []
    got = encode_arrow_batch(stored, KEY, 3, deletes=deletes, keys_out=keys)
    expected: dict[int, list[bytes]] = {}
    for i, (k, n, deleted) in enumerate(rows):
        key = encode_key(key_from_row({"k": k, "n": n}, KEY))
        entry = encode_tombstone(key) if deleted else encode_row({"k": k, "n": n, "v": f"v{i}"})
        expected.setdefault(partition_for(key, 3), []).append(entry)
    assert got == expected
    assert keys == [encode_key((k, n)) for k, n, _ in rows]


def test_a_delete_column_of_the_wrong_type_is_named_with_its_type() -> None:
    with pytest.raises(DeleteColumnError, match="delete column 'v' has type string: it must be boolean"):
        delete_marker(SCHEMA, "k", "v")
    with pytest.raises(DeleteColumnError, match="delete column 'code' has type int: it must be string"):
        delete_marker(SCHEMA, "k", delete_when=("code", "d"))
    with pytest.raises(DeleteColumnError, match="delete column 'op' has type string: it must be"):
        delete_marker(SCHEMA, "k", delete_when=("op", 3))
    with pytest.raises(DeleteColumnError, match="'gone' is not a column of the DataFrame"):
        delete_marker(SCHEMA, "k", "gone")
    with pytest.raises(DeleteColumnError, match="'k' is a key column"):
        delete_marker(SCHEMA, ["k", "n"], delete_when=("k", "x"))
    with pytest.raises(DeleteColumnError, match="not both"):
        delete_marker(SCHEMA, "k", "_deleted", ("op", "d"))
    with pytest.raises(DeleteColumnError, match="bool, int or str"):
        delete_marker(SCHEMA, "k", delete_when=("op", 1.5))


def test_a_good_marker_and_the_stored_schema() -> None:
    assert delete_marker(SCHEMA, "k") is None
    assert delete_marker(SCHEMA, "k", "_deleted") == DeleteMarker("_deleted", True)
    assert delete_marker(SCHEMA, "k", delete_when=("op", "d")) == DeleteMarker("op", "d")
    assert delete_marker(SCHEMA, "k", delete_when=("code", 7)) == DeleteMarker("code", 7)
    marker = DeleteMarker("op", "d")
    assert [f.name for f in without_column(SCHEMA, marker).fields] == ["k", "n", "v", "_deleted", "code"]
    assert without_column(SCHEMA, None) is SCHEMA
