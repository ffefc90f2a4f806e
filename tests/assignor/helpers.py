"""Builders, a hypothesis strategy for random clusters, and rule checkers written independently of
the assignor's code (they recompute costs, bounds and spread from the definitions in the issue)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hypothesis import strategies as st

from hotstate.assignor import (
    Assignment,
    AssignorConfig,
    PartitionId,
    Placement,
    Server,
    Table,
)

RACKS = ("az-a", "az-b", "az-c")


def servers_in_racks(n: int, racks: Sequence[str] = RACKS, prefix: str = "s") -> list[Server]:
    return [Server(f"{prefix}{i:03d}", rack=racks[i % len(racks)]) for i in range(n)]


def all_caught_up(
    assignment: Assignment | Mapping[PartitionId, Placement],
) -> dict[PartitionId, dict[str, int]]:
    """The lag model of the convergence tests: every assigned replica has caught up."""
    parts = assignment.partitions if isinstance(assignment, Assignment) else assignment
    return {pid: dict.fromkeys(pa.replicas(), 0) for pid, pa in parts.items()}


def lag_table(
    servers: Sequence[Server],
    partitions: Sequence[PartitionId],
    previous: Mapping[PartitionId, Placement] | None,
    lags: Mapping[PartitionId, Mapping[str, int]] | None,
) -> dict[PartitionId, dict[str, int]]:
    """Known lags per partition as the inputs define them: reports of live servers, and a live previous
    active without a report counts as caught up (lag 0). Empty: the partition has no state anywhere."""
    live = {s.id for s in servers}
    out: dict[PartitionId, dict[str, int]] = {}
    for pid in partitions:
        known = {s: v for s, v in (lags or {}).get(pid, {}).items() if s in live}
        prev = (previous or {}).get(pid)
        if prev is not None and prev.active in live:
            known.setdefault(prev.active, 0)
        out[pid] = known
    return out


def restoring(
    assignment: Assignment,
    known: Mapping[PartitionId, Mapping[str, int]],
    acceptable_lag: int,
    *,
    warmups_only: bool = False,
) -> list[tuple[PartitionId, str]]:
    """Standbys and warmups (only warmups: the replicas max_warmup_replicas bounds) on servers not caught
    up for a partition that has state somewhere."""
    out = []
    for pid, pa in assignment.partitions.items():
        lags = known[pid]
        if not lags:
            continue  # a new partition: its replicas start empty and in sync, nothing restores
        for s in pa.warmups if warmups_only else (*pa.standbys, *pa.warmups):
            if lags.get(s, acceptable_lag + 1) > acceptable_lag:
                out.append((pid, s))
    return out


def standby_targets(assignment: Assignment) -> dict[PartitionId, list[str]]:
    """Each partition's balanced standby servers in slot order: where a standby is held on a caught-up
    server while its target warms up, the target."""
    out: dict[PartitionId, list[str]] = {pid: [] for pid in assignment.partitions}
    for r in assignment.explanation.replicas:
        if r.role == "standby":
            out[r.partition].append(r.target or r.server)
    return out


def active_warmups(assignment: Assignment) -> dict[PartitionId, list[str]]:
    out: dict[PartitionId, list[str]] = {pid: [] for pid in assignment.partitions}
    for r in assignment.explanation.replicas:
        if r.role == "warmup" and r.reason == "warmup":
            out[r.partition].append(r.server)
    return out


def bounds(total: int, caps: Sequence[int]) -> list[tuple[int, int]]:
    c = sum(caps)
    return [(total * x // c, -(-total * x // c)) for x in caps]


def edge_cost(config: AssignorConfig, sources: Sequence[str], rack: str | None, held: bool) -> int:
    traffic = config.traffic_cost if sources and rack not in sources else 0
    return traffic + (0 if held else config.non_overlap_cost)


def effective_rack(server: Server) -> str | None:
    return server.tags.get("rack", server.rack)


def holders(previous: Mapping[PartitionId, Placement] | None, pid: PartitionId, role: str) -> set[str]:
    """Servers that "held" the partition: its active for an active, any replica for a standby."""
    if not previous or pid not in previous:
        return set()
    return {previous[pid].active} if role == "active" else set(previous[pid].replicas())


def placement_cost(
    placement: Mapping[PartitionId, str],
    servers: Sequence[Server],
    tables: Sequence[Table],
    previous: Mapping[PartitionId, Placement] | None,
    config: AssignorConfig,
    role: str = "active",
) -> int:
    by_id = {s.id: s for s in servers}
    table = {t.name: t for t in tables}
    total = 0
    for pid, sid in placement.items():
        sources = table[pid.table].source_racks(pid.partition)
        total += edge_cost(config, sources, effective_rack(by_id[sid]), sid in holders(previous, pid, role))
    return total


def targets_of(assignment: Assignment) -> dict[PartitionId, str]:
    out = {}
    for r in assignment.explanation.replicas:
        if r.role == "active":
            assert r.target is not None
            out[r.partition] = r.target
    return out


def vector(server: Server, keys: Sequence[str]) -> tuple[str | None, ...]:
    return tuple(effective_rack(server) if k == "rack" else server.tags.get(k) for k in keys)


def spread_rank(vec: Sequence[str | None], used: Sequence[set[str | None]]) -> tuple[int, tuple[bool, ...]]:
    """(number of keys with a new value, which keys, earlier keys first) — bigger is better."""
    new = tuple(v not in u for v, u in zip(vec, used, strict=True))
    return (sum(new), new)


@dataclass(frozen=True)
class Case:
    servers: list[Server]
    tables: list[Table]
    previous: dict[PartitionId, Placement]
    lags: dict[PartitionId, dict[str, int]]
    config: AssignorConfig


@st.composite
def cases(draw: st.DrawFn, max_servers: int = 7, max_partitions: int = 10) -> Case:
    n = draw(st.integers(1, max_servers))
    racks = draw(st.sampled_from([RACKS, RACKS[:2], RACKS[:1]]))
    zones = ("z1", "z2", "z3")
    servers = []
    for i in range(n):
        rack = draw(st.sampled_from([*racks, None]))
        tags: dict[str, str] = {}
        if draw(st.booleans()):
            tags["zone"] = draw(st.sampled_from(zones))
        if draw(st.booleans()):
            tags["cluster"] = draw(st.sampled_from(("k1", "k2")))
        if draw(st.integers(0, 9)) == 0:
            tags["rack"] = draw(st.sampled_from(racks))  # sometimes disagrees with `rack`
        servers.append(Server(f"s{i}", rack=rack, tags=tags, capacity=draw(st.integers(1, 3))))
    tables = []
    for t in range(draw(st.integers(1, 3))):
        parts = draw(st.integers(1, max_partitions))
        writer = tuple(draw(st.sets(st.sampled_from(racks), max_size=2)))
        per_part = draw(
            st.dictionaries(
                st.integers(0, parts - 1), st.sets(st.sampled_from(racks), max_size=2).map(tuple), max_size=3
            )
        )
        standbys = draw(st.one_of(st.none(), st.integers(0, 3)))
        tables.append(Table(f"t{t}", parts, standbys, writer, per_part))
    ids = [s.id for s in servers] + ["gone"]
    pids = [PartitionId(t.name, i) for t in tables for i in range(t.partitions)]
    previous: dict[PartitionId, Placement] = {}
    for pid in draw(st.lists(st.sampled_from(pids), unique=True)):
        reps = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=4, unique=True))
        k = draw(st.integers(0, len(reps) - 1))
        previous[pid] = Placement(reps[0], tuple(reps[1 : 1 + k]), tuple(reps[1 + k :]))
    acceptable = draw(st.integers(0, 50))
    lags: dict[PartitionId, dict[str, int]] = {}
    for pid in draw(st.lists(st.sampled_from(pids), unique=True)):
        lags[pid] = draw(st.dictionaries(st.sampled_from(ids), st.integers(0, 100), max_size=4))
    tag_keys = draw(st.lists(st.sampled_from(("rack", "zone", "cluster")), unique=True, max_size=3))
    config = AssignorConfig(
        acceptable_recovery_lag=acceptable,
        max_warmup_replicas=draw(st.integers(1, 3)),
        num_standby_replicas=draw(st.integers(0, 2)),
        rack_aware_assignment_tags=tuple(tag_keys),
        rack_aware_assignment_strategy=draw(st.sampled_from(("none", "min_traffic", "balance_subtopology"))),
        traffic_cost=draw(st.integers(0, 10)),
        non_overlap_cost=draw(st.integers(0, 10)),
    )
    return Case(servers, tables, previous, lags, config)
