"""Record codec and image snapshots: what the metadata log and its snapshots hold on disk."""

from __future__ import annotations

from dataclasses import astuple

import msgpack
import pytest

from hotstate.controller.codec import RECORDS, decode_batch, encode_batch, iter_batch_records
from hotstate.controller.image import (
    ImageBuilder,
    MetadataImage,
    PartitionInfo,
    block_partitions,
    image_records,
    partition_block,
)
from hotstate.controller.records import (
    CreateTable,
    DeleteTable,
    Endpoint,
    FenceServer,
    KeyColumn,
    KeyType,
    MetadataBatch,
    NoOp,
    PartitionAssignment,
    PartitionBlock,
    PartitionChange,
    RegisterServer,
    UnfenceServer,
)
from hotstate.controller.snapshot import SNAPSHOT_VERSION, decode_snapshot, encode_snapshot
from hotstate.rpc.schema import DecodeError


def sample_batches() -> list[MetadataBatch]:
    return [
        MetadataBatch(
            tuple(
                RegisterServer(
                    n,
                    f"inc{n}",
                    Endpoint("127.0.0.1", 9000 + n),
                    None,
                    f"az-{n}",
                    (("zone", "z"),),
                    ("broker",),
                )
                for n in (1, 2, 3)
            )
        ),
        MetadataBatch((UnfenceServer(1), UnfenceServer(2), UnfenceServer(3))),
        MetadataBatch(
            (
                CreateTable("clicks", 1, 3, 1, (KeyColumn("user", KeyType.STRING),), 100),
                *(
                    PartitionAssignment(1, p, (1 + p % 3, 1 + (p + 1) % 3), 1 + p % 3, (), 0, (1, 2), 0)
                    for p in range(3)
                ),
            )
        ),
        MetadataBatch((CreateTable("gone", 2, 1, 0, (KeyColumn("k", KeyType.INT),), None),)),
        MetadataBatch((DeleteTable("gone", 2),)),
        MetadataBatch((FenceServer(3, "session expired"), PartitionChange(1, 2, None, 1, (3,)))),
        MetadataBatch((NoOp(),)),
    ]


def replay(batches: list[MetadataBatch]) -> MetadataImage:
    builder = ImageBuilder(MetadataImage.empty())
    for offset, batch in enumerate(batches):
        builder.apply_all(batch.records, offset)
    return builder.build(len(batches))


def test_every_record_round_trips_through_the_codec() -> None:
    for batch in sample_batches():
        assert decode_batch(encode_batch(batch)) == batch


def test_garbage_is_a_decode_error_not_a_crash() -> None:
    for data in (b"", b"\x00", b"\x93\x01\x02", encode_batch(MetadataBatch((NoOp(),)))[:-1]):
        with pytest.raises(DecodeError):
            decode_batch(data)


def test_snapshot_rebuilds_the_same_image() -> None:
    image = replay(sample_batches())
    loaded = decode_snapshot(encode_snapshot(image))
    assert loaded.offset == image.offset
    assert dict(loaded.tables) == dict(image.tables)
    assert dict(loaded.partitions) == dict(image.partitions)
    assert {n: (s.fenced, s.rack, s.rpc) for n, s in loaded.servers.items()} == {
        n: (s.fenced, s.rack, s.rpc) for n, s in image.servers.items()
    }
    # A deleted table's id is never handed out again, even after a snapshot forgot the table.
    assert loaded.next_table_id == image.next_table_id == 3


def test_offline_partition_survives_a_snapshot() -> None:
    image = replay(sample_batches())
    assert image.partitions_of("clicks")[2].active is None
    assert decode_snapshot(encode_snapshot(image)).partitions_of("clicks")[2].active is None


def test_unreadable_snapshot_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="snapshot"):
        decode_snapshot(b"\xc1")


