"""LagTable: newest report per node, lag against the highest end any replica reported (KIP-535)."""

from __future__ import annotations

import dataclasses
import json

from hotstate.replica.messages import LagInfo
from hotstate.routing.lags import LagTable, ReplicaLag

T = 7  # table id


def info(partition: int, position: int, end: int, state: str = "standby", table_id: int = T) -> LagInfo:
    return LagInfo(
        table="clicks" if table_id == T else f"t{table_id}",
        table_id=table_id,
        partition=partition,
        state=state,
        current_offset_position=position,
        end_offset_position=end,
        offset_lag=end - position,  # the reporter's own view: the table recomputes it
        leader_epoch=1,
        high_watermark=end,
        in_sync=True,
    )


def test_lag_is_measured_against_the_highest_end_any_replica_reported() -> None:
    lags = LagTable()
    lags.update(1, [info(0, 1_000, 1_000, "active")], now_ms=10)
    # A standby cut off from the active believes it is caught up at 400.
    lags.update(2, [info(0, 400, 400)], now_ms=20)
    assert lags.partition_end(T, 0) == 1_000
    assert lags.lag(2, T, 0) == ReplicaLag(400, 1_000, 600, "standby", 20)
    assert lags.lag(1, T, 0) == ReplicaLag(1_000, 1_000, 0, "active", 10)


def test_a_report_replaces_everything_the_node_reported_before() -> None:
    lags = LagTable()
    lags.update(2, [info(0, 10, 50), info(1, 5, 5)], now_ms=10)
    lags.update(2, [info(1, 9, 9)], now_ms=20)
    assert lags.lag(2, T, 0) is None  # no longer reported: gone
    assert lags.partition_end(T, 0) == 0
    assert lags.lag(2, T, 1) == ReplicaLag(9, 9, 0, "standby", 20)


def test_the_partition_end_follows_reports_down_as_well_as_up() -> None:
    lags = LagTable()
    lags.update(1, [info(0, 900, 900, "active")], now_ms=10)
    lags.update(2, [info(0, 100, 900)], now_ms=10)
    # Node 1's replica moved away (or its report was wrong): its end no longer counts.
    lags.update(1, [], now_ms=20)
    assert lags.partition_end(T, 0) == 900  # node 2 also reported 900
    lags.update(2, [info(0, 100, 300)], now_ms=30)
    assert lags.lag(2, T, 0) == ReplicaLag(100, 300, 200, "standby", 30)


def test_forget_drops_a_node_and_its_ends() -> None:
    lags = LagTable()
    lags.update(1, [info(0, 900, 900, "active")], now_ms=10)
    lags.update(2, [info(0, 100, 100)], now_ms=10)
    lags.forget(1)
    lags.forget(99)  # unknown: nothing to do
    assert lags.lag(1, T, 0) is None
    assert lags.lag(2, T, 0) == ReplicaLag(100, 100, 0, "standby", 10)
    assert 1 not in lags.snapshot()


def test_an_older_report_than_the_one_held_is_ignored() -> None:
    lags = LagTable()
    assert lags.update(2, [info(0, 50, 50)], now_ms=100)
    assert not lags.update(2, [info(0, 10, 10)], now_ms=99)
    assert lags.lag(2, T, 0) == ReplicaLag(50, 50, 0, "standby", 100)
    assert lags.update(2, [info(0, 60, 60)], now_ms=100)  # same time: the later call is newer


def test_the_last_entry_for_a_partition_within_one_report_wins() -> None:
    lags = LagTable()
    lags.update(2, [info(0, 10, 10), info(0, 20, 30)], now_ms=1)
    assert lags.lag(2, T, 0) == ReplicaLag(20, 30, 10, "standby", 1)


def test_lag_is_never_negative() -> None:
    lags = LagTable()
    lags.update(2, [info(0, 500, 400)], now_ms=1)  # a position past every reported end
    lag = lags.lag(2, T, 0)
    assert lag is not None and lag.offset_lag == 0


