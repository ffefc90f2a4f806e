"""Table generations (an atomic overwrite), at the controller: a new generation is staged beside the
table, hidden from listings, and one ReplaceTable record swaps it in; every image in between has the old
generation under the name, every image after it the new one, never both or a mix. Pure: records in,
images out."""

from __future__ import annotations

from dataclasses import replace

from controller.test_controller import SESSION, Harness, create, three_brokers
from hotstate.controller.codec import decode_batch, encode_batch
from hotstate.controller.controller import ControllerConfig, QuorumController
from hotstate.controller.image import ImageBuilder, MetadataImage, image_records
from hotstate.controller.records import (
    DeleteTable,
    KeyColumn,
    KeyType,
    MetadataBatch,
    ReplaceTable,
    staging_name,
)
from hotstate.controller.requests import (
    ControllerError,
    DeleteTableRequest,
    ListTablesRequest,
    ListTablesResponse,
    ReplaceTableRequest,
    ReplaceTableResponse,
    StageTableRequest,
    StageTableResponse,
)

USER = (KeyColumn("user", KeyType.STRING),)


def stage(
    harness: Harness, name: str = "clicks", key: tuple[KeyColumn, ...] = USER, partitions: int = 6
) -> StageTableResponse:
    return harness.reply(StageTableRequest(name, partitions, 1, key, None), StageTableResponse)


def swap(harness: Harness, name: str, table_id: int) -> ReplaceTableResponse:
    return harness.reply(ReplaceTableRequest(name, table_id), ReplaceTableResponse)


def test_a_staged_generation_is_hidden_until_one_record_swaps_it_in() -> None:
    harness = three_brokers()
    create(harness)
    old = harness.image.tables["clicks"]
    staged = stage(harness, partitions=4)
    assert staged.error is ControllerError.NONE, staged.message
    assert staged.replaced_id == old.table_id
    assert staged.staging_name == staging_name("clicks", staged.table_id)
    # Loading: the table still serves the old generation; the new one has replicas of its own, unlisted.
    assert harness.image.tables["clicks"] == old
    assert harness.image.tables[staged.staging_name].staging_for == "clicks"
    assert len(harness.image.partitions[staged.table_id]) == 4
    assert harness.reply(ListTablesRequest(), ListTablesResponse).tables == ("clicks",)

    # Where the load ended (its tasks' tokens merged): the least position a replica serves it from.
    decision = harness.handle(ReplaceTableRequest("clicks", staged.table_id, ((0, 5), (2, 7), (0, 9))))
    assert decision.reply.error is ControllerError.NONE
    [batch] = decision.batches
    assert batch.records == (ReplaceTable("clicks", staged.table_id, old.table_id, (9, 0, 7, 0)),)
    table = harness.image.tables["clicks"]
    assert (table.table_id, table.partitions, table.staging_for) == (staged.table_id, 4, "")
    assert table.loaded_positions == (9, 0, 7, 0)
    assert staged.staging_name not in harness.image.tables
    assert old.table_id not in harness.image.partitions  # the old generation's replicas are dropped
    assert len(harness.image.partitions_of("clicks")) == 4
    # A repeat (the answer was lost) changes nothing and says done.
    assert swap(harness, "clicks", staged.table_id).error is ControllerError.NONE
    assert harness.image.tables["clicks"] == table


def test_a_swap_naming_positions_outside_the_generation_is_refused() -> None:
    harness = three_brokers()
    create(harness)
    staged = stage(harness, partitions=2)
    for positions in (((2, 1),), ((0, -1),)):
        refused = harness.reply(
            ReplaceTableRequest("clicks", staged.table_id, positions), ReplaceTableResponse
        )
        assert refused.error is ControllerError.INVALID_REQUEST and "partitions 0..1" in refused.message
    assert harness.image.tables[staged.staging_name].staged


def test_an_overwrite_of_a_missing_table_creates_it_at_the_swap() -> None:
    harness = three_brokers()
    staged = stage(harness)
    assert staged.replaced_id == -1
    assert "clicks" not in harness.image.tables
    assert harness.reply(ListTablesRequest(), ListTablesResponse).tables == ()
    assert swap(harness, "clicks", staged.table_id).error is ControllerError.NONE
    assert harness.image.tables["clicks"].table_id == staged.table_id


def test_an_overwrite_with_other_key_columns_is_refused_before_anything_is_staged() -> None:
    harness = three_brokers()
    create(harness)
    before = harness.image
    refused = stage(harness, key=(KeyColumn("user", KeyType.INT),))
    assert refused.error is ControllerError.INVALID_REQUEST
    assert "key (user STRING)" in refused.message and "(user INT)" in refused.message
    assert harness.image.tables == before.tables and harness.image.partitions == before.partitions


