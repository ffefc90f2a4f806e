"""Balance bounds and the plain sticky balanced placement."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.assignor import AssignorConfig, PartitionId, Placement, Server, Table
from hotstate.assignor.balance import LoadScale, balanced_bounds, plain_preferences, sticky_balanced_targets
from hotstate.assignor.problem import build_problem


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 200), st.lists(st.integers(1, 7), min_size=1, max_size=12))
def test_bounds_are_floor_and_ceil_of_the_capacity_share(total: int, caps: list[int]) -> None:
    lo, hi = balanced_bounds(total, caps)
    assert sum(lo) <= total <= sum(hi)
    for c, a, b in zip(caps, lo, hi, strict=True):
        share = total * c / sum(caps)
        assert a <= share <= b and b - a <= 1


def test_equal_capacities_differ_by_at_most_one() -> None:
    lo, hi = balanced_bounds(10, [1, 1, 1])
    assert (lo, hi) == ((3, 3, 3), (4, 4, 4))


def test_load_scale_compares_exact_ratios() -> None:
    scale = LoadScale([2, 3, 6])
    # After one more replica: 2/2 = 1, 3/3 = 1, 6/6 = 1 -> ties broken by index only.
    assert scale.key(1, 0)[0] == scale.key(2, 1)[0] == scale.key(5, 2)[0]
    assert scale.key(0, 0) < scale.key(1, 0)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_sticky_placement_is_within_bounds_and_keeps_what_balance_allows(data: st.DataObject) -> None:
    caps = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=6))
    n = data.draw(st.integers(0, 30))
    prefs = [data.draw(st.lists(st.integers(0, len(caps) - 1), max_size=3, unique=True)) for _ in range(n)]
    bounds = balanced_bounds(n, caps)
    out = sticky_balanced_targets(range(n), prefs, caps, bounds)
    assert sorted(out) == list(range(n))
    counts = Counter(out.values())
    lo, hi = bounds
    for s in range(len(caps)):
        assert lo[s] <= counts[s] <= hi[s]
    # A partition leaves its first preference only if that server is full (at its upper bound).
    for p, s in out.items():
        if prefs[p] and s != prefs[p][0]:
            assert counts[prefs[p][0]] >= lo[prefs[p][0]]


def test_sticky_placement_moves_only_the_overflow_to_a_new_server() -> None:
    # 9 partitions on servers 0 and 1 (5 + 4); server 2 joins: it must get exactly 3, nothing else moves.
    prefs = [[0]] * 5 + [[1]] * 4
    out = sticky_balanced_targets(range(9), prefs, [1, 1, 1], balanced_bounds(9, [1, 1, 1]))
    moved = [p for p in range(9) if out[p] != prefs[p][0]]
    assert len(moved) == 3 and all(out[p] == 2 for p in moved)


def test_plain_preferences_put_the_active_then_a_caught_up_warmup_first_and_a_restoring_one_last() -> None:
    servers = [Server(x) for x in "abcde"]
    pid = PartitionId("t", 0)
    prev = {pid: Placement("a", ("b", "c"), ("d",))}
    cfg = AssignorConfig(acceptable_recovery_lag=10)
    caught = build_problem(servers, [Table("t", 1)], prev, {pid: {"b": 5, "c": 1, "d": 0}}, cfg)
    assert plain_preferences(caught, 0) == [0, 3, 2, 1]  # active a, warmup d, then c (lag 1), b (lag 5)
    restoring = build_problem(servers, [Table("t", 1)], prev, {pid: {"b": 50, "c": 1, "d": 99}}, cfg)
    assert plain_preferences(restoring, 0) == [0, 2, 3]  # b is not caught up; d still restoring, last
