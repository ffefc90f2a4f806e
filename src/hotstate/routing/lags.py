"""The global lag table (KIP-535 lag reporting, KLIP-12): every server's reported replica positions.

Each server periodically sends the LagInfo of all its local replicas; every server keeps the newest
report of each. A replica's lag is measured against the highest end offset that ANY replica reported
for its partition, not against the end its own server knows: a standby cut off from the active still
reports its old end and would otherwise look caught up (KIP-535, KLIP-12's maxEndOffsetPerPartition).
The lag each server computed itself (LagInfo.offset_lag) is therefore ignored, except that a replica
that cannot know its partition's end (`routing.freshness`: it has heard nobody since it opened) reports its
end as -1, and routers skip it for bounded reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import cast

from hotstate.protocol.replica_state import REPLICA_STATES, ReplicaState
from hotstate.replica.messages import LagInfo

_Key = tuple[int, int]  # (table_id, partition)


@dataclass(frozen=True, slots=True)
class ReplicaLag:
    position: int  # the replica store's position (LagInfo.current_offset_position)
    end: int  # the highest end offset any replica reported for the partition
    offset_lag: int  # max(0, end - position)
    state: ReplicaState  # as the replica's server reported it
    reported_at_ms: int  # arrival of the report, on this server's clock
    end_known: bool = True  # False: the replica itself could not know its lag when it reported


@dataclass(frozen=True, slots=True)
class _NodeReport:
    reported_at_ms: int
    replicas: dict[_Key, LagInfo]


class LagTable:
    def __init__(self) -> None:
        self._nodes: dict[int, _NodeReport] = {}
        # (table_id, partition) -> node -> reported end: the partition's end is the max of a few values
        # (one per replica), kept up to date per report so no lookup scans the whole table.
        self._ends: dict[_Key, dict[int, int]] = {}
        # Bumped by every change: a reader may keep decisions made from the table (routes) for as long
        # as this stays the same.
        self.version = 0

    def update(self, node_id: int, reports: Sequence[LagInfo], now_ms: int) -> bool:
        """Replace everything `node_id` reported before; False (ignored) if older than what we hold.

        A replica the node no longer reports (moved away, deleted) is gone from the table. Within one
        report a later entry for the same partition wins. An entry naming a state this version does not know
        (a newer peer's) is left out: the replica's own server still judges it when asked."""
        old = self._nodes.get(node_id)
        if old is not None and now_ms < old.reported_at_ms:
            return False
        replicas = {(info.table_id, info.partition): info for info in reports if info.state in REPLICA_STATES}
        self._drop_ends(node_id)
        for key, info in replicas.items():
            if info.end_offset_position >= 0:  # an unknown end says nothing of the partition's end
                self._ends.setdefault(key, {})[node_id] = info.end_offset_position
        self._nodes[node_id] = _NodeReport(now_ms, replicas)
        self.version += 1
        return True

    def forget(self, node_id: int) -> None:
        """Drop a node's report (the node was unregistered)."""
        self._drop_ends(node_id)
        self._nodes.pop(node_id, None)
        self.version += 1

    def _drop_ends(self, node_id: int) -> None:
        old = self._nodes.get(node_id)
        if old is None:
            return
        for key in old.replicas:
            ends = self._ends.get(key)
            if ends is not None:
                ends.pop(node_id, None)
                if not ends:
                    del self._ends[key]

    def partition_end(self, table_id: int, partition: int) -> int:
        """The highest end offset reported for the partition by any replica; 0 if none reported it."""
        ends = self._ends.get((table_id, partition))
        return max(ends.values()) if ends else 0

    def partition_hw(self, table_id: int, partition: int, *, exclude: int) -> int:
        """The highest HW any replica but `exclude`'s reported for the partition, with a known end; 0 if
        none did."""
        key = (table_id, partition)
        ends = self._ends.get(key)
        if not ends:
            return 0
        highest = 0
        for node_id in ends:
            if node_id != exclude and (info := self._nodes[node_id].replicas.get(key)) is not None:
                highest = max(highest, info.high_watermark)
        return highest

    def reported_since(self, table_id: int, partition: int, since_ms: int, *, exclude: int) -> bool:
        """Whether a server other than `exclude` reported the partition's end in a report that arrived at or
        after `since_ms`."""
        return any(
            node_id != exclude and self._nodes[node_id].reported_at_ms >= since_ms
            for node_id in self._ends.get((table_id, partition), {})
        )

    def lag(self, node_id: int, table_id: int, partition: int) -> ReplicaLag | None:
        """The node's replica of the partition as last reported, or None without a report of it."""
        report = self._nodes.get(node_id)
        if report is None:
            return None
        info = report.replicas.get((table_id, partition))
        if info is None:
            return None
        return self._replica_lag(info, report.reported_at_ms)

    def _replica_lag(self, info: LagInfo, reported_at_ms: int) -> ReplicaLag:
        end = self.partition_end(info.table_id, info.partition)
        position = info.current_offset_position
        known = info.end_offset_position >= 0
        state = cast(ReplicaState, info.state)  # `update` kept only known states
        return ReplicaLag(position, end, max(0, end - position), state, reported_at_ms, known)

    def snapshot(self) -> dict[int, dict[str, dict[int, ReplicaLag]]]:
        """node -> table name -> partition -> lag, sorted: /clusterStatus's hostStoreLags."""
        view: dict[int, dict[str, dict[int, ReplicaLag]]] = {}
        for node_id in sorted(self._nodes):
            report = self._nodes[node_id]
            tables: dict[str, dict[int, ReplicaLag]] = {}
            for key in sorted(report.replicas):
                info = report.replicas[key]
                tables.setdefault(info.table, {})[info.partition] = self._replica_lag(
                    info, report.reported_at_ms
                )
            view[node_id] = tables
        return view

    def snapshot_json(self) -> dict[str, dict[str, dict[str, dict[str, int | str | bool]]]]:
        """`snapshot` with string keys and plain values, ready for a JSON answer."""
        return {
            str(node_id): {
                table: {str(partition): asdict(lag) for partition, lag in partitions.items()}
                for table, partitions in tables.items()
            }
            for node_id, tables in self.snapshot().items()
        }
