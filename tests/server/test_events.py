"""Console events read off metadata images (console/events.py): what a change is told as, and the ring."""

from __future__ import annotations

import pytest

from hotstate.controller.image import ImageBuilder, MetadataImage
from hotstate.controller.records import (
    CreateTable,
    DeleteTable,
    DrainServer,
    Endpoint,
    FenceServer,
    KeyColumn,
    KeyType,
    MetadataRecord,
    NoOp,
    PartitionAssignment,
    PartitionChange,
    RegisterServer,
    ReplaceTable,
    UnfenceServer,
    UnregisterServer,
)
from hotstate.server.console.events import (
    EVENT_KINDS,
    EventDraft,
    EventLog,
    image_events,
    leader_events,
    liveness_events,
)


def register(node_id: int, incarnation: str = "a") -> RegisterServer:
    return RegisterServer(
        node_id,
        f"{incarnation}{node_id}",
        Endpoint("127.0.0.1", 9000 + node_id),
        None,
        f"r{node_id}",
        (),
        ("broker",),
    )


def assignment(
    partition: int, replicas: tuple[int, ...], active: int | None, **kw: object
) -> PartitionAssignment:
    fields: dict[object, object] = {"warmups": (), "leader_epoch": 0, "isr": replicas, "partition_epoch": 0}
    fields.update(kw)
    return PartitionAssignment(1, partition, replicas, active, **fields)  # type: ignore[arg-type]


def apply(image: MetadataImage, *records: MetadataRecord) -> MetadataImage:
    builder = ImageBuilder(image)
    builder.apply_all(records, image.offset)
    return builder.build(image.offset + 1)


def cluster_with_table(partitions: int = 4) -> MetadataImage:
    image = apply(
        MetadataImage.empty(), *(register(n) for n in (1, 2, 3)), *(UnfenceServer(n) for n in (1, 2, 3))
    )
    return apply(
        image,
        CreateTable("t", 1, partitions, 1, (KeyColumn("k", KeyType.STRING),), None),
        *(assignment(p, (p % 3 + 1, (p + 1) % 3 + 1), p % 3 + 1) for p in range(partitions)),
    )


def kinds(drafts: list[EventDraft]) -> list[str]:
    return [d.kind for d in drafts]


def test_servers_registering_and_a_table_created_are_told_once_each() -> None:
    empty = MetadataImage.empty()
    registered = apply(empty, register(1), register(2))
    assert kinds(image_events(empty, registered)) == ["server_registered", "server_registered"]
    assert image_events(empty, registered)[0].message == "server 1 registered (rack r1)"
    with_table = cluster_with_table()
    plain = apply(
        MetadataImage.empty(), *(register(n) for n in (1, 2, 3)), *(UnfenceServer(n) for n in (1, 2, 3))
    )
    created = image_events(plain, with_table)
    # Its first placement is part of the creation, not a move.
    assert kinds(created) == ["table_created"]
    assert created[0].message == "table t created: 4 partitions, 1 standby replica each"
    assert image_events(with_table, apply(with_table, NoOp())) == []


def test_a_fenced_server_and_its_actives_moving_are_one_event_per_kind_and_move() -> None:
    before = cluster_with_table(6)  # actives: p0 -> 1, p1 -> 2, p2 -> 3, p3 -> 1, p4 -> 2, p5 -> 3
    after = apply(
        before,
        FenceServer(1, "session expired"),
        PartitionChange(1, 0, 2, 1, (2,)),  # replicas (1, 2)
        PartitionChange(1, 3, 2, 1, (2,)),
        PartitionChange(1, 2, 3, 0, (3,)),  # replicas (3, 1): 1 leaves the ISR, 3 stays active
    )
    events = image_events(before, after)
    assert kinds(events) == ["server_fenced", "active_moved", "isr_shrunk"]
    fenced, moved, shrunk = events
    assert fenced.servers == (1,)
    assert moved.message == "t partitions 0, 3: active moved from server 1 to server 2"
    assert (moved.table, moved.servers, moved.partitions) == ("t", (1, 2), (0, 3))
    assert shrunk.partitions == (0, 2, 3)
    assert "server 1 out of sync" in shrunk.message
    unfenced = apply(after, UnfenceServer(1), PartitionChange(1, 2, 3, 0, (3, 1)))
    assert kinds(image_events(after, unfenced)) == ["server_unfenced", "isr_expanded"]


