"""Copies lost with a broker taken for gone, re-placed without moving anything else.

A broker fenced for `broker_removal_delay_ms` (or removed by an operator while fenced) is gone: its actives
were already moved to in-sync standbys at the fence (`partition_rules.elect_after_fence`); what is left is
its copies. Only the partitions that held one are decided, by `assignor.incremental.replace_lost` against
the live brokers' load: each keeps its active and its live copies and gets new standbys up to its count,
so a partition never runs below its standbys while a server could host one. Every other partition stays
where it is; balancing is the periodic reassignment's job (controller/reassign.py), which waits until no
lost copy is left to re-place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hotstate.assignor import AssignorConfig, PartitionId, Placement, Server
from hotstate.assignor.incremental import replace_lost
from hotstate.controller.image import MetadataImage, PartitionInfo, PerTable, ServerInfo
from hotstate.controller.placement import assignor_table, load_of
from hotstate.controller.records import PartitionAssignment

# (table id, partition) -> the replicas wanted, active first, then standbys, then warmups kept.
Replacement = Mapping[tuple[int, int], tuple[int, ...]]


def lost_partitions(image: MetadataImage, gone: frozenset[int]) -> list[PartitionInfo]:
    """The partitions with a live active and a copy (replica or warmup) on a gone broker."""
    if not gone:
        return []
    return [part for parts in image.partitions.values() for part in parts if _lost(part, gone)]


def _lost(part: PartitionInfo, gone: frozenset[int]) -> bool:
    return (
        part.active is not None
        and part.active not in gone
        and any(r in gone for r in (*part.replicas, *part.warmups))
    )


class LostCopies:
    """Whether any partition has a copy to re-place (`lost_partitions` is not empty), remembered per table
    while its partitions are the same objects and the gone brokers the same. The controller asks at every
    tick while a broker is gone and at every reassignment: a scan of every partition each time held the
    loop for about a second at 1,000,000 partitions, after every metadata change, for as long as a dead
    broker stayed registered."""

    def __init__(self) -> None:
        self._gone: frozenset[int] = frozenset()
        self._tables: PerTable[bool] = PerTable()

    def any(self, image: MetadataImage, gone: frozenset[int]) -> bool:
        if not gone:
            return False
        if gone != self._gone:
            self._gone, self._tables = gone, PerTable()
        self._tables.forget_gone(image)
        found = False
        for table_id, parts in image.partitions.items():
            lost = self._tables.get(table_id, parts)
            if lost is None:
                lost = any(_lost(part, gone) for part in parts)
                self._tables.keep(table_id, parts, lost)
            found = found or lost
        return found


@dataclass(frozen=True, slots=True)
class ReplaceJob:
    """The inputs of one re-placement: plain immutable data, so a shell may run it off the event loop."""

    image: MetadataImage
    brokers: tuple[ServerInfo, ...]  # the brokers that may get the new copies
    gone: frozenset[int]
    config: AssignorConfig

    def run(self) -> Replacement:
        names = {t.table_id: t for t in self.image.tables.values()}
        placements: dict[PartitionId, Placement] = {}
        ids: dict[PartitionId, tuple[int, int]] = {}
        for part in lost_partitions(self.image, self.gone):
            table = names.get(part.table_id)
            if table is None:
                continue
            pid = PartitionId(table.name, part.partition)
            assert part.active is not None
            placements[pid] = Placement(
                str(part.active),
                tuple(str(s) for s in part.standbys),
                tuple(str(w) for w in part.warmups),
            )
            ids[pid] = (part.table_id, part.partition)
        if not placements or not self.brokers:
            return {}
        result = replace_lost(
            [Server(str(b.node_id), b.rack, dict(b.tags)) for b in self.brokers],
            placements,
            {t.name: assignor_table(t) for t in self.image.tables.values()},
            load_of(self.image),
            self.config,
        )
        return {
            ids[pid]: tuple(int(r) for r in (placed.active, *placed.standbys, *placed.warmups))
            for pid, placed in result.partitions.items()
        }


def replacement_records(
    image: MetadataImage, job: ReplaceJob, wanted: Replacement
) -> list[PartitionAssignment]:
    """One record per partition of `wanted` that is still as the job saw it (a partition changed meanwhile
    is looked at again by the next job). The gone copies leave the replica set; the new ones join it out of
    the ISR and catch up by fetching. Dropping a replica bumps the leader epoch: a gone broker that comes
    back must not fetch its way into the ISR of a replica set it no longer belongs to."""
    # Looked up by position (a partition's number is its index), not by a scan of every partition.
    seen = {key: _partition(job.image, *key) for key in wanted}
    records = []
    for (table_id, partition), replicas in sorted(wanted.items()):
        parts = image.partitions.get(table_id, ())
        if partition >= len(parts):
            continue
        part = parts[partition]
        if part != seen.get((table_id, partition)) or part.active != replicas[0]:
            continue
        warmups = tuple(w for w in part.warmups if w in replicas)
        isr = tuple(r for r in part.isr if r in replicas)
        if not isr:
            continue
        records.append(
            PartitionAssignment(
                table_id,
                partition,
                replicas,
                part.active,
                warmups,
                part.leader_epoch + 1,
                isr,
                part.partition_epoch + 1,
            )
        )
    return records


def _partition(image: MetadataImage, table_id: int, partition: int) -> PartitionInfo | None:
    parts = image.partitions.get(table_id, ())
    return parts[partition] if 0 <= partition < len(parts) else None
