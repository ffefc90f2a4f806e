"""The quorum controller's decisions, one rule at a time, with the committed image built by replay."""

from __future__ import annotations

from typing import TypeVar

from hotstate.controller.controller import ControllerConfig, Decision, QuorumController
from hotstate.controller.evidence import ProbeResult
from hotstate.controller.image import ImageBuilder, MetadataImage, PartitionInfo
from hotstate.controller.records import (
    Endpoint,
    FenceServer,
    KeyColumn,
    KeyType,
    MetadataBatch,
    NoOp,
    TableWindow,
    UnfenceServer,
)
from hotstate.controller.requests import (
    AlterPartitionResponse,
    ControllerError,
    CreateTableRequest,
    DeleteTableRequest,
    ListTablesRequest,
    ListTablesResponse,
    RegisterServerRequest,
    ServerHeartbeatRequest,
    ServerHeartbeatResponse,
)

SESSION = 2000
R = TypeVar("R")


class Harness:
    """Commits every proposed batch at once and replays it into the committed image."""

    def __init__(self) -> None:
        self.now = 0
        self.next_offset = 1
        self.image = MetadataImage.empty()
        self.controller = QuorumController(self.image, ControllerConfig(SESSION), now=0, next_offset=1)

    def commit(self, decision_or_batches: Decision | list[MetadataBatch]) -> None:
        batches = (
            decision_or_batches.batches if isinstance(decision_or_batches, Decision) else decision_or_batches
        )
        builder = ImageBuilder(self.image)
        for batch in batches:
            builder.apply_all(batch.records, self.next_offset)
            self.next_offset += 1
        self.image = builder.build(self.next_offset)

    def handle(self, request: object) -> Decision:
        decision = self.controller.handle(request, self.now, self.next_offset)  # type: ignore[arg-type]
        self.commit(decision)
        return decision

    def register(self, node_id: int, rack: str, incarnation: str = "a") -> None:
        self.handle(
            RegisterServerRequest(
                node_id,
                f"{incarnation}{node_id}",
                Endpoint("127.0.0.1", 9000 + node_id),
                None,
                rack,
                (),
                ("broker",),
            )
        )
        self.heartbeat(node_id, incarnation=incarnation)

    def heartbeat(
        self, node_id: int, *, incarnation: str = "a", shutdown: bool = False, offset: int | None = None
    ) -> ServerHeartbeatResponse:
        request = ServerHeartbeatRequest(
            node_id, f"{incarnation}{node_id}", self.next_offset if offset is None else offset, shutdown
        )
        return self.reply(request, ServerHeartbeatResponse)

    def reply(self, request: object, kind: type[R]) -> R:
        """The reply to `request`, which must be a `kind`."""
        reply = self.handle(request).reply
        assert isinstance(reply, kind), reply
        return reply


def active(part: PartitionInfo) -> int:
    assert part.active is not None, part
    return part.active


def three_brokers() -> Harness:
    harness = Harness()
    for node_id, rack in ((1, "az-a"), (2, "az-b"), (3, "az-c")):
        harness.register(node_id, rack)
    return harness


def create(harness: Harness, name: str = "clicks", partitions: int = 6, standbys: int = 1) -> Decision:
    return harness.handle(
        CreateTableRequest(
            name, partitions, standbys, (KeyColumn("user", KeyType.STRING),), acceptable_lag=None
        )
    )


def test_a_registered_server_is_fenced_until_its_heartbeat_shows_it_caught_up() -> None:
    harness = Harness()
    harness.handle(RegisterServerRequest(1, "a1", Endpoint("h", 1), None, "az-a", (), ("broker",)))
    assert harness.image.servers[1].fenced
    registered_at = harness.image.servers[1].changed_at
    reply = harness.heartbeat(1, offset=registered_at)  # not past its own registration yet
    assert reply.fenced and harness.image.servers[1].fenced
    reply = harness.heartbeat(1, offset=registered_at + 1)
    assert not reply.fenced and not harness.image.servers[1].fenced


