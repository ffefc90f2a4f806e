from __future__ import annotations

import contextlib
import datetime as dt
import math
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.keys import (
    InvalidKeyError,
    KeyDecodeError,
    KeyEncodeError,
    KeyValue,
    coerce_key,
    decode_key,
    encode_component,
    encode_key,
    encode_keys,
    key_from_row,
    partition_for,
    partitions_of,
    prefix_end,
    str_components,
)

INT64 = st.integers(-(2**63), 2**63 - 1)
FLOATS = st.floats(allow_nan=False)
# Characters around the escape byte make the 0x00 / 0x00 0xFF cases common instead of rare.
TEXT = st.text(
    alphabet=st.sampled_from("\x00\x01a\xff\u00e9\u4e2d\U0001f600") | st.characters(codec="utf-8"),
    max_size=12,
)
BINARY = st.binary(max_size=12) | st.lists(st.sampled_from([0, 1, 0xFE, 0xFF]), max_size=8).map(bytes)
NAIVE = st.datetimes()
OFFSETS = st.timedeltas(
    min_value=dt.timedelta(hours=-23, minutes=-59), max_value=dt.timedelta(hours=23, minutes=59)
)
# Aware values stay a day inside datetime's range so their UTC equivalent is a datetime too.
AWARE = st.builds(
    lambda naive, offset: naive.replace(tzinfo=dt.timezone(offset)),
    st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30)),
    OFFSETS,
)

TYPED: dict[str, st.SearchStrategy[Any]] = {
    "int": INT64,
    "float": FLOATS,
    "str": TEXT,
    "bytes": BINARY,
    "bool": st.booleans(),
    "datetime": NAIVE,
    "aware": AWARE,
}


def compare(a: Any, b: Any) -> int:
    return int((a > b) - (a < b))


def order_key(value: KeyValue) -> tuple[int, Any]:
    """Python's tuple order with None below everything (None is not comparable in Python)."""
    return (0, 0) if value is None else (1, value)


def utc_naive(value: dt.datetime) -> dt.datetime:
    offset = value.utcoffset()
    return value.replace(tzinfo=None) - offset if offset is not None else value


# --- order, round trip and prefixes ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(TYPED))
@given(data=st.data())
def test_order_is_preserved_per_type(kind: str, data: st.DataObject) -> None:
    a = data.draw(TYPED[kind])
    b = data.draw(TYPED[kind])
    assert compare(encode_key([a]), encode_key([b])) == compare(a, b)
    assert (encode_key([a]) == encode_key([b])) == (a == b)


@st.composite
def layout_pairs(draw: st.DrawFn) -> tuple[tuple[KeyValue, ...], tuple[KeyValue, ...]]:
    kinds = draw(st.lists(st.sampled_from(["int", "float", "str", "bytes", "bool", "datetime"]), max_size=4))
    nullable = [draw(st.booleans()) for _ in kinds]

    def one() -> tuple[KeyValue, ...]:
        return tuple(
            draw(st.none() | TYPED[kind]) if can_be_null else draw(TYPED[kind])
            for kind, can_be_null in zip(kinds, nullable, strict=True)
        )

    first = one()
    # Half the time the second key shares a leading part, where the interesting comparisons are.
    shared = draw(st.integers(0, len(kinds)))
    second = one()
    return first, first[:shared] + second[shared:]


@given(layout_pairs())
def test_order_is_preserved_for_composite_keys(pair: tuple[tuple[KeyValue, ...], ...]) -> None:
    a, b = pair
    expected = compare(tuple(map(order_key, a)), tuple(map(order_key, b)))
    assert compare(encode_key(a), encode_key(b)) == expected


@given(layout_pairs())
def test_round_trip(pair: tuple[tuple[KeyValue, ...], ...]) -> None:
    for key in pair:
        assert decode_key(encode_key(key)) == key


@given(st.lists(st.one_of(*TYPED.values(), st.none()), max_size=5))
def test_prefix_of_components_is_a_byte_prefix_and_bounded_by_prefix_end(key: list[KeyValue]) -> None:
    encoded = encode_key(key)
    for length in range(len(key) + 1):
        prefix = encode_key(key[:length])
        assert encoded.startswith(prefix)
        end = prefix_end(prefix)
        assert end is None or prefix <= encoded < end


def test_empty_key() -> None:
    assert encode_key([]) == b""
    assert decode_key(b"") == ()


def test_str_and_bytes_escape_zero_bytes() -> None:
    assert encode_key(["a\x00b"]) == b"\x02a\x00\xffb\x00"
    assert encode_key([b"\x00\xff"]) == b"\x01\x00\xff\xff\x00"
    assert decode_key(b"\x01\x00\xff\xff\x00") == (b"\x00\xff",)
    ordered = ["", "\x00", "\x00\x00", "\x00\x01", "a", "a\x00", "a\x00\x00", "a\x01", "b"]
    assert sorted(ordered, key=lambda s: encode_key([s])) == ordered
    # A shorter string followed by another component still sorts before a longer one.
    assert encode_key(["a", 2**63 - 1]) < encode_key(["a\x00", -(2**63)])
    assert encode_key([b"a", b"\xff"]) < encode_key([b"a\x00", b""])


