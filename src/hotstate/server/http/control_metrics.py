"""The control plane in /metrics, under Kafka's names where Kafka has the metric (as its JMX exporter names
them), so a KRaft dashboard reads hotstate too; hotstate_* where it has none.

Cluster-wide controller gauges (`kafka_controller_kafkacontroller_*`: offline partitions, fenced and active
brokers, partitions, tables) are reported by the active controller and 0 elsewhere, as Kafka does: a sum
over the servers is the cluster's value, and `activecontrollercount` sums to 1 when one leads. Broker gauges
(`kafka_server_replicamanager_*`) count this server's replicas; the metadata quorum's (`kafka_server_raft_
metrics_*`) and the applied metadata offset (`kafka_server_broker_metadata_metrics_*`) are this server's view.

`samples` is pure (a `ControlPlaneView` in, samples out); `ControlPlaneMetrics` gathers the view at scrape
time and keeps the two counters that need memory: metadata quorum elections seen and partition leader
elections (active changes) applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from hotstate.controller.image import MetadataImage, PartitionInfo
from hotstate.server.copy_counts import Counts, count


@dataclass(frozen=True, slots=True)
class RaftView:
    leader_id: int | None
    epoch: int
    high_watermark: int
    log_end_offset: int
    role: str


@dataclass(frozen=True, slots=True)
class ControlPlaneView:
    node_id: int
    image: MetadataImage
    active_controller: bool
    raft: RaftView | None  # None: this server holds no metadata log (cannot happen today: every server does)
    # The image's counts (server/copy_counts.py), kept per table by the server; None: counted here.
    counts: Counts | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    documentation: str
    value: float


def samples(view: ControlPlaneView) -> list[Sample]:
    image, node = view.image, view.node_id
    counts = view.counts if view.counts is not None else count(image)
    leading = view.active_controller
    brokers = [s for s in image.servers.values() if s.is_broker]
    fenced = sum(1 for s in brokers if s.fenced)
    out = [
        Sample(
            "kafka_controller_kafkacontroller_activecontrollercount",
            "1 on the server that is the active controller, else 0",
            1 if leading else 0,
        ),
        Sample(
            "kafka_controller_kafkacontroller_offlinepartitionscount",
            "Partitions without an active replica (reported by the active controller)",
            counts.offline if leading else 0,
        ),
        Sample(
            "kafka_controller_kafkacontroller_globalpartitioncount",
            "Partitions of all tables (reported by the active controller)",
            counts.partitions if leading else 0,
        ),
        Sample(
            "kafka_controller_kafkacontroller_globaltopiccount",
            "Tables (reported by the active controller)",
            len(image.tables) if leading else 0,
        ),
        Sample(
            "kafka_controller_kafkacontroller_fencedbrokercount",
            "Registered brokers that are fenced (reported by the active controller)",
            fenced if leading else 0,
        ),
        Sample(
            "kafka_controller_kafkacontroller_activebrokercount",
            "Registered brokers that are not fenced (reported by the active controller)",
            len(brokers) - fenced if leading else 0,
        ),
        Sample(
            "kafka_server_replicamanager_leadercount",
            "Partitions whose active replica is on this server",
            counts.actives[node],
        ),
        Sample(
            "kafka_server_replicamanager_partitioncount",
            "Partition replicas on this server (active, standby or warmup)",
            counts.copies[node],
        ),
        Sample(
            "kafka_server_replicamanager_underreplicatedpartitions",
            "Partitions active here whose in-sync replicas are fewer than their replicas",
            counts.under_replicated[node],
        ),
        Sample(
            "kafka_server_broker_metadata_metrics_last_applied_record_offset",
            "Offset of the last metadata record this server applied to its image (-1: none)",
            image.offset - 1,
        ),
    ]
    raft = view.raft
    if raft is not None:
        out += [
            Sample(
                "kafka_server_raft_metrics_current_leader",
                "The metadata quorum's leader as this server knows it (-1: none)",
                -1 if raft.leader_id is None else raft.leader_id,
            ),
            Sample("kafka_server_raft_metrics_current_epoch", "The metadata quorum's epoch", raft.epoch),
            Sample(
                "kafka_server_raft_metrics_high_watermark",
                "The metadata log's high watermark (committed end) as this server knows it",
                raft.high_watermark,
            ),
            Sample(
                "kafka_server_raft_metrics_log_end_offset",
                "The end of this server's metadata log",
                raft.log_end_offset,
            ),
            Sample(
                "hotstate_metadata_lag_records",
                "Committed metadata records this server has not applied to its image yet",
                max(0, raft.high_watermark - image.offset),
            ),
        ]
    return out


class ControlPlaneMetrics:
    """The collector: `view` is asked at each scrape (on the event loop's thread, as /metrics runs there);
    `on_role_change` and `on_image` feed the counters."""

    def __init__(self, view: Callable[[], ControlPlaneView], registry: CollectorRegistry) -> None:
        self._view = view
        self._epochs_seen: set[int] = set()
        self.quorum_elections = 0
        self.leader_elections = 0
        # The image's partitions per table as last seen: the image is copy-on-write, so a table whose tuple
        # is the same object has no changed partition, and only changed ones are compared.
        self._parts: dict[int, tuple[PartitionInfo, ...]] = {}
        registry.register(self)

    def on_epoch(self, epoch: int) -> None:
        """The metadata quorum is in `epoch`: a new one is an election this server saw end."""
        if epoch not in self._epochs_seen:
            self._epochs_seen.add(epoch)
            self.quorum_elections += 1

    def on_image(self, image: MetadataImage) -> None:
        """Counts partitions whose active changed to another server (a partition leader election)."""
        seen = self._parts
        for table_id, parts in image.partitions.items():
            before = seen.get(table_id)
            if before is parts:
                continue
            if before is not None:
                for old, new in zip(before, parts, strict=False):
                    if old is not new and new.active is not None and new.active != old.active:
                        self.leader_elections += 1
        self._parts = dict(image.partitions)

    def collect(self) -> Iterator[Metric]:
        for sample in samples(self._view()):
            family = GaugeMetricFamily(sample.name, sample.documentation)
            family.add_metric([], sample.value)
            yield family
        yield _counter(
            "hotstate_metadata_quorum_elections",
            "Metadata quorum epochs this server has seen begin (elections won by someone)",
            self.quorum_elections,
        )
        yield _counter(
            "hotstate_partition_leader_elections",
            "Partitions whose active moved to another server, as applied to this server's image",
            self.leader_elections,
        )


def _counter(name: str, documentation: str, value: int) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation)
    family.add_metric([], value)
    return family
