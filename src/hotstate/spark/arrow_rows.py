"""Rows and keys of an Arrow record batch, encoded a column at a time: the bytes `protocol.rows.encode_row`
and `protocol.keys.encode_key` give for the dicts the Row path of the sink builds, without a Python object
per value.

Spark hands a `mapInArrow` task its rows as Arrow record batches (columns of C arrays). Each column here
becomes an Arrow binary array of its values' msgpack encodings (fixed-width types through numpy, strings
and bytes as a header array joined to the values), and `binary_join_element_wise` puts each row's map
header, column names and values together; keys are built the same way from the key columns. Python then
touches each row twice: to hash its key (murmur3, as `keys.partition_for`) and to take its bytes out of
the array.

Only flat schemas of the types below take this path (`arrow_encodable`); anything else (structs, arrays,
maps, decimals) goes through the Row path. A batch whose keys cannot be encoded (a null key, a NaN float
key) raises `NotEncodable`, and the caller encodes that batch's rows one by one, which raises the usual
error naming the row and the column.

msgpack layouts written here (msgpack-python writes the same for the same Python values):
  nil c0; false/true c2/c3; float 64 cb + 8 bytes; ints in the shortest form (fixint, cc-cf unsigned for
  non-negatives, d0-d3 signed for negatives); str a0|n, d9, da, db + UTF-8; bin c4, c5, c6 + bytes;
  maps 80|n or de + u16 entries; ext types of protocol.rows: d7 01 (naive datetime, int64 micros), d6 03
  (date, int32 ordinal); an instant is msgpack's timestamp (ext -1) in the form msgpack-python picks for a
  Timestamp: d6 ff + u32 seconds (whole seconds below 2**32), d7 ff + u64 nanoseconds << 34 | seconds
  (seconds below 2**34), else c7 0c ff + u32 nanoseconds + int64 seconds.
"""

from __future__ import annotations

from collections.abc import Sequence

import mmh3
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from hotstate.controller.records import KeyColumn, KeyType

__all__ = ["NotEncodable", "arrow_encodable", "encode_arrow_batch"]

_U8 = npt.NDArray[np.uint8]
_I64 = npt.NDArray[np.int64]

_SIGN = np.uint64(1 << 63)
_DATE_ORDINAL_OF_EPOCH = 719163  # dt.date(1970, 1, 1).toordinal()


class NotEncodable(Exception):
    """This batch cannot take the Arrow path (a null or NaN key, an unexpected type): encode it row by row."""


def _is_int(kind: pa.DataType) -> bool:
    return bool(pa.types.is_integer(kind))


