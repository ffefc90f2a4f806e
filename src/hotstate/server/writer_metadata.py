"""What a broker answers writers about tables, from its metadata image: a table's partitions and their
actives (`TableMetadataRequest`, and its long-poll watch), where a key lives (KIP-535's metadataForKey),
and the retriable NOT_READY a server gives while its image has not caught up since it started.

Pure functions of the image, but `answer_table_metadata`, which waits on the metadata publisher for a watch.
"""

from __future__ import annotations

from hotstate.controller.image import MetadataImage
from hotstate.protocol.keys import encode_key, key_from_row, partition_for, window_suffix
from hotstate.protocol.rows import decode_row
from hotstate.replica.messages import (
    MAX_METADATA_WATCH_MS,
    MetadataForKeyRequest,
    MetadataForKeyResponse,
    PartitionMetadata,
    PartitionQueryResponse,
    ProducePartitionsRequest,
    ProducePartitionsResponse,
    ProduceRequest,
    ProduceResponse,
    QueryPartitionsRequest,
    QueryPartitionsResponse,
    ReplicaError,
    ServerAddress,
    TableMetadataRequest,
    TableMetadataResponse,
)
from hotstate.server.metadata import MetadataPublisher


def metadata_for_key(image: MetadataImage, table_name: str, key_row: bytes) -> MetadataForKeyResponse:
    """KIP-535's metadataForKey: which partition holds a key, and which servers hold that partition."""
    table = image.tables.get(table_name)
    if table is None:
        return MetadataForKeyResponse(ReplicaError.UNKNOWN_TABLE, f"no table {table_name!r}")
    try:
        key = encode_key(key_from_row(decode_row(key_row), table.key_columns))
    except ValueError as error:  # InvalidKeyError, RowDecodeError, KeyEncodeError
        return MetadataForKeyResponse(ReplicaError.INVALID_ROW, f"key for {table_name}: {error}")
    partition = partition_for(key, table.partitions, window_suffix(table.key_columns))
    parts = image.partitions.get(table.table_id, ())
    if partition >= len(parts):
        return MetadataForKeyResponse(ReplicaError.UNKNOWN_PARTITION, f"partition {partition} not assigned")
    part = parts[partition]
    return MetadataForKeyResponse(
        ReplicaError.NONE, "", partition, part.active, part.standbys, part.warmups, part.leader_epoch
    )


# What a server whose metadata has not caught up (server.metadata) refuses with NOT_READY: each would be
# judged from an image that may lack tables and moves committed long ago.
NOT_READY_REFUSES = (
    ProduceRequest,
    ProducePartitionsRequest,
    MetadataForKeyRequest,
    QueryPartitionsRequest,
)


def not_ready_answer(
    request: ProduceRequest | ProducePartitionsRequest | MetadataForKeyRequest | QueryPartitionsRequest,
    reason: str,
) -> ProduceResponse | ProducePartitionsResponse | MetadataForKeyResponse | QueryPartitionsResponse:
    if isinstance(request, ProduceRequest):
        return ProduceResponse(ReplicaError.NOT_READY, reason)
    if isinstance(request, ProducePartitionsRequest):
        return ProducePartitionsResponse(
            tuple(ProduceResponse(ReplicaError.NOT_READY, reason) for _ in request.parts)
        )
    if isinstance(request, MetadataForKeyRequest):
        return MetadataForKeyResponse(ReplicaError.NOT_READY, reason)
    return QueryPartitionsResponse(
        tuple(PartitionQueryResponse(ReplicaError.NOT_READY, reason) for _ in request.parts)
    )


async def answer_table_metadata(
    metadata: MetadataPublisher, request: TableMetadataRequest, produce_max_bytes: int
) -> TableMetadataResponse:
    """A TableMetadataRequest: NOT_READY until the image caught up; a watch (max_wait_ms > 0) is parked
    until the table changes past the caller's known offset or the (capped) wait ends."""
    reason = metadata.not_ready()
    if reason is not None:
        return TableMetadataResponse(ReplicaError.NOT_READY, reason)
    if request.max_wait_ms > 0:
        wait_ms = min(request.max_wait_ms, MAX_METADATA_WATCH_MS)
        await metadata.wait_for_change(request.table, request.known_offset, wait_ms / 1000)
    return table_metadata(metadata.image, request.table, produce_max_bytes)


def table_metadata(
    image: MetadataImage, table_name: str, produce_max_bytes: int = 0
) -> TableMetadataResponse:
    table = image.tables.get(table_name)
    if table is None:
        return TableMetadataResponse(ReplicaError.UNKNOWN_TABLE, f"no table {table_name!r}")
    partitions = tuple(
        PartitionMetadata(p.partition, p.active, p.leader_epoch, p.replicas, p.isr)
        for p in image.partitions.get(table.table_id, ())
    )
    servers = tuple(
        ServerAddress(s.node_id, s.rpc.host, s.rpc.port, s.rack, s.fenced)
        for _, s in sorted(image.servers.items())
    )
    return TableMetadataResponse(
        ReplicaError.NONE,
        "",
        table.table_id,
        table.key_columns,
        table.acceptable_lag,
        partitions,
        servers,
        image.offset,
        produce_max_bytes,
    )
