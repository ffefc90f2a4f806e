"""Record batches and their on-disk encoding.

Layout, big-endian, 26 bytes of header then the payload:

    crc u32 | magic u8 | attributes u8 | payload_length u32 | base_offset i64 | leader_epoch i32 |
    record_count i32 | payload

The CRC32C (Castagnoli, as Kafka's v2 batches) covers every byte after itself, header fields included,
so a flipped bit anywhere in a batch (its length and offsets too) is caught. The payload is the msgpack
array of the records as msgpack `bin` values. Never pickle: the bytes come from disk and from peers.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import crc32c
import msgpack

from hotstate.log.errors import LogError

MAGIC = 2
# The CRC comes first so that it can cover everything else, including the length used for framing.
_CRC = struct.Struct(">I")
_FIELDS = struct.Struct(">BBIqii")
HEADER_SIZE = _CRC.size + _FIELDS.size
# Guards framing on a damaged length field: such a batch is rejected before its bytes are read.
MAX_PAYLOAD_BYTES = 1 << 30
_MAX_INT32 = (1 << 31) - 1


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """Records that share a leader epoch and occupy consecutive offsets from `base_offset`."""

    base_offset: int
    leader_epoch: int
    records: tuple[bytes, ...]

    @property
    def record_count(self) -> int:
        return len(self.records)

    @property
    def last_offset(self) -> int:
        return self.base_offset + len(self.records) - 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + len(self.records)


class InvalidBatchError(Exception):
    """Bytes that do not form a valid batch; callers decide whether that is a torn tail or corruption."""


class BatchHeader(NamedTuple):
    crc: int
    payload_length: int
    base_offset: int
    leader_epoch: int
    record_count: int

    @property
    def size(self) -> int:
        return HEADER_SIZE + self.payload_length

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count


def check_batch_fields(base_offset: int, leader_epoch: int, records: Sequence[object]) -> tuple[bytes, ...]:
    """Validate what a caller wants appended; returns the records as a tuple of `bytes`."""
    if not records:
        raise LogError("a batch needs at least one record")
    if not 0 <= leader_epoch <= _MAX_INT32:
        raise LogError(f"leader epoch {leader_epoch} outside [0, {_MAX_INT32}]")
    if base_offset < 0:
        raise LogError(f"negative base offset {base_offset}")
    if len(records) > _MAX_INT32:
        raise LogError(f"{len(records)} records do not fit one batch")
    out: list[bytes] = []
    for record in records:
        if isinstance(record, bytes):
            out.append(record)
        elif isinstance(record, bytearray | memoryview):
            out.append(bytes(record))
        else:
            raise LogError(f"records must be bytes, got {type(record).__name__}")
    return tuple(out)


def encode_batch(batch: RecordBatch) -> bytes:
    payload = msgpack.packb(list(batch.records), use_bin_type=True)
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise LogError(f"batch payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    fields = _FIELDS.pack(MAGIC, 0, len(payload), batch.base_offset, batch.leader_epoch, batch.record_count)
    crc = crc32c.crc32c(payload, crc32c.crc32c(fields))
    return b"".join((_CRC.pack(crc), fields, payload))


def parse_header(data: bytes | memoryview, pos: int = 0) -> BatchHeader:
    """Parse and sanity-check the header at `data[pos:]` (not the CRC: that needs the payload)."""
    if len(data) - pos < HEADER_SIZE:
        raise InvalidBatchError(f"{len(data) - pos} bytes left, a header needs {HEADER_SIZE}")
    (crc,) = _CRC.unpack_from(data, pos)
    magic, attributes, payload_length, base_offset, leader_epoch, record_count = _FIELDS.unpack_from(
        data, pos + _CRC.size
    )
    if magic != MAGIC:
        raise InvalidBatchError(f"magic byte {magic}, expected {MAGIC}")
    if attributes != 0:
        raise InvalidBatchError(f"unknown attributes {attributes:#x}")
    if payload_length > MAX_PAYLOAD_BYTES:
        raise InvalidBatchError(f"payload length {payload_length} exceeds {MAX_PAYLOAD_BYTES}")
    if base_offset < 0 or leader_epoch < 0 or record_count < 1:
        raise InvalidBatchError(f"bad header fields {base_offset=} {leader_epoch=} {record_count=}")
    return BatchHeader(crc, payload_length, base_offset, leader_epoch, record_count)


def check_crc(header: BatchHeader, data: bytes | memoryview, pos: int) -> None:
    """Check the CRC of the whole batch at `data[pos:pos + header.size]` (the caller has those bytes)."""
    view = memoryview(data)[pos + _CRC.size : pos + header.size]
    if len(view) != header.size - _CRC.size:
        raise InvalidBatchError(f"batch of {header.size} bytes is cut short")
    if crc32c.crc32c(view) != header.crc:
        raise InvalidBatchError("CRC32C mismatch")


def decode_batch(header: BatchHeader, data: bytes | memoryview, pos: int) -> RecordBatch:
    """Decode a batch whose CRC has been checked."""
    start = pos + HEADER_SIZE
    payload = memoryview(data)[start : start + header.payload_length]
    try:
        records = msgpack.unpackb(payload, use_list=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise InvalidBatchError(f"payload is not msgpack: {exc}") from exc
    if (
        not isinstance(records, tuple)
        or len(records) != header.record_count
        or not all(type(record) is bytes for record in records)
    ):
        raise InvalidBatchError(f"payload is not an array of {header.record_count} binary records")
    return RecordBatch(header.base_offset, header.leader_epoch, records)