def arrow_encodable(kind: pa.DataType) -> bool:
    """Whether a column of this Arrow type is encoded here (else the sink uses the Row path)."""
    if pa.types.is_timestamp(kind):
        return bool(kind.unit == "us")
    return bool(
        _is_int(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_date32(kind)
        or pa.types.is_null(kind)
    )


# ---------------------------------------------------------------------------- building binary arrays


def _from_parts(data: _U8, offsets: _I64) -> pa.Array:
    return pa.Array.from_buffers(
        pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _fixed(rows: _U8) -> pa.Array:
    """One piece per row of a (rows, width) byte matrix."""
    count, width = rows.shape
    return _from_parts(np.ascontiguousarray(rows).reshape(-1), np.arange(count + 1, dtype=np.int64) * width)


def _ragged(rows: _U8, starts: _I64, lengths: _I64) -> pa.Array:
    """Piece i is rows[i, starts[i] : starts[i] + lengths[i]]."""
    count, width = rows.shape
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    owner = np.repeat(np.arange(count, dtype=np.int64), lengths)
    within = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[:-1][owner]
    data = np.ascontiguousarray(rows).reshape(-1)[owner * width + starts[owner] + within]
    return _from_parts(data, offsets)


def _big_endian(values: npt.NDArray[np.int64] | npt.NDArray[np.uint64], dtype: str = ">u8") -> _U8:
    converted = values.astype(dtype)
    return converted.view(np.uint8).reshape(len(values), converted.dtype.itemsize)


def _join(pieces: Sequence[pa.Array | pa.Scalar]) -> pa.Array:
    return pc.binary_join_element_wise(*pieces, pa.scalar(b"", pa.large_binary()))


def _scalar(data: bytes) -> pa.Scalar:
    return pa.scalar(data, pa.large_binary())


def _length_header(lengths: _I64, tiny: int | None, codes: tuple[int, int, int]) -> pa.Array:
    """msgpack's header for a str (tiny=0xa0: fixstr below 32) or bin (tiny=None) of each length."""
    count = len(lengths)
    rows = np.zeros((count, 5), dtype=np.uint8)
    head = np.zeros(count, dtype=np.int64)
    size = np.empty(count, dtype=np.int64)
    small = lengths < 256
    medium = (lengths >= 256) & (lengths < 65536)
    big = lengths >= 65536
    rows[small, 0] = codes[0]
    rows[small, 1] = lengths[small]
    size[small] = 2
    rows[medium, 0] = codes[1]
    rows[medium, 1:3] = _big_endian(lengths[medium], ">u2")
    size[medium] = 3
    rows[big, 0] = codes[2]
    rows[big, 1:5] = _big_endian(lengths[big], ">u4")
    size[big] = 5
    if tiny is not None:
        fix = lengths < 32
        rows[fix, 1] = tiny | lengths[fix]
        head[fix] = 1
        size[fix] = 1
    return _ragged(rows, head, size)


def _lengths(column: pa.Array) -> _I64:
    return np.asarray(
        pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False), dtype=np.int64
    )


def _as_binary(column: pa.Array) -> pa.Array:
    return pc.fill_null(column.cast(pa.large_binary()), b"")


# ---------------------------------------------------------------------------- values


def _int_values(values: _I64) -> pa.Array:
    count = len(values)
    rows = np.empty((count, 9), dtype=np.uint8)
    rows[:, 1:] = _big_endian(values, ">i8")
    width = np.zeros(count, dtype=np.int64)  # payload bytes after the header; 0 for a fixint
    code = np.zeros(count, dtype=np.uint8)
    for low, high, size, header in (
        (128, 256, 1, 0xCC),
        (256, 1 << 16, 2, 0xCD),
        (1 << 16, 1 << 32, 4, 0xCE),
        (-128, -32, 1, 0xD0),
        (-(1 << 15), -128, 2, 0xD1),
        (-(1 << 31), -(1 << 15), 4, 0xD2),
    ):
        chosen = (values >= low) & (values < high)
        width[chosen] = size
        code[chosen] = header
    huge = values >= (1 << 32)
    width[huge], code[huge] = 8, 0xCF
    tiny = values < -(1 << 31)
    width[tiny], code[tiny] = 8, 0xD3
    headed = width > 0
    starts = np.where(headed, 8 - width, 8)
    rows[np.flatnonzero(headed), starts[headed]] = code[headed]
    return _ragged(rows, starts, np.where(headed, width + 1, 1))


def _prefixed(prefix: bytes, payload: _U8) -> pa.Array:
    rows = np.empty((len(payload), len(prefix) + payload.shape[1]), dtype=np.uint8)
    rows[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    rows[:, len(prefix) :] = payload
    return _fixed(rows)


def _instants(micros: _I64) -> pa.Array:
    """msgpack's timestamp of each instant (microseconds since the epoch), as msgpack-python packs it."""
    count = len(micros)
    seconds = micros // 1_000_000
    nanos = (micros % 1_000_000) * 1000
    rows = np.zeros((count, 15), dtype=np.uint8)
    lengths = np.empty(count, dtype=np.int64)
    fits = (seconds >= 0) & (seconds < (1 << 34))
    short = fits & (nanos == 0) & (seconds < (1 << 32))
    middle = fits & ~short
    long = ~fits
    rows[short, :2] = (0xD6, 0xFF)
    rows[short, 2:6] = _big_endian(seconds[short], ">u4")
    lengths[short] = 6
    both = (nanos[middle].astype(np.uint64) << np.uint64(34)) | seconds[middle].astype(np.uint64)
    rows[middle, :2] = (0xD7, 0xFF)
    rows[middle, 2:10] = _big_endian(both, ">u8")
    lengths[middle] = 10
    rows[long, :3] = (0xC7, 0x0C, 0xFF)
    rows[long, 3:7] = _big_endian(nanos[long], ">u4")
    rows[long, 7:15] = _big_endian(seconds[long], ">i8")
    lengths[long] = 15
    return _ragged(rows, np.zeros(count, dtype=np.int64), lengths)


def _int64s(column: pa.Array) -> _I64:
    return np.asarray(pc.fill_null(column.cast(pa.int64()), 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _value_pieces(column: pa.Array) -> pa.Array:
    """The msgpack encoding of each value of a column (nil for a null)."""
    kind = column.type
    count = len(column)
    if pa.types.is_null(kind):
        return pa.array([b"\xc0"] * count, pa.large_binary())
    if _is_int(kind):
        pieces = _int_values(_int64s(column))
    elif pa.types.is_floating(kind):
        floats = np.asarray(
            pc.fill_null(column.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False), dtype=np.float64
        )
        pieces = _prefixed(b"\xcb", _big_endian(floats.view(np.uint64)))
    elif pa.types.is_boolean(kind):
        truth = np.asarray(pc.fill_null(column, False).to_numpy(zero_copy_only=False), dtype=bool)
        pieces = _fixed(np.where(truth, 0xC3, 0xC2).astype(np.uint8).reshape(-1, 1))
    elif pa.types.is_timestamp(kind):
        micros = _int64s(column.cast(pa.int64()))
        # With a zone, an instant: written as the aware datetime in UTC that the Row path makes of it.
        pieces = _prefixed(b"\xd7\x01", _big_endian(micros, ">i8")) if kind.tz is None else _instants(micros)
    elif pa.types.is_date32(kind):
        days = _int64s(column.cast(pa.int32())) + _DATE_ORDINAL_OF_EPOCH
        pieces = _prefixed(b"\xd6\x03", _big_endian(days, ">i4"))
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        pieces = _join([_length_header(_lengths(column), 0xA0, (0xD9, 0xDA, 0xDB)), _as_binary(column)])
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        pieces = _join([_length_header(_lengths(column), None, (0xC4, 0xC5, 0xC6)), _as_binary(column)])
    else:
        raise NotEncodable(f"no Arrow encoding for {kind}")
    if column.null_count:
        pieces = pc.if_else(pc.is_null(column), _scalar(b"\xc0"), pieces)
    return pieces


def _map_header(entries: int) -> bytes:
    return bytes((0x80 | entries,)) if entries < 16 else b"\xde" + entries.to_bytes(2, "big")


def _str_header(name: str) -> bytes:
    data = name.encode()
    size = len(data)
    if size < 32:
        return bytes((0xA0 | size,)) + data
    if size < 256:
        return bytes((0xD9, size)) + data
    return b"\xda" + size.to_bytes(2, "big") + data


# ---------------------------------------------------------------------------- keys


def _escaped(code: bytes, column: pa.Array) -> pa.Array:
    body = pc.replace_substring(_as_binary(column), pattern=b"\x00", replacement=b"\x00\xff")
    return _join([_scalar(code), body, _scalar(b"\x00")])


def _key_pieces(column: pa.Array, key: KeyColumn) -> pa.Array:
    kind = column.type
    if column.null_count:
        raise NotEncodable(f"key column {key.name!r} holds a null")
    if key.type is KeyType.STRING and (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return _escaped(b"\x02", column)
    if key.type is KeyType.BYTES and (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        return _escaped(b"\x01", column)
    if key.type is KeyType.INT and _is_int(kind):
        return _prefixed(b"\x14", _big_endian(_int64s(column).view(np.uint64) ^ _SIGN))
    if key.type is KeyType.TIMESTAMP and pa.types.is_timestamp(kind) and kind.unit == "us":
        return _prefixed(b"\x33", _big_endian(_int64s(column.cast(pa.int64())).view(np.uint64) ^ _SIGN))
    if key.type is KeyType.BOOL and pa.types.is_boolean(kind):
        truth = np.asarray(column.to_numpy(zero_copy_only=False), dtype=bool)
        return _fixed(np.where(truth, 0x27, 0x26).astype(np.uint8).reshape(-1, 1))
    if key.type is KeyType.FLOAT and pa.types.is_floating(kind):
        floats = np.asarray(column.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
        if np.isnan(floats).any():
            raise NotEncodable(f"key column {key.name!r} holds a NaN")
        bits = np.where(floats == 0.0, 0.0, floats).view(np.uint64)  # -0.0 and 0.0 are one key
        negative = (bits & _SIGN) != 0
        return _prefixed(b"\x21", _big_endian(np.where(negative, ~bits, bits | _SIGN)))
    raise NotEncodable(f"key column {key.name!r} of type {key.type.name} from an Arrow {kind}")


# ---------------------------------------------------------------------------- batches


def encode_arrow_batch(
    batch: pa.RecordBatch,
    key_columns: Sequence[KeyColumn],
    partitions: int,
    *,
    deletes: pa.Array | None = None,
    keys_out: list[bytes] | None = None,
) -> dict[int, list[bytes]]:
    """The batch's encoded rows grouped by partition, each partition's rows in batch order.

    `deletes`: a boolean array, one per row (no nulls): where true the row's entry is a tombstone of its key
    (`protocol.rows.encode_tombstone`: the msgpack bin of the encoded key) instead of the row, in its place.
    `keys_out`: extended with every row's encoded key, in batch order."""
    if batch.num_rows == 0:
        return {}
    names = batch.schema.names
    pieces: list[pa.Array | pa.Scalar] = [_scalar(_map_header(len(names)))]
    try:
        for name, column in zip(names, batch.columns, strict=True):
            if not arrow_encodable(column.type):
                raise NotEncodable(f"column {name!r} of type {column.type}")
            pieces.append(_scalar(_str_header(name)))
            pieces.append(_value_pieces(column))
    except pa.ArrowException as error:
        raise NotEncodable(str(error)) from None
    try:
        rows = _join(pieces)
        parts = [_key_pieces(batch.column(key.name), key) for key in key_columns]
        joined = parts[0] if len(parts) == 1 else _join(parts)
        if deletes is not None and deletes.true_count:
            tombstones = _join([_length_header(_lengths(joined), None, (0xC4, 0xC5, 0xC6)), joined])
            rows = pc.if_else(deletes, tombstones, rows)
        keys: list[bytes] = joined.to_pylist()
    except KeyError as error:
        raise NotEncodable(f"no key column {error}") from None
    except pa.ArrowException as error:  # e.g. a uint64 above the int64 range
        raise NotEncodable(str(error)) from None
    if keys_out is not None:
        keys_out.extend(keys)
    hash32 = mmh3.hash
    found = np.array([hash32(key, 0, signed=False) for key in keys], dtype=np.uint64) % np.uint64(partitions)
    # Rows leave Arrow already in partition order, so each partition's list is one slice.
    order = np.argsort(found, kind="stable")
    ordered: list[bytes] = rows.take(pa.array(order)).to_pylist()
    counts = np.bincount(found.astype(np.int64), minlength=partitions)
    out: dict[int, list[bytes]] = {}
    start = 0
    for partition in np.flatnonzero(counts).tolist():
        end = start + int(counts[partition])
        out[partition] = ordered[start:end]
        start = end
    return out
