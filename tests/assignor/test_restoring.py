"""KIP-441 for standbys and the one restore budget (restoring.py), rule by rule."""

from __future__ import annotations

from hotstate.assignor import AssignorConfig, PartitionId, Placement, Server, Table, assign
from hotstate.assignor.actives import ActiveChoice
from hotstate.assignor.problem import Problem, build_problem
from hotstate.assignor.restoring import (
    Restore,
    StandbyOutcome,
    StandbyPlan,
    grant,
    has_state,
    keeper_for,
    plan_standbys,
    restore_requests,
    restores,
    settle_slot,
)
from hotstate.assignor.standbys import keep_previous, tag_classes

LIMIT = 10
SERVERS = [Server(x) for x in "abcdef"]  # indexes 0..5
PID = PartitionId("t", 0)


def problem_of(previous: Placement | None, lags: dict[str, int] | None, *, budget: int = 2) -> Problem:
    cfg = AssignorConfig(acceptable_recovery_lag=LIMIT, max_warmup_replicas=budget)
    return build_problem(
        SERVERS,
        [Table("t", 1)],
        {PID: previous} if previous else None,
        {PID: lags} if lags is not None else None,
        cfg,
    )


def test_a_new_partition_has_no_state_and_nothing_restores() -> None:
    new = problem_of(None, None)
    assert not has_state(new, 0) and not restores(new, 0, 3)


def test_a_server_restores_unless_it_is_caught_up() -> None:
    # The previous active without a report is caught up; a report above the limit or none is not.
    p = problem_of(Placement("a", ("b",)), {"b": LIMIT + 1, "c": LIMIT})
    assert has_state(p, 0)
    assert [restores(p, 0, s) for s in range(4)] == [False, True, False, True]


def test_the_keeper_is_a_previous_standby_first_then_the_lowest_lag() -> None:
    p = problem_of(Placement("a", ("d", "b")), {"b": 0, "c": 0, "d": 5, "e": 1})
    assert keeper_for(p, 0, {0}) == 3  # d: a previous standby, in the previous order
    assert keeper_for(p, 0, {0, 3}) == 1  # b: the next previous standby
    assert keeper_for(p, 0, {0, 1, 3}) == 2  # c: lag 0 beats e's lag 1
    assert keeper_for(p, 0, {0, 1, 2, 3, 4}) is None  # a is taken; f has no state


def test_a_standby_target_that_is_not_caught_up_is_held_on_a_caught_up_server() -> None:
    p = problem_of(Placement("a", ("b", "c")), {"b": 0, "c": 0})
    # Targets: c (caught up: stays), e (no state: b holds the standby while e warms up).
    assert plan_standbys(p, 0, [2, 4], 0, ()) == [StandbyPlan(2, False, None), StandbyPlan(4, True, 1)]
    # Both targets without state: only b is free to hold one; the other restores on its target.
    assert plan_standbys(p, 0, [3, 4], 0, ()) == [StandbyPlan(3, True, 1), StandbyPlan(4, True, 2)]
    assert plan_standbys(p, 0, [3, 4, 5], 0, ())[2] == StandbyPlan(5, True, None)


def test_a_new_partition_places_every_standby_on_its_target() -> None:
    assert plan_standbys(problem_of(None, None), 0, [3, 4], 0, ()) == [
        StandbyPlan(3, False, None),
        StandbyPlan(4, False, None),
    ]


def test_requests_name_active_warmups_held_standbys_and_restoring_standbys() -> None:
    p = problem_of(Placement("a", ("b",), ("e",)), {"b": 0, "e": 40})
    choices = [ActiveChoice(0, 2, "held_for_warmup", True)]
    plans = [[StandbyPlan(3, True, 1), StandbyPlan(4, True, None)]]
    assert restore_requests(p, choices, plans) == [
        Restore(0, 2, "active_warmup", False, float("inf")),
        Restore(0, 3, "standby_warmup", False, float("inf")),
        Restore(0, 4, "standby", True, 40),  # e restores already: its restore is under way
    ]