@given(st.lists(TEXT, min_size=2, max_size=2))
def test_str_keys_with_zero_bytes_keep_their_order(pair: list[str]) -> None:
    a, b = pair
    assert compare(encode_key([a, 0]), encode_key([b, 0])) == compare((a, 0), (b, 0))


def test_int_bounds() -> None:
    assert decode_key(encode_key([2**63 - 1, -(2**63)])) == (2**63 - 1, -(2**63))
    for bad in (2**63, -(2**63) - 1, 10**30):
        with pytest.raises(KeyEncodeError, match="signed 64-bit"):
            encode_key([bad])


def test_float_nan_and_negative_zero() -> None:
    with pytest.raises(KeyEncodeError, match="NaN"):
        encode_key([math.nan])
    assert encode_key([-0.0]) == encode_key([0.0])
    assert math.copysign(1.0, decode_key(encode_key([-0.0]))[0]) == 1.0  # type: ignore[arg-type]
    ordered = [-math.inf, -1e308, -1.0, -5e-324, 0.0, 5e-324, 1.0, 1e308, math.inf]
    assert sorted(ordered, key=lambda f: encode_key([f])) == ordered


def test_naive_datetime_is_utc_and_aware_is_converted() -> None:
    naive = dt.datetime(2024, 1, 1, 12, 0, 0, 123456)
    aware = dt.datetime(2024, 1, 1, 13, 0, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert encode_key([naive]) == encode_key([aware]) == encode_key([naive.replace(tzinfo=dt.UTC)])
    assert decode_key(encode_key([aware])) == (naive,)
    assert encode_key([dt.datetime(1970, 1, 1)]) == b"\x33\x80" + b"\x00" * 7
    assert encode_key([dt.datetime(1969, 12, 31, 23, 59, 59, 999999)]) == b"\x33\x7f" + b"\xff" * 7


@given(AWARE)
def test_aware_datetimes_decode_as_naive_utc(value: dt.datetime) -> None:
    assert decode_key(encode_key([value])) == (utc_naive(value),)


def test_bool_is_not_an_int() -> None:
    assert encode_key([True]) == b"\x27"
    assert encode_key([False]) == b"\x26"
    assert encode_key([True]) != encode_key([1])
    assert decode_key(encode_key([True, 1])) == (True, 1)
    assert type(decode_key(encode_key([1]))[0]) is int


def test_subclasses_encode_like_their_base() -> None:
    import enum

    class Color(enum.IntEnum):
        RED = 3

    class Name(str):
        pass

    assert encode_key([Color.RED, Name("x")]) == encode_key([3, "x"])
    assert encode_key([bytearray(b"ab")]) == encode_key([b"ab"])  # type: ignore[list-item]


def test_unsupported_types_are_refused() -> None:
    for bad in ([1], dt.date(2024, 1, 1), object(), 1j):
        with pytest.raises(KeyEncodeError, match="unsupported type"):
            encode_key([bad])  # type: ignore[list-item]
    with pytest.raises(KeyEncodeError, match="not valid Unicode"):
        encode_key(["\ud800"])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x14\x00\x01", "8-byte component"),
        (b"\x21", "8-byte component"),
        (b"\x02abc", "str/bytes component"),
        (b"\x01a\x00\xff", "str/bytes component"),
        (b"\x7f", "unknown key type code 0x7f"),
        (b"\x02\xff\x00", "not valid UTF-8"),
        (b"\x21\xff\xf8\x00\x00\x00\x00\x00\x00", "NaN"),
        (b"\x33\xff\xff\xff\xff\xff\xff\xff\xff", "out of range"),
    ],
)
def test_malformed_bytes_raise_key_decode_error(data: bytes, message: str) -> None:
    with pytest.raises(KeyDecodeError, match=message):
        decode_key(data)


@given(st.binary(max_size=40))
def test_arbitrary_bytes_decode_or_raise_key_decode_error(data: bytes) -> None:
    with contextlib.suppress(KeyDecodeError):
        decode_key(data)


# --- prefix_end ---------------------------------------------------------------------------------------


def test_prefix_end() -> None:
    assert prefix_end(b"ab") == b"ac"
    assert prefix_end(b"a\xff\xff") == b"b"
    assert prefix_end(b"\xff") is None
    assert prefix_end(b"") is None


