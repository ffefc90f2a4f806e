"""The push-query feed's pure parts: EMIT CHANGES parsing and options (query/push.py), what a subscription
takes, its positions and bound (query/feed.py), and the client's resume state (client/subscribe.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.client.subscribe import FeedState
from hotstate.controller.image import TableInfo
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.log.errors import OffsetOutOfRangeError
from hotstate.protocol.keys import encode_key, partition_for
from hotstate.query.execute import QueryError
from hotstate.query.feed import (
    Change,
    End,
    EndReason,
    FeedIndex,
    PendingReplay,
    PendingResync,
    Progress,
    Resync,
    Subscription,
)
from hotstate.query.pull_query import UnsupportedQueryError
from hotstate.query.push import FeedFilter, feed_filter, parse_push, push_options, split_emit
from hotstate.query.tokens import cluster_tag, decode, encode

TAG = cluster_tag("c1")
TABLE = TableInfo("t", 7, 4, 1, (KeyColumn("k", KeyType.STRING),), None)


def key(text: str) -> bytes:
    return encode_key((text,))


def change(partition: int, offset: int, text: str, row: bytes | None = b"\x80") -> Change:
    return Change(partition, offset, 3, key(text), row)


# ------------------------------------------------------------------------------------------- parsing
def test_emit_changes_is_split_off_and_the_rest_parsed_as_a_pull_query() -> None:
    assert split_emit("SELECT * FROM t WHERE k = 'a' EMIT CHANGES;") == "SELECT * FROM t WHERE k = 'a' "
    assert split_emit("select * from t emit changes") == "select * from t "
    assert split_emit("SELECT * FROM t WHERE k = 'EMIT CHANGES'") is None
    assert split_emit("SELECT * FROM t") is None
    query = parse_push("SELECT k, v FROM t WHERE k IN ('a', 'b') EMIT CHANGES")
    assert query.table == "t" and query.columns == ("k", "v")


def test_emit_final_limit_and_plain_queries_are_refused_with_a_reason() -> None:
    with pytest.raises(UnsupportedQueryError, match="EMIT FINAL"):
        split_emit("SELECT * FROM t EMIT FINAL")
    with pytest.raises(UnsupportedQueryError, match="LIMIT"):
        parse_push("SELECT * FROM t LIMIT 3 EMIT CHANGES")
    with pytest.raises(UnsupportedQueryError, match="EMIT CHANGES"):
        parse_push("SELECT * FROM t")


def test_filters_of_lookups_ranges_and_scans() -> None:
    lookup = feed_filter(parse_push("SELECT * FROM t WHERE k IN ('a', 'b') EMIT CHANGES"), TABLE)
    assert lookup.keys == frozenset({key("a"), key("b")})
    assert lookup.partitions == {partition_for(key("a"), 4), partition_for(key("b"), 4)}
    assert lookup.matches(key("a")) and not lookup.matches(key("c"))
    ranged = feed_filter(parse_push("SELECT * FROM t WHERE k >= 'b' AND k < 'd' EMIT CHANGES"), TABLE)
    assert ranged.partitions == {0, 1, 2, 3}
    assert [ranged.matches(key(t)) for t in ("a", "b", "c", "d")] == [False, True, True, False]
    scan = feed_filter(parse_push("SELECT * FROM t EMIT CHANGES"), TABLE)
    assert scan.matches(key("anything")) and scan.partitions == {0, 1, 2, 3}


def test_options_snapshot_offset_reset_and_tokens() -> None:
    assert push_options({}, TABLE, TAG).snapshot is True
    assert push_options({"auto.offset.reset": "latest"}, TABLE, TAG).snapshot is False
    assert push_options({"snapshot": False}, TABLE, TAG).start is None
    token = encode({(7, 1): 5, (7, 3): 9, (8, 0): 2}, TAG)
    options = push_options({"from_token": token}, TABLE, TAG)
    assert options.start == {0: 0, 1: 5, 2: 0, 3: 9}  # a partition the token does not name: from 0
    with pytest.raises(QueryError, match="another cluster"):
        push_options({"from_token": token}, TABLE, cluster_tag("other"))
    with pytest.raises(QueryError, match="names no partition"):
        push_options({"from_token": encode({(8, 0): 2}, TAG)}, TABLE, TAG)
    with pytest.raises(QueryError, match="has 4"):
        push_options({"from_token": encode({(7, 9): 2}, TAG)}, TABLE, TAG)
    with pytest.raises(QueryError, match="unknown property"):
        push_options({"max_lag": 3}, TABLE, TAG)


# ------------------------------------------------------------------------------------------- a subscription
def test_a_subscription_takes_matching_changes_from_its_positions_on() -> None:
    subscription = Subscription(1, FeedFilter(frozenset({0}), keys=frozenset({key("a")})), {0: 5}, bound=10)
    assert not subscription.offer(change(0, 4, "a"))  # before its position: it had it
    assert subscription.offer(change(0, 5, "a"))
    assert not subscription.offer(change(0, 6, "b"))  # not its key: passed over, and its position moves
    assert not subscription.offer(change(1, 7, "a"))  # not its partition
    assert subscription.positions == {0: 7}
    assert [e.offset for e in subscription.take() if isinstance(e, Change)] == [5]


def test_a_subscriber_that_does_not_read_ends_fell_behind_at_its_last_buffered_position() -> None:
    subscription = Subscription(1, FeedFilter(frozenset({0})), {0: 0}, bound=3)
    subscription.start([change(0, 0, "x")])  # the start is not held to the bound
    taken = [subscription.offer(change(0, offset, "a")) for offset in range(1, 10)]
    assert taken == [True, True, True] + [False] * 6
    events = subscription.take()
    end = events[-1]
    assert isinstance(end, End) and end.reason is EndReason.FELL_BEHIND and not end.final
    assert end.positions == {0: 4}  # resume after the last change it will still send
    assert [e.offset for e in events if isinstance(e, Change)] == [0, 1, 2, 3]
    assert not subscription.offer(change(0, 10, "a"))


def test_progress_is_told_once_per_move_and_only_when_idle() -> None:
    subscription = Subscription(1, FeedFilter(frozenset({0}), keys=frozenset({key("a")})), {0: 0}, bound=3)
    assert subscription.progress() is None
    index = FeedIndex(0)
    index.add(subscription)
    index.offer([change(0, offset, "b") for offset in range(12)], 12)  # none of its key: passed over
    assert subscription.progress() == Progress({0: 12})
    assert subscription.progress() is None


def test_the_index_offers_each_change_to_the_subscriptions_that_may_take_it() -> None:
    index = FeedIndex(0)
    by_key = Subscription(1, FeedFilter(frozenset({0}), keys=frozenset({key("a")})), {0: 0}, bound=10)
    other_key = Subscription(2, FeedFilter(frozenset({0}), keys=frozenset({key("z")})), {0: 0}, bound=10)
    ranged = Subscription(3, FeedFilter(frozenset({0}), start=key("b")), {0: 0}, bound=10)
    for s in (by_key, other_key, ranged):
        index.add(s)
    woken = index.offer([change(0, 0, "a"), change(0, 1, "c")], next_offset=2)
    assert woken == {by_key, ranged}
    assert [e.key for e in by_key.take() if isinstance(e, Change)] == [key("a")]
    assert [e.key for e in ranged.take() if isinstance(e, Change)] == [key("c")]
    assert other_key.positions == {0: 2} and not other_key.queue  # passed over, nothing to send
    index.remove(by_key)
    index.remove(other_key)
    assert len(index) == 1


def test_a_subscription_passed_over_by_its_partitions_tail_reports_the_tails_position() -> None:
    """The index moves no subscription per batch: a subscription reads its partitions' tails' position."""
    index = FeedIndex(0)
    quiet = Subscription(1, FeedFilter(frozenset({0}), keys=frozenset({key("a")})), {0: 0}, bound=10)
    index.add(quiet)
    for offset in range(5):
        index.offer([change(0, offset, "b")], offset + 1)
    assert quiet.progress() == Progress({0: 5})
    index.offer([change(0, 5, "b")], 6)
    end = quiet.end(EndReason.SHUTDOWN, "stopping")
    assert end.positions == {0: 6}
    index.offer([change(0, 6, "b")], 7)
    assert quiet.positions == {0: 6}  # ended: where it ended, whatever passes after
    late = Subscription(2, FeedFilter(frozenset({0})), {0: 3}, bound=10)  # starts below the tail
    index.add(late)
    assert late.positions == {0: 3} and index.position == 3
    index.remove(late)
    assert late.tails == {}


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "remove", "offer"]),
            st.one_of(st.none(), st.sampled_from("bdfhj")),
            st.one_of(st.none(), st.sampled_from("cegik")),
            st.lists(st.sampled_from("abcdefghijkl"), min_size=1, max_size=4),
        ),
        max_size=60,
    ),
    st.integers(0, 2),
)
def test_the_index_offers_each_change_to_exactly_the_ranges_holding_its_key(
    steps: list[tuple[str, str | None, str | None, list[str]]], fresh: int
) -> None:
    """Ranges added and removed between batches, indexed by segment (rebuilt every few additions) or
    tested one by one: each subscription takes what offering it every change would give it."""
    import hotstate.query.feed as feed_module

    index = FeedIndex(0)
    live: list[Subscription] = []
    offset = 0
    ids = iter(range(1, 10_000))
    saved = feed_module.FRESH_SPANS
    feed_module.FRESH_SPANS = fresh
    try:
        for action, low, high, texts in steps:
            if action == "add":
                start = None if low is None else key(low)
                end = None if high is None else key(high)
                subscription = Subscription(
                    next(ids), FeedFilter(frozenset({0}), start=start, end=end), {0: offset}, 100
                )
                index.add(subscription)
                live.append(subscription)
            elif action == "remove" and live:
                index.remove(live.pop(len(texts) % len(live)))
            else:
                batch = [change(0, offset + i, text) for i, text in enumerate(texts)]
                offset += len(batch)
                expected = {
                    s.subscription_id: [c.offset for c in batch if s.filter.matches(c.key)] for s in live
                }
                woken = index.offer(batch, offset)
                for subscription in live:
                    taken = [e.offset for e in subscription.take() if isinstance(e, Change)]
                    assert taken == expected[subscription.subscription_id]
                    assert (subscription in woken) == bool(taken)
                    assert subscription.positions == {0: offset}
    finally:
        feed_module.FRESH_SPANS = saved


def test_a_range_takes_the_key_of_its_start_and_not_that_of_its_end() -> None:
    import hotstate.query.feed as feed_module

    index = FeedIndex(0)
    ranges = [("b", "d"), ("d", "f"), ("c", None), (None, "c")]
    subscriptions = [
        Subscription(
            i,
            FeedFilter(
                frozenset({0}),
                start=None if low is None else key(low),
                end=None if high is None else key(high),
            ),
            {0: 0},
            bound=10,
        )
        for i, (low, high) in enumerate(ranges)
    ]
    for subscription in subscriptions:
        index.add(subscription)
    assert len(ranges) <= feed_module.FRESH_SPANS  # tested one by one until here
    index._build()  # now by segment
    for offset, text in enumerate("abcdef"):
        woken = index.offer([change(0, offset, text)], offset + 1)
        assert woken == {s for s in subscriptions if s.filter.matches(key(text))}, text


def test_the_index_tests_each_range_when_they_overlap_too_much_to_segment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hotstate.query.feed as feed_module

    monkeypatch.setattr(feed_module, "MAX_SEGMENT_ENTRIES", 3)
    monkeypatch.setattr(feed_module, "FRESH_SPANS", 1)
    index = FeedIndex(0)
    subscriptions = [
        Subscription(i, FeedFilter(frozenset({0}), start=key(low), end=None), {0: 0}, bound=10)
        for i, low in enumerate("abcdef")
    ]
    for subscription in subscriptions:
        index.add(subscription)
    woken = index.offer([change(0, 0, "c")], 1)
    assert woken == set(subscriptions[:3])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1), st.sampled_from("abc")), min_size=1, max_size=40),
    st.lists(st.integers(1, 39), max_size=4),
    st.integers(1, 5),
)
def test_resuming_from_the_end_positions_delivers_every_change_exactly_once(
    writes: list[tuple[int, str]], cuts: list[int], bound: int
) -> None:
    """Changes offered to a chain of subscriptions, each started from where the last one ended: fell
    behind (from its End's positions), or cut as a dead server would be (half of what it buffered lost,
    the client resuming after the last change it received). Each is fed again from the start of the log
    (a replay from an earlier position, as a replica that is behind gives): the concatenated deliveries
    are every matching change once."""
    log: list[Change] = []
    offsets = {0: 0, 1: 0}
    for partition, text in writes:
        log.append(change(partition, offsets[partition], text))
        offsets[partition] += 1
    wanted = FeedFilter(frozenset({0, 1}), keys=frozenset({key("a"), key("c")}))
    delivered: list[Change] = []
    positions = {0: 0, 1: 0}
    cut_at = sorted(set(cuts))
    attempts = 0
    while attempts < 200:
        attempts += 1
        subscription = Subscription(attempts, wanted, positions, bound)
        cut = False
        for index, item in enumerate(log):
            subscription.offer(item)
            if cut_at and index == cut_at[0]:
                cut_at.pop(0)
                cut = True
                break
        events = subscription.take()
        if cut:
            received = [e for e in events[: len(events) // 2] if isinstance(e, Change)]
            delivered += received
            for item in received:
                positions[item.partition] = item.position
            continue
        delivered += [e for e in events if isinstance(e, Change)]
        end = next((e for e in events if isinstance(e, End)), None)
        if end is None:
            break
        positions = dict(end.positions)
    expected = [c for c in log if c.key in wanted.keys]  # type: ignore[operator]
    assert sorted(delivered, key=lambda c: (c.partition, c.offset)) == sorted(
        expected, key=lambda c: (c.partition, c.offset)
    )


# ------------------------------------------------------------------------------------------- the client
def test_a_snapshot_that_broke_off_is_taken_again_whole() -> None:
    state = FeedState("SELECT * FROM t EMIT CHANGES", None, True, servers=2, first=0)
    start = encode({(7, 0): 4}, TAG)
    state.on_line(_line(type="header", token=start, table_id=7))
    assert state.on_line(_line(type="row", partition=0, key=["a"], row={"k": "a"})) == []
    state.moved_on()  # the server died before snapshot_end: the row was never given out
    assert state.token is None and state.body()["snapshot"] is True
    state.on_line(_line(type="header", token=start, table_id=7))
    state.on_line(_line(type="row", partition=0, key=["a"], row={"k": "a"}))
    rows = state.on_line(_line(type="snapshot_end", positions={"0": 4}, token=start))
    assert [c.key for c in rows] == [("a",)]


def _line(**event: object) -> str:
    return json.dumps(event)


def test_the_client_state_drops_what_it_had_and_resumes_from_its_positions() -> None:
    state = FeedState("SELECT * FROM t EMIT CHANGES", None, True, servers=3, first=0)
    assert state.body() == {"sql": "SELECT * FROM t EMIT CHANGES", "snapshot": True}
    start = encode({(7, 0): 4, (7, 1): 0}, TAG)
    assert state.on_line(_line(type="header", token=start, table_id=7)) == []
    assert state.on_line(_line(type="row", partition=0, key=["a"], row={"k": "a"})) == []  # held back
    rows = state.on_line(_line(type="snapshot_end", positions={"0": 4, "1": 0}, token=start))
    assert [(c.kind, c.key) for c in rows] == [("snapshot", ("a",))]
    got = state.on_line(_line(type="change", partition=0, offset=4, epoch=1, key=["a"], row=None))
    assert got[0].deleted and got[0].offset == 4
    state.on_line(_line(type="end", reason="fell_behind", final=False, positions={"0": 5, "1": 2}))
    assert state.positions == {0: 5, 1: 2}
    token = state.token
    assert token is not None and decode(token, TAG) == {(7, 0): 5, (7, 1): 2}
    assert state.body() == {"sql": "SELECT * FROM t EMIT CHANGES", "from_token": token}
    # A server that replays from further back: what the client had is dropped.
    assert state.on_line(_line(type="change", partition=0, offset=4, epoch=1, key=["a"], row={})) == []
    resync = state.on_line(
        _line(type="resync", partition=1, position=9, epoch=2, rows=[{"key": ["b"], "row": {"k": "b"}}])
    )
    assert [c.kind for c in resync] == ["resync_begin", "resync"] and state.positions[1] == 9
    assert state.moved_on() == 0.0 and state.server == 1
    resumed = state.token  # it had started: it resumes where it was
    assert resumed is not None and decode(resumed, TAG) == {(7, 0): 5, (7, 1): 9}
    assert state.moved_on() == 0.0 and state.server == 2
    assert state.moved_on() > 0 and state.server == 0  # every server failed in a row: a pause


def test_a_resync_in_parts_begins_once_and_moves_the_position_with_its_last_part() -> None:
    state = FeedState("SELECT * FROM t EMIT CHANGES", encode({(7, 0): 1}, TAG), True, servers=1, first=0)
    state.on_line(_line(type="header", token=encode({(7, 0): 1}, TAG), table_id=7))
    first = state.on_line(
        _line(type="resync", partition=0, position=9, epoch=2, rows=[{"key": ["a"], "row": {}}], more=True)
    )
    assert [c.kind for c in first] == ["resync_begin", "resync"] and state.positions == {0: 1}
    rest = state.on_line(
        _line(
            type="resync", partition=0, position=9, epoch=2, rows=[{"key": ["b"], "row": {}}], continued=True
        )
    )
    assert [(c.kind, c.key) for c in rest] == [("resync", ("b",))] and state.positions == {0: 9}


def _replaying(replayed: list[Change], position: int, bound: int = 10) -> tuple[FeedIndex, Subscription]:
    index = FeedIndex(0)
    first = replayed[0].offset
    subscription = Subscription(1, FeedFilter(frozenset({0})), {0: first}, bound=bound, known=False)
    subscription.start([], None, [PendingReplay(0, first, position, iter(replayed))])
    index.add(subscription)
    return index, subscription


def test_a_replay_longer_than_the_buffer_is_sent_in_steps_before_the_changes_queued_since() -> None:
    """A resume seconds behind a busy table: every change from the log, in steps, then the live ones; no
    Progress while the replay is under way (a token from it would skip what is still to come)."""
    index, subscription = _replaying([change(0, offset, f"k{offset % 7}") for offset in range(5, 55)], 55)
    assert subscription.positions == {0: 55}  # the live changes it takes start where the replay ends
    for offset in range(55, 60):  # live, meanwhile: queued behind the replay, within the bound
        index.offer([change(0, offset, "live")], offset + 1)
    assert subscription.progress() is None
    sent: list[int] = []
    steps = 0
    while subscription.waiting:
        events = subscription.take(step=16)
        sent += [e.offset for e in events if isinstance(e, Change)]
        steps += 1
    assert sent == list(range(5, 60)) and steps == 5  # 16 + 16 + 16 + 2, then the queue
    assert subscription.progress() == Progress({0: 60})  # all sent: its position may be told


def test_a_replay_sends_only_the_feeds_keys() -> None:
    subscription = Subscription(1, FeedFilter(frozenset({0}), keys=frozenset({key("b")})), {0: 0}, bound=4)
    replayed = [change(0, offset, "ab"[offset % 2]) for offset in range(20)]
    subscription.start([], None, [PendingReplay(0, 0, 20, iter(replayed))])
    sent = [e for e in subscription.take(step=100) if isinstance(e, Change)]
    assert [e.offset for e in sent] == list(range(1, 20, 2)) and not subscription.waiting


def test_a_replay_the_log_no_longer_holds_gives_way_to_a_resync_and_the_changes_it_holds_go() -> None:
    """Retention moved past a replay under way: the partition's current rows at a position take the rest's
    place, and of the changes queued meanwhile only those past that position are sent after them."""

    def replayed() -> Iterator[Change]:
        yield from (change(0, offset, "a") for offset in range(5, 10))
        raise OffsetOutOfRangeError(10, 30, 40)

    index = FeedIndex(0)
    subscription = Subscription(1, FeedFilter(frozenset({0})), {0: 5}, bound=10, known=False)
    subscription.start([], None, [PendingReplay(0, 5, 20, replayed())])
    index.add(subscription)
    for offset in range(20, 26):
        index.offer([change(0, offset, "live")], offset + 1)
    assert [e.offset for e in subscription.take(step=3) if isinstance(e, Change)] == [5, 6, 7]
    with pytest.raises(OffsetOutOfRangeError):
        subscription.take(step=3)  # 8 and 9 were read but not sent: the replay is at 8
    assert isinstance(subscription.resyncs[0], PendingReplay) and subscription.resyncs[0].next == 8
    rows = iter([(key("a"), b"\x80")])
    subscription.replay_failed(0, PendingResync(0, 23, 4, rows), "log truncated")
    [resync] = subscription.take(step=3)
    assert isinstance(resync, Resync) and resync.position == 23 and resync.rows == ((key("a"), b"\x80"),)
    assert [e.offset for e in subscription.take() if isinstance(e, Change)] == [23, 24, 25]
    assert subscription.positions == {0: 26}


def test_a_replay_whose_replica_went_ends_the_feed_where_the_replay_got_to() -> None:
    """The replica closed under a replay (its log unreadable): the feed ends at the first change it did not
    send on that partition, whatever End it had already queued (the replica's going), and the changes
    queued behind the replay are not sent (they come again on the resume)."""
    index, subscription = _replaying([change(0, offset, "a") for offset in range(5, 20)], 20)
    for offset in range(20, 23):
        index.offer([change(0, offset, "live")], offset + 1)
    assert len(subscription.take(step=4)) == 4
    subscription.end(EndReason.REPLICA_GONE, "moved")  # told beyond the replay: must not be sent as is
    subscription.replay_failed(0, None, "log closed")
    assert not subscription.resyncs
    [end] = subscription.take()
    assert isinstance(end, End) and end.reason is EndReason.REPLICA_GONE and end.positions == {0: 9}
    _, alone = _replaying([change(0, offset, "a") for offset in range(5, 20)], 20)
    alone.take(step=2)
    alone.replay_failed(0, None, "log closed")
    [end] = alone.take()
    assert isinstance(end, End) and end.positions == {0: 7} and end.message == "log closed"
