"""Removing a server (`hotstate server remove`): the records the controller writes for it, with the
committed image built by replay and replicas that catch up at once (test_reassign's Cluster)."""

from __future__ import annotations

import pytest

from hotstate.controller.image import MetadataImage, PartitionInfo
from hotstate.controller.records import (
    DrainServer,
    Endpoint,
    MetadataRecord,
    NoOp,
    UnregisterServer,
)
from hotstate.controller.requests import (
    ControllerError,
    CreateTableRequest,
    RegisterServerRequest,
    RegisterServerResponse,
    RemoveServerRequest,
    RemoveServerResponse,
    ServerHeartbeatRequest,
    ServerHeartbeatResponse,
)
from hotstate.controller.snapshot import decode_snapshot, encode_snapshot

from .test_reassign import KEY, Cluster

RACKS = {1: "az-a", 2: "az-b", 3: "az-c", 4: "az-a"}


def records(cluster: Cluster, request: object) -> tuple[list[MetadataRecord], RemoveServerResponse]:
    decision = cluster.handle(request)
    assert isinstance(decision.reply, RemoveServerResponse), decision.reply
    return [r for batch in decision.batches for r in batch.records], decision.reply


class DrainCluster(Cluster):
    """Cluster's checks, with the in-sync copies a partition keeps through a move being its table's
    (Cluster's assume one standby)."""

    def check(self, old: PartitionInfo, new: PartitionInfo) -> None:
        copies = next(
            1 + t.standby_replicas for t in self.image.tables.values() if t.table_id == new.table_id
        )
        live_in_sync = [r for r in new.isr if r not in self.down]
        old_live_in_sync = [r for r in old.isr if r not in self.down]
        assert len(live_in_sync) >= min(len(old_live_in_sync), copies), (old, new)
        if copies == 2:
            super().check(old, new)


def settled_cluster(
    racks: dict[int, str] = RACKS, standbys: int = 1, *, unreplicated: bool = True, **config: int
) -> Cluster:
    """Table t with `standbys`, and (`unreplicated`) table u with none: a dead server takes its
    partitions of u offline."""
    cluster = DrainCluster(dict(racks), **config)  # type: ignore[arg-type]
    cluster.handle(CreateTableRequest("t", 8, standbys, KEY, None))
    if unreplicated:
        cluster.handle(CreateTableRequest("u", 4, 0, KEY, None))
    cluster.settle()
    return cluster


def holds(image: MetadataImage, node_id: int) -> bool:
    return image.holds_replicas(node_id)


def drain(cluster: Cluster, node_id: int, rounds: int = 120) -> int:
    """Rounds until `node_id` is unregistered; checks every round that it gained nothing and that every
    partition kept its configured copies in sync."""
    wanted = {t.table_id: 1 + t.standby_replicas for t in cluster.image.tables.values()}
    for n in range(rounds):
        before = {
            (p.table_id, p.partition): set(p.replicas) for ps in cluster.image.partitions.values() for p in ps
        }
        cluster.round()
        if node_id not in cluster.image.servers:
            return n
        for parts in cluster.image.partitions.values():
            for p in parts:
                if node_id in p.replicas:
                    assert node_id in before[(p.table_id, p.partition)], f"{node_id} gained {p}"
                in_sync = [r for r in p.isr if r not in cluster.down]
                assert len(in_sync) >= wanted[p.table_id], p
    raise AssertionError(f"server {node_id} was not removed in {rounds} rounds")


def test_a_live_server_is_drained_keeping_every_standby_then_unregistered() -> None:
    cluster = settled_cluster()
    assert holds(cluster.image, 4)
    written, reply = records(cluster, RemoveServerRequest(4))
    assert reply == RemoveServerResponse(ControllerError.NONE, "", "draining")
    assert written == [DrainServer(4)]
    assert cluster.image.servers[4].draining and not cluster.image.servers[4].fenced
    assert [b.node_id for b in cluster.image.placement_brokers()] == [1, 2, 3]
    drain(cluster, 4)
    assert 4 not in cluster.image.servers and cluster.image.removed == frozenset({4})
    for table in cluster.image.tables.values():
        for p in cluster.image.partitions[table.table_id]:
            assert len(p.replicas) == 1 + table.standby_replicas and set(p.isr) == set(p.replicas)
            assert set(p.replicas) <= {1, 2, 3}
    # Asked again: already done.
    written, reply = records(cluster, RemoveServerRequest(4))
    assert reply.state == "removed" and written == [NoOp()]


def test_the_unregister_record_is_written_only_once_the_server_holds_nothing() -> None:
    cluster = settled_cluster()
    cluster.handle(RemoveServerRequest(4))
    unregistered = 0
    for _ in range(200):
        if 4 not in cluster.image.servers:
            break
        held = holds(cluster.image, 4)
        decided = cluster.controller.tick(cluster.now, cluster.next_offset)
        if any(isinstance(r, UnregisterServer) for b in decided for r in b.records):
            assert not held, "unregistered while holding replicas"
            unregistered += 1
        cluster.commit(decided)
        cluster.round()
    assert unregistered == 1 or (4 not in cluster.image.servers and not holds(cluster.image, 4))


