"""The metadata publisher's readiness ("caught up" = the image holds this process's registration) and its
metadata watches, driven with real metadata records through the real codec and image builder."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from hotstate.controller.codec import encode_batch
from hotstate.controller.records import (
    CreateTable,
    DeleteTable,
    Endpoint,
    FenceServer,
    KeyColumn,
    KeyType,
    MetadataBatch,
    MetadataRecord,
    NoOp,
    PartitionAssignment,
    PartitionChange,
    RegisterServer,
)
from hotstate.protocol.wire import MESSAGES
from hotstate.raft.records import Entry
from hotstate.replica.messages import (
    PartitionRows,
    ProducePartitionsRequest,
    ProducePartitionsResponse,
    ProduceRequest,
    ProduceResponse,
    QueryPartitionsRequest,
    QueryPartitionsResponse,
    ReplicaError,
    TableMetadataRequest,
)
from hotstate.server.metadata import MetadataPublisher
from hotstate.server.writer_metadata import NOT_READY_REFUSES, answer_table_metadata, not_ready_answer

KEY = (KeyColumn("k", KeyType.STRING),)


class Log:
    """Commits records to a publisher one entry at a time, as the Raft driver does."""

    def __init__(self, publisher: MetadataPublisher) -> None:
        self.publisher = publisher
        self.offsets: Iterator[int] = iter(range(10_000))

    def commit(self, *records: MetadataRecord) -> int:
        offset = next(self.offsets)
        data = encode_batch(MetadataBatch(tuple(records)))
        self.publisher.on_committed([Entry(offset, 1, data)], None)
        return offset


def publisher(incarnation: tuple[int, str] | None = (1, "me")) -> MetadataPublisher:
    return MetadataPublisher(
        snapshot=None,
        snapshot_max_records=10_000,
        snapshot_interval_ms=10**9,
        clock=lambda: 0,
        incarnation=incarnation,
    )


def register(node_id: int, incarnation: str) -> RegisterServer:
    return RegisterServer(
        node_id, incarnation, Endpoint("127.0.0.1", 9000 + node_id), None, None, (), ("broker",)
    )


def create(name: str, table_id: int, partitions: int = 2) -> tuple[MetadataRecord, ...]:
    return (
        CreateTable(name, table_id, partitions, 0, KEY, None),
        *(PartitionAssignment(table_id, p, (1,), 1, (), 0, (1,), 0) for p in range(partitions)),
    )


# ------------------------------------------------------------------------------------------ readiness


def test_not_ready_until_the_image_holds_this_incarnations_registration() -> None:
    pub = publisher((1, "me"))
    log = Log(pub)
    assert pub.not_ready() is not None and "server 1 is starting: metadata not caught up" in str(
        pub.not_ready()
    )
    log.commit(*create("t", 1))
    log.commit(register(1, "my-previous-life"))  # the previous process's registration does not count
    log.commit(register(2, "me"))  # nor another server's
    assert pub.not_ready() is not None and [pub.caught_up] == [False]  # (a list: no narrowing to False)
    log.commit(register(1, "me"))
    assert pub.not_ready() is None and pub.caught_up
    # Sticky: fenced, or registered again by a later incarnation's stale view, it stays caught up.
    log.commit(FenceServer(1, "test"))
    assert pub.not_ready() is None


def test_a_publisher_without_an_incarnation_is_ready_at_once() -> None:
    assert publisher(None).not_ready() is None


def test_a_not_ready_server_refuses_table_metadata_produce_and_partition_queries_as_retriable() -> None:
    pub = publisher((3, "me"))
    Log(pub).commit(*create("t", 1))  # the table is in the image, but the image has not caught up

    async def ask() -> None:
        reply = await answer_table_metadata(pub, TableMetadataRequest("t"), 8 << 20)
        assert reply.error is ReplicaError.NOT_READY and "server 3 is starting" in reply.message
        # Not "no such table" either, for a table the stale image lacks.
        reply = await answer_table_metadata(pub, TableMetadataRequest("later"), 8 << 20)
        assert reply.error is ReplicaError.NOT_READY

    asyncio.run(ask())
    produce = not_ready_answer(ProduceRequest("t", 0, 1, (b"\x80",)), "starting")
    assert isinstance(produce, ProduceResponse)
    assert produce.error is ReplicaError.NOT_READY and produce.message == "starting"
    query = not_ready_answer(QueryPartitionsRequest(()), "starting")
    assert isinstance(query, QueryPartitionsResponse)
    assert query.answers == ()


def test_a_not_ready_server_refuses_every_part_of_a_multi_partition_produce() -> None:
    request = ProducePartitionsRequest(
        "t", (PartitionRows(0, 1, (b"\x80",)), PartitionRows(1, 1, (b"\x80",)))
    )
    assert isinstance(request, NOT_READY_REFUSES)
    answer = not_ready_answer(request, "starting")
    assert isinstance(answer, ProducePartitionsResponse)
    assert [(a.error, a.message) for a in answer.answers] == [(ReplicaError.NOT_READY, "starting")] * 2


# ------------------------------------------------------------------------------------------ watches


async def settle() -> None:
    """Loop turns enough for a watch woken by a commit (commits answer watches at once, synchronously)
    to finish: its future's callbacks, asyncio.wait's, then the task awaiting it. No wall-clock time."""
    for _ in range(10):
        await asyncio.sleep(0)


def ready_publisher() -> tuple[MetadataPublisher, Log]:
    pub = publisher((1, "me"))
    log = Log(pub)
    log.commit(register(1, "me"))
    log.commit(*create("t", 1))
    log.commit(*create("other", 2))
    return pub, log


def test_a_watch_is_answered_by_a_change_of_its_table_and_not_by_other_commits() -> None:
    pub, log = ready_publisher()

    async def scenario() -> None:
        known = pub.image.offset
        watch = asyncio.ensure_future(pub.wait_for_change("t", known, 30.0))
        await asyncio.sleep(0)
        assert pub.watches == 1
        log.commit(NoOp())
        log.commit(register(2, "x"))  # servers change, the table does not
        log.commit(PartitionChange(2, 0, 1, 1, (1,)))  # another table's partition
        await settle()
        assert not watch.done()
        log.commit(PartitionChange(1, 1, None, 1, (1,)))
        assert await asyncio.wait_for(watch, 1.0) is True
        assert pub.watches == 0

    asyncio.run(scenario())


def test_a_watch_behind_the_image_is_answered_at_once_and_one_ahead_waits() -> None:
    pub, log = ready_publisher()
    created_at = pub.image.offset
    log.commit(PartitionChange(1, 0, None, 1, (1,)))
    changed_at = pub.image.offset
    log.commit(NoOp())

    async def scenario() -> None:
        # The writer's metadata predates the change: answered without waiting.
        assert await pub.wait_for_change("t", created_at, 30.0) is True
        # It has seen the change (from this or a server further ahead): nothing new, the wait runs out.
        assert await pub.wait_for_change("t", changed_at, 0.05) is False
        assert await pub.wait_for_change("t", changed_at + 100, 0.05) is False
        assert pub.watches == 0

    asyncio.run(scenario())


def test_a_deleted_or_created_table_answers_its_watch() -> None:
    pub, log = ready_publisher()

    async def scenario() -> None:
        known = pub.image.offset
        deleted = asyncio.ensure_future(pub.wait_for_change("t", known, 30.0))
        created = asyncio.ensure_future(pub.wait_for_change("new", known, 30.0))
        await asyncio.sleep(0)
        log.commit(DeleteTable("t", 1))
        assert await asyncio.wait_for(deleted, 1.0) is True
        assert not created.done()
        log.commit(*create("new", 3))
        assert await asyncio.wait_for(created, 1.0) is True

    asyncio.run(scenario())


def test_a_cancelled_watch_leaves_nothing_parked() -> None:
    pub, _ = ready_publisher()

    async def scenario() -> None:
        watch = asyncio.ensure_future(pub.wait_for_change("t", pub.image.offset, 30.0))
        await asyncio.sleep(0)
        assert pub.watches == 1
        watch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watch
        assert pub.watches == 0

    asyncio.run(scenario())


def test_answer_table_metadata_parks_a_watch_and_answers_with_the_new_metadata() -> None:
    pub, log = ready_publisher()

    async def scenario() -> None:
        first = await answer_table_metadata(pub, TableMetadataRequest("t"), 1234)
        assert first.error is ReplicaError.NONE and first.partitions[0].active == 1
        assert first.produce_max_bytes == 1234 and first.metadata_offset == pub.image.offset
        request = TableMetadataRequest("t", first.metadata_offset, 30_000)
        watch = asyncio.ensure_future(answer_table_metadata(pub, request, 1234))
        await settle()
        assert pub.watches == 1 and not watch.done()
        log.commit(PartitionChange(1, 0, None, 1, (1,)))
        moved = await asyncio.wait_for(watch, 1.0)
        assert moved.partitions[0].active is None and moved.partitions[0].leader_epoch == 1
        assert moved.metadata_offset > first.metadata_offset
        # A watch whose wait runs out is answered with the metadata as it is.
        unchanged = await answer_table_metadata(
            pub, TableMetadataRequest("t", moved.metadata_offset, 20), 1234
        )
        assert unchanged.error is ReplicaError.NONE and unchanged.metadata_offset == moved.metadata_offset

    asyncio.run(scenario())


def test_a_version_1_table_metadata_request_still_decodes_with_the_defaults() -> None:
    # What a writer from before the metadata watch sends: [type id, version 1, [table]].
    decoded = MESSAGES.from_wire([MESSAGES.type_id(TableMetadataRequest), 1, ["t"]])
    assert decoded == TableMetadataRequest("t", -1, 0)
    wire = MESSAGES.to_wire(TableMetadataRequest("t", 7, 500))
    assert wire[1] == 2 and MESSAGES.from_wire(wire) == TableMetadataRequest("t", 7, 500)


def test_a_big_commit_applied_in_steps_gives_the_image_a_whole_apply_gives() -> None:
    """`prepare` decodes a big entry a record at a time (several PartitionBlocks, one batch) and builds
    it in steps on the loop; the image is the one `on_committed` alone would build."""
    from hotstate.controller.image import PartitionInfo, partition_block
    from hotstate.controller.placement import BLOCK_PARTITIONS

    count = BLOCK_PARTITIONS * 2 + 7
    parts = [
        PartitionInfo(1, p, (1 + p % 3, 1 + (p + 1) % 3), 1 + p % 3, (), 0, (1 + p % 3,), 0)
        for p in range(count)
    ]
    blocks = [partition_block(1, parts[i : i + BLOCK_PARTITIONS]) for i in range(0, count, BLOCK_PARTITIONS)]
    batch = MetadataBatch((register(1, "a"), CreateTable("t", 1, count, 1, KEY, None), *blocks))
    big = [Entry(0, 1, encode_batch(batch))]
    whole = publisher(None)
    whole.on_committed(big, None)
    stepped = publisher(None)

    async def run() -> None:
        await stepped.prepare(big, None)
        stepped.on_committed(big, None)

    asyncio.run(run())
    assert stepped.image.partitions_of("t") == tuple(parts)
    assert stepped.image == whole.image
