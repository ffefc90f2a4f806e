"""What an active does with the rows of a Produce before it appends them: every row's key and partition
checked, and the log records built, for the whole request at once.

The checks are the writer's, redone: each row must be a msgpack map of columns (`replica.rows`) holding
the table's key columns with the right types, and its key (`replica.keys`) must hash to the partition the
request names. Any problem refuses the whole request, naming the first bad row and why.

The common case (every row good) runs as a few passes over the request with no per-row function of ours
in between: decoding, key extraction, a key encoder chosen once for the key's type, hashing, and one
msgpack Packer for the records. Only when something fails are the rows walked one by one with the
general functions, which find the first bad row and say what is wrong with it; so both ways give the
same records and the same errors (tests/replica/test_ingest.py holds them to each other).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mmh3

from hotstate.controller.records import KeyColumn, KeyType
from hotstate.replica.keys import encode_key, key_from_row, partition_for
from hotstate.replica.rows import decode_row, decode_rows, encode_record, encode_records

__all__ = ["records_for_rows"]


def records_for_rows(
    rows: Sequence[bytes], key_columns: Sequence[KeyColumn], partitions: int, partition: int, table: str
) -> tuple[list[bytes], str | None]:
    """The log records ([key, row]) of `rows` for `partition`, or no records and the first problem."""
    records = _fast(rows, key_columns, partitions, partition)
    if records is not None:
        return records, None
    return _one_by_one(rows, key_columns, partitions, partition, table)


def _encode_string_keys(values: list[object]) -> list[bytes] | None:
    if not all(type(value) is str for value in values):
        return None
    # keys._encode_str for exact str: UTF-8, 0x00 escaped as 0x00 0xFF, then a 0x00 terminator.
    return [b"\x02" + value.encode().replace(b"\x00", b"\x00\xff") + b"\x00" for value in values]  # type: ignore[attr-defined]


_SINGLE_KEY_ENCODERS: dict[KeyType, Callable[[list[object]], list[bytes] | None]] = {
    KeyType.STRING: _encode_string_keys,
}


def _fast(
    rows: Sequence[bytes], key_columns: Sequence[KeyColumn], partitions: int, partition: int
) -> list[bytes] | None:
    """The records when every row is good; None when any is not (or anything unusual turns up)."""
    try:
        decoded = decode_rows(rows)
        keys: list[bytes] | None = None
        if len(key_columns) == 1:
            column = key_columns[0]
            encoder = _SINGLE_KEY_ENCODERS.get(column.type)
            if encoder is not None:
                keys = encoder([row[column.name] for row in decoded])
        if keys is None:
            keys = [encode_key(key_from_row(row, key_columns)) for row in decoded]
    except (ValueError, TypeError, OverflowError, KeyError, UnicodeError):
        return None
    if partitions < 1:
        return None
    hash32 = mmh3.hash
    found = [hash32(key, 0, signed=False) % partitions for key in keys]
    if found.count(partition) != len(found):
        return None
    return encode_records(keys, list(rows))


def _one_by_one(
    rows: Sequence[bytes], key_columns: Sequence[KeyColumn], partitions: int, partition: int, table: str
) -> tuple[list[bytes], str | None]:
    records = []
    for index, row_bytes in enumerate(rows):
        try:
            row = decode_row(row_bytes)
            key = encode_key(key_from_row(row, key_columns))
        except ValueError as error:  # InvalidKeyError, RowDecodeError, KeyEncodeError: each names the problem
            return [], f"row {index} of {table}: {error}"
        found = partition_for(key, partitions)
        if found != partition:
            return [], (
                f"row {index} of {table}: its key belongs to partition {found}, "
                f"not {partition} (partition = murmur3(key) mod {partitions})"
            )
        records.append(encode_record(key, row_bytes))
    return records, None
