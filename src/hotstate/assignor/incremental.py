"""Incremental placement: one new table, or the copies lost servers held, placed against the load as it is.

`assign` re-runs every table (about 7 s at 100,000 partitions); placing a new table that way costs as much
as the whole cluster. Here only the new partitions are decided, each against per-server replica counts that
the caller passes in (`Load`), so the time is linear in the new partitions (times the number of racks or tag
groups), whatever else the cluster holds. Nothing existing moves: balancing existing partitions is the whole
assignor's job (`assign`, the controller's periodic reassignment).

The rules, each a small function below with its own test (tests/assignor/test_incremental.py):

- `active_order`: an active goes to the least loaded server by actives per capacity unit, after taking it
  (so floor/ceil balance holds when the load was balanced); among equally loaded servers the cheaper one
  by KIP-925 traffic (in a source rack; strategy `none` ignores racks), then the server id;
- `standby_count`: min(asked, servers - 1), never two replicas of a partition on one server;
- `standby_order`: a standby goes to the server that spreads best over `rack.aware.assignment.tags` (new
  values on as many keys as possible, the `tags.spread_score`), then the least loaded by standbys per
  capacity unit, then traffic cost, then id; every partition's first standby is placed before any second;
- `replace_lost`: a partition that lost replicas with a server keeps its active (the controller elected a
  live one at the fence) and its live standbys, and gets new standbys by `standby_order` up to its count.

Pure: plain frozen data in, placements out; deterministic (servers indexed in id order, explicit keys).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from hotstate.assignor.config import AssignorConfig
from hotstate.assignor.model import PartitionId, Placement, Server, Table
from hotstate.assignor.tags import TagVector, effective_rack, spread_score, tag_vector, used_values


def _frozen_counts(counts: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(sorted(counts.items())))


@dataclass(frozen=True, slots=True)
class Load:
    """Replicas each server holds now, by role: the counts the new replicas are balanced against.
    Warmups count as standbys (a copy that is not the active)."""

    actives: Mapping[str, int] = field(default_factory=dict, hash=False)
    standbys: Mapping[str, int] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "actives", _frozen_counts(self.actives))
        object.__setattr__(self, "standbys", _frozen_counts(self.standbys))

    @staticmethod
    def of(placements: Iterable[Placement]) -> Load:
        actives: dict[str, int] = {}
        standbys: dict[str, int] = {}
        for placed in placements:
            actives[placed.active] = actives.get(placed.active, 0) + 1
            for s in (*placed.standbys, *placed.warmups):
                standbys[s] = standbys.get(s, 0) + 1
        return Load(actives, standbys)


@dataclass(frozen=True, slots=True)
class IncrementalPlacement:
    """Placements of the partitions decided, and notes on what could not be done as asked."""

    partitions: Mapping[PartitionId, Placement]
    notes: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------- rules
def load_key(count: int, capacity: int) -> float:
    """A server's load after it takes one more replica, per capacity unit: the balance order."""
    return (count + 1) / capacity


def traffic(rack: str | None, sources: Sequence[str], config: AssignorConfig) -> int:
    """KIP-925 traffic cost of a replica on a server in `rack` (unknown sources or strategy none: 0)."""
    if config.rack_aware_assignment_strategy == "none" or not sources or rack in sources:
        return 0
    return config.traffic_cost


def active_order(count: int, capacity: int, cost: int, index: int) -> tuple[float, int, int]:
    """Sort key of a server for an active: least loaded, then cheapest, then id order."""
    return (load_key(count, capacity), cost, index)


def standby_count(table: Table, config: AssignorConfig, servers: int) -> int:
    """How many standbys each partition of `table` gets: as asked, but never two replicas on one server."""
    asked = config.num_standby_replicas if table.num_standby_replicas is None else table.num_standby_replicas
    return max(0, min(asked, servers - 1))


