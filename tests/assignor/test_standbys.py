"""KIP-708 standby placement, rule by rule."""

from __future__ import annotations

from collections import Counter

from hotstate.assignor import AssignorConfig, PartitionId, Placement, Server, Table, assign
from hotstate.assignor.problem import build_problem
from hotstate.assignor.standbys import (
    StandbySlot,
    best_classes,
    eligible,
    keep_previous,
    place_standbys,
    rebalance_last_standbys,
    tag_classes,
    wanted_standbys,
)
from hotstate.assignor.tags import used_values

from .helpers import servers_in_racks


def test_eligible_excludes_active_warmup_and_existing_standbys() -> None:
    assert eligible(3, 0, [1], [2])
    assert not eligible(0, 0, [1], [2])
    assert not eligible(1, 0, [1], [2])
    assert not eligible(2, 0, [1], [2])


def test_wanted_standbys_degrades_to_the_servers_available() -> None:
    assert wanted_standbys(2, 5, 0) == 2
    assert wanted_standbys(2, 3, 1) == 1
    assert wanted_standbys(3, 1, 0) == 0


def test_tag_classes_group_servers_with_the_same_vector() -> None:
    classes = tag_classes([("a",), ("b",), ("a",), (None,)])
    assert classes.vectors == (("a",), ("b",), (None,))
    assert classes.members == ((0, 2), (1,), (3,))


def test_best_classes_skips_classes_whose_servers_are_all_excluded() -> None:
    classes = tag_classes([("a",), ("b",), ("c",)])
    used = used_values([("a",)], 1)
    score, winners = best_classes(classes, used, [0, 1])
    assert score == (1, 1) and winners == [2]


def test_previous_standby_is_kept_only_while_it_spreads_as_well_as_any_choice() -> None:
    servers = servers_in_racks(6)  # s000 az-a, s001 az-b, s002 az-c, s003 az-a, ...
    pid = PartitionId("t", 0)
    cfg = AssignorConfig(num_standby_replicas=1)
    good = build_problem(servers, [Table("t", 1)], {pid: Placement("s000", ("s001",))}, None, cfg)
    classes = tag_classes(good.vectors)
    assert [s.server for s in keep_previous(good, classes, 0, 0, (), 1)] == [1]
    # Same rack as the active while other racks are free: not kept.
    bad = build_problem(servers, [Table("t", 1)], {pid: Placement("s000", ("s003",))}, None, cfg)
    assert keep_previous(bad, classes, 0, 0, (), 1) == []


def test_first_standbys_do_not_depend_on_how_many_more_follow() -> None:
    # Rounds: every partition's first standby is placed before any second one, so the first
    # standbys with two per partition are exactly the standbys with one per partition.
    servers = servers_in_racks(7)
    tables = [Table("t", 20)]
    one = assign(
        servers, tables, config=AssignorConfig(num_standby_replicas=1, rack_aware_assignment_strategy="none")
    )
    two = assign(
        servers, tables, config=AssignorConfig(num_standby_replicas=2, rack_aware_assignment_strategy="none")
    )
    assert {p: pa.active for p, pa in one.partitions.items()} == {
        p: pa.active for p, pa in two.partitions.items()
    }
    assert {p: pa.standbys[0] for p, pa in one.partitions.items()} == {
        p: pa.standbys[0] for p, pa in two.partitions.items()
    }


def test_standbys_balance_over_servers_without_tags() -> None:
    servers = [Server(f"s{i}") for i in range(5)]
    out = assign(
        servers,
        [Table("t", 23)],
        config=AssignorConfig(num_standby_replicas=2, rack_aware_assignment_tags=()),
    )
    counts = Counter(s for pa in out.partitions.values() for s in pa.standbys)
    assert max(counts.values()) - min(counts.values()) <= 1


def test_standbys_balance_by_capacity() -> None:
    servers = [Server("big", capacity=3), Server("s1"), Server("s2"), Server("s3")]
    out = assign(
        servers,
        [Table("t", 30)],
        config=AssignorConfig(num_standby_replicas=1, rack_aware_assignment_tags=()),
    )
    counts = Counter(s for pa in out.partitions.values() for s in pa.standbys)
    assert counts["big"] >= 2 * max(counts[s] for s in ("s1", "s2", "s3"))


def test_rebalance_moves_last_standbys_onto_a_server_below_its_share() -> None:
    servers = [Server(f"s{i}") for i in range(4)]
    cfg = AssignorConfig(num_standby_replicas=1, rack_aware_assignment_tags=())
    problem = build_problem(servers, [Table("t", 8)], None, None, cfg)
    classes = tag_classes(problem.vectors)
    actives = [p % 3 for p in range(8)]
    # Everything on servers 0..2, nothing on 3: 3 is short of its lower bound (2 of 8).
    slots = [[StandbySlot((a + 1) % 3, (0, 0), True)] for a in actives]
    rebalance_last_standbys(problem, classes, slots, actives, [()] * 8, 8)
    counts = Counter(row[0].server for row in slots)
    assert counts[3] == 2 and max(counts.values()) <= 2
    assert all(row[0].server != actives[p] for p, row in enumerate(slots))


def test_place_standbys_never_uses_active_or_warmup_servers() -> None:
    servers = servers_in_racks(4)
    cfg = AssignorConfig(num_standby_replicas=3)
    problem = build_problem(servers, [Table("t", 6)], None, None, cfg)
    actives = [p % 4 for p in range(6)]
    warmups = [((p + 1) % 4,) if p == 0 else () for p in range(6)]
    slots, wanted = place_standbys(problem, actives, warmups)
    assert wanted[0] == 2 and all(w == 3 for w in wanted[1:])
    for p, row in enumerate(slots):
        chosen = [s.server for s in row]
        assert len(set(chosen)) == len(chosen) == wanted[p]
        assert actives[p] not in chosen and not set(warmups[p]) & set(chosen)
