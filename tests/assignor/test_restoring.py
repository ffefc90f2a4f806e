"""KIP-441 for standbys and the warmup budget (restoring.py), rule by rule."""

from __future__ import annotations

from hotstate.assignor import AssignorConfig, PartitionId, Placement, Server, Table, assign
from hotstate.assignor.actives import ActiveChoice
from hotstate.assignor.problem import Problem, build_problem
from hotstate.assignor.restoring import (
    StandbyOutcome,
    StandbyPlan,
    Warmup,
    grant,
    has_state,
    keeper_for,
    plan_standbys,
    restores,
    settle_slot,
    standby_on_refused_target,
    warmup_requests,
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


def test_only_warmups_for_moves_are_requests_a_standby_rebuilding_a_lost_copy_is_not() -> None:
    p = problem_of(Placement("a", ("b",), ("e",)), {"b": 0, "e": 40})
    choices = [ActiveChoice(0, 2, "held_for_warmup", True)]
    plans = [[StandbyPlan(3, True, 1), StandbyPlan(4, True, None)]]
    # Slot 2 (target e, no caught-up server free to hold it) restores as a standby: not a warmup.
    assert warmup_requests(p, choices, plans) == [
        Warmup(0, 2, "active_warmup", False, float("inf")),
        Warmup(0, 3, "standby_warmup", False, float("inf")),
    ]


def test_running_warmups_are_never_cut_and_new_ones_fill_the_budget_by_priority() -> None:
    requests = [
        Warmup(0, 1, "standby_warmup", False, 5),
        Warmup(1, 1, "active_warmup", False, 50),
        Warmup(2, 1, "standby_warmup", False, 1),
        Warmup(3, 1, "active_warmup", False, 20),
        Warmup(4, 1, "standby_warmup", True, 99),
    ]
    # Running first (4), then actives' warmups by lag (3, 1), then standbys' by lag (2, 0).
    assert grant(requests, 3) == {(4, 1), (3, 1), (1, 1)}
    assert grant(requests, 4) == {(4, 1), (3, 1), (1, 1), (2, 1)}
    assert grant(requests, 1) == {(4, 1)}
    # More running than the budget: all of them go on, nothing new starts.
    running = [Warmup(p, 2, "standby_warmup", True, 1) for p in range(3)]
    assert grant([*running, Warmup(9, 1, "active_warmup", False, 0)], 2) == {(0, 2), (1, 2), (2, 2)}


def test_a_refused_warmup_leaves_the_standby_on_its_keeper_and_a_lost_copy_always_restores() -> None:
    held = StandbyPlan(3, True, 1)
    cold = StandbyPlan(4, True, None)
    assert settle_slot(0, held, {(0, 3)}) == StandbyOutcome(held, 1, True)
    assert settle_slot(0, held, set()) == StandbyOutcome(held, 1, False)
    # No budget left, no caught-up server free: the standby restores on its target all the same.
    assert settle_slot(0, cold, set()) == StandbyOutcome(cold, 4, False)
    direct = StandbyPlan(2, False, None)
    assert settle_slot(0, direct, set()) == StandbyOutcome(direct, 2, False)


def test_a_refused_active_warmup_target_takes_a_missing_standby() -> None:
    p = build_problem(
        SERVERS[:3],
        [Table("t", 1, num_standby_replicas=2)],
        {PID: Placement("a", ("b",))},
        {PID: {"b": 0}},
        AssignorConfig(acceptable_recovery_lag=LIMIT),
    )
    wants = ActiveChoice(0, 2, "held_for_warmup", True)
    # One standby placed (b), two asked, c kept clear for the active's warmup, which is refused.
    assert standby_on_refused_target(p, 0, wants, set(), 1) == 2
    assert standby_on_refused_target(p, 0, wants, {(0, 2)}, 1) is None  # granted: c warms up
    assert standby_on_refused_target(p, 0, wants, set(), 2) is None  # nothing missing
    assert standby_on_refused_target(p, 0, ActiveChoice(0, 0, "caught_up", False), set(), 1) is None


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
    # Next to a table with state whose standbys restore, the new one is placed in full too.
    old = {PartitionId("old", i): Placement(f"s{i}") for i in range(6)}
    both = assign(servers, [Table("old", 6), Table("t", 12)], old, None, cfg)
    assert all(len(pa.standbys) == 2 and pa.warmups == () for pa in both.partitions.values())


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


# ------------------------------------------------------- lost standbys come back at once (issue 29)
def many_standbys_then_lose(budget: int) -> tuple[dict[PartitionId, Placement], list[Server], Table]:
    """12 partitions, actives on s1..s4, every standby on s0; s0 is then lost."""
    servers = [Server(f"s{i}", rack=f"r{i}") for i in range(5)]
    before = {PartitionId("t", i): Placement(f"s{1 + i % 4}", ("s0",)) for i in range(12)}
    return before, servers[1:], Table("t", 12)


def test_losing_a_server_with_many_standbys_restores_every_one_in_the_next_assignment() -> None:
    before, live, table = many_standbys_then_lose(1)
    lags = {pid: {pa.active: 0} for pid, pa in before.items()}
    for budget in (1, 2):
        cfg = AssignorConfig(
            num_standby_replicas=1, max_warmup_replicas=budget, acceptable_recovery_lag=LIMIT
        )
        out = assign(live, [table], before, lags, cfg)
        for pid, pa in out.partitions.items():
            assert pa.active == before[pid].active and len(pa.standbys) == 1 and pa.warmups == (), pa
        # 12 standbys restore at once, though the budget is 1 or 2: none of them is a warmup.
        assert not any("wait" in note for note in out.explanation.notes)
        reasons = [r for r in out.explanation.replicas if r.role == "standby"]
        assert len(reasons) == 12 and all("rebuilds a lost copy" in r.detail for r in reasons)


def test_warmups_for_moves_stay_within_the_budget_while_lost_standbys_restore() -> None:
    # s0 held every standby and is lost, and a new server s5 joins: lost copies all restore at once,
    # moves towards s5 (its share of actives and standbys) only through max_warmup_replicas warmups.
    before, live, table = many_standbys_then_lose(1)
    live = [*live, Server("s5", rack="r5")]
    lags = {pid: {pa.active: 0} for pid, pa in before.items()}
    cfg = AssignorConfig(num_standby_replicas=1, max_warmup_replicas=1, acceptable_recovery_lag=LIMIT)
    out = assign(live, [table], before, lags, cfg)
    assert all(len(pa.standbys) == 1 for pa in out.partitions.values())
    warmups = [(pid, w) for pid, pa in out.partitions.items() for w in pa.warmups]
    assert len(warmups) == 1 and warmups[0][1] == "s5"


def test_a_warmup_under_way_is_never_cut_for_the_budget() -> None:
    # Two warmups under way (on c for partitions 0 and 1), budget 1: both go on, and no new one starts.
    servers = [Server(x, rack=x) for x in "abc"]
    pids = [PartitionId("t", i) for i in range(3)]
    before = {
        pids[0]: Placement("a", ("b",), ("c",)),
        pids[1]: Placement("b", ("a",), ("c",)),
        pids[2]: Placement("a", ("b",)),
    }
    lags = {pid: {"a": 0, "b": 0, "c": 500} if pid != pids[2] else {"a": 0, "b": 0} for pid in pids}
    cfg = AssignorConfig(num_standby_replicas=1, max_warmup_replicas=1, acceptable_recovery_lag=LIMIT)
    out = assign(servers, [Table("t", 3)], before, lags, cfg)
    warming = {pid: pa.warmups for pid, pa in out.partitions.items() if pa.warmups}
    assert warming == {pids[0]: ("c",), pids[1]: ("c",)}


def test_a_partition_that_needs_every_server_gets_its_standby_on_the_refused_warmup_target() -> None:
    # 2 standbys on 3 servers: every partition needs a, b and c. All 6 actives were on a, standbys on b
    # and on d, which is lost. Two partitions get c as their balanced active target; c has no copy, so
    # each wants a warmup there, and the budget (1) grants one. The other still gets its second standby:
    # on c, the only server left, where it restores and can take the active once caught up.
    servers = [Server(x, rack=x) for x in "abc"]
    before = {PartitionId("t", i): Placement("a", ("b", "d")) for i in range(6)}
    lags = {pid: {"a": 0, "b": 0} for pid in before}
    cfg = AssignorConfig(max_warmup_replicas=1, acceptable_recovery_lag=LIMIT, num_standby_replicas=2)
    out = assign(servers, [Table("t", 6)], before, lags, cfg)
    warming = [pid for pid, pa in out.partitions.items() if pa.warmups]
    on_target = [r for r in out.explanation.replicas if r.reason == "standby_on_warmup_target"]
    assert len(warming) == 1 and out.partitions[warming[0]].warmups == ("c",)
    assert len(on_target) == 1 and on_target[0].server == "c" and on_target[0].partition not in warming
    for pa in out.partitions.values():
        # Where the warmup was granted it is the third copy; everywhere else two standbys are.
        assert len(pa.standbys) + len(pa.warmups) == 2, pa
    # Only the partition whose warmup holds the third copy is short of a standby, and says so.
    short = [note for note in out.explanation.notes if "standbys" in note]
    assert short == [
        "table 't': 1 partitions have 1 of 2 standbys (not enough servers besides the active and warmups)"
    ]
