"""Where a new table's partitions go. A simple balanced, rack-spreading placement for now; the
rack-aware assignor (hotstate.assignor) takes over behind this one function."""

from __future__ import annotations

from collections import Counter

from hotstate.controller.image import MetadataImage, TableInfo
from hotstate.controller.records import PartitionAssignment


def place_table(image: MetadataImage, table: TableInfo) -> list[PartitionAssignment]:
    """Actives balanced over live brokers; standbys on other brokers, preferring racks not yet used by the
    partition, then the least loaded. Fewer standbys than asked when there are not enough brokers."""
    brokers = image.live_brokers()
    if not brokers:
        return []
    load: Counter[int] = Counter()
    actives: Counter[int] = Counter()
    for parts in image.partitions.values():
        for part in parts:
            for replica in part.replicas:
                load[replica] += 1
            if part.active is not None:
                actives[part.active] += 1
    racks = {b.node_id: b.rack for b in brokers}
    assignments = []
    for partition in range(table.partitions):
        active = min(racks, key=lambda n: (actives[n], load[n], n))
        actives[active] += 1
        load[active] += 1
        chosen = [active]
        for _ in range(min(table.standby_replicas, len(racks) - 1)):
            used_racks = {racks[n] for n in chosen}
            standby = min(
                (n for n in racks if n not in chosen),
                key=lambda n: (racks[n] in used_racks, load[n], n),
            )
            chosen.append(standby)
            load[standby] += 1
        assignments.append(
            PartitionAssignment(
                table.table_id,
                partition,
                tuple(chosen),
                active,
                (),
                leader_epoch=0,
                isr=tuple(chosen),
                partition_epoch=0,
            )
        )
    return assignments
