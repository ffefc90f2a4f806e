"""A resumed feed's replay from a real partition log (server/feed_log.py, server/feeds.py): decoded once per
block and shared by every feed resuming over it, read a step at a time as it is sent (however far behind
the feed is, within REPLAY_MAX_CHANGES), then the changes that came meanwhile; retention moving past a
replay under way turns its rest into a resync; another server's reads come in bounded answers. The log is
real (hotstate.log), the store a stand-in holding only its position."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hotstate.controller.image import TableInfo
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.log.errors import LogError, OffsetOutOfRangeError
from hotstate.log.log import Log
from hotstate.protocol.keys import encode_key
from hotstate.protocol.rows import encode_records, encode_row
from hotstate.query.feed import Change, Resync
from hotstate.query.tokens import cluster_tag, encode
from hotstate.replica.core import ReplicaRole
from hotstate.replica.messages import FeedReadRequest, ReplicaError
from hotstate.server.feed_log import BLOCK_OFFSETS, ChangeLog
from hotstate.server.feeds import Feed, FeedHub
from hotstate.server.scan_pace import FIRST_SLICE_ROWS

TABLE = TableInfo("t", 1, 1, 1, (KeyColumn("k", KeyType.STRING),), None)


def _key(i: int) -> bytes:
    return encode_key((f"k{i % 50:03}",))


def _replica(tmp_path: Path, records: int, *, batch: int = 100) -> Any:
    """A replica over a real log of `records` records (every 7th a delete), its store applied to the end."""
    log = Log.open(tmp_path / "log")
    for first in range(0, records, batch):
        offsets = range(first, min(first + batch, records))
        keys = [_key(i) for i in offsets]
        rows = [None if i % 7 == 6 else encode_row({"k": f"k{i % 50:03}", "v": i}) for i in offsets]
        log.append(2, encode_records(keys, rows))
    store = SimpleNamespace(position=records, epoch=2, scan=lambda start, end: iter([(_key(1), b"\x80")]))
    return SimpleNamespace(
        table=TABLE,
        partition=0,
        installing=False,
        log=log,
        store=store,
        core=SimpleNamespace(role=ReplicaRole.LEADER, log_end_offset=records),
    )


def test_changes_are_every_committed_record_decoded_once_per_block_for_every_reader(tmp_path: Path) -> None:
    replica = _replica(tmp_path, 3000)
    changes = ChangeLog()
    got = list(changes.changes(replica, 1500, 2900))
    assert [c.offset for c in got] == list(range(1500, 2900))
    assert all(c.epoch == 2 and c.key == _key(c.offset) for c in got)
    assert [c.offset for c in got if c.row is None] == [o for o in range(1500, 2900) if o % 7 == 6]
    reads = changes.reads
    assert reads == 2  # the blocks of 1024-2047 and 2048-2900
    again = list(changes.changes(replica, 1100, 2900))  # another feed, from elsewhere in the same block
    assert [c.offset for c in again] == list(range(1100, 2900)) and changes.reads == reads
    assert again[400] is got[0]  # one Change per record: its encodings are made once for every feed


def test_a_block_grows_with_the_store_and_the_cache_keeps_its_bound(tmp_path: Path) -> None:
    replica = _replica(tmp_path, 5000)
    changes = ChangeLog(max_changes=2 * BLOCK_OFFSETS)
    assert [c.offset for c in changes.chunk(replica, 10, 100)] == list(range(10, 100))
    assert [c.offset for c in changes.chunk(replica, 100, 300)] == list(range(100, 300))  # grown
    assert changes.reads == 2 and len(changes) == 300
    assert len(changes.chunk(replica, 300, 5000)) == BLOCK_OFFSETS - 300  # to its block's end at most
    list(changes.changes(replica, 1024, 5000))
    assert len(changes) <= 2 * BLOCK_OFFSETS
    assert changes.chunk(replica, 5000, 5000) == []


def test_a_log_that_no_longer_holds_the_next_change_or_is_closed_fails_the_read(tmp_path: Path) -> None:
    replica = _replica(tmp_path, 3000)
    changes = ChangeLog()
    replay = changes.changes(replica, 0, 3000)
    assert next(replay).offset == 0
    replica.log.advance_start_offset(2500)
    for _ in range(BLOCK_OFFSETS - 1):  # the first block was read before
        next(replay)
    with pytest.raises(OffsetOutOfRangeError):
        next(replay)
    replica.log.close()
    with pytest.raises(LogError):
        changes.chunk(replica, 2600, 3000)


def _hub(replica: Any, *, buffer: int, step: int) -> FeedHub:
    """A step's time bound (query.scan.step.ms) too long to bind: steps of `step` changes after the first
    (FIRST_SLICE_ROWS, their cost unknown yet)."""
    image: Any = SimpleNamespace(tables={"t": TABLE}, partitions={})
    return FeedHub(
        1,
        cluster_tag("c"),
        lambda: image,
        lambda: {(1, 0): replica},
        max_subscriptions=8,
        buffer_changes=buffer,
        step_rows=step,
        step_ms=60_000,
    )


def _offsets(events: list[Any]) -> list[int]:
    assert all(isinstance(e, Change) for e in events), events
    return [e.offset for e in events]


async def _drain(feed: Feed, until: int) -> list[list[Any]]:
    steps: list[list[Any]] = []
    while not steps or feed.subscription.positions[0] < until or feed.subscription.waiting:
        steps.append(await feed.next_events(0.01))
    return steps


def test_a_resume_far_beyond_the_buffer_gets_every_change_in_steps_then_the_live_ones(tmp_path: Path) -> None:
    """3,000 changes behind with a buffer of 100: each one, in order, at most a step of them per turn of the
    event loop, then the changes applied while the replay was under way; two feeds share the reads."""

    async def scenario() -> None:
        replica = _replica(tmp_path, 3000)
        hub = _hub(replica, buffer=100, step=250)
        token = encode({(1, 0): 10}, cluster_tag("c"))
        feeds = [hub.open("SELECT * FROM t EMIT CHANGES", {"from_token": token}) for _ in range(2)]
        assert all(isinstance(feed, Feed) for feed in feeds)
        assert hub.changes.reads == 0  # opening reads nothing yet
        live = [(_key(i), encode_row({"k": "live", "v": i})) for i in range(3000, 3050)]
        replica.log.append(2, encode_records([k for k, _ in live], [r for _, r in live]))
        replica.store.position = 3050
        hub.on_applied((1, 0), 3000, 2, live, 3050)
        for feed in feeds:
            assert isinstance(feed, Feed)
            steps = await _drain(feed, 3050)
            assert max(len(events) for events in steps) <= 250
            sent = [e for events in steps for e in events if isinstance(e, Change)]
            assert [c.offset for c in sent] == list(range(10, 3050))
            assert [c.row for c in sent[-50:]] == [r for _, r in live]
            feed.close()
        assert hub.changes.reads == 3  # the replay's three blocks, read for the first feed only

    asyncio.run(scenario())


def test_retention_moving_past_a_replay_under_way_turns_its_rest_into_a_resync(tmp_path: Path) -> None:
    async def scenario() -> None:
        replica = _replica(tmp_path, 3000)
        hub = _hub(replica, buffer=100, step=500)
        feed = hub.open("SELECT * FROM t EMIT CHANGES", {"from_token": encode({(1, 0): 0}, cluster_tag("c"))})
        assert isinstance(feed, Feed)
        first = await feed.next_events(0.01)
        assert _offsets(first) == list(range(FIRST_SLICE_ROWS))
        replica.log.advance_start_offset(2048)  # the rest of the first block is cached: it is sent
        events = await feed.next_events(0.01)
        assert _offsets(events) == list(range(FIRST_SLICE_ROWS, FIRST_SLICE_ROWS + 500))
        events = await feed.next_events(0.01)
        assert _offsets(events) == list(range(FIRST_SLICE_ROWS + 500, FIRST_SLICE_ROWS + 1000))
        # The next step reaches the second block, which the log no longer holds: the rest is a resync (of
        # the store's rows now), the step's changes from the first block with it.
        events = await feed.next_events(0.01)
        assert len(events) == 1 and isinstance(events[0], Resync) and events[0].position == 3000
        assert feed.subscription.positions == {0: 3000}
        feed.close()

    asyncio.run(scenario())


def test_another_servers_read_comes_in_bounded_answers_that_follow_on(tmp_path: Path) -> None:
    async def scenario() -> None:
        replica = _replica(tmp_path, 3000)
        hub = _hub(replica, buffer=100, step=500)
        position, got = 0, list[tuple[int, int, bytes, bytes]]()
        while position < 3000:
            answer = await hub.serve_read(FeedReadRequest(1, 0, position, 0, 20_000))
            assert answer.error is ReplicaError.NONE and 0 < len(answer.changes) <= 1000
            got += answer.changes
            position = answer.position
        assert [c[0] for c in got] == list(range(3000))
        assert [c[0] for c in got if c[3] == b""] == [o for o in range(3000) if o % 7 == 6]
        replica.log.advance_start_offset(2048)
        gone = await hub.serve_read(FeedReadRequest(1, 0, 5, 0, 20_000))
        assert gone.gone and gone.position == 5

    asyncio.run(scenario())
