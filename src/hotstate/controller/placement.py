"""Where a new table's partitions go: incremental placement (hotstate.assignor.incremental) over the live
brokers.

Only the new table is decided, against the replicas each broker holds now (`load_of`), so the time is
linear in the new table's partitions whatever the cluster holds; nothing existing moves (balancing existing
partitions is controller/reassign.py's job, with warmups and safe steps, once the cluster is settled).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Any

import msgpack

from hotstate.assignor import AssignorConfig, PartitionId, Placement, Server, Table
from hotstate.assignor.incremental import Load, place_new_table
from hotstate.controller.codec import RECORDS
from hotstate.controller.image import MetadataImage, PartitionInfo, ServerInfo, TableInfo
from hotstate.controller.records import PartitionBlock

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PreparedPlacement:
    """A placement computed from a `PlacementJob`: the brokers it placed over, each partition's replicas
    (active first), and the partitions as the image will hold them (built off the loop too)."""

    brokers: tuple[int, ...]
    table_id: int
    parts: tuple[PartitionInfo, ...]
    # The parts as the records that write them, `BLOCK_PARTITIONS` each, and each record's msgpack bytes
    # (for `encode_batch(..., packed)`): a bounded step each to encode here and to decode on every server.
    records: tuple[PartitionBlock, ...]
    packed: tuple[bytes, ...]

    def packed_by_id(self) -> dict[int, bytes]:
        return {id(r): b for r, b in zip(self.records, self.packed, strict=True)}


# Partitions per PartitionBlock of a new table: about 10 ms to encode or decode one on 2 loaded cores.
BLOCK_PARTITIONS = 10_000


@dataclass(frozen=True, slots=True)
class PlacementJob:
    """The inputs of one new table's placement: plain immutable data, so a shell may run it off the event
    loop (`run`: about a second for 100,000 partitions, 2 cores); the controller checks the answer against
    its view before writing it (`fits`)."""

    image: MetadataImage  # immutable: the load is counted from it in `run`, off the loop too
    brokers: tuple[ServerInfo, ...]
    table: TableInfo
    config: AssignorConfig

    def run(self) -> PreparedPlacement:
        """Everything in the calling thread (a worker thread, or the loop for small tables)."""
        return self.finish(place_encoded(self.inputs()))

    def inputs(self) -> bytes:
        """The placement's plain inputs, msgpack-encoded for `place_encoded` in another process. Counting
        the load reads every partition of the image: call it off the loop too."""
        load = load_of(self.image)
        return msgpack.packb(
            [
                [[str(b.node_id), b.rack, [list(t) for t in b.tags]] for b in self.brokers],
                [
                    self.table.name,
                    self.table.partitions,
                    self.table.standby_replicas,
                    list(self.table.writer_racks),
                ],
                [list(load.actives.items()), list(load.standbys.items())],
                config_items(self.config),
            ],
            use_bin_type=True,
        )

    def finish(self, placed: bytes) -> PreparedPlacement:
        """`place_encoded`'s answer as the partitions, their records and their bytes."""
        width, flat = self.decode(placed)
        count = len(flat) // width
        blocks = [
            self.block(width, flat, start, min(count, start + BLOCK_PARTITIONS))
            for start in range(0, count, BLOCK_PARTITIONS)
        ]
        return self.prepared(self.partitions(width, flat, 0, count), blocks)

    @staticmethod
    def decode(placed: bytes) -> tuple[int, list[int]]:
        width, flat = msgpack.unpackb(placed)
        return width, flat

    def partitions(self, width: int, flat: list[int], start: int, stop: int) -> list[PartitionInfo]:
        """Partitions start..stop-1 of the answer (a shell may build them a few thousand at a time)."""
        table_id = self.table.table_id
        out = []
        shared: dict[tuple[int, ...], tuple[int, ...]] = {}
        for p in range(start, stop):
            replicas = tuple(flat[p * width : (p + 1) * width])
            r = shared.setdefault(replicas, replicas)
            # A new partition has no state anywhere: every replica starts empty and in sync, epoch 0.
            out.append(PartitionInfo(table_id, p, r, r[0], (), 0, r, 0))
        return out

    def block(self, width: int, flat: list[int], start: int, stop: int) -> tuple[PartitionBlock, bytes]:
        """Partitions start..stop-1 of the answer as one record, and its bytes (a shell may make them a
        block at a time, yielding between)."""
        n = stop - start
        replicas = tuple(flat[start * width : stop * width])
        block = PartitionBlock(
            self.table.table_id,
            start,
            replicas[::width],
            (0,) * n,
            (0,) * n,
            (width,) * n,
            replicas,
            (width,) * n,
            replicas,
            (0,) * n,
            (),
        )
        return block, RECORDS.encode(block)

    def prepared(
        self, parts: list[PartitionInfo], blocks: list[tuple[PartitionBlock, bytes]]
    ) -> PreparedPlacement:
        broker_ids = tuple(b.node_id for b in self.brokers)
        return PreparedPlacement(
            broker_ids,
            self.table.table_id,
            tuple(parts),
            tuple(b for b, _ in blocks),
            tuple(data for _, data in blocks),
        )

    def fits(self, image: MetadataImage, prepared: PreparedPlacement) -> bool:
        """Whether `prepared` may be written to `image`: same placement brokers and table id (what others
        created meanwhile only makes the load it balanced against a little stale)."""
        return prepared.table_id == self.table.table_id and prepared.brokers == tuple(
            b.node_id for b in image.placement_brokers()
        )


def config_items(config: AssignorConfig) -> list[list[Any]]:
    """The assignor's settings as plain msgpack data, for a worker process (`config_from_items`)."""
    return [[f.name, getattr(config, f.name)] for f in fields(config)]


def config_from_items(items: list[list[Any]]) -> AssignorConfig:
    settings: dict[str, Any] = {
        key: tuple(value) if isinstance(value, list) else value for key, value in items
    }
    return AssignorConfig(**settings)


def place_encoded(inputs: bytes) -> bytes:
    """`PlacementJob.inputs` placed (pure: runs in any process): msgpack [replicas per partition, every
    partition's replicas one after the other, active first]. Node ids are ints in and out."""
    brokers, table, load, config = msgpack.unpackb(inputs)
    name, partitions, standbys, writer_racks = table
    result = place_new_table(
        [Server(node, rack, dict(tags)) for node, rack, tags in brokers],
        Table(name, partitions, standbys, tuple(writer_racks)),
        Load(dict(load[0]), dict(load[1])),
        config_from_items(config),
    )
    for note in result.notes:
        log.info("placing table %r: %s", name, note)
    width = 1 + min(standbys, len(brokers) - 1)
    flat: list[int] = []
    for partition in range(partitions):
        placed = result.partitions[PartitionId(name, partition)]
        flat.append(int(placed.active))
        flat.extend(int(s) for s in placed.standbys)
    return msgpack.packb([width, flat], use_bin_type=True)


def placement_job(
    image: MetadataImage, table: TableInfo, config: AssignorConfig | None = None
) -> PlacementJob:
    return PlacementJob(image, tuple(image.placement_brokers()), table, config or AssignorConfig())


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
                out[PartitionId(name, part.partition)] = placement_of(part)
    return out


def placement_of(part: PartitionInfo) -> Placement:
    assert part.active is not None
    return Placement(
        str(part.active), tuple(str(s) for s in part.standbys), tuple(str(w) for w in part.warmups)
    )
