"""The one row codec (msgpack, never pickle) and the record format of a partition log.

A row is a msgpack map of column name to value. Values: None, bool, int (msgpack's range, -2**63 to
2**64 - 1), float, str, bytes (a bytearray is written as bytes), lists (tuples are written as lists) and
dicts nested up to MAX_NESTING levels - Spark arrays, maps and structs (a struct as a dict, e.g. from
`Row.asDict(recursive=True)`). Map keys inside a column may be any hashable supported value, since Spark
maps have int or timestamp keys too; column names must be str. An instant in UTC (an aware datetime
whose offset is 0, what Spark's TIMESTAMP gives) is msgpack's own timestamp type (ext -1, in the shortest
of its three forms), which the decoder (msgspec) reads in C: a Python call per value cost three times the
rest of a four-column row. Other types msgpack lacks travel as ext types with fixed codes, so these bytes
mean the same thing to every server and every version:

    1  naive datetime    int64 microseconds since 1970-01-01 (wall clock)
    2  aware datetime    int64 microseconds since the epoch in UTC, then int64 UTC-offset microseconds;
                         decodes with a fixed-offset timezone (a zone's name is not kept, its offset is).
                         Written for offsets other than 0; rows written before ext -1 was used carry
                         offset 0 here too, and decode to the same value.
    3  date              int32 proleptic Gregorian ordinal
    4  Decimal           its exact str, ASCII

Rows are written with msgpack-python (a packer per thread) and read with msgspec, which reads the same
bytes about five times faster (a 4-column row with a timestamp: 0.15 against 0.84 us).

A log record is a msgpack array [key bytes, row bytes or nil]: nil deletes the key. In a Produce, an entry is
either a row (a msgpack map) or a tombstone (`encode_tombstone`: the msgpack bin of the encoded key to
delete), told apart by their first byte.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import operator
import struct
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import msgpack
import msgspec

from hotstate.controller.records import KeyColumn
from hotstate.protocol.keys import (
    checked_keys,
    datetime_micros,
    encode_key,
    encode_keys,
    key_from_row,
    short_repr,
)

__all__ = [
    "MAX_NESTING",
    "Projection",
    "RowDecodeError",
    "RowEncodeError",
    "check_nesting",
    "decode_entries",
    "decode_entry",
    "decode_record",
    "decode_records",
    "decode_row",
    "decode_rows",
    "encode_record",
    "encode_records",
    "encode_row",
    "encode_tombstone",
    "entry_keys",
    "is_tombstone",
    "may_hold_non_finite",
    "row_keys",
]

EXT_NAIVE_DATETIME = 1
EXT_AWARE_DATETIME = 2
EXT_DATE = 3
EXT_DECIMAL = 4

_Q = struct.Struct(">q")
_QQ = struct.Struct(">qq")
_I = struct.Struct(">i")
_EPOCH = dt.datetime(1970, 1, 1)
_ONE_MICRO = dt.timedelta(microseconds=1)
_MAX_BIN = 2**32 - 1

# The most levels of lists and maps in one column value (a list of lists is 2). msgpack refuses more than
# 511 with a bare "recursion limit exceeded", and a query answer is JSON, whose encoder stops at 254 levels
# with the answer's own levels around each row; 100 leaves room for both and for any real Spark schema.
MAX_NESTING = 100

# Values that need no look inside; anything else is walked for map keys that would not survive decoding.
_PLAIN = frozenset(
    {str, int, float, bool, type(None), bytes, bytearray, dt.datetime, dt.date, decimal.Decimal}
)


class RowEncodeError(ValueError):
    """A row value the codec does not carry; names the top-level column it sits in."""

    def __init__(self, column: str, value: object, reason: str) -> None:
        super().__init__(
            f"column {column!r}: cannot encode {short_repr(value)} ({type(value).__name__}): {reason}"
        )
        self.column = column
        self.value = value
        self.reason = reason


class RowDecodeError(ValueError):
    """Bytes that are not an encoded row or log record."""


def _default(value: Any) -> Any:
    """msgpack's hook for every value that is not exactly a type it packs natively (strict_types)."""
    if isinstance(value, dt.datetime):
        offset = value.utcoffset()
        if offset is None:
            return msgpack.ExtType(EXT_NAIVE_DATETIME, _Q.pack(datetime_micros(value)))
        if not offset:
            seconds, micros = divmod(datetime_micros(value), 1_000_000)
            return msgpack.Timestamp(seconds, micros * 1000)
        return msgpack.ExtType(EXT_AWARE_DATETIME, _QQ.pack(datetime_micros(value), offset // _ONE_MICRO))
    if isinstance(value, dt.date):
        return msgpack.ExtType(EXT_DATE, _I.pack(value.toordinal()))
    if isinstance(value, decimal.Decimal):
        return msgpack.ExtType(EXT_DECIMAL, str(value).encode("ascii"))
    if type(value) is tuple or isinstance(value, list):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    # Subclasses of plain types (IntEnum, StrEnum, numpy.float64) lose only their class.
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, tuple):
        # A namedtuple or a pyspark Row: written as a list it would silently lose its field names.
        raise TypeError(f"unsupported type {type(value).__name__}; write a struct as a dict")
    raise TypeError(f"unsupported type {type(value).__name__}")


# One packer per thread, reused: building a Packer per row costs more than packing a small row. Not one
# shared packer behind a lock: `_default` runs Python code mid-pack, where another thread could take the
# GIL and the packer, and the lock cost a quarter of encode_row (0.53 -> 0.39 us for a 4-column row).
_PACKERS = threading.local()


def _pack(value: object) -> bytes:
    try:
        packer: msgpack.Packer = _PACKERS.packer
    except AttributeError:
        packer = _PACKERS.packer = msgpack.Packer(default=_default, strict_types=True)
    return packer.pack(value)


def _too_deep() -> str:
    return f"lists and maps nested more than {MAX_NESTING} levels deep (the limit)"


def _check_value(column: str, value: object) -> None:
    """Refuse a map key that would decode as a list (unhashable): a tuple inside any nested dict; and
    nesting deeper than MAX_NESTING (which also ends the walk of a list that contains itself)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            if depth > MAX_NESTING:
                raise RowEncodeError(column, value, _too_deep())
            for key, inner in item.items():
                if isinstance(key, tuple):
                    raise RowEncodeError(column, value, f"map key {short_repr(key)} is a tuple")
                if type(inner) not in _PLAIN:
                    stack.append((inner, depth + 1))
        elif isinstance(item, list | tuple):
            if depth > MAX_NESTING:
                raise RowEncodeError(column, value, _too_deep())
            stack.extend((inner, depth + 1) for inner in item if type(inner) not in _PLAIN)


def check_nesting(row: Mapping[str, object]) -> None:
    """Raise RowDecodeError naming the column if a decoded row nests deeper than MAX_NESTING: what a
    server checks of every row it is sent, since a writer other than `encode_row` may have built it."""
    for name, value in row.items():
        if type(value) in _PLAIN:
            continue
        stack = [(value, 1)]
        while stack:
            item, depth = stack.pop()
            children: Iterable[object]
            if type(item) is dict:
                children = item.values()
            elif type(item) is list:
                children = item
            else:
                continue
            if depth > MAX_NESTING:
                raise RowDecodeError(f"column {name!r}: {_too_deep()}")
            stack.extend((inner, depth + 1) for inner in children if type(inner) not in _PLAIN)


def _reason(error: Exception) -> str:
    if isinstance(error, OverflowError):
        return "int outside the msgpack range [-2**63, 2**64 - 1]"
    return str(error) or type(error).__name__


def encode_row(row: Mapping[str, object]) -> bytes:
    """The msgpack bytes of a row (see the module docstring for what it may hold)."""
    if type(row) is not dict:
        row = dict(row)
    for name, value in row.items():
        if type(name) is not str:
            raise RowEncodeError(repr(name), value, "column names must be str")
        if type(value) not in _PLAIN:
            _check_value(name, value)
    try:
        return _pack(row)
    except (TypeError, ValueError, OverflowError) as error:
        # The fast path packs the whole row at once; only on failure is each column tried alone.
        for name, value in row.items():
            try:
                _pack(value)
            except (TypeError, ValueError, OverflowError) as column_error:
                raise RowEncodeError(name, value, _reason(column_error)) from None
        raise RowEncodeError("", row, _reason(error)) from None


@functools.lru_cache(maxsize=256)
def _timezone(offset_micros: int) -> dt.timezone:
    return dt.timezone(offset_micros * _ONE_MICRO)


@functools.lru_cache(maxsize=256)
def _epoch_in(offset_micros: int) -> dt.datetime:
    """1970-01-01 00:00 wall time in the fixed offset: adding local microseconds to it gives the aware
    datetime at once (a third of the cost of a naive sum and a replace of its tzinfo, per row read)."""
    return _EPOCH.replace(tzinfo=_timezone(offset_micros))


def _ext_hook(code: int, payload: memoryview) -> object:
    try:
        if code == EXT_NAIVE_DATETIME:
            return _EPOCH + _Q.unpack(payload)[0] * _ONE_MICRO
        if code == EXT_AWARE_DATETIME:
            utc_micros, offset_micros = _QQ.unpack(payload)
            return _epoch_in(offset_micros) + (utc_micros + offset_micros) * _ONE_MICRO
        if code == EXT_DATE:
            return dt.date.fromordinal(_I.unpack(payload)[0])
        if code == EXT_DECIMAL:
            return decimal.Decimal(bytes(payload).decode("ascii"))
    except (struct.error, ValueError, OverflowError, ArithmeticError) as error:
        raise RowDecodeError(f"bad payload for row ext type {code}: {error}") from None
    raise RowDecodeError(f"unknown row ext type {code}")


def may_hold_non_finite(data: bytes) -> bool:
    """False when the row's bytes hold no NaN or infinity (true may be a false alarm): a byte search, so
    encoders with no JSON number for them can skip walking every row that cannot hold one."""
    # Every float is written as msgpack float 64 (0xcb, then the IEEE 754 bytes big-endian); NaN and the
    # infinities are exactly those whose exponent bits are all set: first byte 0x7f or 0xff, second >= 0xf0.
    # Found by its one-byte 0xcb (a memchr, ten times faster than searching for two bytes).
    end = len(data) - 2
    at = data.find(b"\xcb")
    while at != -1:
        if at < end and data[at + 1] in (0x7F, 0xFF) and data[at + 2] >= 0xF0:
            return True
        at = data.find(b"\xcb", at + 1)
    return False


_ONLY_DICT = {dict}
# Thread-safe: a Decoder holds only its settings.
_DECODE = msgspec.msgpack.Decoder(ext_hook=_ext_hook).decode


def decode_row(data: bytes) -> dict[str, object]:
    """The row of `encode_row` bytes; lists and tuples come back as lists."""
    try:
        row = _DECODE(data)
    except RowDecodeError:
        raise
    except RecursionError:
        raise RowDecodeError("row bytes nest deeper than msgpack reads (about 1,000 levels)") from None
    except (ValueError, TypeError, OverflowError) as error:
        raise RowDecodeError(f"row bytes are not valid msgpack: {error}") from None
    if type(row) is not dict:
        raise RowDecodeError(f"row bytes hold a {type(row).__name__}, not a map of columns")
    return row


def decode_rows(rows: Sequence[bytes]) -> list[dict[str, object]]:
    """`decode_row` of every row, in one pass (an active checks a whole Produce); the same errors."""
    try:
        out = list(map(_DECODE, rows))
    except (ValueError, TypeError, OverflowError, RecursionError):
        out = []
    if len(out) == len(rows) and (not out or set(map(type, out)) == _ONLY_DICT):
        return out
    return [decode_row(data) for data in rows]  # raises on the first bad one, saying what is wrong


class Projection:
    """A decoder of only some columns of rows (`names`, matched exactly): a scan that reads 1 of 6 columns
    decodes a row in a fifth of `decode_row`'s time, since msgspec skips the other fields without building
    their values (a 60-character string, a timestamp). A row decodes to a struct whose fields are read by
    `readers[name]` (a C attribute getter). `decode_many` gives None when any row lacks one of the names
    exactly, as well as for bad bytes: the caller then takes such rows one by one (`decode`), and builds
    the struct of a row that lacks a name from its full decoding (`of_row`), with its own lookup."""

    __slots__ = ("_decode", "names", "readers", "type")

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        fields = [f"c{index}" for index in range(len(self.names))]
        # Required fields (no defaults): a missing column fails the decode, so no per-row check for one.
        # gc=False: a struct of plain values cannot be in a cycle, and the collector need not track it.
        self.type: type = msgspec.defstruct(
            "ProjectedRow",
            [(field, Any) for field in fields],
            rename=dict(zip(fields, self.names, strict=True)),
            gc=False,
        )
        self.readers: dict[str, Callable[[Any], object]] = {
            name: operator.attrgetter(field) for name, field in zip(self.names, fields, strict=True)
        }
        self._decode = msgspec.msgpack.Decoder(self.type, ext_hook=_ext_hook).decode

    def decode_many(self, rows: Sequence[bytes]) -> list[Any] | None:
        """Every row's struct, or None when some row lacks a name or is not a row at all."""
        try:
            return list(map(self._decode, rows))
        except (msgspec.DecodeError, RowDecodeError, ValueError, TypeError, OverflowError, RecursionError):
            return None

    def decode(self, data: bytes) -> Any | None:
        """The row's struct, or None when the row does not hold every name exactly (or is no valid row)."""
        try:
            return self._decode(data)
        except (msgspec.DecodeError, RowDecodeError, ValueError, TypeError, OverflowError, RecursionError):
            return None

    def of_row(self, values: Sequence[object]) -> Any:
        """The struct of values given in the order of `names`."""
        return self.type(*values)


# What a Produce entry decodes to: a row (a map of columns) or a tombstone (the encoded key it deletes).
_ROW_OR_TOMBSTONE = frozenset({dict, bytes})
_TOMBSTONE_HEADS = frozenset({0xC4, 0xC5, 0xC6})


def encode_tombstone(key: bytes) -> bytes:
    """A delete of `key` (an encoded key, `protocol.keys`) as a Produce entry: the msgpack bin of the key.
    A row is a msgpack map (first byte 0x80-0x8f, 0xde or 0xdf), a tombstone a bin (0xc4-0xc6), so one
    byte tells them apart and a Produce of rows only is read exactly as before."""
    if type(key) is not bytes:
        raise TypeError(f"a deleted key is its encoded bytes, got {type(key).__name__}")
    return _bin_header(len(key)) + key


def is_tombstone(entry: bytes) -> bool:
    """Whether a Produce entry deletes a key (`encode_tombstone`) rather than writes a row."""
    return bool(entry) and entry[0] in _TOMBSTONE_HEADS


def decode_entry(data: bytes) -> dict[str, object] | bytes:
    """A Produce entry: a row's dict, or the encoded key a tombstone deletes."""
    if is_tombstone(data):
        try:
            key = _DECODE(data)
        except (ValueError, TypeError, OverflowError) as error:
            raise RowDecodeError(f"tombstone bytes are not valid msgpack: {error}") from None
        if type(key) is not bytes:  # a bin header decodes only to bytes; kept for the type checker
            raise RowDecodeError(f"tombstone bytes hold a {type(key).__name__}, not the deleted key's bytes")
        return key
    return decode_row(data)


def decode_entries(entries: Sequence[bytes]) -> tuple[list[dict[str, object] | bytes], bool]:
    """`decode_entry` of every entry in one pass, and whether any is a tombstone; the same errors. Rows only
    cost what `decode_rows` does."""
    try:
        out = list(map(_DECODE, entries))
    except (ValueError, TypeError, OverflowError, RecursionError):
        out = []
    if len(out) == len(entries):
        kinds = set(map(type, out))
        if kinds <= _ONLY_DICT:
            return out, False
        if kinds <= _ROW_OR_TOMBSTONE:
            return out, True
    decoded = [decode_entry(data) for data in entries]  # raises on the first bad one, saying what is wrong
    return decoded, any(type(value) is bytes for value in decoded)


_BIN8 = struct.Struct(">BB")
_BIN16 = struct.Struct(">BH")
_BIN32 = struct.Struct(">BI")


def _bin_header(size: int) -> bytes:
    if size < 0x100:
        return _BIN8.pack(0xC4, size)
    if size < 0x10000:
        return _BIN16.pack(0xC5, size)
    if size <= _MAX_BIN:
        return _BIN32.pack(0xC6, size)
    raise ValueError(f"a record field of {size} bytes is larger than msgpack allows")


def encode_record(key: bytes, row: bytes | None) -> bytes:
    """One log record: msgpack [key, row] with row None for a delete."""
    # Written by hand: the layout is fixed and this is twice as fast as a Packer call (and thread-safe).
    if not isinstance(key, bytes) or not (row is None or isinstance(row, bytes)):
        raise TypeError(
            f"a record is (bytes, bytes | None), got ({type(key).__name__}, {type(row).__name__})"
        )
    if row is None:
        return b"\x92" + _bin_header(len(key)) + key + b"\xc0"
    return b"\x92" + _bin_header(len(key)) + key + _bin_header(len(row)) + row


def decode_record(data: bytes) -> tuple[bytes, bytes | None]:
    """The (key, row or None) of `encode_record` bytes."""
    try:
        record = msgpack.unpackb(data, use_list=False)
    except (ValueError, TypeError, OverflowError) as error:
        raise RowDecodeError(f"record bytes are not valid msgpack: {error}") from None
    if (
        type(record) is not tuple
        or len(record) != 2
        or type(record[0]) is not bytes
        or not (record[1] is None or type(record[1]) is bytes)
    ):
        raise RowDecodeError(f"record bytes hold {short_repr(record)}, not [key bytes, row bytes or nil]")
    return cast(tuple[bytes, bytes | None], record)


def encode_records(keys: Sequence[bytes], rows: Sequence[bytes | None]) -> list[bytes]:
    """`encode_record(keys[i], rows[i])` for every i, the same bytes at a third of the cost per record."""
    if len(keys) != len(rows):
        raise ValueError(f"{len(keys)} keys for {len(rows)} rows")
    if not all(type(key) is bytes for key in keys) or not all(
        type(row) is bytes or row is None for row in rows
    ):
        for key, row in zip(keys, rows, strict=True):
            encode_record(key, row)  # raises the TypeError naming the types
    # A Packer of its own per call: it holds state mid-pack, and callers may run on several threads.
    pack = msgpack.Packer(use_bin_type=True).pack
    try:
        return [pack((key, row)) for key, row in zip(keys, rows, strict=True)]
    except ValueError as error:  # a field over msgpack's 4 GiB
        raise ValueError(f"a record field is larger than msgpack allows: {error}") from None


def decode_records(records: Sequence[bytes]) -> list[tuple[bytes, bytes | None]]:
    """`decode_record` of every record (a store applies a whole batch): the same checks, in one pass."""
    unpack = msgpack.unpackb
    try:
        out = [unpack(record, use_list=False) for record in records]
    except (ValueError, TypeError, OverflowError):
        out = []
    if len(out) == len(records):
        for record in out:
            if (
                type(record) is not tuple
                or len(record) != 2
                or type(record[0]) is not bytes
                or not (record[1] is None or type(record[1]) is bytes)
            ):
                break
        else:
            return cast(list[tuple[bytes, bytes | None]], out)
    return [decode_record(record) for record in records]  # raises on the first bad one, naming it


def entry_keys(
    rows: Sequence[bytes], key_columns: Sequence[KeyColumn]
) -> tuple[list[bytes], Sequence[bytes | None]]:
    """The encoded key of every entry and what its record holds (the row, or None for a tombstone), in a few
    passes; ValueError, TypeError, OverflowError, KeyError or UnicodeError when an entry is bad
    (`_one_by_one` says which and why)."""
    decoded, tombstones = decode_entries(rows)
    if not tombstones:
        return _keys_of_rows(cast(list[dict[str, object]], decoded), key_columns), rows
    # Tombstones and rows each keyed in one pass of their own, then put back in the entries' order.
    dead = [type(entry) is bytes for entry in decoded]
    deleted = checked_keys(
        cast(list[bytes], [e for e, d in zip(decoded, dead, strict=True) if d]), key_columns
    )
    live = cast(list[dict[str, object]], [e for e, d in zip(decoded, dead, strict=True) if not d])
    written = _keys_of_rows(live, key_columns)
    deleted_keys, written_keys = iter(deleted), iter(written)
    keys = [next(deleted_keys) if d else next(written_keys) for d in dead]
    return keys, [None if d else row for d, row in zip(dead, rows, strict=True)]


def _keys_of_rows(rows: list[dict[str, object]], key_columns: Sequence[KeyColumn]) -> list[bytes]:
    """The encoded key of each decoded row: in one pass for the common shape (`encode_keys`), else row by
    row (which raises on the first bad one)."""
    keys = encode_keys(rows, key_columns)
    if keys is None:
        keys = [encode_key(key_from_row(row, key_columns)) for row in rows]
    return keys


def row_keys(rows: Sequence[bytes], key_columns: Sequence[KeyColumn]) -> list[bytes]:
    """The encoded key of every entry (a row's, or the key a tombstone deletes); the errors of
    `entry_keys`."""
    return entry_keys(rows, key_columns)[0]
