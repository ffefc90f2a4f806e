"""The metadata image: the cluster as the committed metadata log describes it at one offset.

Immutable, so any reader (router, replicas, the HTTP API) can hold one without locks while the next is
built. `ImageBuilder` applies records copy-on-write per part (servers, tables, one table's partitions),
so a heartbeat-driven change does not copy a million partitions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Generic, TypeVar

from hotstate.controller.records import (
    CreateTable,
    DeleteTable,
    DrainServer,
    Endpoint,
    FenceServer,
    KeyColumn,
    MetadataRecord,
    NoOp,
    PartitionAssignment,
    PartitionBlock,
    PartitionChange,
    RegisterServer,
    ReplaceTable,
    TableBatch,
    TableTtl,
    TableValueColumns,
    TableWindow,
    TableWriters,
    UnfenceServer,
    UnregisterServer,
    ValueColumn,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ServerInfo:
    node_id: int
    incarnation_id: str
    rpc: Endpoint
    http: Endpoint | None
    rack: str | None
    tags: tuple[tuple[str, str], ...]
    roles: tuple[str, ...]
    fenced: bool
    # Offset of the last record that changed this server's registration or fencing: a server is caught
    # up enough to be unfenced once its own image is past it.
    changed_at: int
    # Being removed (`hotstate server remove`): gets no new replica, loses the ones it has, then is
    # unregistered.
    draining: bool = False

    @property
    def is_broker(self) -> bool:
        return "broker" in self.roles


@dataclass(frozen=True, slots=True)
class TableInfo:
    name: str
    table_id: int
    partitions: int
    standby_replicas: int
    key_columns: tuple[KeyColumn, ...]
    acceptable_lag: int | None
    writer_racks: tuple[str, ...] = ()  # where its writers run (sorted): the assignor's traffic cost
    # The last Spark batch committed into it (-1: none) and every partition's position then (TableBatch).
    batch_id: int = -1
    batch_positions: tuple[int, ...] = ()
    # Its value columns as its latest writer declared them (TableValueColumns); () when none did.
    value_columns: tuple[ValueColumn, ...] = ()
    # Not "": a staged generation of that table (an overwrite being loaded), not a table of its own.
    staging_for: str = ""
    # Where the overwrite that made this generation ended, per partition (ReplaceTable.positions): the
    # least store position a replica serves it from. () for a table made by CreateTable.
    loaded_positions: tuple[int, ...] = ()
    # A windowed table's windows (CreateTable.window); None: not windowed.
    window: TableWindow | None = None
    # A plain table's time to live (CreateTable.ttl); None: none.
    ttl: TableTtl | None = None

    @property
    def staged(self) -> bool:
        return bool(self.staging_for)

    @classmethod
    def created(cls, record: CreateTable) -> TableInfo:
        """The table as its CreateTable record makes it."""
        return cls(
            record.name,
            record.table_id,
            record.partitions,
            record.standby_replicas,
            record.key_columns,
            record.acceptable_lag,
            tuple(sorted(set(record.writer_racks))),
            staging_for=record.staging_for,
            loaded_positions=record.loaded_positions,
            window=record.window,
            ttl=record.ttl,
        )

    def create_record(self) -> CreateTable:
        """The CreateTable record that makes this table (its batch and value columns are records of their
        own)."""
        return CreateTable(
            self.name,
            self.table_id,
            self.partitions,
            self.standby_replicas,
            self.key_columns,
            self.acceptable_lag,
            self.writer_racks,
            self.staging_for,
            self.loaded_positions,
            self.window,
            self.ttl,
        )


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    table_id: int
    partition: int
    replicas: tuple[int, ...]
    active: int | None
    warmups: tuple[int, ...]
    leader_epoch: int
    isr: tuple[int, ...]
    # Goes up with every change of the partition: an ISR change request names the state it was based on, so
    # a late or repeated one can never apply to a newer state (KIP-497's partition epoch).
    partition_epoch: int = 0

    @property
    def standbys(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r != self.active and r not in self.warmups)


_EMPTY_SERVERS: Mapping[int, ServerInfo] = MappingProxyType({})
_EMPTY_TABLES: Mapping[str, TableInfo] = MappingProxyType({})
_EMPTY_PARTITIONS: Mapping[int, tuple[PartitionInfo, ...]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class MetadataImage:
    offset: int  # every committed entry below this offset is reflected
    servers: Mapping[int, ServerInfo]
    tables: Mapping[str, TableInfo]
    partitions: Mapping[int, tuple[PartitionInfo, ...]]  # by table id; index = partition number
    next_table_id: int = 1
    # Node ids unregistered for good: a server registering under one is refused.
    removed: frozenset[int] = frozenset()

    @staticmethod
    def empty() -> MetadataImage:
        return MetadataImage(0, _EMPTY_SERVERS, _EMPTY_TABLES, _EMPTY_PARTITIONS)

    def partitions_of(self, table: str) -> tuple[PartitionInfo, ...]:
        info = self.tables.get(table)
        return () if info is None else self.partitions.get(info.table_id, ())

    def tables_listed(self) -> list[str]:
        """The tables' names, sorted, without the generations staged for overwrites."""
        return sorted(name for name, table in self.tables.items() if not table.staged)

    def staged_for(self, table: str) -> list[TableInfo]:
        """The generations staged to replace `table`, oldest first."""
        staged = (t for t in self.tables.values() if t.staging_for == table)
        return sorted(staged, key=lambda t: t.table_id)

    def live_brokers(self) -> list[ServerInfo]:
        return [s for _, s in sorted(self.servers.items()) if s.is_broker and not s.fenced]

    def placement_brokers(self) -> list[ServerInfo]:
        """The live brokers that may get replicas: the draining ones only give theirs away."""
        return [s for s in self.live_brokers() if not s.draining]

    def holds_replicas(self, node_id: int) -> bool:
        return any(
            node_id in part.replicas or node_id in part.isr or node_id in part.warmups
            for parts in self.partitions.values()
            for part in parts
        )

    def partition_count(self) -> int:
        return sum(len(parts) for parts in self.partitions.values())