def test_create_table_places_balanced_actives_and_rack_spread_standbys() -> None:
    harness = three_brokers()
    decision = create(harness, partitions=6, standbys=1)
    assert decision.reply.error is ControllerError.NONE
    parts = harness.image.partitions_of("clicks")
    assert len(parts) == 6
    actives = [p.active for p in parts]
    assert sorted(actives.count(n) for n in (1, 2, 3)) == [2, 2, 2]
    racks = {1: "az-a", 2: "az-b", 3: "az-c"}
    for part in parts:
        assert len(part.standbys) == 1 and part.active not in part.standbys
        assert racks[part.standbys[0]] != racks[active(part)]
        assert set(part.isr) == {active(part), *part.standbys}


def test_create_existing_table_answers_exists_after_a_commit() -> None:
    harness = three_brokers()
    create(harness)
    decision = create(harness)
    assert decision.reply.error is ControllerError.TABLE_EXISTS
    assert decision.wait and decision.batches[0].records == (NoOp(),)


def test_invalid_tables_are_refused_with_the_field_named() -> None:
    harness = three_brokers()
    for request, fragment in [
        (CreateTableRequest("bad name", 1, 0, (KeyColumn("k", KeyType.INT),), None), "table name 'bad name'"),
        (CreateTableRequest("t", 0, 0, (KeyColumn("k", KeyType.INT),), None), "partitions=0"),
        (CreateTableRequest("t", 1, 11, (KeyColumn("k", KeyType.INT),), None), "standby_replicas=11"),
        (CreateTableRequest("t", 1, 0, (), None), "key_columns"),
        (CreateTableRequest("t", 1, 0, (KeyColumn("k", KeyType.INT),) * 2, None), "distinct"),
        (CreateTableRequest("t", 1, 0, (KeyColumn("k", KeyType.INT),), -1), "acceptable_lag=-1"),
    ]:
        reply = harness.handle(request).reply
        assert reply.error is ControllerError.INVALID_REQUEST and fragment in reply.message
    assert "t" not in harness.image.tables


def test_no_live_brokers_is_a_clear_error() -> None:
    harness = Harness()
    assert create(harness).reply.error is ControllerError.NO_LIVE_BROKERS


def test_delete_and_list_tables() -> None:
    harness = three_brokers()
    create(harness, "a")
    create(harness, "b")
    assert harness.reply(ListTablesRequest(), ListTablesResponse).tables == ("a", "b")
    assert harness.handle(DeleteTableRequest("a")).reply.error is ControllerError.NONE
    assert harness.handle(DeleteTableRequest("a")).reply.error is ControllerError.UNKNOWN_TABLE
    assert harness.reply(ListTablesRequest(), ListTablesResponse).tables == ("b",)
    assert harness.image.partitions_of("a") == ()


def test_expired_session_fences_the_server_and_moves_its_actives() -> None:
    harness = three_brokers()
    create(harness, partitions=6, standbys=1)
    harness.now = SESSION // 2
    harness.heartbeat(1)
    harness.heartbeat(2)
    harness.now = SESSION + 100  # 3 last heartbeat at 0
    harness.commit(harness.controller.tick(harness.now, harness.next_offset))
    assert harness.image.servers[3].fenced and not harness.image.servers[1].fenced
    for part in harness.image.partitions_of("clicks"):
        assert part.active != 3 and part.active is not None
        assert 3 not in part.isr
    moved = [p for p in harness.image.partitions_of("clicks") if p.leader_epoch == 1]
    assert len(moved) == 2  # the two actives 3 held, each with a bumped leader epoch


