"""Tombstones in a Produce: an entry that is the msgpack bin of an encoded key deletes it. The active checks
that the key is one of the table's key types, encoded as the writer encodes it, and of the partition; the
bulk check gives what the one-by-one check gives, mixed with rows in any order; a Produce of rows only pays
nothing for it."""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.keys import (
    InvalidKeyError,
    KeyDecodeError,
    checked_key,
    checked_keys,
    encode_key,
    partition_for,
)
from hotstate.protocol.rows import (
    RowDecodeError,
    decode_entries,
    decode_entry,
    decode_record,
    encode_record,
    encode_row,
    encode_tombstone,
    entry_keys,
    is_tombstone,
    row_keys,
)
from hotstate.replica import ingest
from hotstate.replica.ingest import records_for_rows

STRING_KEY = (KeyColumn("user", KeyType.STRING),)
COMPOSITE_KEY = (KeyColumn("user", KeyType.STRING), KeyColumn("n", KeyType.INT))
EVERY_TYPE = (
    KeyColumn("s", KeyType.STRING),
    KeyColumn("i", KeyType.INT),
    KeyColumn("f", KeyType.FLOAT),
    KeyColumn("b", KeyType.BOOL),
    KeyColumn("y", KeyType.BYTES),
    KeyColumn("t", KeyType.TIMESTAMP),
)


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65_535, 65_536])
def test_a_tombstone_is_a_msgpack_bin_of_the_key_and_no_row_looks_like_one(size: int) -> None:
    key = b"\x02" + b"x" * size + b"\x00"
    entry = encode_tombstone(key)
    assert msgpack.unpackb(entry) == key and is_tombstone(entry)
    assert decode_entry(entry) == key
    for row in ({}, {"a": 1}, {str(i): i for i in range(20)}, {str(i): i for i in range(70_000)}):
        assert not is_tombstone(encode_row(row))
    with pytest.raises(TypeError, match="encoded bytes"):
        encode_tombstone("k")  # type: ignore[arg-type]


def test_entries_decode_in_one_pass_and_say_whether_any_deletes() -> None:
    rows = [encode_row({"user": "a"}), encode_row({"user": "b"})]
    assert decode_entries(rows) == ([{"user": "a"}, {"user": "b"}], False)
    mixed = [rows[0], encode_tombstone(b"\x02a\x00")]
    assert decode_entries(mixed) == ([{"user": "a"}, b"\x02a\x00"], True)
    with pytest.raises(RowDecodeError, match="not a map"):
        decode_entries([rows[0], msgpack.packb([1])])
    with pytest.raises(RowDecodeError, match="not valid msgpack"):
        decode_entries([rows[0], encode_tombstone(b"k")[:-1]])


def test_checked_key_takes_every_key_type_and_refuses_what_no_writer_sends() -> None:
    key = ("s", -3, 1.5, True, b"\x00y", dt.datetime(2026, 1, 1, 12))
    assert checked_key(encode_key(key), EVERY_TYPE) == encode_key(key)
    with pytest.raises(InvalidKeyError, match="has 1 values"):
        checked_key(encode_key(("a",)), COMPOSITE_KEY)  # a component missing
    with pytest.raises(InvalidKeyError, match="has 3 values"):
        checked_key(encode_key(("a", 1, 2)), COMPOSITE_KEY)  # one too many
    with pytest.raises(InvalidKeyError, match="'n' must be an int"):
        checked_key(encode_key(("a", "1")), COMPOSITE_KEY)  # the wrong type
    with pytest.raises(InvalidKeyError, match="is null"):
        checked_key(encode_key(("a", None)), COMPOSITE_KEY)
    with pytest.raises(InvalidKeyError, match="not the encoding"):
        checked_key(encode_key((1,)), (KeyColumn("f", KeyType.FLOAT),))  # an INT where a FLOAT goes
    with pytest.raises(KeyDecodeError):
        checked_key(b"\x02unterminated", STRING_KEY)
    with pytest.raises(KeyDecodeError):
        checked_key(b"\x99", STRING_KEY)


def _in_partition(keys: list[tuple[Any, ...]], partitions: int, partition: int) -> list[tuple[Any, ...]]:
    return [k for k in keys if partition_for(encode_key(k), partitions) == partition]


@pytest.mark.parametrize("key", [STRING_KEY, COMPOSITE_KEY])
def test_tombstones_become_nil_records_in_their_place_on_the_fast_path(key: tuple[KeyColumn, ...]) -> None:
    keys = _in_partition([(f"u\x00{i}", i)[: len(key)] for i in range(300)], 3, 1)
    entries = []
    expected = []
    for n, k in enumerate(keys):
        row = encode_row({"user": k[0], "n": k[-1], "v": n})
        tombstone = encode_tombstone(encode_key(k))
        # Written then deleted, deleted then written, deleted alone: every order is kept.
        pair = [row, tombstone] if n % 3 == 0 else [tombstone, row] if n % 3 == 1 else [tombstone]
        entries += pair
        expected += [encode_record(encode_key(k), None if e is tombstone else e) for e in pair]
    records = ingest._fast(entries, key, 3, 1)  # None would mean the slow path ran
    assert records == expected
    assert records == ingest._one_by_one(entries, key, 3, 1, "t")[0]
    assert [decode_record(r)[1] is None for r in records] == [is_tombstone(e) for e in entries]
    assert row_keys(entries, key) == [decode_record(r)[0] for r in records]


