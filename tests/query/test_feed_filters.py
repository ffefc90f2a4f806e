"""Push queries with a WHERE beyond their keys (query/push.py, query/feed.py): the filter is the scan's
condition, tested once per change per group of feeds with the same one; a row that stops matching is sent as
a *left* change, so a client-side cache of the feed stays equal to the filtered table; a snapshot handed
over as an iterator is read in steps."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.controller.image import TableInfo
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.keys import encode_key
from hotstate.protocol.rows import encode_row
from hotstate.query.feed import Change, Event, FeedIndex, Resync, SnapshotEnd, SnapshotRow, Subscription
from hotstate.query.pull_query import UnsupportedQueryError
from hotstate.query.push import FeedFilter, feed_filter, feed_outputs, parse_push

TABLE = TableInfo("t", 7, 1, 1, (KeyColumn("k", KeyType.STRING),), None)


def key(text: str) -> bytes:
    return encode_key((text,))


def row(text: str, v: int) -> bytes:
    return encode_row({"k": text, "v": v})


def filtered(sql: str) -> FeedFilter:
    return feed_filter(parse_push(sql), TABLE)


# ------------------------------------------------------------------------------------------- parsing
def test_a_non_key_where_becomes_the_feeds_row_test_with_a_normalized_text() -> None:
    wanted = filtered("SELECT * FROM t WHERE v > 3 EMIT CHANGES")
    assert wanted.where is not None and wanted.keys is None
    assert wanted.holds(row("a", 4)) and not wanted.holds(row("a", 3))
    assert not wanted.holds(encode_row({"k": "a", "v": "text"}))  # cannot be compared: no match, no failure
    assert filtered("select * from t where v>3 emit changes").where_text == wanted.where_text
    assert filtered("SELECT * FROM t WHERE v > 4 EMIT CHANGES").where_text != wanted.where_text
    # Key terms still narrow the keys read; the whole WHERE is the row test.
    keyed = filtered("SELECT * FROM t WHERE k = 'a' AND v LIKE 'x%' EMIT CHANGES")
    assert keyed.keys == frozenset({key("a")}) and keyed.where is not None
    assert filtered("SELECT * FROM t WHERE k = 'a' EMIT CHANGES").where is None


def test_aggregates_group_by_and_order_by_are_refused_naming_what_is_refused() -> None:
    for sql in (
        "SELECT COUNT(*) FROM t EMIT CHANGES",
        "SELECT v, COUNT(*) FROM t GROUP BY v EMIT CHANGES",
        "SELECT SUM(v) FROM t WHERE v > 1 EMIT CHANGES",
    ):
        with pytest.raises(
            UnsupportedQueryError, match="aggregates and GROUP BY are not supported on a push"
        ):
            filtered(sql)
    with pytest.raises(UnsupportedQueryError, match="ORDER BY is not supported on a push"):
        filtered("SELECT * FROM t ORDER BY v EMIT CHANGES")


def test_computed_columns_are_outputs_and_plain_ones_are_names() -> None:
    names, outputs = feed_outputs(parse_push("SELECT k, v * 2 AS twice FROM t EMIT CHANGES"), TABLE)
    assert names == ("k", "twice") and len(outputs) == 2
    assert feed_outputs(parse_push("SELECT k, v FROM t WHERE v > 1 EMIT CHANGES"), TABLE) == (("k", "v"), ())
    assert feed_outputs(parse_push("SELECT * FROM t WHERE v > 1 EMIT CHANGES"), TABLE) == (None, ())


# ------------------------------------------------------------------------------------------- left changes
def test_a_row_that_stops_matching_is_sent_as_left_only_to_whom_it_was_sent() -> None:
    wanted = filtered("SELECT * FROM t WHERE v > 3 EMIT CHANGES")
    subscription = Subscription(1, wanted, {0: 10}, bound=100)
    subscription.start([SnapshotRow(0, key("a"), row("a", 5)), SnapshotRow(0, key("b"), row("b", 1))])
    assert [e.key for e in subscription.take() if isinstance(e, SnapshotRow)] == [key("a")]
    assert subscription.offer(Change(0, 10, 1, key("a"), row("a", 2)))  # a leaves the filter
    assert not subscription.offer(Change(0, 11, 1, key("b"), row("b", 2)))  # b never was in it
    assert not subscription.offer(Change(0, 12, 1, key("b"), None))  # nor is its delete news
    assert subscription.offer(Change(0, 13, 1, key("b"), row("b", 9)))  # b enters
    assert subscription.offer(Change(0, 14, 1, key("b"), None))  # and is deleted
    sent = [e for e in subscription.take() if isinstance(e, Change)]
    assert [(e.offset, e.row is None, e.left) for e in sent] == [
        (10, True, True),
        (13, False, False),
        (14, True, False),
    ]
    assert subscription.positions == {0: 15}


def test_a_resumed_filtered_feed_sends_every_non_matching_change_as_left() -> None:
    wanted = filtered("SELECT * FROM t WHERE v > 3 EMIT CHANGES")
    subscription = Subscription(1, wanted, {0: 0}, bound=100, known=False)
    subscription.start([])
    assert subscription.offer(Change(0, 0, 1, key("x"), row("x", 1)))  # it may hold x from before
    sent = subscription.take()
    assert isinstance(sent[0], Change) and sent[0].left and sent[0].row is None


def test_the_filter_is_evaluated_once_per_change_per_group_of_feeds_with_the_same_one() -> None:
    calls: list[str] = []

    def counting(wanted: FeedFilter, name: str) -> FeedFilter:
        test = wanted._test
        assert test is not None

        def counted(values: Any) -> object:
            calls.append(name)
            return test(values)

        return dataclasses.replace(wanted, _test=counted)

    same = counting(filtered("SELECT * FROM t WHERE v > 3 EMIT CHANGES"), "v>3")
    other = counting(filtered("SELECT * FROM t WHERE v < 3 EMIT CHANGES"), "v<3")
    index = FeedIndex(0)
    subscriptions = [Subscription(i, same, {0: 0}, bound=10) for i in range(5)]
    subscriptions.append(Subscription(9, other, {0: 0}, bound=10))
    for subscription in subscriptions:
        subscription.start([])
        index.add(subscription)
    woken = index.offer([Change(0, 0, 1, key("a"), row("a", 7)), Change(0, 1, 1, key("b"), row("b", 1))], 2)
    assert sorted(calls) == ["v<3", "v<3", "v>3", "v>3"]  # two changes, two groups
    assert len(woken) == 6


def _cache(events: Iterable[Event], cache: dict[bytes, bytes]) -> None:
    """A client's cache of a feed: rows by key (a resync replaces its partition's)."""
    for event in events:
        if isinstance(event, SnapshotRow):
            cache[event.key] = event.row
        elif isinstance(event, Resync):
            cache.clear()
            cache.update(event.rows)
        elif isinstance(event, Change):
            if event.row is None:
                cache.pop(event.key, None)
            else:
                cache[event.key] = event.row


@settings(max_examples=80, deadline=None)
@given(
    st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 9), max_size=6),
    st.lists(st.tuples(st.sampled_from("abcdef"), st.one_of(st.none(), st.integers(0, 9))), max_size=40),
    st.integers(0, 40),
    st.integers(1, 4),
    st.booleans(),
)
def test_a_client_cache_of_a_filtered_feed_stays_equal_to_the_filtered_table(
    initial: dict[str, int], writes: list[tuple[str, int | None]], cut: int, step: int, resume: bool
) -> None:
    """Start from a snapshot read in steps while changes arrive; optionally resume from a token midway
    (the server then does not know what the client holds): the cache is the filtered table at every end."""
    wanted = filtered("SELECT * FROM t WHERE v >= 5 EMIT CHANGES")
    table = {key(k): row(k, v) for k, v in initial.items()}
    snapshot = sorted(table.items())
    subscription = Subscription(1, wanted, {0: 0}, bound=1000)
    subscription.start([SnapshotEnd({0: 0})], iter([(0, k, r) for k, r in snapshot]))
    cache: dict[bytes, bytes] = {}
    for offset, (text, value) in enumerate(writes):
        if offset == cut and resume:
            _cache(_drain(subscription, step), cache)
            subscription = Subscription(2, wanted, dict(subscription.positions), bound=1000, known=False)
            subscription.start([])
        new = None if value is None else row(text, value)
        subscription.offer(Change(0, offset, 1, key(text), new))
        if new is None:
            table.pop(key(text), None)
        else:
            table[key(text)] = new
        if offset % 3 == 0:
            _cache(subscription.take(step), cache)  # reads a step now and then
    _cache(_drain(subscription, step), cache)
    assert cache == {k: r for k, r in table.items() if wanted.holds(r)}


def _drain(subscription: Subscription, step: int) -> list[Event]:
    events: list[Event] = []
    while subscription.waiting:
        events += subscription.take(step)
    return events


def test_a_pending_snapshot_is_read_a_step_at_a_time_before_the_queue() -> None:
    subscription = Subscription(1, FeedFilter(frozenset({0})), {0: 3}, bound=2)
    rows = ((0, key(f"k{i:03}"), row("x", i)) for i in range(25))
    subscription.start([SnapshotEnd({0: 3})], rows)
    assert subscription.offer(Change(0, 3, 1, key("z"), row("z", 1)))
    steps = []
    while subscription.pending is not None:
        steps.append(subscription.take(10))
    assert [len(s) for s in steps] == [10, 10, 5]
    assert all(isinstance(e, SnapshotRow) for s in steps for e in s)
    rest = subscription.take()
    assert isinstance(rest[0], SnapshotEnd) and isinstance(rest[1], Change)
