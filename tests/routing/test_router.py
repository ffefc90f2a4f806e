"""route(): one rule per test, then a property over random partitions, liveness and lags."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.controller.image import PartitionInfo
from hotstate.replica.messages import LagInfo
from hotstate.routing.freshness import UNKNOWN_LAG_REASON
from hotstate.routing.lags import LagTable
from hotstate.routing.router import Candidate, NoReplicaError, Route, Skip, route

T, P = 7, 3


def part(replicas: tuple[int, ...], active: int | None, warmups: tuple[int, ...] = ()) -> PartitionInfo:
    return PartitionInfo(T, P, replicas, active, warmups, leader_epoch=1, isr=replicas)


def lag_table(positions: dict[int, int], end: int, states: dict[int, str] | None = None) -> LagTable:
    """Each node reports its position; the first node listed reports the partition's end."""
    lags = LagTable()
    for i, (node, position) in enumerate(positions.items()):
        state = (states or {}).get(node, "standby")
        report = LagInfo("clicks", T, P, state, position, end if i == 0 else position, 0, 1, end, True)
        lags.update(node, [report], now_ms=0)
    return lags


def alive_all(_: int) -> bool:
    return True


def alive_except(*down: int) -> frozenset[int]:
    return frozenset(range(100)) - frozenset(down)


def do_route(
    p: PartitionInfo,
    lags: LagTable,
    *,
    down: tuple[int, ...] = (),
    local: int = 50,
    max_lag: int | None = None,
) -> Route:
    return route(
        p,
        table="clicks",
        alive=alive_except(*down).__contains__,
        lags=lags,
        local_node=local,
        max_lag=max_lag,
    )


def order(r: Route) -> list[tuple[int, str, int | None]]:
    return [(c.node_id, c.role, c.offset_lag) for c in r.candidates]


def test_the_active_comes_first_even_when_a_standby_is_fresher() -> None:
    lags = lag_table({2: 900, 1: 800, 3: 850}, end=1_000)  # the active (1) lags the most
    r = do_route(part((1, 2, 3), 1), lags)
    assert order(r) == [(1, "active", 200), (2, "standby", 100), (3, "standby", 150)]
    assert r.skipped == ()
    assert (r.table, r.partition) == ("clicks", P)


def test_a_down_active_is_tried_after_the_live_standbys_which_follow_by_lag() -> None:
    lags = lag_table({1: 1_000, 2: 700, 3: 900}, end=1_000)
    r = do_route(part((1, 2, 3), 1), lags, down=(1,))
    assert order(r) == [(3, "standby", 100), (2, "standby", 300), (1, "active", 0)]
    assert [c.down for c in r.candidates] == [False, False, True]
    assert r.skipped == ()


def test_a_restoring_active_over_the_bound_is_skipped() -> None:
    lags = lag_table({2: 1_000, 1: 100}, end=1_000, states={1: "restoring"})
    r = do_route(part((1, 2), 1), lags, max_lag=500)
    assert order(r) == [(2, "standby", 0)]
    assert r.skipped == (Skip(1, "lag 900 > bound 500", "active"),)


def test_a_running_active_is_not_judged_by_a_lag_that_is_only_report_skew() -> None:
    lags = lag_table({2: 1_000, 1: 990}, end=1_000)  # 1 reported before the last writes, 2 after
    r = do_route(part((1, 2), 1), lags, max_lag=0)
    assert order(r) == [(1, "active", 10), (2, "standby", 0)]
    assert r.skipped == ()


def test_a_restoring_active_within_the_bound_stays_first() -> None:
    lags = lag_table({2: 1_000, 1: 600}, end=1_000, states={1: "restoring"})
    r = do_route(part((1, 2), 1), lags, max_lag=500)
    assert order(r) == [(1, "active", 400), (2, "standby", 0)]


def test_standbys_and_warmups_are_sorted_together_by_lag() -> None:
    lags = lag_table({1: 1_000, 2: 500, 3: 990, 4: 700}, end=1_000)
    r = do_route(part((1, 2, 3, 4), 1, warmups=(3,)), lags)
    assert order(r) == [(1, "active", 0), (3, "warmup", 10), (4, "standby", 300), (2, "standby", 500)]


def test_replicas_over_the_bound_are_dropped_with_the_reason_and_the_bound_is_inclusive() -> None:
    lags = lag_table({1: 1_000, 2: 900, 3: 899}, end=1_000)
    r = do_route(part((1, 2, 3), 1), lags, max_lag=100)
    assert order(r) == [(1, "active", 0), (2, "standby", 100)]
    assert r.skipped == (Skip(3, "lag 101 > bound 100", "standby"),)


def test_no_bound_keeps_every_live_replica() -> None:
    lags = lag_table({1: 10**9, 2: 0}, end=10**9)
    assert order(do_route(part((1, 2), 1), lags)) == [(1, "active", 0), (2, "standby", 10**9)]


