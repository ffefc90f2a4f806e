"""The control plane in /metrics (server/http/control_metrics.py): Kafka's names, the active controller's
cluster-wide gauges (0 elsewhere), this broker's replica counts, and elections counted once each."""

from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hotstate.controller.image import MetadataImage, PartitionInfo, ServerInfo, TableInfo
from hotstate.controller.records import Endpoint, KeyColumn, KeyType
from hotstate.server.http.control_metrics import ControlPlaneMetrics, ControlPlaneView, RaftView, samples

TABLE = TableInfo("clicks", 1, 3, 1, (KeyColumn("user", KeyType.STRING),), None)


def _server(node: int, *, fenced: bool = False) -> ServerInfo:
    endpoint = Endpoint("127.0.0.1", 9000 + node)
    return ServerInfo(node, "x", endpoint, None, None, (), ("broker", "controller"), fenced, 0)


def _image(*parts: PartitionInfo, fenced: frozenset[int] = frozenset()) -> MetadataImage:
    servers = {n: _server(n, fenced=n in fenced) for n in (1, 2, 3)}
    return MetadataImage(42, servers, {"clicks": TABLE}, {1: parts})


PARTS = (
    PartitionInfo(1, 0, (1, 2), 1, (), 3, (1, 2)),
    PartitionInfo(1, 1, (2, 3), 2, (), 1, (2,)),  # a standby out of sync: under-replicated
    PartitionInfo(1, 2, (3, 1), None, (), 4, (3,)),  # offline: no active
)


def _values(view: ControlPlaneView) -> dict[str, float]:
    return {s.name: s.value for s in samples(view)}


def test_the_active_controller_reports_the_cluster_and_every_broker_its_replicas() -> None:
    raft = RaftView(leader_id=1, epoch=5, high_watermark=45, log_end_offset=46, role="leader")
    leader = _values(ControlPlaneView(1, _image(*PARTS, fenced=frozenset({3})), True, raft))
    assert leader["kafka_controller_kafkacontroller_activecontrollercount"] == 1
    assert leader["kafka_controller_kafkacontroller_offlinepartitionscount"] == 1
    assert leader["kafka_controller_kafkacontroller_globalpartitioncount"] == 3
    assert leader["kafka_controller_kafkacontroller_globaltopiccount"] == 1
    assert leader["kafka_controller_kafkacontroller_fencedbrokercount"] == 1
    assert leader["kafka_controller_kafkacontroller_activebrokercount"] == 2
    assert leader["kafka_server_replicamanager_leadercount"] == 1
    assert leader["kafka_server_replicamanager_partitioncount"] == 2
    assert leader["kafka_server_replicamanager_underreplicatedpartitions"] == 0
    assert leader["kafka_server_broker_metadata_metrics_last_applied_record_offset"] == 41
    assert leader["hotstate_metadata_lag_records"] == 3
    assert leader["kafka_server_raft_metrics_current_leader"] == 1
    # Another server: cluster-wide gauges are 0 there (a sum over servers is the cluster's value).
    other = _values(ControlPlaneView(2, _image(*PARTS), False, dataclasses.replace(raft, role="follower")))
    assert other["kafka_controller_kafkacontroller_activecontrollercount"] == 0
    assert other["kafka_controller_kafkacontroller_offlinepartitionscount"] == 0
    assert other["kafka_server_replicamanager_underreplicatedpartitions"] == 1
    assert other["kafka_server_replicamanager_leadercount"] == 1


def test_elections_are_counted_once_each_from_the_changes_of_the_image() -> None:
    registry = CollectorRegistry()
    image = _image(*PARTS)
    metrics = ControlPlaneMetrics(lambda: ControlPlaneView(1, image, False, None), registry)
    metrics.on_image(image)
    for epoch in (1, 1, 2, 4):
        metrics.on_epoch(epoch)
    moved = _image(PARTS[0], dataclasses.replace(PARTS[1], active=3, leader_epoch=2), PARTS[2])
    metrics.on_image(moved)
    metrics.on_image(moved)  # the same image again: nothing moved
    back = _image(
        PARTS[0], PARTS[1], dataclasses.replace(PARTS[2], active=3, leader_epoch=5)
    )  # 1 -> 2, None -> 3
    metrics.on_image(back)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert families["hotstate_metadata_quorum_elections"].samples[0].value == 3
    assert families["hotstate_partition_leader_elections"].samples[0].value == 3
    assert families["kafka_controller_kafkacontroller_activecontrollercount"].samples[0].value == 0
