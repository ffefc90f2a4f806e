"""The one codec for metadata records: msgpack through a type registry, never pickle.

Type ids are part of the on-disk format: never reuse or renumber one; add new records with new ids.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import msgpack

from hotstate.controller.records import (
    CreateTable,
    DeleteTable,
    DrainServer,
    Endpoint,
    FenceServer,
    KeyColumn,
    MetadataBatch,
    MetadataRecord,
    NoOp,
    PartitionAssignment,
    PartitionBlock,
    PartitionChange,
    RegisterServer,
    ReplaceTable,
    TableBatch,
    TableTtl,
    TableValueColumns,
    TableWindow,
    TableWriters,
    UnfenceServer,
    UnregisterServer,
    ValueColumn,
)
from hotstate.rpc.schema import DecodeError, TypeRegistry

RECORDS = TypeRegistry()
for type_id, cls in (
    (1, Endpoint),
    (2, KeyColumn),
    (3, ValueColumn),
    (4, TableWindow),
    (5, TableTtl),
    (10, RegisterServer),
    (11, UnregisterServer),
    (12, FenceServer),
    (13, UnfenceServer),
    (14, DrainServer),
    (21, DeleteTable),
    (22, TableWriters),
    (23, TableBatch),
    (24, TableValueColumns),
    (25, ReplaceTable),
    (30, PartitionAssignment),
    (31, PartitionChange),
    (87, PartitionBlock),
    (40, NoOp),
    (100, MetadataBatch),
):
    RECORDS.register(type_id, cls)
# Version 2 appended writer_racks, version 3 staging_for and loaded_positions, version 4 window, version 5
# ttl; older records (without them) still decode.
RECORDS.register(20, CreateTable, version=5)


def encode_batch(batch: MetadataBatch, packed: Mapping[int, bytes] | None = None) -> bytes:
    """`packed`: records of the batch already msgpack-encoded (`RECORDS.encode`, done off the event loop or
    a block at a time for a 100,000-partition table's PartitionBlocks), by `id()` of the record object.
    msgpack values concatenate: the batch is its headers and the records' bytes, the same bytes either way."""
    if not packed:
        return RECORDS.encode(batch)
    type_id, version, _ = RECORDS.to_wire(MetadataBatch(()))
    packer = msgpack.Packer(use_bin_type=True)
    head = packer.pack_array_header(3) + packer.pack(type_id) + packer.pack(version)
    head += packer.pack_array_header(1) + packer.pack_array_header(len(batch.records))
    return head + b"".join(packed.get(id(r)) or RECORDS.encode(r) for r in batch.records)


def decode_batch(data: bytes) -> MetadataBatch:
    batch = RECORDS.decode(data)
    if not isinstance(batch, MetadataBatch):
        raise DecodeError(f"expected a metadata batch, found {type(batch).__name__}")
    return batch


def iter_batch_records(data: bytes) -> Iterator[MetadataRecord]:
    """`decode_batch(data).records` one record at a time: a shell decoding a big batch (a 100,000-partition
    table's PartitionBlocks, about 1 MB) may yield between records, where one `decode_batch` holds the
    event loop for the whole entry (msgpack's C unpacker keeps the GIL: a thread would not help)."""
    type_id, version, _ = RECORDS.to_wire(MetadataBatch(()))
    n = len(data)
    if n > RECORDS.max_decode_bytes:
        raise DecodeError(f"cannot decode {n} bytes: over the limit of {RECORDS.max_decode_bytes}")
    unpacker = msgpack.Unpacker(
        raw=False,
        use_list=True,
        strict_map_key=True,
        max_buffer_size=max(n, 1),
        max_str_len=n,
        max_bin_len=n,
        max_array_len=n,
        max_map_len=n // 2,
        max_ext_len=n,
    )
    unpacker.feed(data)
    try:
        if unpacker.read_array_header() != 3 or unpacker.unpack() != type_id:
            raise ValueError("not a metadata batch")
        if unpacker.unpack() != version or unpacker.read_array_header() != 1:
            raise ValueError("another batch version")
        count = unpacker.read_array_header()
    except Exception:
        # Not the layout stepped through here (an older version, or invalid): the whole-entry decoder says.
        yield from decode_batch(data).records
        return
    for _ in range(count):
        try:
            wire = unpacker.unpack()
        except Exception as e:
            raise DecodeError(f"not valid msgpack: {type(e).__name__}: {e}") from None
        record = RECORDS.from_wire(wire)
        yield record  # type: ignore[misc]
    if unpacker.tell() != n:
        raise DecodeError("cannot decode a metadata batch: bytes after its end")
