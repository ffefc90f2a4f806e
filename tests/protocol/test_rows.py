from __future__ import annotations

import collections
import contextlib
import datetime as dt
import decimal
import enum
import math
import struct
from typing import Any, NamedTuple

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hotstate.protocol.rows import (
    Projection,
    RowDecodeError,
    RowEncodeError,
    decode_record,
    decode_row,
    encode_record,
    encode_row,
    may_hold_non_finite,
)

OFFSETS = st.timedeltas(min_value=dt.timedelta(hours=-23), max_value=dt.timedelta(hours=23))
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.datetimes()
    | st.builds(lambda naive, offset: naive.replace(tzinfo=dt.timezone(offset)), st.datetimes(), OFFSETS)
    | st.dates()
    | st.decimals(allow_nan=False)
)
MAP_KEYS = st.text() | st.integers(-(2**63), 2**63 - 1) | st.binary(max_size=4) | st.dates()
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(MAP_KEYS, inner, max_size=4),
    max_leaves=12,
)
ROWS = st.dictionaries(st.text(max_size=8), VALUES, max_size=6)


def same(a: Any, b: Any) -> bool:
    """Equality that also tells apart what == does not: bool/int, aware offsets, Decimal exponents."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return bool(a.keys() == b.keys()) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, dt.datetime):
        return bool(
            a == b and a.utcoffset() == b.utcoffset() and a.replace(tzinfo=None) == b.replace(tzinfo=None)
        )
    if isinstance(a, decimal.Decimal):
        return bool(a.as_tuple() == b.as_tuple())
    return bool(a == b)


@given(ROWS)
def test_round_trip(row: dict[str, Any]) -> None:
    assert same(decode_row(encode_row(row)), row)


def test_round_trip_of_every_type() -> None:
    row: dict[str, object] = {
        "none": None,
        "flag": True,
        "small": -1,
        "big": 2**64 - 1,
        "low": -(2**63),
        "f": 1.5,
        "s": "hé\x00",
        "b": b"\x00\xff",
        "naive": dt.datetime(2024, 2, 29, 23, 59, 59, 999999),
        "aware": dt.datetime(
            2024, 2, 29, 23, 59, 59, 1, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))
        ),
        "utc": dt.datetime(1, 1, 1, tzinfo=dt.UTC),
        "before_epoch": dt.datetime(1900, 1, 1, 0, 0, 0, 5),
        "day": dt.date(9999, 12, 31),
        "money": decimal.Decimal("-1.10E+5"),
        "struct": {"a": [1, {"b": (2, 3)}], "c": {}},
        "array": (1, "x", None),
        "int_map": {1: "one", -2: "minus two"},
    }
    decoded = decode_row(encode_row(row))
    expected = {**row, "array": [1, "x", None], "struct": {"a": [1, {"b": [2, 3]}], "c": {}}}
    assert same(decoded, expected)
    utc = decoded["utc"]
    assert isinstance(utc, dt.datetime) and utc.tzinfo is dt.UTC


def test_an_instant_in_utc_is_msgpacks_own_timestamp_and_rows_written_before_read_the_same() -> None:
    at = dt.datetime(2026, 1, 1, 12, 0, 0, 7, tzinfo=dt.UTC)
    data = encode_row({"at": at})
    assert msgpack.unpackb(data, timestamp=3) == {"at": at}  # ext -1, which any msgpack reader knows
    # Before, an instant was ext 2 with offset 0: a row written then decodes to the same value and type.
    micros = (at - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    old = msgpack.packb({"at": msgpack.ExtType(2, struct.pack(">qq", micros, 0))})
    decoded = decode_row(old)["at"]
    assert decoded == at and isinstance(decoded, dt.datetime) and decoded.tzinfo is dt.UTC
    # Another offset keeps ext 2, so that the offset comes back.
    berlin = dt.datetime(2026, 1, 1, 13, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert msgpack.unpackb(encode_row({"b": berlin}), ext_hook=lambda code, _: code) == {"b": 2}
    assert decode_row(encode_row({"b": berlin}))["b"].utcoffset() == dt.timedelta(hours=1)  # type: ignore[attr-defined]


def test_bytearray_and_subclasses_are_written_as_their_base_type() -> None:
    class Level(enum.IntEnum):
        HIGH = 2

    class Tag(str):
        pass

    class Items(list[int]):
        pass

    row = {
        "blob": bytearray(b"ab"),
        "level": Level.HIGH,
        "tag": Tag("t"),
        "ordered": collections.OrderedDict(a=1),
        "sub": Items([1]),
    }
    decoded = decode_row(encode_row(row))
    assert same(decoded, {"blob": b"ab", "level": 2, "tag": "t", "ordered": {"a": 1}, "sub": [1]})


class Point(NamedTuple):
    x: int
    y: int


class Opaque:
    def __repr__(self) -> str:
        return "Opaque()"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({1, 2}, "unsupported type set"),
        (Opaque(), "unsupported type Opaque"),
        (1j, "unsupported type complex"),
        ([1, [frozenset()]], "unsupported type frozenset"),
        (Point(1, 2), "unsupported type Point; write a struct as a dict"),
        (2**64, "int outside the msgpack range"),
        (-(2**63) - 1, "int outside the msgpack range"),
        ({"m": {(1, 2): "tuple key"}}, "map key (1, 2) is a tuple"),
    ],
)
def test_unsupported_values_name_their_column(value: object, reason: str) -> None:
    with pytest.raises(RowEncodeError) as caught:
        encode_row({"fine": 1, "bad": value, "also_fine": "x"})
    assert caught.value.column == "bad"
    assert str(caught.value).startswith("column 'bad': cannot encode ")
    assert reason in str(caught.value)


def test_column_names_must_be_str() -> None:
    with pytest.raises(RowEncodeError, match="column names must be str"):
        encode_row({1: "x"})  # type: ignore[dict-item]


def test_encoder_is_reusable_after_an_error() -> None:
    with pytest.raises(RowEncodeError):
        encode_row({"bad": object()})
    assert decode_row(encode_row({"a": 1})) == {"a": 1}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not valid msgpack"),
        (encode_row({"a": "long enough"})[:-3], "not valid msgpack"),
        (encode_row({"a": 1}) + b"\x00", "not valid msgpack"),
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb([1, 2]), "hold a list, not a map"),
        (msgpack.packb({"a": msgpack.ExtType(9, b"")}), "unknown row ext type 9"),
        (msgpack.packb({"a": msgpack.ExtType(1, b"\x00")}), "bad payload for row ext type 1"),
        (msgpack.packb({"a": msgpack.ExtType(3, b"\x00\x00\x00\x00")}), "bad payload for row ext type 3"),
        (msgpack.packb({"a": msgpack.ExtType(4, b"one")}), "bad payload for row ext type 4"),
        (msgpack.packb({"a": msgpack.ExtType(4, b"\xff")}), "bad payload for row ext type 4"),
        (msgpack.packb({"a": msgpack.ExtType(1, b"\x7f" + b"\xff" * 7)}), "bad payload for row ext type 1"),
        (msgpack.packb({"a": msgpack.Timestamp(2**40, 0)}), "not valid msgpack"),  # past year 9999
    ],
)
def test_malformed_rows_raise_row_decode_error(data: bytes, message: str) -> None:
    with pytest.raises(RowDecodeError, match=message):
        decode_row(data)


@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_row_decode_error(data: bytes) -> None:
    with contextlib.suppress(RowDecodeError):
        decode_row(data)


# --- records ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key_size", [0, 255, 256, 65535, 65536])
@pytest.mark.parametrize("row_size", [None, 0, 300, 70000])
def test_record_round_trip_and_msgpack_layout(key_size: int, row_size: int | None) -> None:
    key = b"k" * key_size
    row = None if row_size is None else b"r" * row_size
    data = encode_record(key, row)
    assert data == msgpack.packb([key, row])
    assert decode_record(data) == (key, row)


def test_delete_record() -> None:
    assert decode_record(encode_record(b"key", None)) == (b"key", None)


def test_record_fields_must_be_bytes() -> None:
    with pytest.raises(TypeError):
        encode_record("key", b"x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_record(b"key", "x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        msgpack.packb([b"k"]),
        msgpack.packb([b"k", b"v", b"x"]),
        msgpack.packb(["k", b"v"]),
        msgpack.packb([b"k", 1]),
        msgpack.packb({b"k": b"v"}),
        encode_record(b"key", b"value")[:-1],
    ],
)
def test_malformed_records_raise_row_decode_error(data: bytes) -> None:
    with pytest.raises(RowDecodeError, match="record bytes"):
        decode_record(data)


# ------------------------------------------------------------------------------------------ nesting


def nested(depth: int, leaf: object = 1) -> object:
    """A list holding a list ... `depth` levels of lists around `leaf`."""
    value: object = leaf
    for _ in range(depth):
        value = [value]
    return value


def test_nesting_up_to_the_limit_round_trips_and_one_more_level_is_refused_naming_the_column() -> None:
    from hotstate.protocol.rows import MAX_NESTING

    row = {"deep": nested(MAX_NESTING), "map": {"a": nested(MAX_NESTING - 1)}}
    assert same(decode_row(encode_row(row)), row)
    for value in (nested(MAX_NESTING + 1), {"a": nested(MAX_NESTING)}):
        with pytest.raises(RowEncodeError) as error:
            encode_row({"k": "x", "deep": value})
        assert error.value.column == "deep" and f"nested more than {MAX_NESTING} levels" in str(error.value)


def test_a_value_nested_5000_deep_or_containing_itself_is_a_clear_error_not_a_recursion_error() -> None:
    with pytest.raises(RowEncodeError) as error:
        encode_row({"deep": nested(5000)})
    assert "column 'deep'" in str(error.value) and "nested too deeply to show" in str(error.value)
    looped: list[object] = []
    looped.append(looped)
    with pytest.raises(RowEncodeError, match="nested more than"):
        encode_row({"loop": looped})


def test_check_nesting_refuses_decoded_rows_deeper_than_the_limit_and_decode_refuses_absurd_depth() -> None:
    from hotstate.protocol.rows import MAX_NESTING, check_nesting

    # Bytes another writer could send: {"a": [[...[nil]...]]}.
    def row_bytes(depth: int) -> bytes:
        return b"\x81\xa1a" + b"\x91" * depth + b"\xc0"

    check_nesting(decode_row(row_bytes(MAX_NESTING)))
    check_nesting({"flat": 1, "text": "x"})
    with pytest.raises(RowDecodeError, match="column 'a': lists and maps nested more than"):
        check_nesting(decode_row(row_bytes(MAX_NESTING + 1)))
    with pytest.raises(RowDecodeError, match="nest deeper than msgpack reads"):
        decode_row(row_bytes(100_000))


def test_threads_encoding_at_once_get_their_own_rows() -> None:
    """`_default` runs Python mid-pack, where another thread may take the GIL: a packer shared without a
    lock would mix two rows' bytes."""
    import sys
    import threading

    rows = [
        {
            "n": i,
            "at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i),
            "d": [decimal.Decimal(i)] * 20,
        }
        for i in range(8)
    ]
    expected = [encode_row(row) for row in rows]
    wrong: list[int] = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:

        def work(index: int) -> None:
            for _ in range(300):
                if encode_row(rows[index]) != expected[index]:
                    wrong.append(index)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(rows))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(old)
    assert wrong == []


