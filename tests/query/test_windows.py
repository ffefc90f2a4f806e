"""Pull queries on windowed tables: the key range a WINDOWSTART / WINDOWEND predicate reads, in one partition
for a key's windows, and what is left to the window filter."""

from __future__ import annotations

import datetime as dt

import pytest

from hotstate.controller.image import TableInfo
from hotstate.controller.records import KeyColumn, KeyType, TableWindow
from hotstate.protocol.keys import encode_key, partition_for, window_suffix
from hotstate.query.execute import plain_work
from hotstate.query.plan import FullScan, KeyLookup, KeyRange, QueryPlan, plan
from hotstate.query.sql import QueryError, parse
from hotstate.query.windows import NotWindowedError, WindowFilter

MINUTE = 60_000_000
KEY = (
    KeyColumn("user", KeyType.STRING),
    KeyColumn("WINDOWSTART", KeyType.WINDOW_START),
    KeyColumn("WINDOWEND", KeyType.WINDOW_END),
)
TUMBLING = TableInfo(
    "clicks", 3, 8, 1, KEY, None, window=TableWindow("window", "TUMBLING", 5 * MINUTE, 5 * MINUTE)
)
SESSIONS = TableInfo("sessions", 4, 8, 1, KEY, None, window=TableWindow("session_window", "SESSION"))
PLAIN = TableInfo("plain", 5, 8, 1, (KeyColumn("user", KeyType.STRING),), None)


def at(minute: int) -> dt.datetime:
    return dt.datetime(2026, 1, 1) + dt.timedelta(minutes=minute)


def key(user: str, start: int, end: int) -> bytes:
    return encode_key((user, at(start), at(end)))


def planned(sql: str, table: TableInfo) -> QueryPlan:
    return plan(parse(sql), table)


def test_a_keys_windows_share_its_partition_whatever_their_bounds() -> None:
    suffix = window_suffix(KEY)
    assert suffix == 18
    partitions = {partition_for(key("a", m, m + 5), 8, suffix) for m in range(0, 600, 5)}
    assert partitions == {partition_for(encode_key(("a",)), 8)}
    # Without leaving the bounds out, the windows would scatter (the rule the suffix exists for).
    assert len({partition_for(key("a", m, m + 5), 8) for m in range(0, 600, 5)}) > 1


def test_a_lookup_by_key_alone_reads_its_windows_in_one_partition() -> None:
    query = planned("SELECT * FROM clicks WHERE user = 'a'", TUMBLING)
    access = query.access
    assert isinstance(access, KeyRange)
    assert access.partition == partition_for(encode_key(("a",)), 8)
    assert access.start is not None and access.end is not None
    assert access.start <= key("a", 0, 5) < key("a", 9999, 10004) < access.end
    assert not access.start <= key("b", 0, 5) < access.end
    assert list(plain_work(query, TUMBLING, None)) == [access.partition]


def test_windowstart_range_with_the_key_is_a_key_range() -> None:
    sql = (
        "SELECT * FROM clicks WHERE user = 'a' AND WINDOWSTART >= '2026-01-01T00:10:00' "
        "AND WINDOWSTART < TIMESTAMP '2026-01-01 00:20:00'"
    )
    query = planned(sql, TUMBLING)
    access = query.access
    assert isinstance(access, KeyRange) and query.window_filter is None
    inside = [m for m in range(0, 40, 5) if access.start <= key("a", m, m + 5) < access.end]  # type: ignore[operator]
    assert inside == [10, 15]


def test_spark_names_and_epoch_millis_mean_the_same() -> None:
    ms = int((at(10) - dt.datetime(1970, 1, 1)).total_seconds() * 1000)
    ksql = planned(f"SELECT * FROM clicks WHERE user = 'a' AND WINDOWSTART >= {ms}", TUMBLING)
    spark = planned(f"SELECT * FROM clicks WHERE user = 'a' AND window.start >= {ms}", TUMBLING)
    iso = planned(
        "SELECT * FROM clicks WHERE user = 'a' AND `window`.`start` >= '2026-01-01T00:10:00Z'", TUMBLING
    )
    assert ksql.access == spark.access == iso.access


def test_windowend_of_a_fixed_size_window_plans_as_windowstart() -> None:
    by_end = planned("SELECT * FROM clicks WHERE user = 'a' AND WINDOWEND = '2026-01-01T00:15:00'", TUMBLING)
    by_start = planned(
        "SELECT * FROM clicks WHERE user = 'a' AND WINDOWSTART = '2026-01-01T00:10:00'", TUMBLING
    )
    assert by_end.access == by_start.access and by_end.window_filter is None
    between = planned(
        "SELECT * FROM clicks WHERE user = 'a' "
        "AND window.end BETWEEN '2026-01-01T00:10:00' AND '2026-01-01T00:20:00'",
        TUMBLING,
    )
    access = between.access
    assert isinstance(access, KeyRange)
    inside = [m for m in range(0, 40, 5) if access.start <= key("a", m, m + 5) < access.end]  # type: ignore[operator]
    assert inside == [5, 10, 15]  # ends 10, 15 and 20: BETWEEN takes both ends