def test_a_stalled_controller_does_not_count_its_stall_against_sessions() -> None:
    """Ticks far apart: the controller's process was stalled, and the heartbeats of that time are unread."""
    harness = three_brokers()
    grace = SESSION // 4
    controller = QuorumController(
        harness.image,
        ControllerConfig(SESSION, stall_grace_ms=grace),
        now=0,
        next_offset=harness.next_offset,
    )
    step = grace // 2
    for now in range(step, SESSION // 2 + 1, step):  # ticking, every server heard at SESSION // 2
        assert controller.tick(now, harness.next_offset) == []
    for node_id in (1, 2, 3):
        request = ServerHeartbeatRequest(node_id, f"a{node_id}", harness.next_offset, False)
        controller.handle(request, SESSION // 2, harness.next_offset)
    stalled_until = SESSION // 2 + SESSION + 1  # past every session, with no tick on the way
    assert controller.tick(stalled_until, harness.next_offset) == []
    # Ticking again, the sessions run: server 1 alone heartbeats, 2 and 3 are fenced a session later.
    now = stalled_until
    heard = ServerHeartbeatRequest(1, "a1", harness.next_offset, False)
    while now + step <= stalled_until + SESSION:
        now += step
        controller.handle(heard, now, harness.next_offset)
        assert controller.tick(now, harness.next_offset) == [], now
    last_heard = now
    now += step
    fences = [b.records[0] for b in controller.tick(now, harness.next_offset)]
    assert [(f.node_id, f.reason) for f in fences if isinstance(f, FenceServer)] == [
        (2, "session expired"),
        (3, "session expired"),
    ]
    # Gaps of the grace count in full: server 1 is fenced the first tick past a session since it was heard.
    while not controller.tick(now + grace, harness.next_offset):
        now += grace
    assert now <= last_heard + SESSION < now + grace


def test_a_new_controller_gives_every_server_a_fresh_session() -> None:
    harness = three_brokers()
    later = 10 * SESSION
    controller = QuorumController(
        harness.image, ControllerConfig(SESSION), now=later, next_offset=harness.next_offset
    )
    assert controller.tick(later + SESSION - 1, harness.next_offset) == []
    assert len(controller.tick(later + SESSION + 1, harness.next_offset)) == 3


def test_fenced_server_is_unfenced_after_catching_up_and_offline_partitions_return() -> None:
    harness = three_brokers()
    create(harness, partitions=3, standbys=0)
    harness.now = SESSION + 1
    harness.heartbeat(1)
    harness.heartbeat(2)
    harness.commit(harness.controller.tick(harness.now, harness.next_offset))
    offline = [p for p in harness.image.partitions_of("clicks") if p.active is None]
    assert len(offline) == 1  # no standby could take over 3's partition
    fenced_at = harness.image.servers[3].changed_at
    assert harness.heartbeat(3, offset=fenced_at).fenced  # still behind its own fencing
    assert not harness.heartbeat(3, offset=fenced_at + 1).fenced
    assert all(p.active is not None for p in harness.image.partitions_of("clicks"))


def test_controlled_shutdown_moves_every_active_in_one_batch() -> None:
    harness = three_brokers()
    create(harness, partitions=6, standbys=1)
    decision = harness.controller.handle(
        ServerHeartbeatRequest(2, "a2", harness.next_offset, True), 0, harness.next_offset
    )
    assert isinstance(decision.reply, ServerHeartbeatResponse)
    assert decision.reply.shutdown_ready and len(decision.batches) == 1
    records = decision.batches[0].records
    assert isinstance(records[0], FenceServer) and records[0].reason == "controlled shutdown"
    harness.commit(decision)
    assert all(p.active != 2 for p in harness.image.partitions_of("clicks"))
    again = harness.controller.handle(
        ServerHeartbeatRequest(2, "a2", harness.next_offset, True), 0, harness.next_offset
    )
    assert isinstance(again.reply, ServerHeartbeatResponse)
    assert again.reply.shutdown_ready and again.batches == () and again.wait


def test_heartbeat_from_a_previous_incarnation_is_told_to_register_again() -> None:
    harness = three_brokers()
    harness.register(1, "az-a", incarnation="b")  # restarted
    reply = harness.heartbeat(1, incarnation="a")
    assert reply.error is ControllerError.STALE_INCARNATION


def test_re_registration_of_a_live_server_fences_it_first() -> None:
    harness = three_brokers()
    create(harness, partitions=3, standbys=1)
    decision = harness.handle(RegisterServerRequest(1, "b1", Endpoint("h", 1), None, "az-a", (), ("broker",)))
    kinds = [type(r).__name__ for r in decision.batches[0].records]
    assert kinds[0] == "FenceServer" and kinds[-1] == "RegisterServer"
    assert all(p.active != 1 for p in harness.image.partitions_of("clicks"))
    assert not any(isinstance(r, UnfenceServer) for r in decision.batches[0].records)


def _alter(
    harness: Harness, part: PartitionInfo, node: int, isr: tuple[int, ...], **changes: int
) -> AlterPartitionResponse:
    from hotstate.controller.requests import AlterPartitionRequest

    fields = {"leader_epoch": part.leader_epoch, "partition_epoch": part.partition_epoch, **changes}
    return harness.reply(
        AlterPartitionRequest(
            node, part.table_id, part.partition, fields["leader_epoch"], fields["partition_epoch"], isr
        ),
        AlterPartitionResponse,
    )


def test_alter_partition_changes_the_isr_and_bumps_the_partition_epoch() -> None:
    harness = three_brokers()
    create(harness, partitions=1, standbys=2)
    part = harness.image.partitions_of("clicks")[0]
    shrunk = tuple(r for r in part.isr if r != part.standbys[0])
    assert _alter(harness, part, active(part), shrunk).error is ControllerError.NONE
    now = harness.image.partitions_of("clicks")[0]
    assert now.isr == shrunk and now.leader_epoch == part.leader_epoch
    assert now.partition_epoch == part.partition_epoch + 1


def test_alter_partition_based_on_an_older_state_is_refused_as_stale() -> None:
    harness = three_brokers()
    create(harness, partitions=1, standbys=2)
    part = harness.image.partitions_of("clicks")[0]
    shrunk = (active(part), part.standbys[0])
    assert _alter(harness, part, active(part), shrunk).error is ControllerError.NONE
    # The same request again (a retry whose first copy applied): its partition epoch is old now.
    again = _alter(harness, part, active(part), part.isr)
    assert again.error is ControllerError.STALE_PARTITION_STATE
    assert harness.image.partitions_of("clicks")[0].isr == shrunk
    # Only the active may ask, and only in its leader epoch.
    now = harness.image.partitions_of("clicks")[0]
    assert _alter(harness, now, now.standbys[0], now.isr).error is ControllerError.STALE_PARTITION_STATE
    stale_epoch = _alter(harness, now, active(now), now.isr, leader_epoch=now.leader_epoch + 1)
    assert stale_epoch.error is ControllerError.STALE_PARTITION_STATE


def test_alter_partition_never_adds_a_fenced_server_or_drops_the_active() -> None:
    harness = three_brokers()
    create(harness, partitions=1, standbys=2)
    part = harness.image.partitions_of("clicks")[0]
    follower = part.standbys[0]
    assert _alter(harness, part, active(part), (active(part), part.standbys[1])).error is ControllerError.NONE
    harness.commit([harness.controller._propose((FenceServer(follower, "test"),))])
    part = harness.image.partitions_of("clicks")[0]
    refused = _alter(harness, part, active(part), (*part.isr, follower))
    assert refused.error is ControllerError.INVALID_REQUEST and "fenced" in refused.message
    refused = _alter(harness, part, active(part), (part.standbys[1],))
    assert refused.error is ControllerError.INVALID_REQUEST and "active" in refused.message
    refused = _alter(harness, part, active(part), (active(part), 99))
    assert refused.error is ControllerError.INVALID_REQUEST


def test_a_fenced_active_is_replaced_by_the_most_caught_up_in_sync_replica() -> None:
    harness = three_brokers()
    create(harness, partitions=1, standbys=2)
    part = harness.image.partitions_of("clicks")[0]
    first, second = part.standbys
    harness.handle(ServerHeartbeatRequest(first, f"a{first}", harness.next_offset, False, ((1, 0, 50),)))
    harness.handle(ServerHeartbeatRequest(second, f"a{second}", harness.next_offset, False, ((1, 0, 70),)))
    harness.commit([harness.controller._propose(harness.controller._fence_records(active(part), "test"))])
    now = harness.image.partitions_of("clicks")[0]
    assert now.active == second and now.leader_epoch == part.leader_epoch + 1
    assert now.replicas == part.replicas  # the replica set stays; only the roles move


def _probe(harness: Harness, node_id: int, result: ProbeResult, incarnation: str = "a") -> bool:
    batch = harness.controller.on_probe(node_id, f"{incarnation}{node_id}", result, harness.next_offset)
    if batch is not None:
        harness.commit([batch])
    return batch is not None


def test_a_refused_probe_fences_at_once_and_moves_the_actives_as_a_session_expiry_would() -> None:
    harness = three_brokers()
    create(harness, partitions=6, standbys=1)
    held = [p.partition for p in harness.image.partitions_of("clicks") if p.active == 3]
    assert _probe(harness, 3, ProbeResult.REFUSED)  # no time has passed: the session is still fresh
    assert harness.image.servers[3].fenced
    for part in harness.image.partitions_of("clicks"):
        assert part.active not in (3, None) and 3 not in part.isr
        assert part.leader_epoch == (1 if part.partition in held else 0)
    # Fenced once: a second refusal changes nothing.
    assert not _probe(harness, 3, ProbeResult.REFUSED)


def test_silence_or_an_answer_never_fences() -> None:
    harness = three_brokers()
    create(harness)
    for result in (ProbeResult.SILENT, ProbeResult.ANSWERED):
        assert not _probe(harness, 2, result)
    assert not harness.image.servers[2].fenced


def test_a_refusal_seen_before_the_server_registered_again_does_not_fence_the_new_process() -> None:
    harness = three_brokers()
    create(harness)
    harness.register(2, "az-b", incarnation="b")  # restarted: registering fenced the old process
    harness.heartbeat(2, incarnation="b")
    assert not harness.image.servers[2].fenced
    assert not _probe(harness, 2, ProbeResult.REFUSED, incarnation="a")
    assert not harness.image.servers[2].fenced
    assert not _probe(harness, 9, ProbeResult.REFUSED)  # never registered


def test_a_live_server_fenced_by_a_wrong_probe_is_unfenced_by_its_next_heartbeat() -> None:
    harness = three_brokers()
    create(harness)
    assert _probe(harness, 1, ProbeResult.REFUSED)
    reply = harness.heartbeat(1)
    assert not reply.fenced and not harness.image.servers[1].fenced


def test_committed_batches_merge_positions_and_survive_a_snapshot() -> None:
    from hotstate.controller.requests import CommitBatchRequest, CommitBatchResponse
    from hotstate.controller.snapshot import decode_snapshot, encode_snapshot

    harness = three_brokers()
    create(harness, partitions=3)
    table = harness.image.tables["clicks"]
    assert table.batch_id == -1
    reply = harness.handle(CommitBatchRequest("clicks", table.table_id, 0, ((0, 10), (2, 4)))).reply
    assert reply == CommitBatchResponse(ControllerError.NONE, "")
    # Batch 1 wrote partition 1 only: the others keep where batch 0 left them; positions never go back.
    harness.handle(CommitBatchRequest("clicks", table.table_id, 1, ((1, 7), (2, 3))))
    table = harness.image.tables["clicks"]
    assert (table.batch_id, table.batch_positions) == (1, (10, 7, 4))
    # A batch that wrote nothing knows no table id.
    harness.handle(CommitBatchRequest("clicks", -1, 2, ()))
    assert harness.image.tables["clicks"].batch_id == 2
    restored = decode_snapshot(encode_snapshot(harness.image))
    assert restored.tables["clicks"] == harness.image.tables["clicks"]
    for bad, error in (
        (CommitBatchRequest("nope", 1, 0, ()), ControllerError.UNKNOWN_TABLE),
        (CommitBatchRequest("clicks", table.table_id + 1, 0, ()), ControllerError.UNKNOWN_TABLE),
        (CommitBatchRequest("clicks", table.table_id, -1, ()), ControllerError.INVALID_REQUEST),
        (CommitBatchRequest("clicks", table.table_id, 3, ((3, 1),)), ControllerError.INVALID_REQUEST),
        (CommitBatchRequest("clicks", table.table_id, 3, ((0, -1),)), ControllerError.INVALID_REQUEST),
    ):
        assert harness.handle(bad).reply.error is error, bad
    assert harness.image.tables["clicks"].batch_id == 2


def test_value_columns_are_the_latest_writers_and_survive_a_snapshot() -> None:
    from hotstate.controller.records import ValueColumn
    from hotstate.controller.requests import SetValueColumnsRequest, SetValueColumnsResponse
    from hotstate.controller.snapshot import decode_snapshot, encode_snapshot

    harness = three_brokers()
    create(harness, partitions=2)

    def columns() -> tuple[ValueColumn, ...]:  # read anew each time (the image is replaced per commit)
        return harness.image.tables["clicks"].value_columns

    assert not columns()
    first = (ValueColumn("clicks", "bigint"), ValueColumn("seen", "timestamp"))
    assert harness.handle(SetValueColumnsRequest("clicks", first)).reply == SetValueColumnsResponse(
        ControllerError.NONE, ""
    )
    assert columns() == first
    # The same again writes nothing; a grown schema replaces it.
    assert harness.handle(SetValueColumnsRequest("clicks", first)).batches[0].records == (NoOp(),)
    grown = (*first, ValueColumn("tags", "array<string>"))
    harness.handle(SetValueColumnsRequest("clicks", grown))
    assert columns() == grown
    restored = decode_snapshot(encode_snapshot(harness.image))
    assert restored.tables["clicks"].value_columns == grown
    for bad, error, fragment in (
        (SetValueColumnsRequest("nope", first), ControllerError.UNKNOWN_TABLE, "no table 'nope'"),
        (SetValueColumnsRequest("clicks", first * 2), ControllerError.INVALID_REQUEST, "distinct"),
        (
            SetValueColumnsRequest("clicks", (ValueColumn("user", "string"),)),
            ControllerError.INVALID_REQUEST,
            "key columns are not value columns",
        ),
        (
            SetValueColumnsRequest("clicks", (ValueColumn("x", ""),)),
            ControllerError.INVALID_REQUEST,
            "needs a name and a type",
        ),
    ):
        reply = harness.handle(bad).reply
        assert reply.error is error and fragment in reply.message, reply
    assert harness.image.tables["clicks"].value_columns == grown


WINDOW_KEY = (
    KeyColumn("user", KeyType.STRING),
    KeyColumn("WINDOWSTART", KeyType.WINDOW_START),
    KeyColumn("WINDOWEND", KeyType.WINDOW_END),
)


def test_a_windowed_table_keeps_its_window_through_the_log_and_a_snapshot() -> None:
    from hotstate.controller.codec import decode_batch, encode_batch
    from hotstate.controller.snapshot import decode_snapshot, encode_snapshot

    harness = three_brokers()
    window = TableWindow("window", "HOPPING", 600_000_000, 300_000_000)
    decision = harness.handle(CreateTableRequest("w", 2, 0, WINDOW_KEY, None, window=window))
    assert decision.reply.error is ControllerError.NONE
    assert harness.image.tables["w"].window == window
    [batch] = decision.batches
    assert decode_batch(encode_batch(batch)) == batch
    assert decode_snapshot(encode_snapshot(harness.image)).tables["w"].window == window


def test_window_bounds_and_windows_that_do_not_fit_are_refused() -> None:
    harness = three_brokers()
    tumbling = TableWindow("window", "TUMBLING", 60_000_000, 60_000_000)
    user = KeyColumn("user", KeyType.STRING)
    for request, fragment in [
        (CreateTableRequest("t", 1, 0, WINDOW_KEY, None), "a window bound in a table without a window"),
        (CreateTableRequest("t", 1, 0, (user,), None, window=tumbling), "ends in one WINDOW_START"),
        (CreateTableRequest("t", 1, 0, WINDOW_KEY[::-1], None, window=tumbling), "ends in one WINDOW_START"),
        (
            CreateTableRequest("t", 1, 0, WINDOW_KEY, None, window=TableWindow("window", "WEEKLY")),
            "window kind 'WEEKLY'",
        ),
        (
            CreateTableRequest("t", 1, 0, WINDOW_KEY, None, window=TableWindow("window", "TUMBLING", 0, 0)),
            "window size 0 us",
        ),
    ]:
        reply = harness.handle(request).reply
        assert reply.error is ControllerError.INVALID_REQUEST and fragment in reply.message, reply.message
    assert "t" not in harness.image.tables


TTL_KEY = (KeyColumn("user", KeyType.STRING), KeyColumn("seen", KeyType.TIMESTAMP))


def test_a_tables_ttl_goes_through_the_log_and_a_snapshot_and_old_records_still_decode() -> None:
    import msgpack

    from hotstate.controller.codec import RECORDS, decode_batch, encode_batch
    from hotstate.controller.records import CreateTable, TableTtl
    from hotstate.controller.snapshot import decode_snapshot, encode_snapshot

    harness = three_brokers()
    ttl = TableTtl(3_600_000_000, "seen")
    decision = harness.handle(CreateTableRequest("t", 2, 0, TTL_KEY, None, ttl=ttl))
    assert decision.reply.error is ControllerError.NONE
    assert harness.image.tables["t"].ttl == ttl
    [batch] = decision.batches
    assert decode_batch(encode_batch(batch)) == batch
    assert decode_snapshot(encode_snapshot(harness.image)).tables["t"].ttl == ttl
    # A version 4 record (written before TTLs): no ttl field, decodes as a table without one.
    record = CreateTable("old", 9, 1, 0, TTL_KEY, None)
    type_id, version, fields = msgpack.unpackb(RECORDS.encode(record))
    assert version == 5
    old = RECORDS.decode(msgpack.packb([type_id, 4, fields[:-1]]))
    assert old == record and isinstance(old, CreateTable) and old.ttl is None


def test_ttls_that_do_not_fit_the_table_are_refused() -> None:
    from hotstate.controller.records import TableTtl, ValueColumn
    from hotstate.controller.requests import SetValueColumnsRequest

    harness = three_brokers()
    tumbling = TableWindow("window", "TUMBLING", 60_000_000, 60_000_000, 60_000_000)
    for request, fragment in [
        (CreateTableRequest("t", 1, 0, WINDOW_KEY, None, window=tumbling, ttl=TableTtl(1)), "retention"),
        (CreateTableRequest("t", 1, 0, TTL_KEY, None, ttl=TableTtl(1, "user")), "not a TIMESTAMP"),
        (CreateTableRequest("t", 1, 0, TTL_KEY, None, ttl=TableTtl(-5)), "must be positive"),
    ]:
        reply = harness.handle(request).reply
        assert reply.error is ControllerError.INVALID_REQUEST and fragment in reply.message, reply.message
    assert "t" not in harness.image.tables
    # A value column as the ttl column: its writer's declaration is checked against it.
    created = harness.handle(CreateTableRequest("t", 1, 0, TTL_KEY, None, ttl=TableTtl(1, "at"))).reply
    assert created.error is ControllerError.NONE
    for columns, fragment in [
        ((ValueColumn("at", "string"),), "not a timestamp"),
        ((ValueColumn("x", "timestamp"),), "no such column"),
    ]:
        reply = harness.handle(SetValueColumnsRequest("t", columns)).reply
        assert reply.error is ControllerError.INVALID_REQUEST and fragment in reply.message, reply.message
    ok = harness.handle(SetValueColumnsRequest("t", (ValueColumn("at", "timestamp"),))).reply
    assert ok.error is ControllerError.NONE
