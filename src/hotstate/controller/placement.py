"""Where a new table's partitions go: the rack-aware assignor (hotstate.assignor) over the live brokers.

The assignor sees every table, with the current placement as its previous assignment, so the new table
is balanced against the load that is already there; only the new table's part of the answer is written.
Existing partitions stay where they are here: moving them takes warmups and safe steps, which
controller/reassign.py does once the cluster is settled; should balance make the assignor move one at
create time, that is logged, not done.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from hotstate.assignor import Assignment, AssignorConfig, PartitionId, Placement, Server, Table, assign
from hotstate.controller.image import MetadataImage, PartitionInfo, TableInfo
from hotstate.controller.records import PartitionAssignment

log = logging.getLogger(__name__)


def place_table(
    image: MetadataImage, table: TableInfo, config: AssignorConfig | None = None
) -> list[PartitionAssignment]:
    """One assignment record per partition of `table`: an active on a live broker, standbys on other
    brokers spread over the `rack.aware.assignment.tags` (fewer than asked when there are not enough
    brokers), never on a draining one. Empty when there is no live broker."""
    brokers = image.placement_brokers()
    if not brokers:
        return []
    config = config or AssignorConfig()
    # Existing partitions are not moved here, so make moving one never worth it to the assignor: a move
    # saves at most one traffic cost for itself and one for the new partition taking its place. The new
    # table is then placed against the load as it is, not against a rebalanced one that will not happen.
    config = replace(config, non_overlap_cost=max(config.non_overlap_cost, 2 * config.traffic_cost + 1))
    tables = [assignor_table(t) for t in image.tables.values() if t.name != table.name]
    tables.append(assignor_table(table))
    result = assign(
        [Server(str(b.node_id), b.rack, dict(b.tags)) for b in brokers],
        tables,
        previous_placement(image, exclude=table.name),
        None,
        config,
    )
    log_moves_not_made(image, result, table.name)
    records = []
    for partition in range(table.partitions):
        placed = result.partitions[PartitionId(table.name, partition)]
        # A new partition has no state anywhere, so the assignor never gives it a warmup: every replica
        # starts empty and in sync.
        replicas = (int(placed.active), *(int(s) for s in placed.standbys))
        records.append(
            PartitionAssignment(
                table.table_id,
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


def log_moves_not_made(image: MetadataImage, result: Assignment, new_table: str) -> None:
    wanted = 0
    for pid, placed in result.partitions.items():
        if pid.table == new_table:
            continue
        info = image.tables.get(pid.table)
        parts = image.partitions.get(info.table_id, ()) if info else ()
        if pid.partition < len(parts) and parts[pid.partition].active != int(placed.active):
            wanted += 1
    if wanted:
        log.info(
            "placing table %r: the assignor would also move %d existing active(s); existing partitions "
            "are not reassigned",
            new_table,
            wanted,
        )