class PerTable(Generic[T]):
    """A value per table, kept while the table's partitions are the same objects: the image is
    copy-on-write, so a table whose partitions tuple is unchanged needs no new look. What a server or the
    controller derives from every partition (copy counts, whether any copy is lost) is then worked out
    again only for the tables that changed, not for a million partitions at every ask."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[tuple[PartitionInfo, ...], T]] = {}

    def get(self, table_id: int, parts: tuple[PartitionInfo, ...]) -> T | None:
        """The value kept for exactly these partitions of the table, or None."""
        kept = self._kept.get(table_id)
        return kept[1] if kept is not None and kept[0] is parts else None

    def keep(self, table_id: int, parts: tuple[PartitionInfo, ...], value: T) -> None:
        self._kept[table_id] = (parts, value)

    def forget_gone(self, image: MetadataImage) -> None:
        """Drop the tables `image` no longer has: their partitions are not held alive."""
        for table_id in [t for t in self._kept if t not in image.partitions]:
            del self._kept[table_id]


class ImageBuilder:
    """Applies records on top of an image; `build` hands out a new immutable image."""

    def __init__(self, image: MetadataImage) -> None:
        self._reset(image)

    def _reset(self, image: MetadataImage) -> None:
        self._base = image
        self._servers: dict[int, ServerInfo] | None = None
        self._tables: dict[str, TableInfo] | None = None
        self._partitions: dict[int, tuple[PartitionInfo, ...]] | None = None
        self._changed_parts: dict[int, list[PartitionInfo]] = {}
        self._next_table_id = image.next_table_id
        self._removed = image.removed

    # Copy each part only the first time a record touches it.
    def _servers_w(self) -> dict[int, ServerInfo]:
        if self._servers is None:
            self._servers = dict(self._base.servers)
        return self._servers

    def _tables_w(self) -> dict[str, TableInfo]:
        if self._tables is None:
            self._tables = dict(self._base.tables)
        return self._tables

    def _partitions_w(self) -> dict[int, tuple[PartitionInfo, ...]]:
        if self._partitions is None:
            self._partitions = dict(self._base.partitions)
        return self._partitions

    def _table_parts_w(self, table_id: int) -> list[PartitionInfo] | None:
        parts = self._changed_parts.get(table_id)
        if parts is None:
            current = (self._partitions if self._partitions is not None else self._base.partitions).get(
                table_id
            )
            if current is None:
                return None
            parts = list(current)
            self._changed_parts[table_id] = parts
        return parts

    def servers(self) -> Mapping[int, ServerInfo]:
        return self._servers if self._servers is not None else self._base.servers

    def tables(self) -> Mapping[str, TableInfo]:
        return self._tables if self._tables is not None else self._base.tables

    def apply_all(self, records: Iterable[MetadataRecord], offset: int) -> None:
        for record in records:
            self.apply(record, offset)

    def apply(
        self, record: MetadataRecord, offset: int, built: Sequence[PartitionInfo] | None = None
    ) -> None:
        """Apply one committed record found at `offset` of the metadata log. `built`: a PartitionBlock's
        partitions, already built from it (off the event loop), so they are not built again here."""
        match record:
            case RegisterServer():
                existing = self._servers_w().get(record.node_id)
                self._servers_w()[record.node_id] = ServerInfo(
                    record.node_id,
                    record.incarnation_id,
                    record.rpc,
                    record.http,
                    record.rack,
                    record.tags,
                    record.roles,
                    fenced=True,  # a (re)registered server serves only once it has caught up
                    changed_at=offset,
                    # A restart does not call off its removal.
                    draining=existing is not None and existing.draining,
                )
            case UnregisterServer(node_id):
                self._servers_w().pop(node_id, None)
                self._removed = self._removed | {node_id}
            case DrainServer(node_id):
                servers = self._servers_w()
                server = servers.get(node_id)
                if server is not None:
                    servers[node_id] = replace(server, draining=True, changed_at=offset)
            case FenceServer(node_id, _):
                self._set_fenced(node_id, True, offset)
            case UnfenceServer(node_id):
                self._set_fenced(node_id, False, offset)
            case CreateTable():
                tables = self._tables_w()
                if record.name in tables:
                    log.warning(
                        "metadata offset %d: table %r already exists; record skipped", offset, record.name
                    )
                    return
                tables[record.name] = TableInfo.created(record)
                self._next_table_id = max(self._next_table_id, record.table_id + 1)
                self._partitions_w()[record.table_id] = ()
                self._changed_parts[record.table_id] = []
            case DeleteTable(name, table_id):
                tables = self._tables_w()
                if name in tables and tables[name].table_id == table_id:
                    del tables[name]
                    self._partitions_w().pop(table_id, None)
                    self._changed_parts.pop(table_id, None)
            case ReplaceTable(name, table_id, replaced_id, positions):
                self._replace_table(name, table_id, replaced_id, positions, offset)
            case TableWriters(table_id, writer_racks):
                racks = tuple(sorted(set(writer_racks)))
                self._change_table(table_id, offset, "writers", lambda t: replace(t, writer_racks=racks))
            case TableValueColumns(table_id, value_columns):
                self._change_table(
                    table_id, offset, "value columns", lambda t: replace(t, value_columns=value_columns)
                )
            case TableBatch(table_id, batch_id, positions):
                self._change_table(
                    table_id,
                    offset,
                    "a batch",
                    lambda t: replace(t, batch_id=batch_id, batch_positions=positions),
                )
            case PartitionAssignment():
                parts = self._table_parts_w(record.table_id)
                if parts is None:
                    log.warning(
                        "metadata offset %d: assignment for unknown table %d", offset, record.table_id
                    )
                    return
                info = PartitionInfo(
                    record.table_id,
                    record.partition,
                    record.replicas,
                    record.active,
                    record.warmups,
                    record.leader_epoch,
                    record.isr,
                    record.partition_epoch,
                )
                if record.partition == len(parts):
                    parts.append(info)
                elif record.partition < len(parts):
                    parts[record.partition] = info
                else:
                    log.warning("metadata offset %d: partition %d out of order", offset, record.partition)
            case PartitionBlock():
                parts = self._table_parts_w(record.table_id)
                if parts is None:
                    log.warning("metadata offset %d: partitions of unknown table %d", offset, record.table_id)
                    return
                if record.first > len(parts):
                    log.warning("metadata offset %d: partition %d out of order", offset, record.first)
                    return
                try:
                    block = list(built) if built is not None else block_partitions(record)
                except ValueError as error:
                    log.warning("metadata offset %d: %s", offset, error)
                    return
                end = record.first + len(block)
                parts[record.first : min(end, len(parts))] = block
            case PartitionChange():
                parts = self._table_parts_w(record.table_id)
                if parts is None or record.partition >= len(parts):
                    log.warning(
                        "metadata offset %d: change for unknown partition %d", offset, record.partition
                    )
                    return
                old = parts[record.partition]
                parts[record.partition] = replace(
                    old,
                    active=record.active,
                    leader_epoch=record.leader_epoch,
                    isr=record.isr,
                    partition_epoch=old.partition_epoch + 1,
                )
            case NoOp():
                pass

    def _change_table(
        self, table_id: int, offset: int, what: str, change: Callable[[TableInfo], TableInfo]
    ) -> None:
        """A record that changes a table found by id; one of a table no longer there is skipped."""
        tables = self._tables_w()
        found = next((t for t in tables.values() if t.table_id == table_id), None)
        if found is None:
            log.warning("metadata offset %d: %s of unknown table %d", offset, what, table_id)
            return
        tables[found.name] = change(found)

    def _replace_table(
        self, name: str, table_id: int, replaced_id: int, positions: tuple[int, ...], offset: int
    ) -> None:
        tables = self._tables_w()
        staged = next((t for t in tables.values() if t.table_id == table_id), None)
        current = tables.get(name)
        if staged is None or staged.staging_for != name:
            log.warning("metadata offset %d: no generation %d staged for %r; skipped", offset, table_id, name)
            return
        if (-1 if current is None else current.table_id) != replaced_id:
            log.warning("metadata offset %d: %r is not generation %d; skipped", offset, name, replaced_id)
            return
        del tables[staged.name]
        if current is not None:
            self._partitions_w().pop(current.table_id, None)
            self._changed_parts.pop(current.table_id, None)
        tables[name] = replace(staged, name=name, staging_for="", loaded_positions=positions)

    def _set_fenced(self, node_id: int, fenced: bool, offset: int) -> None:
        servers = self._servers_w()
        server = servers.get(node_id)
        if server is not None:
            servers[node_id] = replace(server, fenced=fenced, changed_at=offset)

    def build(self, offset: int) -> MetadataImage:
        partitions = self._partitions
        if self._changed_parts:
            partitions = self._partitions_w()
            for table_id, parts in self._changed_parts.items():
                partitions[table_id] = tuple(parts)
        image = MetadataImage(
            offset,
            MappingProxyType(self._servers) if self._servers is not None else self._base.servers,
            MappingProxyType(self._tables) if self._tables is not None else self._base.tables,
            MappingProxyType(partitions) if partitions is not None else self._base.partitions,
            self._next_table_id,
            self._removed,
        )
        self._reset(image)  # the next round starts from the new image
        return image

    def set_next_table_id(self, next_table_id: int) -> None:
        self._next_table_id = max(self._next_table_id, next_table_id)


def partition_block(table_id: int, parts: Sequence[PartitionInfo]) -> PartitionBlock:
    """`parts` (consecutive partitions of one table) as one columnar record."""
    replicas: list[int] = []
    isr: list[int] = []
    warmups: list[int] = []
    for part in parts:
        replicas.extend(part.replicas)
        isr.extend(part.isr)
        warmups.extend(part.warmups)
    return PartitionBlock(
        table_id,
        parts[0].partition if parts else 0,
        tuple(-1 if p.active is None else p.active for p in parts),
        tuple(p.leader_epoch for p in parts),
        tuple(p.partition_epoch for p in parts),
        tuple(len(p.replicas) for p in parts),
        tuple(replicas),
        tuple(len(p.isr) for p in parts),
        tuple(isr),
        tuple(len(p.warmups) for p in parts),
        tuple(warmups),
    )


def block_partitions(block: PartitionBlock) -> list[PartitionInfo]:
    """The partitions a PartitionBlock holds. Replica tuples repeat across partitions (a table over a few
    servers has few distinct sets), so equal ones are shared rather than kept once per partition."""
    return list(iter_block_partitions(block))


def iter_block_partitions(block: PartitionBlock) -> Iterator[PartitionInfo]:
    """`block_partitions` one at a time (a shell may build a big block in steps). Checks the columns first:
    ValueError if their lengths disagree."""
    n = len(block.actives)
    columns = (
        block.leader_epochs,
        block.partition_epochs,
        block.replica_counts,
        block.isr_counts,
        block.warmup_counts,
    )
    if any(len(column) != n for column in columns) or (
        sum(block.replica_counts) != len(block.replicas)
        or sum(block.isr_counts) != len(block.isr)
        or sum(block.warmup_counts) != len(block.warmups)
    ):
        raise ValueError(f"partition block of table {block.table_id}: columns of different lengths")
    return _block_items(block)


def _block_items(block: PartitionBlock) -> Iterator[PartitionInfo]:
    n = len(block.actives)
    widths = set(block.replica_counts)
    if (
        len(widths) == 1
        and 0 not in widths
        and block.isr == block.replicas
        and not block.warmups
        and -1 not in block.actives
    ):
        # The common shape (every partition fully in sync, all with the same number of replicas): the
        # replica tuples are cut in C, and the ISR is the same tuple.
        (width,) = widths
        return _uniform_items(block, width, n)
    return _general_items(block)


def _uniform_items(block: PartitionBlock, width: int, n: int) -> Iterator[PartitionInfo]:
    shared: dict[tuple[int, ...], tuple[int, ...]] = {}
    rows = (shared.setdefault(r, r) for r in zip(*[iter(block.replicas)] * width, strict=False))
    table_id = block.table_id
    for partition, r, a, e, pe in zip(
        range(block.first, block.first + n),
        rows,
        block.actives,
        block.leader_epochs,
        block.partition_epochs,
        strict=True,
    ):
        yield PartitionInfo(table_id, partition, r, a, (), e, r, pe)


def _general_items(block: PartitionBlock) -> Iterator[PartitionInfo]:
    shared: dict[tuple[int, ...], tuple[int, ...]] = {}
    table_id = block.table_id
    partition = block.first
    at_r = at_i = at_w = 0
    replicas, isr, warmups = block.replicas, block.isr, block.warmups
    for a, e, pe, nr, ni, nw in zip(
        block.actives,
        block.leader_epochs,
        block.partition_epochs,
        block.replica_counts,
        block.isr_counts,
        block.warmup_counts,
        strict=True,
    ):
        r = replicas[at_r : at_r + nr]
        i = isr[at_i : at_i + ni]
        w = warmups[at_w : at_w + nw]
        at_r += nr
        at_i += ni
        at_w += nw
        yield PartitionInfo(
            table_id,
            partition,
            shared.setdefault(r, r),
            None if a < 0 else a,
            shared.setdefault(w, w),
            e,
            shared.setdefault(i, i),
            pe,
        )
        partition += 1


def image_records(image: MetadataImage) -> list[MetadataRecord]:
    """Records that rebuild `image` from empty: what a metadata snapshot holds."""
    records: list[MetadataRecord] = []
    for node_id, server in sorted(image.servers.items()):
        records.append(
            RegisterServer(
                node_id,
                server.incarnation_id,
                server.rpc,
                server.http,
                server.rack,
                server.tags,
                server.roles,
            )
        )
        if not server.fenced:
            records.append(UnfenceServer(node_id))
        if server.draining:
            records.append(DrainServer(node_id))
    records.extend(UnregisterServer(node_id) for node_id in sorted(image.removed))
    for table in sorted(image.tables.values(), key=lambda t: t.table_id):
        records.append(table.create_record())
        if table.batch_id >= 0:
            records.append(TableBatch(table.table_id, table.batch_id, table.batch_positions))
        if table.value_columns:
            records.append(TableValueColumns(table.table_id, table.value_columns))
        parts = image.partitions.get(table.table_id, ())
        if parts:
            records.append(partition_block(table.table_id, parts))
    return records
