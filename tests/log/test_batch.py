from __future__ import annotations

import pytest

from hotstate.log import LogError, RecordBatch
from hotstate.log.batch import (
    HEADER_SIZE,
    InvalidBatchError,
    check_batch_fields,
    check_crc,
    decode_batch,
    encode_batch,
    parse_header,
)


def decode(data: bytes) -> RecordBatch:
    header = parse_header(data)
    check_crc(header, data, 0)
    return decode_batch(header, data, 0)


def test_round_trip_and_properties() -> None:
    batch = RecordBatch(41, 7, (b"", b"a", b"\x00" * 300))
    data = encode_batch(batch)
    assert decode(data) == batch
    assert parse_header(data).size == len(data)
    assert (batch.record_count, batch.last_offset, batch.next_offset) == (3, 43, 44)


def test_every_flipped_byte_is_detected() -> None:
    data = encode_batch(RecordBatch(5, 2, (b"hello", b"world")))
    assert len(data) > HEADER_SIZE
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x5A
        with pytest.raises(InvalidBatchError):
            decode(bytes(damaged))


def test_cut_batches_are_detected() -> None:
    data = encode_batch(RecordBatch(0, 0, (b"x" * 50,)))
    for cut in range(len(data)):
        with pytest.raises(InvalidBatchError):
            decode(data[:cut])


def test_field_checks() -> None:
    assert check_batch_fields(0, 0, [bytearray(b"ab"), memoryview(b"c")]) == (b"ab", b"c")
    with pytest.raises(LogError):
        check_batch_fields(0, 0, [])
    with pytest.raises(LogError):
        check_batch_fields(0, -1, [b"x"])
    with pytest.raises(LogError):
        check_batch_fields(-1, 0, [b"x"])
    with pytest.raises(LogError):
        check_batch_fields(0, 0, ["text"])
