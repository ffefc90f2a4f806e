"""A new table's placement through the rack-aware assignor, and the writer racks it is placed near."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hotstate.assignor import AssignorConfig
from hotstate.controller.codec import RECORDS, decode_batch, encode_batch
from hotstate.controller.controller import ControllerConfig, QuorumController
from hotstate.controller.image import (
    ImageBuilder,
    MetadataImage,
    TableInfo,
    block_partitions,
    image_records,
    partition_block,
)
from hotstate.controller.placement import BLOCK_PARTITIONS, place_encoded, placement_job
from hotstate.controller.records import CreateTable, KeyColumn, KeyType, MetadataBatch, TableWriters
from hotstate.controller.requests import (
    ControllerError,
    CreateTableRequest,
    RegisterWriterRequest,
    RegisterWriterResponse,
)
from hotstate.rpc.schema import TypeRegistry

from .test_controller import SESSION, Harness

RACKS = {1: "az-a", 2: "az-a", 3: "az-b", 4: "az-b", 5: "az-c", 6: "az-c"}
KEY = (KeyColumn("user", KeyType.STRING),)


def six_brokers(config: AssignorConfig | None = None) -> Harness:
    harness = Harness()
    if config is not None:
        harness.controller = QuorumController(
            harness.image, ControllerConfig(SESSION, config), now=0, next_offset=1
        )
    for node_id, rack in RACKS.items():
        harness.register(node_id, rack)
    return harness


def create(harness: Harness, name: str, partitions: int, rack: str | None) -> None:
    reply = harness.handle(CreateTableRequest(name, partitions, 1, KEY, None, writer_rack=rack)).reply
    assert reply.error is ControllerError.NONE, reply


def actives_in(harness: Harness, table: str, rack: str) -> int:
    return sum(RACKS[p.active] == rack for p in harness.image.partitions_of(table) if p.active)


def test_a_table_created_with_a_writer_rack_gets_its_actives_in_that_rack_as_far_as_balance_allows() -> None:
    near = six_brokers()
    create(near, "clicks", 4, "az-c")
    assert near.image.tables["clicks"].writer_racks == ("az-c",)
    # 4 actives over 6 servers: at most one each, so two of them can be in az-c, and both are.
    assert actives_in(near, "clicks", "az-c") == 2
    assert max(Counter(p.active for p in near.image.partitions_of("clicks")).values()) == 1

    blind = six_brokers(AssignorConfig(rack_aware_assignment_strategy="none"))
    create(blind, "clicks", 4, "az-c")
    assert actives_in(blind, "clicks", "az-c") < 2  # the plain placement does not look at writers


def test_standbys_are_in_another_rack_than_their_active() -> None:
    harness = six_brokers()
    create(harness, "clicks", 12, "az-a")
    for part in harness.image.partitions_of("clicks"):
        assert part.active is not None and len(part.standbys) == 1
        assert RACKS[part.standbys[0]] != RACKS[part.active]
        assert part.isr == part.replicas and part.warmups == ()


def test_a_second_table_is_balanced_against_the_first_and_never_moves_it() -> None:
    harness = six_brokers()
    create(harness, "first", 4, "az-c")
    before = harness.image.partitions_of("first")
    create(harness, "second", 8, "az-a")
    assert harness.image.partitions_of("first") == before
    load = Counter(p.active for t in ("first", "second") for p in harness.image.partitions_of(t))
    assert sorted(load.values()) == [2, 2, 2, 2, 2, 2]
    # Every slot az-a's servers have left after the first table goes to the second.
    room = sum(2 - Counter(p.active for p in before)[n] for n in (1, 2))
    assert room > 0 and actives_in(harness, "second", "az-a") == room


def test_tables_without_writer_racks_are_balanced_over_all_servers() -> None:
    harness = six_brokers()
    for name in ("a", "b", "c"):
        create(harness, name, 4, None)
    load = Counter(p.active for t in ("a", "b", "c") for p in harness.image.partitions_of(t))
    assert sorted(load.values()) == [2, 2, 2, 2, 2, 2]


def test_register_writer_adds_the_rack_once() -> None:
    harness = six_brokers()
    create(harness, "clicks", 4, "az-a")
    first = harness.handle(RegisterWriterRequest("clicks", "az-b"))
    assert first.reply == RegisterWriterResponse(ControllerError.NONE, "", ("az-a", "az-b"))
    assert any(isinstance(r, TableWriters) for b in first.batches for r in b.records)
    again = harness.handle(RegisterWriterRequest("clicks", "az-b"))
    assert again.reply == RegisterWriterResponse(ControllerError.NONE, "", ("az-a", "az-b"))
    assert not any(isinstance(r, TableWriters) for b in again.batches for r in b.records)
    assert harness.image.tables["clicks"].writer_racks == ("az-a", "az-b")


def test_register_writer_errors_name_the_problem() -> None:
    harness = six_brokers()
    create(harness, "clicks", 4, None)
    unknown = harness.handle(RegisterWriterRequest("nope", "az-a")).reply
    assert unknown.error is ControllerError.UNKNOWN_TABLE and "nope" in unknown.message
    for rack in ("", " az-a", "x" * 256, "a\nb"):
        bad = harness.handle(RegisterWriterRequest("clicks", rack)).reply
        assert bad.error is ControllerError.INVALID_REQUEST and "writer rack" in bad.message
    bad_create = harness.handle(CreateTableRequest("other", 4, 1, KEY, None, writer_rack="")).reply
    assert bad_create.error is ControllerError.INVALID_REQUEST and "writer rack" in bad_create.message
    assert "other" not in harness.image.tables


def test_writer_racks_survive_a_snapshot_and_the_record_codec() -> None:
    harness = six_brokers()
    create(harness, "clicks", 4, "az-b")
    harness.handle(RegisterWriterRequest("clicks", "az-a"))
    records = image_records(harness.image)
    decoded = decode_batch(encode_batch(MetadataBatch(tuple(records))))
    builder = ImageBuilder(MetadataImage.empty())
    builder.apply_all(decoded.records, 1)
    assert builder.build(2).tables["clicks"].writer_racks == ("az-a", "az-b")


@dataclass(frozen=True, slots=True)
class _CreateTableV1:
    name: str
    table_id: int
    partitions: int
    standby_replicas: int
    key_columns: tuple[KeyColumn, ...]
    acceptable_lag: int | None


def test_a_create_table_record_of_version_1_still_decodes() -> None:
    # Written before writer_racks existed: [type id, version 1, fields without the last one].
    old = TypeRegistry()
    old.register(20, _CreateTableV1)
    data = old.encode(_CreateTableV1("clicks", 1, 4, 1, (), None))
    record = RECORDS.decode(data)
    assert record == CreateTable("clicks", 1, 4, 1, (), None, ())


def test_a_table_the_assignor_cannot_place_is_a_clear_error_and_nothing_is_written() -> None:
    # The controller takes a server's rack as registered; the assignor refuses an empty one.
    harness = Harness()
    harness.register(1, "")
    reply = harness.handle(CreateTableRequest("clicks", 4, 0, KEY, None)).reply
    assert reply.error is ControllerError.INVALID_REQUEST
    assert "cannot place the table" in reply.message and "rack" in reply.message, reply.message
    assert "clicks" not in harness.image.tables


def test_a_placement_run_through_its_encoded_inputs_is_the_same_as_run_whole() -> None:
    """The worker-process path (inputs -> place_encoded -> partitions in steps -> prepared) gives the same
    partitions and the same record as `run`, and the record means those partitions."""
    harness = six_brokers()
    create(harness, "first", 7, "az-a")
    job = placement_job(harness.image, TableInfo("t", 9, 12, 2, KEY, None, ("az-b",)))
    whole = job.run()
    width, flat = job.decode(place_encoded(job.inputs()))
    parts = job.partitions(width, flat, 0, 5) + job.partitions(width, flat, 5, 12)
    blocks = [job.block(width, flat, 0, 5), job.block(width, flat, 5, 12)]
    stepped = job.prepared(parts, blocks)
    assert stepped.parts == whole.parts
    assert [b.first for b in stepped.records] == [0, 5] and [b.first for b in whole.records] == [0]
    built = tuple(p for block in stepped.records for p in block_partitions(block))
    assert built == stepped.parts
    assert whole.records[0] == partition_block(9, stepped.parts)
    assert stepped.packed == tuple(RECORDS.encode(b) for b in stepped.records)


def test_a_big_table_is_written_as_blocks_of_bounded_size_in_one_batch() -> None:
    harness = six_brokers()
    job = placement_job(harness.image, TableInfo("t", 9, BLOCK_PARTITIONS * 2 + 3, 1, KEY, None, ()))
    placed = job.run()
    assert [len(b.actives) for b in placed.records] == [BLOCK_PARTITIONS, BLOCK_PARTITIONS, 3]
    assert tuple(p for b in placed.records for p in block_partitions(b)) == placed.parts