def test_unknown_nodes_tables_and_partitions() -> None:
    lags = LagTable()
    lags.update(2, [info(0, 1, 1)], now_ms=1)
    assert lags.lag(3, T, 0) is None
    assert lags.lag(2, T + 1, 0) is None
    assert lags.lag(2, T, 1) is None
    assert lags.partition_end(T, 1) == 0


def test_partitions_of_other_tables_do_not_mix() -> None:
    lags = LagTable()
    lags.update(1, [info(0, 1_000, 1_000), info(0, 5, 5, table_id=8)], now_ms=1)
    lags.update(2, [info(0, 3, 5, table_id=8)], now_ms=1)
    assert lags.lag(2, 8, 0) == ReplicaLag(3, 5, 2, "standby", 1)


def test_snapshot_is_by_node_table_name_and_partition() -> None:
    lags = LagTable()
    lags.update(2, [info(1, 5, 10), info(0, 7, 10, "warmup"), info(0, 1, 1, table_id=8)], now_ms=42)
    lags.update(1, [info(0, 10, 10, "active")], now_ms=40)
    snap = lags.snapshot()
    assert list(snap) == [1, 2]
    assert snap[2] == {
        "clicks": {0: ReplicaLag(7, 10, 3, "warmup", 42), 1: ReplicaLag(5, 10, 5, "standby", 42)},
        "t8": {0: ReplicaLag(1, 1, 0, "standby", 42)},
    }
    as_json = json.loads(json.dumps(lags.snapshot_json()))
    assert as_json["2"]["clicks"]["0"] == {
        "position": 7,
        "end": 10,
        "offset_lag": 3,
        "state": "warmup",
        "reported_at_ms": 42,
        "end_known": True,
    }


def test_a_replica_that_cannot_know_its_end_adds_nothing_to_the_partitions_end() -> None:
    lags = LagTable()
    lags.update(1, [info(0, 100, 100, "active")], now_ms=10)
    unknown = dataclasses.replace(info(0, 20, 0), end_offset_position=-1, offset_lag=-1)
    lags.update(2, [unknown], now_ms=20)
    assert lags.partition_end(T, 0) == 100
    assert lags.lag(2, T, 0) == ReplicaLag(20, 100, 80, "standby", 20, end_known=False)
    # Only another server's report with a known end, arrived since the time asked for, tells the end.
    assert lags.reported_since(T, 0, 10, exclude=2)
    assert not lags.reported_since(T, 0, 11, exclude=2)
    assert not lags.reported_since(T, 0, 0, exclude=1)
    assert lags.partition_hw(T, 0, exclude=2) == 100
    assert lags.partition_hw(T, 0, exclude=1) == 0


def test_the_version_moves_with_every_change_and_only_then() -> None:
    """Routes made from the table are kept while its version stays the same."""
    lags = LagTable()
    start = lags.version
    assert lags.update(1, [info(0, 5, 5, "active")], now_ms=10)
    after_update = lags.version
    assert after_update != start
    assert not lags.update(1, [info(0, 9, 9, "active")], now_ms=5)  # older: ignored
    assert lags.version == after_update
    lags.forget(1)
    assert lags.version != after_update


def test_a_replica_reported_in_a_state_this_version_does_not_know_is_left_out() -> None:
    from hotstate.replica.messages import LagInfo
    from hotstate.routing.lags import LagTable

    table = LagTable()
    known = LagInfo("t", 1, 0, "standby", 5, 10, 5, 1, 10, True)
    newer = LagInfo("t", 1, 1, "observer", 5, 10, 5, 1, 10, True)
    table.update(2, [known, newer], now_ms=1)
    lag = table.lag(2, 1, 0)
    assert lag is not None and lag.state == "standby"
    assert table.lag(2, 1, 1) is None
