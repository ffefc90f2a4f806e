"""Snapshots of the metadata image: the records that rebuild it, like KRaft's snapshots.

Format: msgpack [version, offset, next_table_id, [record, ...]] with records in the record codec's wire
form. Loading replays them into an empty image. Version 2 holds each table's partitions as one columnar
`PartitionBlock` record; version 1 (one `PartitionAssignment` per partition) still loads, as the same replay.
"""

from __future__ import annotations

import msgpack

from hotstate.controller.codec import RECORDS
from hotstate.controller.image import ImageBuilder, MetadataImage, image_records
from hotstate.rpc.schema import DecodeError

SNAPSHOT_VERSION = 2
# Versions this server loads: 1 wrote a PartitionAssignment record per partition.
READABLE_VERSIONS = (1, 2)


def encode_snapshot(image: MetadataImage) -> bytes:
    records = [RECORDS.to_wire(record) for record in image_records(image)]
    return msgpack.packb([SNAPSHOT_VERSION, image.offset, image.next_table_id, records], use_bin_type=True)


def decode_snapshot(data: bytes) -> MetadataImage:
    try:
        version, offset, next_table_id, records = msgpack.unpackb(data, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as error:
        raise DecodeError(f"metadata snapshot is unreadable: {error}") from error
    if version not in READABLE_VERSIONS:
        raise DecodeError(f"metadata snapshot version {version}; this server reads {READABLE_VERSIONS}")
    builder = ImageBuilder(MetadataImage.empty())
    at = max(offset - 1, 0)
    for wire in records:
        builder.apply(RECORDS.from_wire(wire), at)  # type: ignore[arg-type]
    builder.set_next_table_id(next_table_id)
    return builder.build(offset)
