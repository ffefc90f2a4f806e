"""The one key encoding: what the store sorts by, the partitioner hashes, and the sink and router produce.

A key is a tuple of typed components. Each component is encoded as a one-byte type code followed by a
body whose bytewise order equals the value order of its type, and a composite key is the plain
concatenation of its components (the layout of FoundationDB's tuple layer):

    None        0x00
    bytes       0x01, the bytes with each 0x00 written as 0x00 0xFF, then a 0x00 terminator
    str         0x02, its UTF-8 escaped and terminated like bytes
    int         0x14, 8 bytes big-endian two's complement with the sign bit flipped (signed 64-bit only)
    float       0x21, the 8 IEEE-754 bytes big-endian: all bits flipped when negative, else the sign bit
    False/True  0x26 / 0x27
    datetime    0x33, int64 microseconds since the Unix epoch (UTC; naive is taken as UTC) as for int

Why bytewise order equals tuple order when two keys have the same types position by position: the first
differing component decides both orders, and within one type the bodies compare like the values.
Flipping the sign bit puts negative ints below positive ones; flipping every bit of a negative float
reverses the order of the magnitudes; UTF-8 orders like code points, which is how Python orders str.
Fixed-width bodies decide before the next component is reached. A variable-length body ends in 0x00 not
followed by 0xFF, while a longer value continues with either a byte above 0x00 or an escaped 0x00 0xFF:
so a value sorts before every value it is a proper prefix of, whatever the next component's type code
(all are below 0xFF). The same reasoning makes the encoding of a prefix of components a byte prefix of
the encoding of the whole key, which is what range scans over a leading subset of key columns rely on.
"""

from __future__ import annotations

import datetime as dt
import itertools
import operator
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import mmh3

from hotstate.controller.records import TIMESTAMP_KEY_TYPES, KeyColumn, KeyType

__all__ = [
    "InvalidKeyError",
    "KeyDecodeError",
    "KeyEncodeError",
    "KeyValue",
    "checked_key",
    "checked_keys",
    "coerce_key",
    "decode_key",
    "encode_component",
    "encode_key",
    "encode_keys",
    "key_from_row",
    "partition_for",
    "prefix_end",
    "window_suffix",
]

KeyValue: TypeAlias = bool | int | float | str | bytes | dt.datetime | None

_NULL = 0x00
_BYTES = 0x01
_STRING = 0x02
_INT = 0x14
_FLOAT = 0x21
_FALSE = 0x26
_TRUE = 0x27
_TIMESTAMP = 0x33

MIN_KEY_INT = -(2**63)
MAX_KEY_INT = 2**63 - 1
_SIGN_BIT = 1 << 63
_ALL_BITS = (1 << 64) - 1
_U64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = _EPOCH.replace(tzinfo=dt.UTC)
_ONE_MICRO = dt.timedelta(microseconds=1)
_MAX_REPR = 80


class KeyEncodeError(ValueError):
    """A key component that has no place in the key order (out-of-range int, NaN, unsupported type)."""


class KeyDecodeError(ValueError):
    """Bytes that are not an encoded key."""


class InvalidKeyError(ValueError):
    """A key column value that does not fit the column's declared type."""

    def __init__(self, column: str, value: object, reason: str) -> None:
        subject = f"key column {column!r}" if column else "key"
        # None means there is no value worth showing (a null or missing column says so in `reason`).
        shown = "" if value is None else f", got {short_repr(value)} ({type(value).__name__})"
        super().__init__(f"{subject} {reason}{shown}")
        self.column = column
        self.value = value
        self.reason = reason


def short_repr(value: object) -> str:
    try:
        text = repr(value)
    except RecursionError:  # an error message must not fail on the value it describes
        return f"a {type(value).__name__} nested too deeply to show"
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


# --- encoding -------------------------------------------------------------------------------------------


def _encode_none(_: None) -> bytes:
    return b"\x00"


def _encode_bool(value: bool) -> bytes:
    return b"\x27" if value else b"\x26"


def _encode_int(value: int) -> bytes:
    if not MIN_KEY_INT <= value <= MAX_KEY_INT:
        raise KeyEncodeError(f"int key component {short_repr(value)} is outside the signed 64-bit range")
    return b"\x14" + _U64.pack(value + _SIGN_BIT)


def _encode_float(value: float) -> bytes:
    if value != value:
        raise KeyEncodeError("a float key component is NaN, which has no place in the key order")
    if value == 0.0:
        value = 0.0  # -0.0 == 0.0, so both must give the same bytes
    bits: int = _U64.unpack(_F64.pack(value))[0]
    bits = bits ^ _ALL_BITS if bits & _SIGN_BIT else bits | _SIGN_BIT
    return b"\x21" + _U64.pack(bits)


