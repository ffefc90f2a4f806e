"""A query's pure execution (query/execute.py): the partitions a plan touches, merging, limits, properties."""

from __future__ import annotations

import pytest

from hotstate.controller.image import TableInfo
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.keys import encode_key, partition_for
from hotstate.protocol.rows import encode_row
from hotstate.query import execute
from hotstate.query.execute import PartitionAnswer, PartitionServed, QueryError, QueryResult
from hotstate.query.plan import plan
from hotstate.query.sql import parse

TABLE = TableInfo("clicks", 1, 4, 1, (KeyColumn("user", KeyType.STRING),), acceptable_lag=50)


def _answer(partition: int, users: list[str]) -> PartitionAnswer:
    items = sorted((encode_key((u,)), encode_row({"user": u, "clicks": len(u)})) for u in users)
    return PartitionAnswer(PartitionServed(partition, 1, "active", 0, 10), items)


def test_point_lookups_go_only_to_the_partitions_holding_the_keys() -> None:
    query_plan = plan(parse("SELECT * FROM clicks WHERE user IN ('a', 'b', 'c')"), TABLE)
    work = execute.partition_work(query_plan, TABLE)
    keys = sorted(k for spec in work.values() for k in spec.keys)
    assert keys == sorted(encode_key((u,)) for u in "abc")
    assert all(not spec.scan for spec in work.values())
    assert len(work) <= 3


def test_ranges_and_scans_read_every_partition() -> None:
    for sql in ("SELECT * FROM clicks WHERE user > 'm'", "SELECT * FROM clicks LIMIT 3"):
        work = execute.partition_work(plan(parse(sql), TABLE), TABLE)
        assert sorted(work) == [0, 1, 2, 3] and all(spec.scan for spec in work.values())


def test_rows_are_merged_in_key_order_and_cut_at_the_limit() -> None:
    answers = [_answer(0, ["d", "a"]), _answer(1, ["c", "b"]), _answer(2, ["e"])]
    columns, rows, last_key = execute.merge_rows(
        plan(parse("SELECT * FROM clicks LIMIT 4"), TABLE), TABLE, answers
    )
    assert columns == ["user", "clicks"]
    assert [r[0] for r in rows] == ["a", "b", "c", "d"]
    assert last_key == encode_key(("d",))  # cut short: the next page starts after "d"
    assert execute.merge_rows(plan(parse("SELECT * FROM clicks LIMIT 5"), TABLE), TABLE, answers)[2] is None
    assert execute.merge_rows(plan(parse("SELECT * FROM clicks"), TABLE), TABLE, answers)[2] is None


def test_a_table_is_read_in_pages_of_chosen_partitions_after_a_cursor() -> None:
    users = [f"u{i:02d}" for i in range(40)]
    by_partition: dict[int, list[str]] = {}
    for user in users:
        by_partition.setdefault(partition_for(encode_key((user,)), 4), []).append(user)
    query_plan = plan(parse("SELECT * FROM clicks LIMIT 3"), TABLE)
    for partition, held in by_partition.items():
        read: list[object] = []
        after = None
        while True:
            properties: dict[str, object] = {"partitions": [partition]}
            if after is not None:
                properties["after"] = after
            work = execute.page(
                execute.partition_work(query_plan, TABLE),
                execute.partitions(properties, TABLE),
                execute.after(properties),
            )
            assert list(work) == [partition]
            spec = work[partition]
            items = [(encode_key((u,)), encode_row({"user": u})) for u in sorted(held)]
            items = [item for item in items if spec.start is None or item[0] >= spec.start][: spec.limit]
            answer = PartitionAnswer(PartitionServed(partition, 1, "active", 0, 10), items)
            _, rows, last_key = execute.merge_rows(query_plan, TABLE, [answer])
            assert len(rows) <= 3
            read += [row[0] for row in rows]
            result = QueryResult("q", TABLE, [], [], last_key=last_key)
            after = result.cursor
            if after is None:
                break
        assert read == sorted(held)
    lookup = plan(parse("SELECT * FROM clicks WHERE user IN ('u01', 'u02', 'u03')"), TABLE)
    work = execute.page(execute.partition_work(lookup, TABLE), None, encode_key(("u01",)))
    assert sorted(k for spec in work.values() for k in spec.keys) == [
        encode_key((u,)) for u in ("u02", "u03")
    ]
    for bad in ([], [4], [-1], ["0"], [True], 3):
        with pytest.raises(QueryError, match="partitions: must be a list of partition numbers of clicks"):
            execute.partitions({"partitions": bad}, TABLE)
    for bad_after in ("%%%", 7, ""):
        with pytest.raises(QueryError, match="after: must be the cursor of an earlier answer"):
            execute.after({"after": bad_after})