def test_rows_alone_skip_every_tombstone_step() -> None:
    rows = [encode_row({"user": f"u{i}"}) for i in range(10)]
    keys, values = entry_keys(rows, STRING_KEY)
    assert values is rows  # the request's own tuple of rows: no per-row value built
    assert keys == [encode_key((f"u{i}",)) for i in range(10)]


def test_a_bad_tombstone_is_named_and_nothing_is_written() -> None:
    good = _in_partition([(f"u{i}",) for i in range(40)], 4, 0)
    other = next(k for k in [(f"u{i}",) for i in range(40)] if k not in good)
    cases = {
        encode_tombstone(encode_key((1,))): "delete 1 of t: key column 'user' must be a str",
        encode_tombstone(b"\x02no end"): "delete 1 of t: key bytes end inside",
        encode_tombstone(encode_key(other)): "delete 1 of t: its key belongs to partition",
        encode_tombstone(encode_key(("a", "b"))): "delete 1 of t: key has 2 values",
    }
    for bad, message in cases.items():
        entries = [encode_row({"user": good[0][0]}), bad, encode_tombstone(encode_key(good[1]))]
        records, problem = records_for_rows(entries, STRING_KEY, 4, 0, "t")
        assert records == [] and problem is not None and problem.startswith(message), problem


ENTRIES = st.lists(
    st.tuples(
        st.booleans(),
        st.text(max_size=4) | st.integers(-5, 5) | st.none(),
        st.integers(-3, 3) | st.text(max_size=2),
    ),
    min_size=1,
    max_size=8,
)


@given(ENTRIES, st.sampled_from([STRING_KEY, COMPOSITE_KEY]), st.integers(1, 3), st.integers(0, 2))
def test_bulk_check_with_tombstones_equals_the_one_by_one_check(
    drawn: list[tuple[bool, object, object]], key: tuple[KeyColumn, ...], partitions: int, partition: int
) -> None:
    entries = []
    for deletes, user, n in drawn:
        if deletes:
            try:
                entries.append(encode_tombstone(encode_key((user, n)[: len(key)])))  # type: ignore[arg-type]
            except ValueError:
                entries.append(encode_tombstone(b"\x02"))
        else:
            entries.append(encode_row({"user": user, "n": n}))
    expected = ingest._one_by_one(entries, key, partitions, partition, "t")
    assert records_for_rows(entries, key, partitions, partition, "t") == expected


def _one_by_one(datas: list[bytes], key_columns: tuple[KeyColumn, ...]) -> list[bytes] | str:
    try:
        return [checked_key(data, key_columns) for data in datas]
    except ValueError as error:
        return f"{type(error).__name__}: {error}"


def _bulk(datas: list[bytes], key_columns: tuple[KeyColumn, ...]) -> list[bytes] | str:
    try:
        return checked_keys(datas, key_columns)
    except ValueError as error:
        return f"{type(error).__name__}: {error}"


# Near misses of a STRING key's encoding: another type code, no terminator, a NUL not escaped, an escape
# cut short, invalid UTF-8, an INT key.
_STRING_NEAR_MISSES = [
    b"\x02a\x00",
    b"\x02\x00",
    b"\x03a\x00",
    b"\x02a",
    b"\x02a\x00b\x00",
    b"\x02a\x00\xff\x00",
    b"\x02a\x00\xfe\x00",
    b"\x02\xff\x00",
    b"\x02\xc3\x00",
    b"",
    b"\x02",
    encode_key((7,)),
    encode_key(("a", "b")),
    encode_key(("a\x00b",)),
    encode_key(("\u00e9\U0001f600",)),
]


@given(
    st.lists(
        st.text(max_size=12).map(lambda s: encode_key((s,)))
        | st.sampled_from(_STRING_NEAR_MISSES)
        | st.binary(max_size=8),
        max_size=8,
    )
)
def test_the_bulk_key_check_gives_what_the_one_by_one_check_gives(datas: list[bytes]) -> None:
    """The one-STRING-column fast path (`_string_keys_checked`) accepts exactly the keys `checked_key`
    accepts; any other gives the same first error."""
    for key_columns in (STRING_KEY, COMPOSITE_KEY, (KeyColumn("b", KeyType.BYTES),)):
        assert _bulk(datas, key_columns) == _one_by_one(datas, key_columns)


def test_a_produce_of_string_key_deletes_takes_the_bulk_check(monkeypatch: pytest.MonkeyPatch) -> None:
    import hotstate.protocol.keys as key_codec

    def one_by_one(data: bytes, key_columns: object) -> bytes:
        raise AssertionError("a key checked one by one")

    monkeypatch.setattr(key_codec, "checked_key", one_by_one)
    keys = [encode_key((f"user-{i}",)) for i in range(200)]
    keys = [k for k in keys if partition_for(k, 4) == 1]
    records, problem = records_for_rows([encode_tombstone(k) for k in keys], STRING_KEY, 4, 1, "t")
    assert problem is None and [decode_record(r) for r in records] == [(k, None) for k in keys]
