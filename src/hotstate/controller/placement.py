"""Where a new table's partitions go: incremental placement (hotstate.assignor.incremental) over the live
brokers.

Only the new table is decided, against the replicas each broker holds now (`load_of`), so the time is
linear in the new table's partitions whatever the cluster holds; nothing existing moves (balancing existing
partitions is controller/reassign.py's job, with warmups and safe steps, once the cluster is settled).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from hotstate.assignor import AssignorConfig, PartitionId, Placement, Server, Table
from hotstate.assignor.incremental import Load, place_new_table
from hotstate.controller.image import MetadataImage, PartitionInfo, ServerInfo, TableInfo
from hotstate.controller.records import PartitionAssignment

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PlacementJob:
    """The inputs of one new table's placement: plain immutable data, so a shell may run it off the event
    loop (`run`), and the controller checks the answer against its view before writing it."""

    image: MetadataImage  # immutable: the load is counted from it in `run`, off the loop too
    brokers: tuple[ServerInfo, ...]
    table: TableInfo
    config: AssignorConfig

    def run(self) -> list[PartitionAssignment]:
        if not self.brokers:
            return []
        result = place_new_table(
            [Server(str(b.node_id), b.rack, dict(b.tags)) for b in self.brokers],
            assignor_table(self.table),
            load_of(self.image),
            self.config,
        )
        for note in result.notes:
            log.info("placing table %r: %s", self.table.name, note)
        records = []
        for partition in range(self.table.partitions):
            placed = result.partitions[PartitionId(self.table.name, partition)]
            # A new partition has no state anywhere: every replica starts empty and in sync.
            replicas = (int(placed.active), *(int(s) for s in placed.standbys))
            records.append(
                PartitionAssignment(
                    self.table.table_id,
                    partition,
                    replicas,
                    replicas[0],
                    (),
                    leader_epoch=0,
                    isr=replicas,
                    partition_epoch=0,
                )
            )
        return records


def placement_job(
    image: MetadataImage, table: TableInfo, config: AssignorConfig | None = None
) -> PlacementJob:
    return PlacementJob(image, tuple(image.placement_brokers()), table, config or AssignorConfig())


def place_table(
    image: MetadataImage, table: TableInfo, config: AssignorConfig | None = None
) -> list[PartitionAssignment]:
    """One assignment record per partition of `table`: an active on a live broker, standbys on other
    brokers spread over the `rack.aware.assignment.tags` (fewer than asked when there are not enough
    brokers), never on a draining one. Empty when there is no live broker."""
    return placement_job(image, table, config).run()


def load_of(image: MetadataImage) -> Load:
    """Actives and other copies per broker (as assignor server ids), over every partition of the image."""
    actives: dict[str, int] = {}
    standbys: dict[str, int] = {}
    for parts in image.partitions.values():
        for part in parts:
            if part.active is not None:
                key = str(part.active)
                actives[key] = actives.get(key, 0) + 1
            for r in part.replicas:
                if r != part.active:
                    key = str(r)
                    standbys[key] = standbys.get(key, 0) + 1
    return Load(actives, standbys)


def assignor_table(table: TableInfo) -> Table:
    return Table(table.name, table.partitions, table.standby_replicas, table.writer_racks)


def previous_placement(image: MetadataImage, *, exclude: str) -> dict[PartitionId, Placement]:
    """The current placement in the assignor's terms (partitions without an active are left out: the
    assignor then treats them as new, which is what they are to it)."""
    names = {t.table_id: t.name for t in image.tables.values() if t.name != exclude}
    out: dict[PartitionId, Placement] = {}
    for table_id, parts in image.partitions.items():
        name = names.get(table_id)
        if name is None:
            continue
        for part in parts:
            if part.active is not None:
                out[PartitionId(name, part.partition)] = _placement_of(part)
    return out


def _placement_of(part: PartitionInfo) -> Placement:
    assert part.active is not None
    return Placement(
        str(part.active), tuple(str(s) for s in part.standbys), tuple(str(w) for w in part.warmups)
    )