def _non_finite_marks(data: bytes) -> bool:
    """The definition may_hold_non_finite follows: a float 64 (0xcb) whose exponent bits are all set."""
    return any(
        data[at] == 0xCB and data[at + 1] in (0x7F, 0xFF) and data[at + 2] >= 0xF0
        for at in range(len(data) - 2)
    )


@given(
    st.binary(max_size=64)
    | st.lists(st.sampled_from([b"\xcb", b"\x7f", b"\xff", b"\xf0", b"a"])).map(b"".join)
)
def test_may_hold_non_finite_finds_exactly_the_marks(data: bytes) -> None:
    assert may_hold_non_finite(data) == _non_finite_marks(data)


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=5))
def test_a_row_with_nan_or_infinity_may_hold_non_finite(values: list[float]) -> None:
    data = encode_row({"a": values, "b": dict(enumerate(values))})
    if not all(math.isfinite(value) for value in values):
        assert may_hold_non_finite(data)


def test_a_projection_decodes_only_its_columns_as_decode_row_reads_them() -> None:
    row = {
        "id": "k1",
        "Amount": decimal.Decimal("1.50"),
        "ts": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        "when": dt.datetime(2026, 1, 1, 12, 30),
        "nested": {"a": [1, {"b": None}]},
        "name with space": 7,
    }
    data = encode_row(row)
    projection = Projection(["ts", "Amount", "name with space", "nested", "when"])
    [decoded] = projection.decode_many([data]) or [None]
    whole = decode_row(data)
    for name in projection.names:
        assert projection.readers[name](decoded) == whole[name]
    # A row without one of the names exactly (another case, or absent) is no struct: the caller reads it
    # whole; so is anything that is not a row.
    lacking = encode_row({"TS": 1, "Amount": 2, "name with space": 3, "nested": 4, "when": 5})
    assert projection.decode(lacking) is None
    assert projection.decode_many([data, lacking]) is None
    assert projection.decode(b"\x93\x01\x02\x03") is None and projection.decode(b"\xc1") is None
    struct = projection.of_row([1, 2, 3, 4, 5])
    assert [projection.readers[name](struct) for name in projection.names] == [1, 2, 3, 4, 5]
    assert Projection([]).decode_many([data, lacking]) is not None
