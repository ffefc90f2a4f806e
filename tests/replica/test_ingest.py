"""An active's bulk check of a Produce's rows gives exactly what the row-by-row check gives: the same records
for good rows, the same first error for bad ones; and the bulk record codecs equal the single ones."""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.keys import encode_key, partition_for
from hotstate.protocol.rows import (
    RowDecodeError,
    decode_record,
    decode_records,
    decode_row,
    decode_rows,
    encode_record,
    encode_records,
    encode_row,
)
from hotstate.replica import ingest
from hotstate.replica.ingest import records_for_rows

STRING_KEY = (KeyColumn("user", KeyType.STRING),)
COMPOSITE_KEY = (KeyColumn("user", KeyType.STRING), KeyColumn("n", KeyType.INT))
KEY_VALUES = (
    st.text(max_size=6)
    | st.integers(-(2**64), 2**64)
    | st.none()
    | st.booleans()
    | st.floats()
    | st.datetimes()
    | st.binary(max_size=3)
)
ROWS = st.fixed_dictionaries(
    {}, optional={"user": KEY_VALUES, "n": KEY_VALUES, "x": st.integers(0, 9) | st.text(max_size=3)}
)


def row_bytes(draw_rows: list[dict[str, Any]], junk: list[bytes]) -> list[bytes]:
    out = []
    for row in draw_rows:
        try:
            out.append(encode_row(row))
        except ValueError:
            out.append(msgpack.packb(["not", "a", "map"]))
    return out + junk


@given(
    st.lists(ROWS, min_size=1, max_size=6),
    st.lists(st.binary(max_size=4), max_size=1),
    st.sampled_from([STRING_KEY, COMPOSITE_KEY]),
    st.integers(1, 3),
    st.integers(0, 2),
)
def test_bulk_check_equals_the_one_by_one_check(
    rows: list[dict[str, Any]], junk: list[bytes], key: tuple[KeyColumn, ...], partitions: int, partition: int
) -> None:
    data = row_bytes(rows, junk)
    expected = ingest._one_by_one(data, key, partitions, partition, "t")
    assert records_for_rows(data, key, partitions, partition, "t") == expected


@pytest.mark.parametrize("key", [STRING_KEY, COMPOSITE_KEY])
def test_good_rows_take_the_fast_path_and_give_the_records(key: tuple[KeyColumn, ...]) -> None:
    rows = [{"user": f"u\x00{i}", "n": i, "at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)} for i in range(200)]
    for partition in range(3):
        mine = [
            encode_row(r)
            for r in rows
            if partition_for(encode_key(tuple(r[c.name] for c in key)), 3) == partition  # type: ignore[misc]
        ]
        records = ingest._fast(mine, key, 3, partition)  # None would mean the slow path ran
        assert records is not None and records == ingest._one_by_one(mine, key, 3, partition, "t")[0]
        assert [decode_row(decode_record(r)[1] or b"") for r in records] == [decode_row(r) for r in mine]


def test_a_row_of_another_partition_is_named() -> None:
    rows = [encode_row({"user": f"u{i}"}) for i in range(50)]
    records, problem = records_for_rows(rows, STRING_KEY, 4, 0, "t")
    first = next(i for i, r in enumerate(rows) if partition_for(encode_key((decode_row(r)["user"],)), 4) != 0)  # type: ignore[arg-type]
    assert records == [] and problem is not None and problem.startswith(f"row {first} of t: its key belongs")


@given(st.lists(st.tuples(st.binary(max_size=300), st.none() | st.binary(max_size=300)), max_size=5))
def test_bulk_record_codecs_equal_the_single_ones(pairs: list[tuple[bytes, bytes | None]]) -> None:
    keys = [k for k, _ in pairs]
    rows = [r for _, r in pairs]
    records = encode_records(keys, rows)
    assert records == [encode_record(k, r) for k, r in pairs]
    assert decode_records(records) == pairs


def test_bulk_decoders_raise_what_the_single_ones_raise() -> None:
    good = encode_record(b"k", b"v")
    with pytest.raises(RowDecodeError, match="not \\[key bytes"):
        decode_records([good, msgpack.packb([1, 2])])
    with pytest.raises(RowDecodeError, match="not a map"):
        decode_rows([encode_row({"a": 1}), msgpack.packb([1])])
    with pytest.raises(RowDecodeError, match="not valid msgpack"):
        decode_rows([encode_row({"a": 1}), b"\xc1"])
    with pytest.raises(TypeError, match="a record is"):
        encode_records([b"k", "k"], [b"v", b"v"])  # type: ignore[list-item]
