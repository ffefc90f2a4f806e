"""Every rule of the issue, checked on random clusters (hypothesis), against independent re-computations."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hotstate.assignor import Assignment, AssignorConfig, PartitionId, Server, Table, assign

from .helpers import (
    Case,
    active_warmups,
    bounds,
    cases,
    lag_table,
    placement_cost,
    restoring,
    spread_rank,
    standby_targets,
    targets_of,
    vector,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(case: Case, config: AssignorConfig | None = None) -> Assignment:
    return assign(case.servers, case.tables, case.previous, case.lags, config or case.config)


def known_lags(case: Case) -> dict[PartitionId, dict[str, int]]:
    pids = [PartitionId(t.name, i) for t in case.tables for i in range(t.partitions)]
    return lag_table(case.servers, pids, case.previous, case.lags)


def unlimited(cfg: AssignorConfig) -> AssignorConfig:
    """The config with a restore budget nothing reaches: every standby slot is placed (held on a
    caught-up server or on its target), so the balanced standby targets can be read off the result."""
    return replace(cfg, max_warmup_replicas=10_000)


def standbys_asked(case: Case, table: Table) -> int:
    return (
        case.config.num_standby_replicas if table.num_standby_replicas is None else table.num_standby_replicas
    )


@SETTINGS
@given(cases())
def test_structure_and_counts(case: Case) -> None:
    a = run(case)
    ids = {s.id for s in case.servers}
    tables = {t.name: t for t in case.tables}
    warming = active_warmups(a)
    assert set(a.partitions) == {PartitionId(t.name, i) for t in case.tables for i in range(t.partitions)}
    for pid, pa in a.partitions.items():
        replicas = pa.replicas()
        assert set(replicas) <= ids
        assert len(set(replicas)) == len(replicas), f"{pid}: two replicas on one server: {pa}"
        asked = standbys_asked(case, tables[pid.table])
        # Every standby asked for, as far as the servers allow: the restore budget never holds one back
        # (the active's warmup, which holds a copy already, is the only other server that may not host one).
        want = min(asked, len(ids) - 1 - len(warming[pid]))
        assert len(pa.standbys) == want, f"{pid}: {len(pa.standbys)} standbys of {asked}, {want} possible"


@SETTINGS
@given(cases())
def test_actives_go_to_caught_up_or_most_caught_up(case: Case) -> None:
    a = run(case)
    lags = known_lags(case)
    limit = case.config.acceptable_recovery_lag
    targets = targets_of(a)
    warming = active_warmups(a)
    for pid, pa in a.partitions.items():
        known = lags[pid]
        caught_up = {s for s, lag in known.items() if lag <= limit}
        if caught_up:
            assert pa.active in caught_up, f"{pid}: active {pa.active} not caught up; caught up: {caught_up}"
        elif known:
            assert known.get(pa.active) == min(known.values()), f"{pid}: active is not the most caught up"
        else:
            assert pa.active == targets[pid]
        if pa.active != targets[pid]:
            # Only a lagging target is ever passed over, and only it ever gets the active's warmup.
            assert targets[pid] not in caught_up
            assert set(warming[pid]) <= {targets[pid]}
        else:
            assert warming[pid] == []


@SETTINGS
@given(cases())
def test_targets_are_balanced_by_capacity(case: Case) -> None:
    a = run(case)
    targets = targets_of(a)
    caps = [s.capacity for s in case.servers]
    index = {s.id: i for i, s in enumerate(case.servers)}
    counts = Counter(targets.values())
    for sid, (lo, hi) in zip(index, bounds(len(targets), caps), strict=True):
        assert lo <= counts[sid] <= hi, f"{sid}: {counts[sid]} targets, bounds [{lo}, {hi}]"
    if case.config.rack_aware_assignment_strategy == "balance_subtopology":
        for t in case.tables:
            per = Counter(s for pid, s in targets.items() if pid.table == t.name)
            for sid, (lo, hi) in zip(index, bounds(t.partitions, caps), strict=True):
                assert lo <= per[sid] <= hi, f"table {t.name}, {sid}: {per[sid]} in [{lo}, {hi}]"
    # Without warmups pending, the actives themselves are the balanced targets.
    if all(pa.active == targets[pid] for pid, pa in a.partitions.items()):
        assert Counter(pa.active for pa in a.partitions.values()) == counts


@SETTINGS
@given(cases())
def test_standby_spread_is_the_best_available_at_each_step(case: Case) -> None:
    a = run(case, unlimited(case.config))
    keys = case.config.rack_aware_assignment_tags
    by_id = {s.id: s for s in case.servers}
    warming = active_warmups(a)
    for pid, targets in standby_targets(a).items():
        active = a.partitions[pid].active
        for j, sb in enumerate(targets):
            placed = [active, *targets[:j]]
            used = [{vector(by_id[x], keys)[i] for x in placed} for i in range(len(keys))]
            eligible = [s for s in by_id if s not in placed and s not in warming[pid]]
            best = max(spread_rank(vector(by_id[s], keys), used) for s in eligible)
            got = spread_rank(vector(by_id[sb], keys), used)
            assert got == best, f"{pid} standby {j} on {sb}: spread {got}, best possible {best}"


@SETTINGS
@given(cases())
def test_standbys_are_balanced_as_far_as_spread_allows(case: Case) -> None:
    # Checked on the KIP-708 placement itself (strategy none; the flows keep per-server counts).
    cfg = unlimited(replace(case.config, rack_aware_assignment_strategy="none"))
    a = run(case, cfg)
    keys = cfg.rack_aware_assignment_tags
    by_id = {s.id: s for s in case.servers}
    targets = standby_targets(a)
    warming = active_warmups(a)
    counts = Counter(s for row in targets.values() for s in row)
    total = sum(counts.values())
    share = dict(zip(by_id, bounds(total, [s.capacity for s in case.servers]), strict=True))
    for pid, row in targets.items():
        if not row:
            continue
        last = row[-1]
        placed = [a.partitions[pid].active, *row[:-1]]
        used = [{vector(by_id[x], keys)[i] for x in placed} for i in range(len(keys))]
        rank = spread_rank(vector(by_id[last], keys), used)
        others = [
            b
            for b in by_id
            if b not in (*placed, last, *warming[pid]) and spread_rank(vector(by_id[b], keys), used) == rank
        ]
        # No server above its share keeps a last standby that a server below its share could take
        # just as well, and no server below its lower bound is left out while this one has spare.
        if counts[last] > share[last][1]:
            assert all(counts[b] >= share[b][1] for b in others), f"{pid}: {last} over its share"
        if counts[last] > share[last][0]:
            assert all(counts[b] >= share[b][0] for b in others), f"{pid}: a server is short"


@SETTINGS
@given(cases())
def test_flow_never_costs_more_than_plain_balanced(case: Case) -> None:
    cfg = unlimited(case.config)
    a = run(case, cfg)
    targets = targets_of(a)
    cost = placement_cost(targets, case.servers, case.tables, case.previous, cfg)
    assert cost == a.explanation.cost.active_target
    assert a.explanation.cost.active_target <= a.explanation.cost.active_baseline
    assert a.explanation.cost.standby <= a.explanation.cost.standby_baseline
    standby_cost = sum(
        placement_cost({pid: s}, case.servers, case.tables, case.previous, cfg, role="standby")
        for pid, row in standby_targets(a).items()
        for s in row
    )
    assert standby_cost == a.explanation.cost.standby
    # Against the assignor run with strategy none (the plain balanced placement) on the same input:
    plain = targets_of(run(case, replace(cfg, rack_aware_assignment_strategy="none")))
    plain_cost = placement_cost(plain, case.servers, case.tables, case.previous, cfg)
    comparable = cfg.rack_aware_assignment_strategy == "min_traffic" or _tables_balanced(case, plain)
    if comparable:
        assert cost <= plain_cost


@SETTINGS
@given(cases(), st.integers(0, 2**32 - 1))
def test_input_order_does_not_matter(case: Case, seed: int) -> None:
    rnd = random.Random(seed)
    servers = list(case.servers)
    rnd.shuffle(servers)
    tables = list(case.tables)
    rnd.shuffle(tables)
    servers = [Server(s.id, s.rack, dict(reversed(list(s.tags.items()))), s.capacity) for s in servers]
    prev = list(case.previous.items())
    rnd.shuffle(prev)
    lags = [(pid, dict(reversed(list(v.items())))) for pid, v in case.lags.items()]
    rnd.shuffle(lags)
    a = run(case)
    b = assign(servers, tables, dict(prev), dict(lags), case.config)
    assert a == b


def _tables_balanced(case: Case, placement: dict[PartitionId, str]) -> bool:
    caps = [s.capacity for s in case.servers]
    for t in case.tables:
        per = Counter(s for pid, s in placement.items() if pid.table == t.name)
        for s, (lo, hi) in zip(case.servers, bounds(t.partitions, caps), strict=True):
            if not lo <= per[s.id] <= hi:
                return False
    return True


def caught_up_in(lags: dict[str, int], limit: int, server: str) -> bool:
    return lags.get(server, limit + 1) <= limit


@SETTINGS
@given(cases())
def test_a_caught_up_standby_is_never_given_up_for_a_server_that_is_not_caught_up(case: Case) -> None:
    a = run(case)
    known = known_lags(case)
    limit = case.config.acceptable_recovery_lag
    live = {s.id for s in case.servers}
    for pid, pa in a.partitions.items():
        prev = case.previous.get(pid)
        if prev is None:
            continue
        lags = known[pid]
        dropped = [
            s
            for s in prev.standbys
            if s in live and caught_up_in(lags, limit, s) and s not in (pa.active, *pa.standbys)
        ]
        cold = [s for s in pa.standbys if not caught_up_in(lags, limit, s)]
        assert not (dropped and cold), f"{pid}: caught-up {dropped} dropped while {cold} restore as standbys"


@SETTINGS
@given(cases())
def test_new_warmups_start_only_within_max_warmup_replicas(case: Case) -> None:
    # The budget bounds warmups (replicas that move an active or a standby to its balanced target), not
    # standbys that rebuild a lost copy (test_structure_and_counts: those are always placed).
    a = run(case)
    known = known_lags(case)
    live = {s.id for s in case.servers}
    rest = restoring(a, known, case.config.acceptable_recovery_lag, warmups_only=True)
    held = {pid: set(pa.replicas()) & live for pid, pa in case.previous.items()}
    new = [(pid, s) for pid, s in rest if s not in held.get(pid, set())]
    # Warmups already under way are never cut for the budget (they may exceed it); nothing new starts
    # unless the total, them included, stays within it.
    if new:
        assert len(rest) <= case.config.max_warmup_replicas, f"warming up {rest}, of them new {new}"
