"""Incremental placement (assignor/incremental.py): each rule on its own, then whole placements checked
against the rules' definitions (balance against the given load, spread, no server twice, determinism)."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.assignor import AssignorConfig, PartitionId, Placement, Server, Table
from hotstate.assignor.incremental import (
    Load,
    active_order,
    load_key,
    place_new_table,
    replace_lost,
    standby_count,
    standby_order,
    traffic,
)

from .helpers import servers_in_racks

CONFIG = AssignorConfig()


# ------------------------------------------------------------------------------------------- the rules
def test_load_key_is_the_load_after_taking_one_per_capacity_unit() -> None:
    assert load_key(0, 1) == 1.0
    assert load_key(3, 2) == 2.0
    assert load_key(1, 2) < load_key(1, 1)  # a bigger server is less loaded at the same count


def test_traffic_costs_only_outside_known_source_racks_and_never_for_strategy_none() -> None:
    assert traffic("az-a", ("az-a",), CONFIG) == 0
    assert traffic("az-b", ("az-a",), CONFIG) == CONFIG.traffic_cost
    assert traffic(None, ("az-a",), CONFIG) == CONFIG.traffic_cost  # unknown rack: count the traffic
    assert traffic("az-b", (), CONFIG) == 0  # unknown sources: nothing to save
    assert traffic("az-b", ("az-a",), AssignorConfig(rack_aware_assignment_strategy="none")) == 0


def test_active_order_puts_balance_before_traffic_and_traffic_before_id() -> None:
    less_loaded_cross_rack = active_order(0, 1, cost=10, index=5)
    more_loaded_in_rack = active_order(1, 1, cost=0, index=0)
    assert less_loaded_cross_rack < more_loaded_in_rack
    assert active_order(0, 1, cost=0, index=5) < active_order(0, 1, cost=10, index=0)
    assert active_order(0, 1, cost=0, index=1) < active_order(0, 1, cost=0, index=2)


def test_standby_count_is_as_asked_but_never_two_replicas_on_one_server() -> None:
    assert standby_count(Table("t", 1, num_standby_replicas=2), CONFIG, servers=5) == 2
    assert standby_count(Table("t", 1, num_standby_replicas=2), CONFIG, servers=2) == 1
    assert standby_count(Table("t", 1), AssignorConfig(num_standby_replicas=3), servers=10) == 3
    assert standby_count(Table("t", 1, num_standby_replicas=0), CONFIG, servers=1) == 0


def test_standby_order_puts_spread_before_load_and_load_before_rotation() -> None:
    used: list[set[str | None]] = [{"az-a"}]
    new_rack_loaded = standby_order(("az-b",), used, count=5, capacity=1, cost=0, after_active=3)
    same_rack_idle = standby_order(("az-a",), used, count=0, capacity=1, cost=0, after_active=1)
    assert new_rack_loaded < same_rack_idle
    assert standby_order(("az-b",), used, 0, 1, 0, 3) < standby_order(("az-c",), used, 1, 1, 0, 1)
    assert standby_order(("az-b",), used, 0, 1, 0, 1) < standby_order(("az-c",), used, 0, 1, 0, 2)


# ------------------------------------------------------------------------------------------- placements
def counts(placements: dict[PartitionId, Placement], load: Load) -> tuple[Counter[str], Counter[str]]:
    actives = Counter(load.actives)
    standbys = Counter(load.standbys)
    for placed in placements.values():
        actives[placed.active] += 1
        standbys.update(placed.standbys)
    return actives, standbys


def test_a_new_table_is_balanced_against_the_existing_load() -> None:
    servers = servers_in_racks(4)
    load = Load({"s000": 5, "s001": 1}, {"s002": 3})
    out = place_new_table(servers, Table("t", 10), load, CONFIG).partitions
    actives, standbys = counts(dict(out), load)
    # 16 actives over 4 servers: 4 each, except s000 that already had 5 (nothing existing moves).
    assert (
        actives == Counter({"s000": 5, "s001": 4, "s002": 4, "s003": 3})
        or max(actives[s] for s in ("s001", "s002", "s003"))
        - min(actives[s] for s in ("s001", "s002", "s003"))
        <= 1
    )
    assert all(actives[s] >= 3 for s in ("s001", "s002", "s003"))
    assert "s000" not in {p.active for p in out.values()}
    assert max(standbys.values()) - min(standbys[s.id] for s in servers) <= 1


def test_actives_go_to_the_writers_rack_as_far_as_balance_allows() -> None:
    servers = servers_in_racks(6)  # two servers per rack
    out = place_new_table(servers, Table("t", 4, writer_racks=("az-c",)), Load(), CONFIG).partitions
    racks = {s.id: s.rack for s in servers}
    assert sum(racks[p.active] == "az-c" for p in out.values()) == 2  # one each, both az-c servers
    assert max(Counter(p.active for p in out.values()).values()) == 1
    blind = AssignorConfig(rack_aware_assignment_strategy="none")
    out = place_new_table(servers, Table("t", 4, writer_racks=("az-c",)), Load(), blind).partitions
    assert sum(racks[p.active] == "az-c" for p in out.values()) < 2


def test_standbys_spread_over_racks_and_never_share_a_server() -> None:
    servers = servers_in_racks(6)
    racks = {s.id: s.rack for s in servers}
    out = place_new_table(servers, Table("t", 60, num_standby_replicas=2), Load(), CONFIG).partitions
    for placed in out.values():
        assert len(placed.standbys) == 2 and placed.warmups == ()
        assert len({racks[s] for s in placed.replicas()}) == 3  # ideal spread: 3 racks for 3 copies


def test_too_few_servers_give_fewer_standbys_with_a_note() -> None:
    out = place_new_table(servers_in_racks(2), Table("t", 3, num_standby_replicas=3), Load(), CONFIG)
    assert all(len(p.standbys) == 1 for p in out.partitions.values())
    assert out.notes and "1 standby" in out.notes[0]


def test_capacity_weights_balance() -> None:
    servers = [Server("a", "az-a", capacity=2), Server("b", "az-b"), Server("c", "az-c")]
    out = place_new_table(servers, Table("t", 40), Load(), CONFIG).partitions
    assert Counter(p.active for p in out.values()) == Counter({"a": 20, "b": 10, "c": 10})


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 9),
    partitions=st.integers(1, 40),
    standbys=st.integers(0, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_cluster_gets_distinct_replicas_balance_and_the_same_answer_in_any_input_order(
    n: int, partitions: int, standbys: int, seed: int
) -> None:
    rng = random.Random(seed)
    servers = servers_in_racks(n, racks=("az-a", "az-b", "az-c")[: rng.randint(1, 3)])
    load = Load({s.id: rng.randint(0, 3) for s in servers}, {s.id: rng.randint(0, 3) for s in servers})
    table = Table("t", partitions, num_standby_replicas=standbys)
    out = place_new_table(servers, table, load, CONFIG).partitions
    shuffled = list(servers)
    rng.shuffle(shuffled)
    assert place_new_table(shuffled, table, load, CONFIG).partitions == out
    assert len(out) == partitions
    for placed in out.values():
        assert len(set(placed.replicas())) == len(placed.replicas()) == 1 + min(standbys, n - 1)
    # Water filling: a server that got a new active was, before its last one, no more loaded than any
    # server left without one more.
    actives, _ = counts(dict(out), load)
    got = {p.active for p in out.values()}
    for s in got:
        assert all(actives[s] - 1 <= actives[t.id] for t in servers)


def test_replace_lost_gives_the_partitions_that_lost_a_copy_new_standbys_and_nothing_else() -> None:
    servers = servers_in_racks(6)
    table = Table("t", 12, num_standby_replicas=1)
    placed = dict(place_new_table(servers, table, Load(), CONFIG).partitions)
    lost = "s004"
    live = [s for s in servers if s.id != lost]
    # The controller elects a live active at the fence: a partition led by the lost server is led by its
    # standby now.
    now = {pid: Placement(p.standbys[0], (p.active,)) if p.active == lost else p for pid, p in placed.items()}
    load = Load.of(p for p in now.values())
    out = replace_lost(live, now, {"t": table}, load, CONFIG)
    touched = {pid for pid, p in now.items() if lost in p.replicas()}
    assert set(out.partitions) == touched
    racks = {s.id: s.rack for s in servers}
    for pid, p in out.partitions.items():
        assert lost not in p.replicas() and len(p.standbys) == 1
        assert p.active == now[pid].active
        assert racks[p.standbys[0]] != racks[p.active]
    # The new copies are spread, not all on one server.
    assert len({p.standbys[0] for p in out.partitions.values()}) > 1


def test_replace_lost_leaves_a_partition_without_a_live_active_with_a_note() -> None:
    servers = servers_in_racks(3)
    now = {PartitionId("t", 0): Placement("s009", ("s001",))}
    out = replace_lost(servers, now, {"t": Table("t", 1)}, Load(), CONFIG)
    assert out.partitions == {} and "not live" in out.notes[0]
