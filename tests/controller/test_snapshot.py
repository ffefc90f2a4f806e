"""Record codec and image snapshots: what the metadata log and its snapshots hold on disk."""

from __future__ import annotations

import pytest

from hotstate.controller.codec import decode_batch, encode_batch
from hotstate.controller.image import ImageBuilder, MetadataImage
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
    PartitionChange,
    RegisterServer,
    UnfenceServer,
)
from hotstate.controller.snapshot import decode_snapshot, encode_snapshot
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