def _escaped(code: bytes, body: bytes) -> bytes:
    return code + body.replace(b"\x00", b"\x00\xff") + b"\x00"


def _encode_str(value: str) -> bytes:
    try:
        body = value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise KeyEncodeError(f"str key component {short_repr(value)} is not valid Unicode: {e}") from None
    return _escaped(b"\x02", body)


def _encode_bytes(value: bytes) -> bytes:
    return _escaped(b"\x01", bytes(value))


def datetime_micros(value: dt.datetime) -> int:
    """Microseconds since the Unix epoch; a naive datetime is read as UTC wall-clock time."""
    if value.tzinfo is None:
        return (value - _EPOCH) // _ONE_MICRO
    if value.utcoffset() is None:  # a tzinfo that declines to give an offset makes a naive datetime
        return (value.replace(tzinfo=None) - _EPOCH) // _ONE_MICRO
    # Aware subtraction works on offsets, never builds the UTC datetime, so it cannot leave year 1..9999.
    return (value - _EPOCH_UTC) // _ONE_MICRO


def _encode_datetime(value: dt.datetime) -> bytes:
    return b"\x33" + _U64.pack(datetime_micros(value) + _SIGN_BIT)


_ENCODERS: dict[type, Callable[[Any], bytes]] = {
    type(None): _encode_none,
    bool: _encode_bool,
    int: _encode_int,
    float: _encode_float,
    str: _encode_str,
    bytes: _encode_bytes,
    bytearray: _encode_bytes,
    dt.datetime: _encode_datetime,
}


def _encode_component(value: object) -> bytes:
    encoder = _ENCODERS.get(type(value))
    if encoder is not None:
        return encoder(value)
    # Subclasses (IntEnum, a str subclass, pandas.Timestamp) take the slow path; bool before int.
    if isinstance(value, bool):
        return _encode_bool(value)
    if isinstance(value, int):
        return _encode_int(int(value))
    if isinstance(value, float):
        return _encode_float(float(value))
    if isinstance(value, str):
        return _encode_str(str.__str__(value))
    if isinstance(value, bytes | bytearray):
        return _encode_bytes(bytes(value))
    if isinstance(value, dt.datetime):
        return _encode_datetime(value)
    raise KeyEncodeError(
        f"key component {short_repr(value)} has unsupported type {type(value).__name__} "
        "(supported: None, bool, int, float, str, bytes, datetime)"
    )


def encode_key(values: Sequence[KeyValue]) -> bytes:
    """The order-preserving encoding of a key tuple (see the module docstring)."""
    if len(values) == 1:
        return _encode_component(values[0])
    return b"".join([_encode_component(value) for value in values])


# --- decoding -------------------------------------------------------------------------------------------


def _terminator(data: bytes, start: int) -> int:
    """Index of the 0x00 that ends the escaped body starting at `start`."""
    end = data.find(b"\x00", start)
    while end != -1 and end + 1 < len(data) and data[end + 1] == 0xFF:
        end = data.find(b"\x00", end + 2)
    if end == -1:
        raise KeyDecodeError(f"key bytes end inside a str/bytes component that starts at byte {start - 1}")
    return end


def _fixed(data: bytes, position: int) -> int:
    if position + 8 > len(data):
        raise KeyDecodeError(f"key bytes end inside the 8-byte component that starts at byte {position - 1}")
    value: int = _U64.unpack_from(data, position)[0]
    return value