def test_down_standbys_and_warmups_come_last_in_their_own_order() -> None:
    lags = lag_table({1: 10, 2: 5, 3: 10, 4: 8}, end=10)
    r = do_route(part((1, 2, 3, 4), 1, warmups=(3,)), lags, down=(1, 2, 3))
    assert order(r) == [(4, "standby", 2), (1, "active", 0), (3, "warmup", 0), (2, "standby", 5)]
    assert [c.down for c in r.candidates] == [False, True, True, True]


def test_a_down_replica_the_lag_rules_would_skip_is_skipped_as_down() -> None:
    lags = lag_table({1: 1_000, 2: 500}, end=1_000, states={1: "restoring"})
    lags.update(3, [LagInfo("clicks", T, P, "standby", 1_000, -1, -1, 1, 1_000, False)], now_ms=0)
    r = do_route(part((1, 2, 3), 1), lags, down=(2, 3), max_lag=100)
    assert order(r) == [(1, "active", 0)]
    assert r.skipped == (Skip(2, "down", "standby"), Skip(3, "down", "standby"))


def test_a_down_candidate_that_failed_says_it_was_down_and_tried_anyway() -> None:
    assert Candidate(1, "active", 0, down=True).skip("timed out") == Skip(
        1, "down, tried anyway: timed out", "active"
    )
    assert Candidate(1, "active", 0).skip("timed out") == Skip(1, "timed out", "active")
    # One the executor passed over was not tried.
    assert Candidate(1, "standby", 0, down=True).passed("standby reads are off") == Skip(
        1, "standby reads are off", "standby"
    )


def test_a_replica_without_a_lag_report_is_kept_after_the_known_ones() -> None:
    lags = lag_table({1: 1_000, 2: 0}, end=1_000)  # 3 and 4 never reported
    r = do_route(part((1, 4, 2, 3), 1), lags, max_lag=10)
    assert order(r) == [(1, "active", 0), (3, "standby", None), (4, "standby", None)]
    assert r.skipped == (Skip(2, "lag 1000 > bound 10", "standby"),)


def test_a_replica_that_reported_an_unknown_lag_is_skipped_for_bounded_reads_only() -> None:
    lags = lag_table({1: 1_000, 2: 990}, end=1_000)
    # 3 restarted: it has heard nobody yet, so it cannot know how far behind it is (routing.freshness).
    lags.update(3, [LagInfo("clicks", T, P, "standby", 1_000, -1, -1, 1, 1_000, False)], now_ms=0)
    bounded = do_route(part((1, 2, 3), 1), lags, max_lag=50)
    assert order(bounded) == [(1, "active", 0), (2, "standby", 10)]
    assert bounded.skipped == (Skip(3, UNKNOWN_LAG_REASON, "standby"),)
    assert UNKNOWN_LAG_REASON in str(bounded.error())
    unbounded = do_route(part((1, 2, 3), 1), lags)
    assert order(unbounded) == [(1, "active", 0), (3, "standby", 0), (2, "standby", 10)]


def test_an_active_without_a_lag_report_still_comes_first() -> None:
    lags = lag_table({2: 1_000}, end=1_000)
    assert order(do_route(part((1, 2), 1), lags, max_lag=0)) == [(1, "active", None), (2, "standby", 0)]


def test_equal_lags_prefer_the_local_replica_then_the_lower_node_id() -> None:
    lags = lag_table({1: 1_000, 2: 900, 3: 900, 4: 900}, end=1_000)
    r = do_route(part((1, 4, 3, 2), 1), lags, local=3)
    assert [c.node_id for c in r.candidates] == [1, 3, 2, 4]
    r = do_route(part((1, 4, 3, 2), 1), lags, local=1)
    assert [c.node_id for c in r.candidates] == [1, 2, 3, 4]
    # Among replicas without a report, the same tie-break.
    r = do_route(part((6, 5, 7), None), LagTable(), local=7)
    assert [c.node_id for c in r.candidates] == [7, 5, 6]


def test_the_local_node_counts_as_alive() -> None:
    lags = lag_table({1: 10, 2: 10}, end=10)
    r = route(part((1, 2), 1), table="clicks", alive=lambda _: False, lags=lags, local_node=2, max_lag=None)
    assert order(r) == [(2, "standby", 0), (1, "active", 0)]
    assert [c.down for c in r.candidates] == [False, True]


def test_an_offline_partition_contributes_no_active() -> None:
    lags = lag_table({2: 5, 3: 10}, end=10)
    r = do_route(part((2, 3), None), lags)
    assert order(r) == [(3, "standby", 0), (2, "standby", 5)]
    assert do_route(part((), None), lags) == Route("clicks", P, (), ())