def test_a_removed_server_is_refused_and_told_why() -> None:
    cluster = settled_cluster()
    cluster.handle(RemoveServerRequest(4))
    drain(cluster, 4)
    beat = cluster.reply(ServerHeartbeatRequest(4, "a4", cluster.next_offset, False), ServerHeartbeatResponse)
    assert beat.error is ControllerError.SERVER_REMOVED and "new node.id" in beat.message
    decision = cluster.handle(
        RegisterServerRequest(4, "b4", Endpoint("127.0.0.1", 9004), None, "az-a", (), ("broker",))
    )
    assert isinstance(decision.reply, RegisterServerResponse)
    assert decision.reply.error is ControllerError.SERVER_REMOVED
    assert [r for b in decision.batches for r in b.records] == [NoOp()]
    assert 4 not in cluster.image.servers


def test_removing_a_server_that_would_leave_too_few_for_a_table_is_a_clear_error() -> None:
    cluster = settled_cluster({1: "az-a", 2: "az-b", 3: "az-c"}, standbys=2)
    written, reply = records(cluster, RemoveServerRequest(3))
    assert reply.error is ControllerError.INVALID_REQUEST and written == [NoOp()]
    assert "leave 2 live broker(s) (1, 2)" in reply.message and "table 't' needs 3" in reply.message
    assert not cluster.image.servers[3].draining


def test_unknown_servers_and_voters_are_refused_and_a_controller_out_of_the_quorum_is_removed() -> None:
    cluster = settled_cluster()
    _, reply = records(cluster, RemoveServerRequest(9))
    assert reply.error is ControllerError.UNKNOWN_SERVER
    cluster.handle(
        RegisterServerRequest(
            5, "a5", Endpoint("127.0.0.1", 9005), None, "az-b", (), ("broker", "controller")
        )
    )
    cluster.controller.voters = frozenset({1, 5})
    written, reply = records(cluster, RemoveServerRequest(5))
    assert reply.error is ControllerError.INVALID_REQUEST and written == [NoOp()]
    assert "voter of the metadata quorum" in reply.message
    assert "`hotstate cluster voters remove 5`" in reply.message
    # Out of the quorum (`cluster voters remove 5`), the same combined server is removed as a broker is.
    cluster.controller.voters = frozenset({1})
    written, reply = records(cluster, RemoveServerRequest(5))
    assert reply.error is ControllerError.NONE and written == [UnregisterServer(5)], (reply, written)


def test_a_dead_server_already_replaced_is_unregistered_at_once() -> None:
    cluster = settled_cluster(unreplicated=False, broker_removal_delay_ms=5_000)
    cluster.down.add(4)
    for _ in range(60):  # 15 s: fenced, then its replicas re-created on the others
        cluster.round()
    assert cluster.image.servers[4].fenced and not holds(cluster.image, 4)
    written, reply = records(cluster, RemoveServerRequest(4))
    assert reply.state == "removed" and written == [UnregisterServer(4)]
    assert 4 not in cluster.image.servers


def test_a_dead_server_still_holding_replicas_is_replaced_without_waiting_for_the_removal_delay() -> None:
    cluster = settled_cluster(unreplicated=False, broker_removal_delay_ms=600_000)
    cluster.down.add(4)
    for _ in range(12):  # 3 s: fenced (session 2 s); nothing moves for 10 minutes
        cluster.round()
    assert cluster.image.servers[4].fenced and holds(cluster.image, 4)
    _, reply = records(cluster, RemoveServerRequest(4))
    assert reply.state == "draining"
    assert drain(cluster, 4) < 60  # 15 s, far below the delay
    for table in cluster.image.tables.values():
        for p in cluster.image.partitions[table.table_id]:
            assert len(p.replicas) == 1 + table.standby_replicas and set(p.replicas) <= {1, 2, 3}


def test_a_partition_held_only_by_the_dead_server_blocks_its_removal() -> None:
    cluster = settled_cluster()
    cluster.check = lambda old, new: None  # type: ignore[method-assign]  # a partition goes offline
    cluster.down.add(4)
    for _ in range(12):
        cluster.round()
    lonely = next(p for p in cluster.image.partitions_of("u") if 4 in p.isr)
    assert lonely.isr == (4,) and lonely.active is None  # no standby: offline while 4 is down
    _, reply = records(cluster, RemoveServerRequest(4))
    assert reply.error is ControllerError.INVALID_REQUEST
    assert f"partition u/{lonely.partition} has no in-sync replica but server 4" in reply.message


def test_a_draining_server_gets_no_new_table() -> None:
    cluster = settled_cluster()
    cluster.handle(RemoveServerRequest(4))
    cluster.handle(CreateTableRequest("v", 12, 2, KEY, None))
    assert all(4 not in p.replicas for p in cluster.image.partitions_of("v"))


@pytest.mark.parametrize("done", [False, True], ids=["draining", "removed"])
def test_draining_and_removed_servers_survive_a_snapshot(done: bool) -> None:
    cluster = settled_cluster()
    cluster.handle(RemoveServerRequest(4))
    if done:
        drain(cluster, 4)
    loaded = decode_snapshot(encode_snapshot(cluster.image))
    assert {n: s.draining for n, s in loaded.servers.items()} == {
        n: s.draining for n, s in cluster.image.servers.items()
    }
    assert loaded.removed == cluster.image.removed
    assert (4 in loaded.servers and loaded.servers[4].draining) is not done


def test_a_draining_server_that_restarts_stays_draining() -> None:
    cluster = settled_cluster()
    cluster.handle(RemoveServerRequest(4))
    cluster.register(4, "az-a", incarnation="b")
    assert cluster.image.servers[4].draining
