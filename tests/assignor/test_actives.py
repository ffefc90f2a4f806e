"""KIP-441 rules for actives and warmups."""

from __future__ import annotations

from hotstate.assignor import AssignorConfig, PartitionId, Placement, Server, Table, assign
from hotstate.assignor.actives import ActiveChoice, choose_active, warmups_by_partition

LIMIT = 100


def test_caught_up_target_takes_the_active() -> None:
    assert choose_active(1, 0, {0: 0, 1: 100}, LIMIT) == ActiveChoice(1, 1, "caught_up", False)


def test_lagging_target_warms_up_while_the_caught_up_previous_owner_keeps_it() -> None:
    assert choose_active(1, 0, {0: 0, 1: 101, 2: 5}, LIMIT) == ActiveChoice(0, 1, "held_for_warmup", True)


def test_owner_gone_lowest_lag_caught_up_replica_keeps_it() -> None:
    assert choose_active(1, -1, {2: 50, 3: 7}, LIMIT) == ActiveChoice(3, 1, "held_for_warmup", True)


def test_nobody_caught_up_the_most_caught_up_wins_and_the_target_wins_ties() -> None:
    assert choose_active(1, 0, {0: 900, 2: 300}, LIMIT) == ActiveChoice(2, 1, "most_caught_up", True)
    assert choose_active(1, 0, {1: 300, 2: 300}, LIMIT) == ActiveChoice(1, 1, "most_caught_up", False)


def test_no_lags_at_all_means_a_new_partition_on_its_target() -> None:
    assert choose_active(2, -1, {}, LIMIT) == ActiveChoice(2, 2, "no_state", False)


def test_warmups_by_partition_are_on_the_target_when_wanted_or_granted() -> None:
    choices = [ActiveChoice(0, 1, "held_for_warmup", True), ActiveChoice(0, 0, "caught_up", False)]
    assert warmups_by_partition(choices) == [(1,), ()]
    assert warmups_by_partition(choices, {(0, 1)}) == [(1,), ()]
    assert warmups_by_partition(choices, set()) == [(), ()]


def test_new_server_gets_warmups_then_takes_over_once_caught_up() -> None:
    cfg = AssignorConfig(num_standby_replicas=0, max_warmup_replicas=1, acceptable_recovery_lag=10)
    servers = [Server("a"), Server("b")]
    prev = {PartitionId("t", i): Placement("a") for i in range(2)}
    first = assign(servers, [Table("t", 2)], prev, None, cfg)
    # b must get one of the two partitions; it has no state, so a keeps both and b warms one up.
    assert {pa.active for pa in first.partitions.values()} == {"a"}
    warm = [pid for pid, pa in first.partitions.items() if pa.warmups == ("b",)]
    assert len(warm) == 1
    # Still lagging: nothing changes.
    lags = {warm[0]: {"a": 0, "b": 500}}
    again = assign(servers, [Table("t", 2)], first, lags, cfg)
    assert again.partitions == first.partitions
    # Caught up: the warmup is promoted.
    lags = {warm[0]: {"a": 0, "b": 3}}
    done = assign(servers, [Table("t", 2)], again, lags, cfg)
    assert done.partitions[warm[0]] == Placement("b")
    reasons = {(r.partition, r.role): r.reason for r in done.explanation.replicas}
    assert reasons[(warm[0], "active")] == "caught_up"
