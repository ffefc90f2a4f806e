"""Plain frozen data the assignor reads and returns.

Inputs are normalised in ``__post_init__`` (tags and racks become sorted, read-only values) so that two
inputs that mean the same thing compare equal and iterate in the same order, whatever order the caller
built them in: the assignor's output must not depend on dict or set order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

AssignedRole = Literal["active", "standby", "warmup"]
SpreadLevel = Literal["ideal", "partial", "least_loaded"]


def _frozen_str_tuple(values: Iterable[str], what: str) -> tuple[str, ...]:
    if isinstance(values, str):
        # A bare string is iterable too; treating "az-a" as the racks a, z, -, a would be a silent bug.
        raise ValueError(f"{what} must be a collection of strings, got the string {values!r}")
    out = tuple(sorted(set(values)))
    for v in out:
        if not isinstance(v, str) or not v:
            raise ValueError(f"{what} must contain non-empty strings, got {v!r}")
    return out


@dataclass(frozen=True, order=True, slots=True)
class PartitionId:
    """One partition of one table; orders by (table, partition)."""

    table: str
    partition: int

    def __str__(self) -> str:
        return f"{self.table}-{self.partition}"


@dataclass(frozen=True, slots=True)
class Server:
    """A broker that can host replicas.

    ``capacity`` weights balance (a server with capacity 2 gets twice the actives of one with 1), as
    the number of stream threads does in Kafka Streams. ``rack`` is the server's rack (availability
    zone); it also counts as the tag ``rack`` for standby spread unless ``tags`` has its own ``rack``.
    """

    id: str
    rack: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict, hash=False)
    capacity: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Server.id must be a non-empty string, got {self.id!r}")
        if self.rack is not None and (not isinstance(self.rack, str) or not self.rack):
            raise ValueError(
                f"Server {self.id!r}: rack must be a non-empty string or None, got {self.rack!r}"
            )
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int) or self.capacity <= 0:
            raise ValueError(f"Server {self.id!r}: capacity must be an integer > 0, got {self.capacity!r}")
        tags = dict(self.tags)
        for key, value in tags.items():
            if not isinstance(key, str) or not key or not isinstance(value, str):
                raise ValueError(
                    f"Server {self.id!r}: tags must map non-empty strings to strings, got {key!r}: {value!r}"
                )
        object.__setattr__(self, "tags", MappingProxyType(dict(sorted(tags.items()))))


@dataclass(frozen=True, slots=True)
class Table:
    """A table to place: ``partitions`` partitions numbered 0..partitions-1.

    ``num_standby_replicas`` overrides the config default for this table. ``writer_racks`` are the racks
    the table's writers (Spark sinks) run in; ``partition_racks`` gives per-partition source racks where
    they are known and wins over ``writer_racks`` for those partitions.
    """

    name: str
    partitions: int
    num_standby_replicas: int | None = None
    writer_racks: tuple[str, ...] = ()
    partition_racks: Mapping[int, tuple[str, ...]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Table.name must be a non-empty string, got {self.name!r}")
        if isinstance(self.partitions, bool) or not isinstance(self.partitions, int) or self.partitions < 1:
            raise ValueError(
                f"Table {self.name!r}: partitions must be an integer >= 1, got {self.partitions!r}"
            )
        n = self.num_standby_replicas
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ValueError(
                f"Table {self.name!r}: num_standby_replicas must be None or an integer >= 0, got {n!r}"
            )
        object.__setattr__(
            self, "writer_racks", _frozen_str_tuple(self.writer_racks, f"Table {self.name!r}: writer_racks")
        )
        racks: dict[int, tuple[str, ...]] = {}
        for part, part_racks in dict(self.partition_racks).items():
            if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part < self.partitions:
                raise ValueError(
                    f"Table {self.name!r}: partition_racks has partition {part!r}, "
                    f"allowed are 0..{self.partitions - 1}"
                )
            racks[part] = _frozen_str_tuple(part_racks, f"Table {self.name!r}: partition_racks[{part}]")
        object.__setattr__(self, "partition_racks", MappingProxyType(dict(sorted(racks.items()))))

    def source_racks(self, partition: int) -> tuple[str, ...]:
        """Racks the partition's records come from (empty: unknown)."""
        return self.partition_racks.get(partition, self.writer_racks)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one partition's replicas live. ``standbys`` are in placement order (first standby first)."""

    active: str
    standbys: tuple[str, ...] = ()
    warmups: tuple[str, ...] = ()

    def replicas(self) -> tuple[str, ...]:
        return (self.active, *self.standbys, *self.warmups)


@dataclass(frozen=True, slots=True)
class ReplicaReason:
    """Why one replica is where it is.

    ``reason`` is a stable code (see ``explain.REASONS``); ``detail`` is the human sentence; ``cost`` is
    the replica's KIP-925 edge cost (traffic_cost x cross-rack + non_overlap_cost x newly placed).
    """

    partition: PartitionId
    server: str
    role: AssignedRole
    reason: str
    detail: str
    cost: int
    spread: SpreadLevel | None = None
    target: str | None = None


@dataclass(frozen=True, slots=True)
class CostSummary:
    """KIP-925 costs of the result, and of the plain balanced assignment it must not exceed.

    ``active_target`` is the balanced placement the flow chose (what the actives converge to);
    ``active_baseline`` is the plain (rack-blind, sticky, balanced) placement for the same input.
    """

    active_target: int
    active_baseline: int
    active: int
    standby: int
    standby_baseline: int
    cross_rack_actives: int


@dataclass(frozen=True, slots=True)
class Explanation:
    replicas: tuple[ReplicaReason, ...]
    notes: tuple[str, ...]
    warnings: tuple[str, ...]
    cost: CostSummary
    strategy: str


@dataclass(frozen=True, slots=True)
class Assignment:
    """The assignor's output: per partition its replicas, and why."""

    partitions: Mapping[PartitionId, Placement] = field(hash=False)
    explanation: Explanation = field(hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "partitions", MappingProxyType(dict(sorted(self.partitions.items()))))

    def actives_by_server(self) -> dict[str, list[PartitionId]]:
        out: dict[str, list[PartitionId]] = {}
        for pid, pa in self.partitions.items():
            out.setdefault(pa.active, []).append(pid)
        return out