def standby_order(
    vector: TagVector,
    used: Sequence[set[str | None]],
    count: int,
    capacity: int,
    cost: int,
    after_active: int,
) -> tuple[int, int, float, int, int]:
    """Sort key of a server for a standby: best spread first (KIP-708), then least loaded, cheapest, then
    the first server after the active in id order (`after_active`: (index - active's index) mod servers).
    That last tie-break chooses between groups of alike servers (within a group the heap's least loaded,
    then lowest id, wins): it spreads one server's partitions' standbys over several racks' servers rather
    than always the first one, so a lost server's copies are rebuilt from more than one partner."""
    count_new, mask = spread_score(vector, used)
    return (-count_new, -mask, load_key(count, capacity), cost, after_active)


# ---------------------------------------------------------------------------------------------- engine
class _Servers:
    """The servers in id order, grouped by (tag vector, rack): servers of one group are alike for spread
    and cost, so each group keeps a heap by load and a choice looks at one candidate per group."""

    def __init__(self, servers: Sequence[Server], config: AssignorConfig) -> None:
        if not servers:
            raise ValueError("no servers to place replicas on")
        ordered = sorted(servers, key=lambda s: s.id)
        ids = [s.id for s in ordered]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate server ids in {ids}")
        self.ids = ids
        self.index = {sid: i for i, sid in enumerate(ids)}
        self.capacity = [s.capacity for s in ordered]
        self.racks = [effective_rack(s) for s in ordered]
        keys = config.rack_aware_assignment_tags
        self.vectors = [tag_vector(s, keys) for s in ordered]
        self.num_keys = len(keys)
        groups: dict[tuple[TagVector, str | None], list[int]] = {}
        for i in range(len(ordered)):
            groups.setdefault((self.vectors[i], self.racks[i]), []).append(i)
        self.groups = [members for _, members in sorted(groups.items(), key=lambda g: g[1][0])]


class _Heaps:
    """One heap of (load key, index) per group, for one role's counts. Entries go stale when a server
    takes a replica (a fresh one is pushed); a stale entry is dropped when it reaches the top."""

    def __init__(self, servers: _Servers, counts: list[int]) -> None:
        self.servers = servers
        self.counts = counts
        self.heaps = [sorted((self._key(i), i) for i in members) for members in servers.groups]

    def _key(self, i: int) -> float:
        return load_key(self.counts[i], self.servers.capacity[i])

    def best(self, group: int, skip: set[int]) -> int | None:
        """The least loaded server of the group not in `skip` (at most a few: the partition's replicas)."""
        heap = self.heaps[group]
        aside = []
        found = None
        while heap:
            key, i = heap[0]
            if key != self._key(i):
                heapq.heappop(heap)
            elif i in skip:
                aside.append(heapq.heappop(heap))
            else:
                found = i
                break
        for item in aside:
            heapq.heappush(heap, item)
        return found

    def take(self, group: int, index: int) -> None:
        self.counts[index] += 1
        heapq.heappush(self.heaps[group], (self._key(index), index))


def _counts(servers: _Servers, by_server: Mapping[str, int]) -> list[int]:
    return [by_server.get(sid, 0) for sid in servers.ids]


def _group_of(servers: _Servers) -> list[int]:
    out = [0] * len(servers.ids)
    for g, members in enumerate(servers.groups):
        for i in members:
            out[i] = g
    return out


def _pick_active(servers: _Servers, heaps: _Heaps, sources: Sequence[str], config: AssignorConfig) -> int:
    best: tuple[float, int, int] | None = None
    for g in range(len(servers.groups)):
        i = heaps.best(g, set())
        if i is None:
            continue
        key = active_order(
            heaps.counts[i], servers.capacity[i], traffic(servers.racks[i], sources, config), i
        )
        if best is None or key < best:
            best = key
    assert best is not None
    return best[2]


def _pick_standby(
    servers: _Servers, heaps: _Heaps, holders: list[int], sources: Sequence[str], config: AssignorConfig
) -> int | None:
    used = used_values([servers.vectors[i] for i in holders], servers.num_keys)
    skip = set(holders)
    n = len(servers.ids)
    best: tuple[int, int, float, int, int] | None = None
    for g in range(len(servers.groups)):
        i = heaps.best(g, skip)
        if i is None:
            continue
        key = standby_order(
            servers.vectors[i],
            used,
            heaps.counts[i],
            servers.capacity[i],
            traffic(servers.racks[i], sources, config),
            (i - holders[0]) % n,
        )
        if best is None or key < best:
            best = key
    return None if best is None else (best[4] + holders[0]) % n