def test_a_partition_left_without_an_active_says_it_is_not_writable() -> None:
    before = cluster_with_table(1)
    after = apply(before, PartitionChange(1, 0, None, 1, ()))
    (event,) = [e for e in image_events(before, after) if e.kind == "active_moved"]
    assert event.message == "t partition 0: no active (was server 1); not writable until one is chosen"


def test_a_reassignment_names_each_partition_s_replicas_before_and_after() -> None:
    before = cluster_with_table(2)
    after = apply(before, assignment(1, (2, 3, 1), 2, warmups=(1,), isr=(2, 3), partition_epoch=1))
    (event,) = image_events(before, after)
    assert event.kind == "reassigned"
    assert event.message == "t replicas reassigned: 1: [2 (active), 3] → [2 (active), 3, 1 (warmup)]"
    assert event.servers == (1, 2, 3)


def test_many_partitions_are_counted_past_the_listed_ones() -> None:
    before = cluster_with_table(40)
    moves = [PartitionChange(1, p, 2, 1, (2,)) for p in range(0, 40, 3)]  # every partition active on 1
    (moved,) = [e for e in image_events(before, apply(before, *moves)) if e.kind == "active_moved"]
    assert moved.message.endswith(
        "0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33 and 2 more: active moved from server 1 to server 2"
    )
    assert len(moved.partitions) == 14


def test_a_restarted_server_registering_again_and_a_deleted_table() -> None:
    before = cluster_with_table(1)
    after = apply(before, register(2, incarnation="b"), DeleteTable("t", 1))
    events = image_events(before, after)
    assert kinds(events) == ["server_registered", "table_deleted"]
    assert "registered again after a restart" in events[0].message


def test_a_server_draining_then_removed() -> None:
    image = cluster_with_table()
    draining = apply(image, DrainServer(3))
    assert kinds(image_events(image, draining)) == ["server_draining"]
    assert image_events(image, draining)[0].servers == (3,)
    removed = apply(draining, UnregisterServer(3))
    assert [(d.kind, d.message) for d in image_events(draining, removed)] == [
        ("server_unregistered", "server 3 removed: it holds no replica, and its node id is not used again")
    ]


def test_leader_and_heartbeat_events() -> None:
    assert kinds(leader_events(None, 1, 1)) == ["controller_leader"]
    assert leader_events(1, None, 2) == []  # an election is under way: no news yet
    assert leader_events(1, 1, 2) == []
    assert leader_events(1, 2, 3)[0].message == "controller leader is server 2 (epoch 3, was server 1)"
    assert kinds(liveness_events({}, {2: True, 3: False})) == ["server_down"]
    assert kinds(liveness_events({2: True, 3: False}, {2: False, 3: True})) == ["server_down", "server_up"]


def test_every_kind_told_is_a_documented_kind() -> None:
    before = cluster_with_table(2)
    after = apply(before, FenceServer(1, "x"), PartitionChange(1, 0, 2, 1, (2,)))
    told = {e.kind for e in image_events(before, after)} | {"controller_leader", "server_down", "server_up"}
    assert told <= set(EVENT_KINDS)


def test_the_log_keeps_the_newest_events_numbered_in_order() -> None:
    log = EventLog(3)
    log.record([EventDraft("server_up", f"m{i}") for i in range(5)], now_ms=1_000, metadata_offset=7)
    assert log.latest_seq == 5
    assert [e.seq for e in log.after(0, 10)] == [3, 4, 5]
    assert [e.message for e in log.after(3, 10)] == ["m3", "m4"]
    assert [e.seq for e in log.after(0, 1)] == [5]
    assert log.after(5, 10) == []
    assert log.after(0, 1)[0].time_ms == 1_000 and log.after(0, 1)[0].metadata_offset == 7
    with pytest.raises(ValueError, match="at least one"):
        EventLog(0)


def test_an_overwrite_is_told_once_at_its_swap_and_a_failed_one_not_at_all() -> None:
    before = cluster_with_table(2)
    staged = apply(
        before,
        CreateTable("t#2", 2, 3, 1, (KeyColumn("k", KeyType.STRING),), None, staging_for="t"),
        *(PartitionAssignment(2, p, (1, 2), 1, (), 0, (1, 2), 0) for p in range(3)),
    )
    assert image_events(before, staged) == []  # the table is unchanged while the load runs
    swapped = apply(staged, ReplaceTable("t", 2, 1, (5, 5, 5)))
    events = image_events(staged, swapped)
    assert kinds(events) == ["table_overwritten"]
    assert events[0].message == "table t overwritten: its new generation (3 partitions) serves"
    assert image_events(staged, apply(staged, DeleteTable("t#2", 2))) == []