def test_a_later_overwrite_supersedes_an_earlier_one_whose_swap_then_fails() -> None:
    harness = three_brokers()
    create(harness)
    old_id = harness.image.tables["clicks"].table_id
    first = stage(harness)
    second = stage(harness)
    assert first.staging_name not in harness.image.tables  # dropped with its replicas
    assert first.table_id not in harness.image.partitions
    late = swap(harness, "clicks", first.table_id)
    assert late.error is ControllerError.UNKNOWN_TABLE and "unchanged" in late.message
    assert harness.image.tables["clicks"].table_id == old_id
    assert swap(harness, "clicks", second.table_id).error is ControllerError.NONE


def test_a_failed_load_is_dropped_and_the_old_generation_keeps_serving() -> None:
    harness = three_brokers()
    create(harness)
    old = harness.image.tables["clicks"]
    staged = stage(harness)
    # What a failed Spark job's driver does: drop its generation.
    assert harness.handle(DeleteTableRequest(staged.staging_name)).reply.error is ControllerError.NONE
    assert harness.image.tables == {"clicks": old}
    assert staged.table_id not in harness.image.partitions
    assert swap(harness, "clicks", staged.table_id).error is ControllerError.UNKNOWN_TABLE


def test_deleting_the_table_drops_its_staged_generation() -> None:
    harness = three_brokers()
    create(harness)
    staged = stage(harness)
    assert harness.handle(DeleteTableRequest("clicks")).reply.error is ControllerError.NONE
    assert dict(harness.image.tables) == {}
    assert staged.table_id not in harness.image.partitions


def test_a_generation_whose_writer_died_is_dropped_after_the_staged_timeout() -> None:
    harness = three_brokers()
    harness.controller.config = replace(harness.controller.config, staged_timeout_ms=10 * SESSION)
    create(harness)
    old = harness.image.tables["clicks"]
    staged = stage(harness)

    def tick() -> None:
        for node_id in (1, 2, 3):
            harness.heartbeat(node_id)
        harness.commit(harness.controller.tick(harness.now, harness.next_offset, reassign=False))

    tick()  # the controller starts the generation's clock
    harness.now += 10 * SESSION
    tick()
    assert staged.staging_name in harness.image.tables  # not past the timeout yet
    harness.now += 1
    tick()
    assert harness.image.tables == {"clicks": old}
    assert staged.table_id not in harness.image.partitions


def test_the_swap_record_applies_only_to_the_generations_it_names() -> None:
    """A ReplaceTable replayed against another state (the generation dropped, or the table replaced since)
    changes nothing: the name never points at a generation that was not loaded for it."""
    harness = three_brokers()
    create(harness)
    staged = stage(harness)
    image = harness.image
    old_id = image.tables["clicks"].table_id
    for record in (
        ReplaceTable("clicks", staged.table_id, old_id + 100),  # not the current generation
        ReplaceTable("clicks", old_id, old_id),  # not a staged generation
        ReplaceTable("other", staged.table_id, -1),  # staged for another table
    ):
        builder = ImageBuilder(image)
        builder.apply(record, image.offset)
        after = builder.build(image.offset + 1)
        assert after.tables == image.tables and after.partitions == image.partitions


def test_generations_survive_the_record_codec_and_snapshots() -> None:
    harness = three_brokers()
    create(harness)
    swapped = stage(harness)
    swap_with = ReplaceTableRequest("clicks", swapped.table_id, ((1, 3),))
    assert harness.reply(swap_with, ReplaceTableResponse).error is ControllerError.NONE
    stage(harness)
    batch = MetadataBatch(tuple(image_records(harness.image)))
    assert decode_batch(encode_batch(batch)) == batch
    builder = ImageBuilder(MetadataImage.empty())
    builder.apply_all(batch.records, 0)
    rebuilt = builder.build(harness.image.offset)
    assert rebuilt.tables["clicks"].loaded_positions == (0, 3, 0, 0, 0, 0)
    assert rebuilt.tables == harness.image.tables
    assert rebuilt.partitions == harness.image.partitions
    record = ReplaceTable("clicks", 7, 3)
    decoded = decode_batch(encode_batch(MetadataBatch((record, DeleteTable("clicks#7", 7)))))
    assert decoded.records[0] == record


def test_a_new_controller_restarts_the_clock_of_a_staged_generation() -> None:
    """The timeout counts from when this controller first saw the generation: a failover never drops a
    load that is still running because an earlier leader staged it long ago."""
    harness = three_brokers()
    create(harness)
    staged = stage(harness)
    later = 100 * SESSION
    controller = QuorumController(
        harness.image,
        ControllerConfig(SESSION, staged_timeout_ms=10 * SESSION),
        now=later,
        next_offset=harness.next_offset,
    )
    assert controller.tick(later, harness.next_offset, reassign=False) == []
    assert staged.staging_name in controller.view.tables
