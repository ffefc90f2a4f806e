"""What an active does with the entries of a Produce before it appends them: every entry's key and partition
checked, and the log records built, for the whole request at once.

An entry is a row or a tombstone (`protocol.rows`: a msgpack map, or the msgpack bin of the encoded key to
delete; the first byte tells which). The checks are the writer's, redone: each row must be a msgpack map of
columns holding the table's key columns with the right types, each tombstone's key must be a key of the
table's key types exactly as `protocol.keys` encodes it, and every key must hash to the partition the
request names. Any problem refuses the whole request, naming the first bad entry and why. A row becomes the
record [key, row]; a tombstone [key, nil], which every replica's store applies as a delete.

The common case (every entry a good row) runs as a few passes over the request with no per-row function of
ours in between: decoding, key extraction, a key encoder chosen once for the key's type, hashing, and one
msgpack Packer for the records. A request holding tombstones keys them in a pass of their own
(`protocol.keys.checked_keys`: one STRING key column is decoded and encoded again in bulk, other key shapes
key by key), then puts rows and tombstones back in order. Only when something fails are the entries walked
one by one with the general functions, which find the first bad entry and say what is wrong with it; so
both ways give the same records and the same errors (tests/replica/test_ingest.py holds them to each
other).
"""

from __future__ import annotations

from collections.abc import Sequence

from hotstate.controller.records import KeyColumn
from hotstate.protocol.keys import (
    checked_key,
    encode_key,
    key_from_row,
    partition_for,
    partitions_of,
    window_suffix,
)
from hotstate.protocol.rows import decode_entry, encode_record, encode_records, entry_keys

__all__ = ["records_for_rows"]

_BAD_ENTRY = (ValueError, TypeError, OverflowError, KeyError, UnicodeError)


def records_for_rows(
    rows: Sequence[bytes],
    key_columns: Sequence[KeyColumn],
    partitions: int,
    partition: int,
    table: str,
    *,
    first_index: int = 0,
) -> tuple[list[bytes], str | None]:
    """The log records ([key, row or nil]) of a Produce's entries (rows and tombstones) for `partition`, or
    no records and the first problem. `first_index`: the request's index of `rows[0]` (a problem names the
    entry by its index in the request, when the request is checked a part at a time)."""
    records = _fast(rows, key_columns, partitions, partition)
    if records is not None:
        return records, None
    return _one_by_one(rows, key_columns, partitions, partition, table, first_index)


def _fast(
    rows: Sequence[bytes], key_columns: Sequence[KeyColumn], partitions: int, partition: int
) -> list[bytes] | None:
    """The records when every entry is good; None when any is not (or anything unusual turns up)."""
    try:
        keys, values = entry_keys(rows, key_columns)
        found = partitions_of(keys, partitions, window_suffix(key_columns))
    except _BAD_ENTRY:
        return None
    if found.count(partition) != len(found):
        return None
    return encode_records(keys, values)


def _one_by_one(
    rows: Sequence[bytes],
    key_columns: Sequence[KeyColumn],
    partitions: int,
    partition: int,
    table: str,
    first_index: int = 0,
) -> tuple[list[bytes], str | None]:
    records = []
    suffix = window_suffix(key_columns)
    for index, entry_bytes in enumerate(rows, first_index):
        what = "row"
        try:
            entry = decode_entry(entry_bytes)
            if isinstance(entry, bytes):
                what = "delete"
                key = checked_key(entry, key_columns)
            else:
                key = encode_key(key_from_row(entry, key_columns))
        except ValueError as error:  # InvalidKeyError, RowDecodeError, Key*Error: each names the problem
            return [], f"{what} {index} of {table}: {error}"
        found = partition_for(key, partitions, suffix)
        if found != partition:
            return [], (
                f"{what} {index} of {table}: its key belongs to partition {found}, "
                f"not {partition} (partition = murmur3(key) mod {partitions})"
            )
        records.append(encode_record(key, None if what == "delete" else entry_bytes))
    return records, None
