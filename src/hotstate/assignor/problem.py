"""Validate the caller's plain data and index it for the placement rules.

Servers and partitions are numbered in sorted order (servers by id, partitions by (table, partition)),
so every later step can work on small integers and iterate ranges: order never comes from a dict or a
set. Bad input raises ``ValueError`` naming what is wrong; stale references (a previous owner or a lag
report from a server that has left, a partition of a deleted table) are normal in a live cluster and
are dropped with a note in the explanation.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hotstate.assignor.config import AssignorConfig
from hotstate.assignor.model import Assignment, PartitionId, Placement, Server, Table
from hotstate.assignor.tags import TagVector, resolve_locations

NO_SERVER = -1

Previous = Assignment | Mapping[PartitionId, Placement] | None
Lags = Mapping[PartitionId, Mapping[str, int]] | None


@dataclass(frozen=True, slots=True)
class Problem:
    config: AssignorConfig
    server_ids: tuple[str, ...]
    capacities: tuple[int, ...]
    racks: tuple[str | None, ...]
    vectors: tuple[TagVector, ...]
    partitions: tuple[PartitionId, ...]
    table_names: tuple[str, ...]
    table_of: tuple[int, ...]
    standbys_asked: tuple[int, ...]
    sources: tuple[frozenset[str], ...]
    prev_active: tuple[int, ...]
    prev_standbys: tuple[tuple[int, ...], ...]
    prev_warmups: tuple[tuple[int, ...], ...]
    held: tuple[frozenset[int], ...]
    lags: tuple[Mapping[int, int], ...]
    notes: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def num_servers(self) -> int:
        return len(self.server_ids)

    def caught_up(self, p: int, s: int) -> bool:
        lag = self.lags[p].get(s)
        return lag is not None and lag <= self.config.acceptable_recovery_lag


def _index_servers(cluster: Iterable[Server]) -> list[Server]:
    servers = list(cluster)
    for s in servers:
        if not isinstance(s, Server):
            raise ValueError(f"cluster must contain Server objects, got {s!r}")
    if not servers:
        raise ValueError("cluster has no servers: at least one server is needed to place any replica")
    servers.sort(key=lambda s: s.id)
    for a, b in itertools.pairwise(servers):
        if a.id == b.id:
            raise ValueError(f"cluster lists server id {a.id!r} twice")
    return servers


def _index_tables(tables: Iterable[Table]) -> list[Table]:
    out = list(tables)
    for t in out:
        if not isinstance(t, Table):
            raise ValueError(f"tables must contain Table objects, got {t!r}")
    out.sort(key=lambda t: t.name)
    for a, b in itertools.pairwise(out):
        if a.name == b.name:
            raise ValueError(f"tables lists table {a.name!r} twice")
    return out


def _sorted_partition_keys(mapping: Mapping[PartitionId, object], what: str) -> list[PartitionId]:
    for key in mapping:
        if not isinstance(key, PartitionId):
            raise ValueError(f"{what} must be keyed by PartitionId, got key {key!r}")
    return sorted(mapping)


def _previous_map(previous: Previous) -> Mapping[PartitionId, Placement]:
    if previous is None:
        return {}
    if isinstance(previous, Assignment):
        return previous.partitions
    return previous


def build_problem(
    cluster: Iterable[Server],
    tables: Iterable[Table],
    previous: Previous,
    lags: Lags,
    config: AssignorConfig,
) -> Problem:
    if not isinstance(config, AssignorConfig):
        raise ValueError(f"config must be an AssignorConfig, got {config!r}")
    servers = _index_servers(cluster)
    table_list = _index_tables(tables)
    server_ids = tuple(s.id for s in servers)
    index_of = {sid: i for i, sid in enumerate(server_ids)}
    locations = resolve_locations(servers, config.rack_aware_assignment_tags)
    notes: list[str] = []

    partitions: list[PartitionId] = []
    table_of: list[int] = []
    asked: list[int] = []
    sources: list[frozenset[str]] = []
    for ti, table in enumerate(table_list):
        n_standby = (
            config.num_standby_replicas if table.num_standby_replicas is None else table.num_standby_replicas
        )
        if n_standby > len(servers) - 1:
            notes.append(
                f"table {table.name!r} asks for {n_standby} standbys per partition but only "
                f"{len(servers) - 1} other servers exist: placing fewer"
            )
        for part in range(table.partitions):
            partitions.append(PartitionId(table.name, part))
            table_of.append(ti)
            asked.append(n_standby)
            sources.append(frozenset(table.source_racks(part)))
    p_index = {pid: i for i, pid in enumerate(partitions)}

    prev_active = [NO_SERVER] * len(partitions)
    prev_standbys: list[tuple[int, ...]] = [()] * len(partitions)
    prev_warmups: list[tuple[int, ...]] = [()] * len(partitions)
    gone_servers: set[str] = set()
    gone_partitions = 0
    prev_map = _previous_map(previous)
    for pid in _sorted_partition_keys(prev_map, "previous"):
        pa = prev_map[pid]
        if not isinstance(pa, Placement):
            raise ValueError(f"previous[{pid}] must be a Placement, got {type(pa).__name__}")
        p = p_index.get(pid)
        if p is None:
            gone_partitions += 1
            continue
        seen: set[int] = set()

        def live(ids: Iterable[str], seen: set[int] = seen) -> tuple[int, ...]:
            out = []
            for sid in ids:
                s = index_of.get(sid)
                if s is None:
                    gone_servers.add(sid)
                elif s not in seen:
                    seen.add(s)
                    out.append(s)
            return tuple(out)

        active = live((pa.active,))
        prev_active[p] = active[0] if active else NO_SERVER
        prev_standbys[p] = live(pa.standbys)
        prev_warmups[p] = live(pa.warmups)
    if gone_servers:
        names = ", ".join(repr(s) for s in sorted(gone_servers))
        notes.append(f"previous assignment names servers no longer in the cluster ({names}): ignored")
    if gone_partitions:
        notes.append(
            f"previous assignment has {gone_partitions} partitions of unknown tables/partitions: ignored"
        )

    lag_maps: list[dict[int, int]] = [{} for _ in partitions]
    ignored_lags = 0
    lag_input = lags or {}
    for pid in _sorted_partition_keys(lag_input, "lags"):
        per_server = lag_input[pid]
        p = p_index.get(pid)
        for sid in sorted(per_server):
            lag = per_server[sid]
            if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
                raise ValueError(
                    f"lag of partition {pid} on server {sid!r} must be an integer >= 0, got {lag!r}"
                )
            s = index_of.get(sid)
            if p is None or s is None:
                ignored_lags += 1
                continue
            lag_maps[p][s] = lag
    if ignored_lags:
        notes.append(f"{ignored_lags} lag reports for unknown servers or partitions: ignored")
    for p, s in enumerate(prev_active):
        # The active defines the partition's end offset; without a report it is taken to be current.
        if s != NO_SERVER and s not in lag_maps[p]:
            lag_maps[p][s] = 0

    held = tuple(
        frozenset(x for x in (prev_active[p], *prev_standbys[p], *prev_warmups[p]) if x != NO_SERVER)
        for p in range(len(partitions))
    )
    return Problem(
        config=config,
        server_ids=server_ids,
        capacities=tuple(s.capacity for s in servers),
        racks=locations.racks,
        vectors=locations.vectors,
        partitions=tuple(partitions),
        table_names=tuple(t.name for t in table_list),
        table_of=tuple(table_of),
        standbys_asked=tuple(asked),
        sources=tuple(sources),
        prev_active=tuple(prev_active),
        prev_standbys=tuple(prev_standbys),
        prev_warmups=tuple(prev_warmups),
        held=held,
        lags=tuple(lag_maps),
        notes=tuple(notes),
        warnings=locations.warnings,
    )