def place_new_table(
    servers: Sequence[Server], table: Table, load: Load, config: AssignorConfig
) -> IncrementalPlacement:
    """Every partition of `table` (which holds no state yet) placed against `load`: no warmups, nothing
    else moves."""
    info = _Servers(servers, config)
    group = _group_of(info)
    actives = _Heaps(info, _counts(info, load.actives))
    chosen: list[int] = []
    for p in range(table.partitions):
        i = _pick_active(info, actives, table.source_racks(p), config)
        actives.take(group[i], i)
        chosen.append(i)
    wanted = standby_count(table, config, len(info.ids))
    standbys = _Heaps(info, _counts(info, load.standbys))
    rows: list[list[int]] = [[] for _ in range(table.partitions)]
    for _ in range(wanted):
        for p in range(table.partitions):
            s = _pick_standby(info, standbys, [chosen[p], *rows[p]], table.source_racks(p), config)
            assert s is not None  # wanted <= servers - 1
            standbys.take(group[s], s)
            rows[p].append(s)
    notes = []
    if wanted < (
        config.num_standby_replicas if table.num_standby_replicas is None else table.num_standby_replicas
    ):
        notes.append(
            f"table {table.name!r}: {wanted} standby(s) per partition, only {len(info.ids)} server(s)"
        )
    ids = info.ids
    return IncrementalPlacement(
        {
            PartitionId(table.name, p): Placement(ids[chosen[p]], tuple(ids[i] for i in rows[p]))
            for p in range(table.partitions)
        },
        tuple(notes),
    )


def replace_lost(
    servers: Sequence[Server],
    placements: Mapping[PartitionId, Placement],
    tables: Mapping[str, Table],
    load: Load,
    config: AssignorConfig,
) -> IncrementalPlacement:
    """New standbys for partitions whose replicas on servers not in `servers` are lost. `placements`: the
    partitions to look at, as they are now (the active a live server: the controller elected one at the
    fence). Answers only the partitions that change; one without a live active is left (no source to
    copy from) with a note. `load` counts the live servers' replicas now."""
    info = _Servers(servers, config)
    group = _group_of(info)
    standbys = _Heaps(info, _counts(info, load.standbys))
    live = info.index
    out: dict[PartitionId, Placement] = {}
    notes: list[str] = []
    todo: list[tuple[PartitionId, Placement, list[int], int]] = []
    for pid in sorted(placements):
        placed = placements[pid]
        table = tables.get(pid.table)
        if table is None:
            continue
        if placed.active not in live:
            notes.append(f"{pid}: its active is not live; nothing to copy from")
            continue
        kept = [s for s in (*placed.standbys, *placed.warmups) if s in live]
        wanted = standby_count(table, config, len(info.ids))
        missing = wanted - len(kept) if len(kept) < wanted else 0
        if missing == 0 and len(kept) == len(placed.standbys) + len(placed.warmups):
            continue
        holders = [live[placed.active], *(live[s] for s in kept)]
        todo.append((pid, placed, holders, missing))
    # Every partition's first new standby before any second one, as in place_new_table.
    added: dict[PartitionId, list[int]] = {pid: [] for pid, _, _, _ in todo}
    for round_ in range(max((m for _, _, _, m in todo), default=0)):
        for pid, _, holders, missing in todo:
            if round_ >= missing:
                continue
            i = _pick_standby(
                info, standbys, [*holders, *added[pid]], tables[pid.table].source_racks(pid.partition), config
            )
            if i is None:
                continue
            standbys.take(group[i], i)
            added[pid].append(i)
    for pid, placed, _, _ in todo:
        kept_standbys = tuple(s for s in placed.standbys if s in live)
        kept_warmups = tuple(s for s in placed.warmups if s in live)
        new = tuple(info.ids[i] for i in added[pid])
        out[pid] = Placement(placed.active, (*kept_standbys, *new), kept_warmups)
    return IncrementalPlacement(out, tuple(notes))
