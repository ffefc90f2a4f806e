"""What an active does with the rows of a Produce before it appends them: every row's key and partition
checked, and the log records built, for the whole request at once.

The checks are the writer's, redone: each row must be a msgpack map of columns (`protocol.rows`) holding
the table's key columns with the right types, and its key (`protocol.keys`) must hash to the partition the
request names. Any problem refuses the whole request, naming the first bad row and why.

The common case (every row good) runs as a few passes over the request with no per-row function of ours
in between: decoding, key extraction, a key encoder chosen once for the key's type, hashing, and one
msgpack Packer for the records. Only when something fails are the rows walked one by one with the
general functions, which find the first bad row and say what is wrong with it; so both ways give the
same records and the same errors (tests/replica/test_ingest.py holds them to each other).
"""

from __future__ import annotations

from collections.abc import Sequence

from hotstate.controller.records import KeyColumn
from hotstate.protocol.keys import encode_key, key_from_row, partition_for, partitions_of
from hotstate.protocol.rows import decode_row, encode_record, encode_records, row_keys

__all__ = ["records_for_rows"]


def records_for_rows(
    rows: Sequence[bytes], key_columns: Sequence[KeyColumn], partitions: int, partition: int, table: str
) -> tuple[list[bytes], str | None]:
    """The log records ([key, row]) of `rows` for `partition`, or no records and the first problem."""
    records = _fast(rows, key_columns, partitions, partition)
    if records is not None:
        return records, None
    return _one_by_one(rows, key_columns, partitions, partition, table)


def _fast(
    rows: Sequence[bytes], key_columns: Sequence[KeyColumn], partitions: int, partition: int
) -> list[bytes] | None:
    """The records when every row is good; None when any is not (or anything unusual turns up)."""
    try:
        keys = row_keys(rows, key_columns)
        found = partitions_of(keys, partitions)
    except (ValueError, TypeError, OverflowError, KeyError, UnicodeError):
        return None
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