def test_every_bound_pinned_is_a_point_lookup_in_the_keys_partition() -> None:
    sql = (
        "SELECT * FROM clicks WHERE user = 'a' AND WINDOWSTART = '2026-01-01T00:10:00' "
        "AND WINDOWEND = '2026-01-01T00:15:00'"
    )
    access = planned(sql.replace("clicks", "sessions"), SESSIONS).access
    assert access == KeyLookup((key("a", 10, 15),), (partition_for(encode_key(("a",)), 8),))
    # A fixed-size window's end follows from its start: the range holds that one window.
    ranged = planned(sql, TUMBLING).access
    assert isinstance(ranged, KeyRange) and ranged.partition == access.partitions[0]
    assert ranged.start is not None and ranged.end is not None
    assert [m for m in range(0, 40, 5) if ranged.start <= key("a", m, m + 5) < ranged.end] == [10]


def test_windowend_of_a_session_window_filters_the_keys_windows() -> None:
    query = planned(
        "SELECT * FROM sessions WHERE user = 'a' AND WINDOWEND >= '2026-01-01T00:30:00'", SESSIONS
    )
    assert isinstance(query.access, KeyRange) and query.access.partition is not None
    window_filter = query.window_filter
    assert window_filter is not None
    assert window_filter.keep(key("a", 20, 31)) and window_filter.keep(key("a", 0, 30))
    assert not window_filter.keep(key("a", 20, 29))
    # Rows the filter drops must not use up a LIMIT: the partitions are read without one.
    limited = planned("SELECT * FROM sessions WHERE user = 'a' AND WINDOWEND > 5 LIMIT 3", SESSIONS)
    assert all(spec.limit is None for spec in plain_work(limited, SESSIONS, None).values())


def test_windowstart_without_the_key_scans_every_partition_and_filters() -> None:
    query = planned(
        "SELECT * FROM clicks "
        "WHERE WINDOWSTART >= '2026-01-01T00:10:00' AND WINDOWSTART < '2026-01-01T00:20:00'",
        TUMBLING,
    )
    assert isinstance(query.access, FullScan)
    assert len(plain_work(query, TUMBLING, None)) == 8
    window_filter = query.window_filter
    assert isinstance(window_filter, WindowFilter)
    assert [m for m in range(0, 40, 5) if window_filter.keep(key("zed", m, m + 5))] == [10, 15]


def test_selecting_the_window_column_selects_its_bounds() -> None:
    assert planned("SELECT user, window FROM clicks", TUMBLING).columns == (
        "user",
        "WINDOWSTART",
        "WINDOWEND",
    )
    assert planned("SELECT window.start, count FROM clicks", TUMBLING).columns == ("WINDOWSTART", "count")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM plain WHERE user = 'a' AND WINDOWSTART >= 1",
        "SELECT * FROM plain WHERE windowend = 1",
        "SELECT * FROM plain WHERE window.start >= 1",
        "SELECT WINDOWSTART FROM plain",
    ],
)
def test_window_bounds_on_a_table_that_is_not_windowed_are_an_error_saying_so(sql: str) -> None:
    with pytest.raises(NotWindowedError, match="table 'plain' is not windowed"):
        planned(sql, PLAIN)


def test_a_bound_compared_with_something_not_a_time_is_an_error_naming_it() -> None:
    with pytest.raises(QueryError, match="WINDOWSTART must be compared with a TIMESTAMP"):
        planned("SELECT * FROM clicks WHERE user = 'a' AND WINDOWSTART >= 'yesterday'", TUMBLING)
    with pytest.raises(QueryError, match=r"its window is window\.start"):
        planned("SELECT * FROM clicks WHERE user = 'a' AND other.start >= 1", TUMBLING)


def test_several_window_starts_of_a_key_filter_its_windows() -> None:
    sql = (
        "SELECT * FROM clicks WHERE user = 'a' "
        "AND WINDOWSTART IN ('2026-01-01T00:10:00', '2026-01-01T00:20:00', TIMESTAMP '2026-01-01 00:10:00')"
    )
    query = planned(sql, TUMBLING)
    assert isinstance(query.access, KeyRange) and query.access.partition is not None
    window_filter = query.window_filter
    assert window_filter is not None
    assert [m for m in range(0, 40, 5) if window_filter.keep(key("a", m, m + 5))] == [10, 20]