def decode_key(data: bytes) -> tuple[KeyValue, ...]:
    """The key tuple of `encode_key` bytes; datetimes come back naive, in UTC."""
    values: list[KeyValue] = []
    position = 0
    size = len(data)
    while position < size:
        code = data[position]
        position += 1
        if code == _NULL:
            values.append(None)
        elif code in (_FALSE, _TRUE):
            values.append(code == _TRUE)
        elif code in (_STRING, _BYTES):
            end = _terminator(data, position)
            body = data[position:end].replace(b"\x00\xff", b"\x00")
            position = end + 1
            if code == _BYTES:
                values.append(body)
                continue
            try:
                values.append(body.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise KeyDecodeError(f"str key component is not valid UTF-8: {e}") from None
        elif code == _INT:
            values.append(_fixed(data, position) - _SIGN_BIT)
            position += 8
        elif code == _FLOAT:
            bits = _fixed(data, position)
            position += 8
            bits = bits ^ _SIGN_BIT if bits & _SIGN_BIT else bits ^ _ALL_BITS
            value: float = _F64.unpack(_U64.pack(bits))[0]
            if value != value:
                raise KeyDecodeError("float key component is NaN, which encode_key never writes")
            values.append(value)
        elif code == _TIMESTAMP:
            micros = _fixed(data, position) - _SIGN_BIT
            position += 8
            try:
                values.append(_EPOCH + micros * _ONE_MICRO)
            except OverflowError:
                raise KeyDecodeError(f"timestamp key component {micros} us is out of range") from None
        else:
            raise KeyDecodeError(f"unknown key type code 0x{code:02x} at byte {position - 1}")
    return tuple(values)


# --- partitioning and ranges ----------------------------------------------------------------------------


# A window bound is a TIMESTAMP component: its type code and 8 bytes.
WINDOW_BOUND_BYTES = 9


def window_suffix(key_columns: Sequence[KeyColumn]) -> int:
    """How many trailing bytes of an encoded key the partition hash leaves out: a windowed table's two
    window bounds (always its last key columns, fixed-width), so every window of a key lands in the
    partition of the key's other columns; 0 for any other table."""
    if key_columns and key_columns[-1].type is KeyType.WINDOW_END:
        return 2 * WINDOW_BOUND_BYTES
    return 0


def partition_for(encoded_key: bytes, partitions: int, suffix: int = 0) -> int:
    """The partition of a key: murmur3_32 (seed 0, unsigned) of its encoding, less its last `suffix` bytes
    (`window_suffix`), modulo the partition count."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    if suffix:
        encoded_key = encoded_key[: max(len(encoded_key) - suffix, 0)]
    return mmh3.hash(encoded_key, 0, signed=False) % partitions


def partitions_of(encoded_keys: Sequence[bytes], partitions: int, suffix: int = 0) -> tuple[int, ...]:
    """`partition_for` of each key, in one pass (an IN list's keys)."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    if suffix:
        encoded_keys = [key[: max(len(key) - suffix, 0)] for key in encoded_keys]
    murmur = mmh3.hash
    if len(encoded_keys) == 1:  # a point lookup
        return (murmur(encoded_keys[0], 0, signed=False) % partitions,)
    hashes = map(murmur, encoded_keys, itertools.repeat(0), itertools.repeat(False))  # seed 0, unsigned
    return tuple(map(operator.mod, hashes, itertools.repeat(partitions)))


def _string_components(values: Sequence[object]) -> list[bytes] | None:
    """`encode_component` of a STRING key column for each of `values`, in order, in one pass (no call per
    value): `_encode_str`'s bytes (UTF-8, 0x00 escaped as 0x00 0xFF, then a 0x00 terminator). None when
    some value is not a str or not valid Unicode: encode those one by one, which words the error."""
    try:
        return [b"\x02" + v.encode().replace(b"\x00", b"\x00\xff") + b"\x00" for v in values]  # type: ignore[attr-defined]
    except (AttributeError, UnicodeEncodeError):
        return None


_SINGLE_KEY_ENCODERS: dict[KeyType, Callable[[Sequence[object]], list[bytes] | None]] = {
    KeyType.STRING: _string_components,
}


def encode_keys(rows: Sequence[Mapping[str, object]], key_columns: Sequence[KeyColumn]) -> list[bytes] | None:
    """`encode_key(key_from_row(row, key_columns))` of every row in one pass, for the common shape (one
    STRING key column holding exact str values): the same bytes at about a third of the cost. None for
    anything else, including a row without its key: then the caller takes each row on its own, which names
    the bad row."""
    if len(key_columns) != 1:
        return None
    column = key_columns[0]
    encoder = _SINGLE_KEY_ENCODERS.get(column.type)
    if encoder is None:
        return None
    name = column.name
    try:
        values = [row[name] for row in rows]
    except (KeyError, TypeError):
        return None
    return encoder(values)


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest bytes above every bytes starting with `prefix`; None when there is none (all 0xFF).

    A bound on byte prefixes, not on key components: a STRING or BYTES 'a' encodes as a byte prefix of
    'a\x00', so this bound takes in greater strings. For the keys whose first components equal an encoded
    prefix, the bound is `prefix + b"\xff"` (what query.plan uses)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes((stripped[-1] + 1,))


# --- typed key columns ----------------------------------------------------------------------------------


# Key types whose exact Python type needs neither a check nor a conversion (the common case, so first).
_PASS_THROUGH: dict[KeyType, type] = {
    KeyType.STRING: str,
    KeyType.BOOL: bool,
    KeyType.BYTES: bytes,
    KeyType.TIMESTAMP: dt.datetime,
    KeyType.WINDOW_START: dt.datetime,
    KeyType.WINDOW_END: dt.datetime,
}


def _coerce_value(column: KeyColumn, value: object) -> KeyValue:
    kind = column.type
    if type(value) is _PASS_THROUGH.get(kind):
        return value  # type: ignore[return-value]
    name = column.name
    if value is None:
        raise InvalidKeyError(name, None, "is null")
    if kind is KeyType.STRING:
        if isinstance(value, str):
            return value if type(value) is str else str.__str__(value)
        raise InvalidKeyError(name, value, "must be a str (STRING)")
    if kind is KeyType.INT:
        if isinstance(value, int) and not isinstance(value, bool):
            if not MIN_KEY_INT <= value <= MAX_KEY_INT:
                raise InvalidKeyError(name, value, "must be a signed 64-bit int (INT)")
            return int(value)
        raise InvalidKeyError(name, value, "must be an int (INT)")
    if kind is KeyType.FLOAT:
        if isinstance(value, float | int) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:
                raise InvalidKeyError(name, value, "must fit a float (FLOAT)") from None
            if number != number:
                raise InvalidKeyError(name, value, "must be a float that is not NaN (FLOAT)")
            return number
        raise InvalidKeyError(name, value, "must be a float or an int (FLOAT)")
    if kind is KeyType.BOOL:
        if isinstance(value, bool):
            return value
        raise InvalidKeyError(name, value, "must be a bool (BOOL)")
    if kind is KeyType.BYTES:
        if isinstance(value, bytes | bytearray):
            return value if type(value) is bytes else bytes(value)
        raise InvalidKeyError(name, value, "must be bytes or a bytearray (BYTES)")
    if kind in TIMESTAMP_KEY_TYPES:
        if isinstance(value, dt.datetime):
            return value
        raise InvalidKeyError(name, value, "must be a datetime.datetime (TIMESTAMP)")
    raise InvalidKeyError(name, value, f"has an unknown key type {kind!r}")


def coerce_key(values: Sequence[object], key_columns: Sequence[KeyColumn]) -> tuple[KeyValue, ...]:
    """Check and convert positional key values against the key columns (equal keys get equal bytes)."""
    if len(values) != len(key_columns):
        names = ", ".join(column.name for column in key_columns)
        raise InvalidKeyError(
            "", tuple(values), f"has {len(values)} values but the table's key columns are ({names})"
        )
    return tuple(_coerce_value(column, value) for column, value in zip(key_columns, values, strict=True))


def encode_component(column: KeyColumn, value: object) -> bytes:
    """`encode_key(coerce_key((value,), (column,)))`, without the tuples: one key component."""
    return _encode_component(_coerce_value(column, value))


def str_components(values: Sequence[object]) -> set[bytes] | None:
    """`_string_components` as a set (an IN list's distinct keys)."""
    components = _string_components(values)
    return None if components is None else set(components)


def _string_keys_checked(datas: Sequence[bytes]) -> bool:
    """Whether every one of `datas` is exactly `_string_components` of some str (one STRING component), in
    two passes with no call per key: decoded the way `decode_key` reads a STRING component, then encoded
    again and compared. Anything else (another type code, a bad escape or terminator, invalid UTF-8) is
    False: `checked_key` then says which and why."""
    try:
        values = [data[1:-1].replace(b"\x00\xff", b"\x00").decode() for data in datas]
    except UnicodeDecodeError:
        return False
    return _string_components(values) == list(datas)


_SINGLE_KEY_CHECKS: dict[KeyType, Callable[[Sequence[bytes]], bool]] = {
    KeyType.STRING: _string_keys_checked,
}


def checked_keys(datas: Sequence[bytes], key_columns: Sequence[KeyColumn]) -> list[bytes]:
    """`checked_key` of each of `datas` (the keys a Produce's tombstones delete): for the common shape (one
    STRING key column) in one pass at about the cost of `encode_keys`, else, or when one is bad, one by one
    (the first bad one raises, saying why)."""
    if len(key_columns) == 1:
        check = _SINGLE_KEY_CHECKS.get(key_columns[0].type)
        if check is not None and check(datas):
            return list(datas)
    return [checked_key(data, key_columns) for data in datas]


def checked_key(data: bytes, key_columns: Sequence[KeyColumn]) -> bytes:
    """`data` if it is the encoding of a key of `key_columns` (what a tombstone carries), exactly as
    `encode_key` writes it; else KeyDecodeError or InvalidKeyError saying why. Decoded, checked against the
    columns' types and encoded again: an INT component in a FLOAT column, a null, a missing or an extra
    component, or a -0.0 float (stored as 0.0) would name no row a writer can have written."""
    values = coerce_key(decode_key(data), key_columns)
    if encode_key(values) != data:
        names = ", ".join(f"{column.name} {column.type.name}" for column in key_columns)
        raise InvalidKeyError("", values, f"bytes are not the encoding of a key of ({names})")
    return data


def key_from_row(row: Mapping[str, object], key_columns: Sequence[KeyColumn]) -> tuple[KeyValue, ...]:
    """The checked key tuple of a row, in key column order."""
    key: list[KeyValue] = []
    for column in key_columns:
        try:
            value = row[column.name]
        except KeyError:
            raise InvalidKeyError(column.name, None, "is missing from the row") from None
        key.append(_coerce_value(column, value))
    return tuple(key)
