"""The one codec for metadata records: msgpack through a type registry, never pickle.

Type ids are part of the on-disk format: never reuse or renumber one; add new records with new ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack

from hotstate.controller.records import (
    CreateTable,
    DeleteTable,
    DrainServer,
    Endpoint,
    FenceServer,
    KeyColumn,
    MetadataBatch,
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


def encode_batch(batch: MetadataBatch, wired: Mapping[int, list[Any]] | None = None) -> bytes:
    """`wired`: records of the batch already in wire form (`RECORDS.to_wire`, done off the event loop for a
    100,000-partition PartitionBlock), by `id()` of the record object; the bytes are the same either way."""
    if not wired:
        return RECORDS.encode(batch)
    type_id, version, _ = RECORDS.to_wire(MetadataBatch(()))
    records = [wired.get(id(r)) or RECORDS.to_wire(r) for r in batch.records]
    return msgpack.packb([type_id, version, [records]], use_bin_type=True)


def decode_batch(data: bytes) -> MetadataBatch:
    batch = RECORDS.decode(data)
    if not isinstance(batch, MetadataBatch):
        raise DecodeError(f"expected a metadata batch, found {type(batch).__name__}")
    return batch