def v1_snapshot(image: MetadataImage) -> bytes:
    """A snapshot as version 1 wrote it: one PartitionAssignment record per partition."""
    records: list[object] = []
    for record in image_records(image):
        if isinstance(record, PartitionBlock):
            records.extend(
                PartitionAssignment(
                    p.table_id,
                    p.partition,
                    p.replicas,
                    p.active,
                    p.warmups,
                    p.leader_epoch,
                    p.isr,
                    p.partition_epoch,
                )
                for p in block_partitions(record)
            )
        else:
            records.append(record)
    wire = [RECORDS.to_wire(r) for r in records]
    return msgpack.packb([1, image.offset, image.next_table_id, wire], use_bin_type=True)


def test_a_version_1_snapshot_still_loads_into_the_same_image() -> None:
    image = replay(sample_batches())
    old = v1_snapshot(image)
    assert (
        msgpack.unpackb(old)[0] == 1 and msgpack.unpackb(encode_snapshot(image))[0] == SNAPSHOT_VERSION == 2
    )
    loaded = decode_snapshot(old)
    assert dict(loaded.partitions) == dict(image.partitions)
    assert dict(loaded.tables) == dict(image.tables)


def test_a_snapshot_holds_each_tables_partitions_as_one_block() -> None:
    image = replay(sample_batches())
    blocks = [r for r in image_records(image) if isinstance(r, PartitionBlock)]
    assert len(blocks) == 1 and len(blocks[0].actives) == 3
    assert not any(isinstance(r, PartitionAssignment) for r in image_records(image))
    assert decode_batch(encode_batch(MetadataBatch(tuple(blocks)))).records == tuple(blocks)


def test_a_block_means_the_same_as_one_assignment_per_partition_and_shares_equal_replica_sets() -> None:
    parts = replay(sample_batches()).partitions_of("clicks")
    block = partition_block(1, parts)
    rebuilt = block_partitions(block)
    assert tuple(rebuilt) == parts
    assert rebuilt[0].isr is rebuilt[1].isr  # equal tuples are one object
    # Applied over an existing table it replaces those partitions, as PartitionAssignment records would.
    builder = ImageBuilder(replay(sample_batches()))
    moved = PartitionInfo(1, 1, (3, 1), 3, (), 5, (3, 1), 9)
    builder.apply(partition_block(1, [moved]), 99)
    assert builder.build(100).partitions_of("clicks")[1] == moved


def test_a_block_with_columns_of_different_lengths_is_skipped_not_applied() -> None:
    image = replay(sample_batches())
    good = partition_block(1, image.partitions_of("clicks"))
    bad = PartitionBlock(1, 0, good.actives, good.leader_epochs[:2], *astuple(good)[4:])
    builder = ImageBuilder(image)
    builder.apply(bad, 99)
    assert builder.build(100).partitions == image.partitions


def test_a_batch_encoded_with_records_packed_ahead_is_the_same_bytes_and_decodes_a_record_at_a_time() -> None:
    parts = replay(sample_batches()).partitions_of("clicks")
    block = partition_block(1, parts)
    rest = partition_block(1, parts[1:])
    batch = MetadataBatch((CreateTable("t", 1, 3, 1, (KeyColumn("k", KeyType.INT),), None), block, rest))
    packed = encode_batch(batch, {id(block): RECORDS.encode(block), id(rest): RECORDS.encode(rest)})
    assert packed == encode_batch(batch)
    assert decode_batch(packed) == batch
    assert tuple(iter_batch_records(packed)) == batch.records


def test_decoding_a_batch_a_record_at_a_time_refuses_what_decode_batch_refuses() -> None:
    data = encode_batch(MetadataBatch((NoOp(), NoOp())))
    with pytest.raises(DecodeError):
        list(iter_batch_records(data + b"\x00"))
    with pytest.raises(DecodeError):
        list(iter_batch_records(data[:-1]))
    with pytest.raises(DecodeError):
        list(iter_batch_records(RECORDS.encode(NoOp())))