def test_the_active_is_listed_once_even_if_also_named_a_warmup() -> None:
    r = route(
        part((1, 2), 1, warmups=(1, 2)),
        table="clicks",
        alive=alive_all,
        lags=LagTable(),
        local_node=9,
        max_lag=None,
    )
    assert order(r) == [(1, "active", None), (2, "warmup", None)]


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError):
        do_route(part((1,), 1), LagTable(), max_lag=-1)


# ---------------------------------------------------------------------- the error


def test_no_replica_error_names_the_partition_and_every_reason() -> None:
    lags = lag_table({2: 0, 1: 0}, end=1_500, states={1: "restoring"})
    r = do_route(part((1, 2), 1), lags, down=(1,), max_lag=100)
    assert r.candidates == ()
    error = r.error()
    assert isinstance(error, Exception)
    assert (
        str(error) == "no replica of clicks/3 can serve: 1 (active): down; 2 (standby): lag 1500 > bound 100"
    )
    assert (error.table, error.partition) == ("clicks", P)


def test_executor_failures_are_appended() -> None:
    r = do_route(part((1, 2), 1), LagTable(), down=(1,))
    (candidate, silent) = r.candidates
    error = r.error([candidate.skip("timed out"), silent.skip("unreachable")])
    assert str(error) == (
        "no replica of clicks/3 can serve: 2 (standby): timed out;"
        " 1 (active): down, tried anyway: unreachable"
    )
    more = NoReplicaError("clicks", P, r.skipped).with_more([candidate.skip("timed out"), Skip(4, "refused")])
    assert str(more).endswith("2 (standby): timed out; 4: refused")
    assert more.skipped[-1] == Skip(4, "refused")


def test_no_replica_error_without_replicas_and_through_pickle() -> None:
    error = NoReplicaError("clicks", 0, [])
    assert str(error) == "no replica of clicks/0 can serve: no replica is assigned"
    error = NoReplicaError("clicks", 3, [Skip(1, "down", "active")])
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.skipped) == (str(error), error.skipped)


# ---------------------------------------------------------------------- property


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[PartitionInfo, frozenset[int], LagTable, int, int | None]:
    nodes = draw(st.lists(st.integers(0, 9), unique=True, max_size=6))
    active = draw(st.one_of(st.none(), st.sampled_from(nodes))) if nodes else None
    warmups = tuple(draw(st.lists(st.sampled_from(nodes), unique=True))) if nodes else ()
    alive = frozenset(draw(st.lists(st.integers(0, 9), unique=True)))
    lags = LagTable()
    for node in draw(st.lists(st.integers(0, 9), unique=True)):
        position = draw(st.integers(0, 1_000))
        end = position + draw(st.integers(0, 1_000))
        reported = -1 if draw(st.booleans()) and draw(st.booleans()) else end  # -1: it cannot know its end
        lags.update(node, [LagInfo("clicks", T, P, "standby", position, reported, 0, 1, end, True)], 0)
    local = draw(st.integers(0, 9))
    max_lag = draw(st.one_of(st.none(), st.integers(0, 1_000)))
    return part(tuple(nodes), active, warmups), alive, lags, local, max_lag


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_every_replica_is_routed_or_skipped_once_and_candidates_respect_the_bound(
    scenario: tuple[PartitionInfo, frozenset[int], LagTable, int, int | None],
) -> None:
    p, alive, lags, local, max_lag = scenario
    r = route(p, table="clicks", alive=alive.__contains__, lags=lags, local_node=local, max_lag=max_lag)
    routed = [c.node_id for c in r.candidates] + [s.node_id for s in r.skipped]
    replicas = set(p.replicas) | set(p.warmups) | ({p.active} if p.active is not None else set())
    assert sorted(routed) == sorted(replicas)  # each exactly once
    for c in r.candidates:
        assert c.down == (c.node_id != local and c.node_id not in alive)
        judged = c.role != "active"  # the scenarios report every replica as running, none restoring
        known = lags.lag(c.node_id, T, P)
        if judged and max_lag is not None and c.offset_lag is not None:
            assert c.offset_lag <= max_lag
            assert known is not None and known.end_known
        assert c.offset_lag == (None if known is None else known.offset_lag)
    downs = [c.down for c in r.candidates]
    assert downs == sorted(downs)  # every live candidate before every down one
    for down in (False, True):
        rest = [c for c in r.candidates if c.down == down]
        if rest and rest[0].role == "active":
            assert rest[0].node_id == p.active
            rest = rest[1:]
        assert all(c.role != "active" for c in rest)
        keys = [(c.offset_lag is None, c.offset_lag or 0) for c in rest]
        assert keys == sorted(keys)  # by lag, unreported last
    for s in r.skipped:
        assert s.reason == "down" or s.reason.startswith("lag ")
    assert (
        route(p, table="clicks", alive=alive.__contains__, lags=lags, local_node=local, max_lag=max_lag) == r
    )


def test_candidate_is_hashable_and_frozen() -> None:
    c = Candidate(1, "active", 0)
    assert {c: 1}[Candidate(1, "active", 0)] == 1