def test_running_restores_are_never_cut_and_new_ones_fill_the_budget_by_priority() -> None:
    requests = [
        Restore(0, 1, "standby_warmup", False, 5),
        Restore(1, 1, "active_warmup", False, 50),
        Restore(2, 1, "standby", False, 90),
        Restore(3, 1, "active_warmup", False, 20),
        Restore(4, 1, "standby_warmup", True, 99),
    ]
    # Running first (4), then a standby the partition has no caught-up copy for (2), then actives by lag.
    assert grant(requests, 3) == {(4, 1), (2, 1), (3, 1)}
    assert grant(requests, 1) == {(4, 1)}
    # More running than the budget: all of them go on, nothing new starts.
    running = [Restore(p, 2, "standby", True, 1) for p in range(3)]
    assert grant([*running, Restore(9, 1, "active_warmup", False, 0)], 2) == {(0, 2), (1, 2), (2, 2)}


def test_a_denied_slot_keeps_its_keeper_or_waits() -> None:
    held = StandbyPlan(3, True, 1)
    cold = StandbyPlan(4, True, None)
    assert settle_slot(0, held, {(0, 3)}) == StandbyOutcome(held, 1, True)
    assert settle_slot(0, held, set()) == StandbyOutcome(held, 1, False)
    assert settle_slot(0, cold, {(0, 4)}) == StandbyOutcome(cold, 4, False)
    assert settle_slot(0, cold, set()) == StandbyOutcome(cold, None, False)
    direct = StandbyPlan(2, False, None)
    assert settle_slot(0, direct, set()) == StandbyOutcome(direct, 2, False)


def test_a_previous_warmup_stays_the_standby_target_while_it_restores() -> None:
    p = problem_of(Placement("a", ("b",), ("e",)), {"b": 0, "e": 400})
    classes = tag_classes(p.vectors)
    assert [slot.server for slot in keep_previous(p, classes, 0, 0, (), 1)] == [4]


# ------------------------------------------------------------------------------------------ whole assign
def test_a_new_table_restores_nothing_so_the_budget_does_not_limit_it() -> None:
    servers = [Server(f"s{i}", rack=f"r{i % 3}") for i in range(6)]
    cfg = AssignorConfig(num_standby_replicas=2, max_warmup_replicas=1)
    out = assign(servers, [Table("t", 12)], None, None, cfg)
    assert all(len(pa.standbys) == 2 and pa.warmups == () for pa in out.partitions.values())
    # Next to a table with state whose standbys restore, the new one is still placed in full.
    old = {PartitionId("old", i): Placement(f"s{i}") for i in range(6)}
    both = assign(servers, [Table("old", 6), Table("t", 12)], old, None, cfg)
    restoring = [s for pid, pa in both.partitions.items() if pid.table == "old" for s in pa.standbys]
    assert len(restoring) == 1  # the old table's standbys have no state: one at a time
    assert all(len(pa.standbys) == 2 for pid, pa in both.partitions.items() if pid.table == "t")
    assert any("standbys wait" in note for note in both.explanation.notes)


def test_a_joining_server_gets_standbys_through_warmups_while_caught_up_copies_stay() -> None:
    servers = [Server(f"s{i}", rack=f"r{i}") for i in range(3)]
    cfg = AssignorConfig(num_standby_replicas=1, max_warmup_replicas=2, rack_aware_assignment_tags=())
    tables = [Table("t", 6)]
    before = assign(servers, tables, None, None, cfg)
    lags = {pid: dict.fromkeys(pa.replicas(), 0) for pid, pa in before.partitions.items()}
    joined = assign([*servers, Server("new", rack="r3")], tables, before, lags, cfg)
    for pid, pa in joined.partitions.items():
        assert "new" not in pa.standbys and pa.active != "new"
        assert set(before.partitions[pid].replicas()) <= set(pa.replicas())
    warming = [pid for pid, pa in joined.partitions.items() if "new" in pa.warmups]
    assert len(warming) == 2  # the budget, shared by the actives' and the standbys' warmups
    held = [r for r in joined.explanation.replicas if r.reason == "standby_held_for_warmup"]
    assert held and all(r.target == "new" for r in held)