def test_projection_matches_columns_ignoring_case_and_refuses_unknown_ones() -> None:
    answers = [_answer(0, ["a"])]
    columns, rows, _ = execute.merge_rows(
        plan(parse("SELECT CLICKS, user FROM clicks"), TABLE), TABLE, answers
    )
    assert columns == ["CLICKS", "user"] and rows == [[1, "a"]]
    with pytest.raises(QueryError, match="column 'nope'"):
        execute.merge_rows(plan(parse("SELECT nope FROM clicks"), TABLE), TABLE, answers)


def test_select_star_lists_every_column_any_row_has_and_fills_the_gaps_with_null() -> None:
    rows: list[dict[str, str | int]] = [
        {"user": "a", "clicks": 1, "url": "/x"},
        {"user": "b", "clicks": 2, "url": "/y"},  # the same columns: its shape is skipped
        {"user": "c", "last": 3},  # another writer's columns
        {"url": "/z", "user": "d", "clicks": 4},  # the same set in another order
    ]
    items = [(encode_key((r["user"],)), encode_row(r)) for r in rows]
    answer = PartitionAnswer(PartitionServed(0, 1, "active", 0, 4), items)
    columns, got, _ = execute.merge_rows(plan(parse("SELECT * FROM clicks"), TABLE), TABLE, [answer])
    assert columns == ["user", "clicks", "url", "last"]
    assert got == [["a", 1, "/x", None], ["b", 2, "/y", None], ["c", None, None, 3], ["d", 4, "/z", None]]
    one = execute.merge_rows(plan(parse("SELECT url FROM clicks"), TABLE), TABLE, [answer])[1]
    assert one == [["/x"], ["/y"], [None], ["/z"]]


def test_the_bound_comes_from_the_query_else_the_table() -> None:
    assert execute.max_lag({}, TABLE) == 50
    assert execute.max_lag({"max_lag": 7}, TABLE) == 7
    assert execute.max_lag({"ksql.query.pull.max.allowed.offset.lag": "9"}, TABLE) == 9
    for bad in ("x", -1):
        with pytest.raises(QueryError, match="max_lag"):
            execute.max_lag({"max_lag": bad}, TABLE)


def test_flags_and_timeouts_are_checked() -> None:
    assert execute.flag({}, ("standby_reads",), default=True) is True
    assert execute.flag({"standby_reads": "false"}, ("standby_reads",), default=True) is False
    with pytest.raises(QueryError):
        execute.flag({"standby_reads": "maybe"}, ("standby_reads",), default=True)
    assert execute.timeout_ms({"timeout_ms": "250"}) == 250
    for bad in ("soon", 0, 10**9):
        with pytest.raises(QueryError, match="timeout_ms"):
            execute.timeout_ms({"timeout_ms": bad})


def test_the_active_is_behind_only_by_what_is_committed_and_not_applied() -> None:
    from hotstate.routing.freshness import local_lag

    # An active with 5,000 rows appended and not yet committed is not behind: nobody can serve them.
    assert local_lag(leader=True, position=100, high_watermark=100, epoch_start=90, known_end=5100) == 0
    restoring = local_lag(leader=True, position=40, high_watermark=100, epoch_start=90, known_end=5100)
    assert restoring == 60
    # A new active whose HW has not reached its epoch's start may lack what its predecessor acked.
    assert local_lag(leader=True, position=80, high_watermark=80, epoch_start=100, known_end=100) == 20
    assert local_lag(leader=False, position=100, high_watermark=100, epoch_start=0, known_end=5100) == 5000
    assert local_lag(leader=False, position=120, high_watermark=100, epoch_start=0, known_end=110) == 0


def test_the_bound_has_three_names_that_must_agree_when_several_are_given() -> None:
    assert execute.max_lag({"acceptable.offset.lag": 7}, TABLE) == 7
    assert execute.max_lag({"max_lag": 7, "acceptable.offset.lag": "7"}, TABLE) == 7
    with pytest.raises(QueryError, match="the same bound under different names, with different values"):
        execute.max_lag({"max_lag": 7, "ksql.query.pull.max.allowed.offset.lag": 8}, TABLE)