@given(st.binary(max_size=6), st.binary(max_size=6))
def test_prefix_end_bounds_exactly_the_prefixed_strings(prefix: bytes, other: bytes) -> None:
    end = prefix_end(prefix)
    if other.startswith(prefix):
        assert end is None or other < end
    elif other > prefix:
        assert end is not None and other >= end


# --- partitioning -------------------------------------------------------------------------------------


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """Reference murmur3_x86_32, so the pinned function is the algorithm, not whatever mmh3 does."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    c1, c2, h = 0xCC9E2D51, 0x1B873593, seed
    full = len(data) // 4 * 4
    for (block,) in struct.iter_unpack("<I", data[:full]):
        k = rotl(block * c1 & 0xFFFFFFFF, 15) * c2 & 0xFFFFFFFF
        h = (rotl(h ^ k, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    tail = int.from_bytes(data[full:], "little")
    if len(data) > full:
        h ^= rotl(tail * c1 & 0xFFFFFFFF, 15) * c2 & 0xFFFFFFFF
    h ^= len(data)
    h = (h ^ (h >> 16)) * 0x85EBCA6B & 0xFFFFFFFF
    h = (h ^ (h >> 13)) * 0xC2B2AE35 & 0xFFFFFFFF
    return h ^ (h >> 16)


def test_partition_for_pinned_vectors() -> None:
    # Computed once; a change means every existing table's rows would move partitions.
    assert partition_for(encode_key(["alice"]), 2**31 - 1) == 775457213
    assert partition_for(encode_key([42, "eu-west"]), 12) == 11
    assert partition_for(encode_key([dt.datetime(2024, 5, 17, 12, 30), b"\x00\xff"]), 2**31 - 1) == 770272889


@given(st.binary(max_size=64), st.integers(1, 10_000))
def test_partition_for_is_murmur3_modulo_and_in_range(key: bytes, partitions: int) -> None:
    partition = partition_for(key, partitions)
    assert 0 <= partition < partitions
    assert partition == murmur3_32(key) % partitions


def test_partition_for_refuses_no_partitions() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        partition_for(b"k", 0)


# --- key columns --------------------------------------------------------------------------------------

COLUMNS = (
    KeyColumn("user", KeyType.STRING),
    KeyColumn("n", KeyType.INT),
    KeyColumn("score", KeyType.FLOAT),
    KeyColumn("on", KeyType.BOOL),
    KeyColumn("blob", KeyType.BYTES),
    KeyColumn("at", KeyType.TIMESTAMP),
)
GOOD_ROW: dict[str, object] = {
    "user": "u1",
    "n": 7,
    "score": 2.5,
    "on": False,
    "blob": b"\x00",
    "at": dt.datetime(2024, 1, 1),
    "other": object(),
}


def test_key_from_row_accepts_each_type_in_column_order() -> None:
    assert key_from_row(GOOD_ROW, COLUMNS) == ("u1", 7, 2.5, False, b"\x00", dt.datetime(2024, 1, 1))
    assert coerce_key(["u1", 7, 2.5, False, b"\x00", dt.datetime(2024, 1, 1)], COLUMNS) == key_from_row(
        GOOD_ROW, COLUMNS
    )


def test_equal_keys_give_equal_bytes() -> None:
    as_int = key_from_row({**GOOD_ROW, "score": 1, "blob": bytearray(b"\x00")}, COLUMNS)
    as_float = key_from_row({**GOOD_ROW, "score": 1.0}, COLUMNS)
    assert encode_key(as_int) == encode_key(as_float)
    assert type(as_int[2]) is float and type(as_int[4]) is bytes


def error_for(column: str, value: object) -> InvalidKeyError:
    with pytest.raises(InvalidKeyError) as caught:
        key_from_row({**GOOD_ROW, column: value}, COLUMNS)
    assert caught.value.column == column
    return caught.value


@pytest.mark.parametrize(
    ("column", "value", "expected"),
    [
        ("user", 5, "key column 'user' must be a str (STRING), got 5 (int)"),
        ("n", True, "key column 'n' must be an int (INT), got True (bool)"),
        ("n", 1.0, "key column 'n' must be an int (INT), got 1.0 (float)"),
        ("n", 2**63, "key column 'n' must be a signed 64-bit int (INT), got 9223372036854775808 (int)"),
        ("score", True, "key column 'score' must be a float or an int (FLOAT), got True (bool)"),
        ("score", "1.5", "key column 'score' must be a float or an int (FLOAT), got '1.5' (str)"),
        ("score", math.nan, "key column 'score' must be a float that is not NaN (FLOAT), got nan (float)"),
        ("score", 10**400, "key column 'score' must fit a float (FLOAT)"),
        ("on", 1, "key column 'on' must be a bool (BOOL), got 1 (int)"),
        ("blob", "x", "key column 'blob' must be bytes or a bytearray (BYTES), got 'x' (str)"),
        (
            "at",
            dt.date(2024, 1, 1),
            "key column 'at' must be a datetime.datetime (TIMESTAMP), got datetime.date(2024, 1, 1) (date)",
        ),
    ],
)
def test_key_from_row_type_errors(column: str, value: object, expected: str) -> None:
    error = error_for(column, value)
    assert str(error).startswith(expected)
    assert isinstance(error, ValueError)


def test_null_and_missing_key_columns() -> None:
    assert str(error_for("user", None)) == "key column 'user' is null"
    row = dict(GOOD_ROW)
    del row["at"]
    with pytest.raises(InvalidKeyError, match=r"^key column 'at' is missing from the row$"):
        key_from_row(row, COLUMNS)


def test_long_values_are_truncated_in_the_message() -> None:
    message = str(error_for("n", "x" * 500))
    assert "'xxxx" in message and "..." in message
    assert len(message) < 160


def test_coerce_key_checks_the_number_of_values() -> None:
    with pytest.raises(InvalidKeyError, match=r"has 2 values but the table's key columns are \(user, n"):
        coerce_key(["u1", 7], COLUMNS)


@pytest.mark.parametrize(
    ("key_type", "strategy"),
    [
        (KeyType.INT, INT64),
        # Ints within 2**53 convert to floats exactly, so their order survives the conversion.
        (KeyType.FLOAT, FLOATS | st.integers(-(2**53), 2**53)),
        (KeyType.STRING, TEXT),
        (KeyType.TIMESTAMP, NAIVE | AWARE),
    ],
)
@given(data=st.data())
def test_coerced_keys_encode_in_value_order(
    key_type: KeyType, strategy: st.SearchStrategy[Any], data: st.DataObject
) -> None:
    columns = (KeyColumn("k", key_type),)
    a, b = data.draw(strategy), data.draw(strategy)
    encoded_a, encoded_b = encode_key(coerce_key([a], columns)), encode_key(coerce_key([b], columns))
    if key_type is KeyType.TIMESTAMP:
        a, b = utc_naive(a), utc_naive(b)
    assert compare(encoded_a, encoded_b) == compare(a, b)


def test_a_tzinfo_without_an_offset_counts_as_naive() -> None:
    class Floating(dt.tzinfo):
        def utcoffset(self, _: dt.datetime | None) -> None:
            return None

        def dst(self, _: dt.datetime | None) -> None:
            return None

        def tzname(self, _: dt.datetime | None) -> None:
            return None

    floating = dt.datetime(2024, 1, 1, 12, tzinfo=Floating())
    assert encode_key([floating]) == encode_key([dt.datetime(2024, 1, 1, 12)])


@given(st.lists(TEXT, max_size=20), st.integers(1, 64))
def test_str_components_and_partitions_of_equal_one_key_at_a_time(values: list[str], partitions: int) -> None:
    column = KeyColumn("k", KeyType.STRING)
    expected = {encode_component(column, value) for value in values}
    assert str_components(values) == expected
    keys = sorted(expected)
    assert partitions_of(keys, partitions) == tuple(partition_for(key, partitions) for key in keys)


def test_str_components_leave_what_is_not_a_valid_str_to_the_one_at_a_time_path() -> None:
    assert str_components(["a", 1]) is None
    assert str_components(["a", b"b"]) is None
    assert str_components(["\ud800"]) is None  # a lone surrogate: encode_component words the error
    assert str_components([]) == set()


STRING_KEY = (KeyColumn("user", KeyType.STRING),)


@given(st.lists(st.text(), max_size=20), st.integers(1, 12))
def test_keys_in_bulk_are_the_keys_one_by_one(users: list[str], partitions: int) -> None:
    rows = [{"user": user, "n": i} for i, user in enumerate(users)]
    keys = encode_keys(rows, STRING_KEY)
    try:
        one_by_one = [encode_key(key_from_row(row, STRING_KEY)) for row in rows]
    except ValueError:  # a lone surrogate: refused one by one, so the bulk pass leaves it to that
        assert keys is None
        return
    assert keys == one_by_one
    assert partitions_of(keys, partitions) == tuple(partition_for(key, partitions) for key in keys)


def test_keys_in_bulk_leave_every_unusual_row_to_the_one_by_one_path() -> None:
    assert encode_keys([{"user": "a"}, {"other": "b"}], STRING_KEY) is None  # a row without its key
    assert encode_keys([{"user": "a"}, {"user": 5}], STRING_KEY) is None  # not a str
    assert encode_keys([{"user": "a"}, {"user": "b"}], (KeyColumn("user", KeyType.INT),)) is None
    two = (KeyColumn("a", KeyType.STRING), KeyColumn("b", KeyType.STRING))
    assert encode_keys([{"a": "x", "b": "y"}], two) is None
    assert encode_keys([], STRING_KEY) == []
