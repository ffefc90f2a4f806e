"""KIP-535's metadata for a key, answered from the image: the partition and its replicas, or a clear error."""

from __future__ import annotations

from hotstate.controller.image import ImageBuilder, MetadataImage
from hotstate.controller.records import CreateTable, KeyColumn, KeyType, PartitionAssignment
from hotstate.protocol.keys import encode_key, partition_for
from hotstate.protocol.rows import encode_row
from hotstate.replica.messages import ReplicaError
from hotstate.server.writer_metadata import metadata_for_key


def _image() -> MetadataImage:
    builder = ImageBuilder(MetadataImage.empty())
    builder.apply(CreateTable("clicks", 1, 2, 1, (KeyColumn("user", KeyType.STRING),), None), 1)
    for p in range(2):
        builder.apply(PartitionAssignment(1, p, (1 + p, 2 - p), 1 + p, (), 0, (1, 2), 0), 2)
    return builder.build(3)


def test_a_key_maps_to_its_partition_and_replicas() -> None:
    reply = metadata_for_key(_image(), "clicks", encode_row({"user": "u42"}))
    expected = partition_for(encode_key(("u42",)), 2)
    assert reply.error is ReplicaError.NONE and reply.partition == expected
    assert reply.active == 1 + expected and reply.standbys == (2 - expected,)


def test_unknown_tables_and_bad_keys_get_clear_errors() -> None:
    image = _image()
    unknown = metadata_for_key(image, "nope", encode_row({"user": "x"}))
    assert unknown.error is ReplicaError.UNKNOWN_TABLE and "nope" in unknown.message
    wrong_type = metadata_for_key(image, "clicks", encode_row({"user": 5}))
    assert wrong_type.error is ReplicaError.INVALID_ROW and "'user'" in wrong_type.message
    missing = metadata_for_key(image, "clicks", encode_row({"clicks": 1}))
    assert missing.error is ReplicaError.INVALID_ROW and "'user'" in missing.message
    garbage = metadata_for_key(image, "clicks", b"\xc1 not msgpack")
    assert garbage.error is ReplicaError.INVALID_ROW
