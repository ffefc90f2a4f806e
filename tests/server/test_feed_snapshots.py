"""A feed's snapshot (and a resync) read in steps by its stream (server/feeds.py): never more than
`step_rows` rows per event-loop turn, the changes that arrive meanwhile after it, a store closed under it
ending the feed without a `snapshot_end` (the subscriber takes the snapshot again), and a resync sent in
parts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hotstate.controller.image import TableInfo
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.keys import encode_key
from hotstate.protocol.rows import encode_row
from hotstate.query.feed import Change, End, EndReason, Resync, SnapshotEnd, SnapshotRow
from hotstate.query.tokens import cluster_tag, encode
from hotstate.replica.core import ReplicaRole
from hotstate.replica.store import StoreError
from hotstate.server.feeds import Feed, FeedHub
from hotstate.server.scan_pace import FIRST_SLICE_ROWS

TABLE = TableInfo("t", 1, 1, 1, (KeyColumn("k", KeyType.STRING),), None)


class _Store:
    """A store whose scan is a view of its rows when called, and counts what was read of it."""

    def __init__(self, rows: int, fail_after: int | None = None, pad: str = "") -> None:
        self.rows = [
            (
                encode_key((f"k{i:05}",)),
                encode_row({"k": f"k{i:05}", "v": i, **({"pad": pad} if pad else {})}),
            )
            for i in range(rows)
        ]
        self.position = 10
        self.epoch = 1
        self.read = 0
        self.fail_after = fail_after

    def scan(self, start: bytes | None, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        view = list(self.rows)

        def items() -> Iterator[tuple[bytes, bytes]]:
            for item in view:
                if self.fail_after is not None and self.read >= self.fail_after:
                    raise StoreError(Path("x"), "closed during a scan")
                self.read += 1
                yield item

        return items()


def _hub(store: _Store, step: int, log_start: int = 0, step_ms: int = 60_000) -> FeedHub:
    """step_ms: a step's time bound, by default too long to bind (these rows cost microseconds)."""
    replica = SimpleNamespace(
        store=store,
        table=TABLE,
        partition=0,
        installing=False,
        core=SimpleNamespace(role=ReplicaRole.LEADER, log_end_offset=store.position),
        log=SimpleNamespace(start_offset=log_start),
    )
    image: Any = SimpleNamespace(tables={"t": TABLE}, partitions={})
    return FeedHub(
        1,
        cluster_tag("c"),
        lambda: image,
        lambda: {(1, 0): replica},  # type: ignore[dict-item]
        max_subscriptions=4,
        buffer_changes=100,
        step_rows=step,
        step_ms=step_ms,
    )


def test_a_snapshot_is_read_a_step_per_turn_and_the_changes_meanwhile_follow_it() -> None:
    async def scenario() -> None:
        store = _Store(250)
        hub = _hub(store, step=100)
        feed = hub.open("SELECT * FROM t WHERE v >= 0 EMIT CHANGES", {})
        assert isinstance(feed, Feed)
        assert store.read == 0  # opening reads nothing yet
        store.rows.append((encode_key(("zz",)), encode_row({"k": "zz", "v": 1})))  # after the view: not in it
        hub.on_applied((1, 0), 10, 1, [(encode_key(("k00001",)), encode_row({"k": "k00001", "v": 7}))], 11)
        steps = []
        while True:
            events = await feed.next_events(1.0)
            steps.append((store.read, events))
            if any(isinstance(e, SnapshotEnd) for e in events):
                break
        # The first step reads FIRST_SLICE_ROWS (these rows' cost unknown yet), then step_rows a step.
        assert [read for read, _ in steps[:4]] == [
            FIRST_SLICE_ROWS,
            FIRST_SLICE_ROWS + 100,
            FIRST_SLICE_ROWS + 200,
            250,
        ]
        rows = [e for _, events in steps for e in events if isinstance(e, SnapshotRow)]
        assert len(rows) == 250
        last = steps[-1][1]
        assert isinstance(last[-2], SnapshotEnd) and isinstance(last[-1], Change) and last[-1].offset == 10
        feed.close()

    asyncio.run(scenario())


def test_a_snapshot_of_rows_a_costly_where_tests_is_read_a_row_or_so_a_step() -> None:
    """A WHERE that rewrites a 120 kB string takes milliseconds a row: past the first step each step reads
    about query.scan.step.ms of them (one row), not step_rows rows' seconds of the event loop."""

    async def scenario() -> None:
        store = _Store(30, pad="x" * 120_000)
        hub = _hub(store, step=1000, step_ms=1)
        where = "LENGTH(REPLACE(REPLACE(pad, 'x', 'yy'), 'y', 'zz')) > 0"
        feed = hub.open(f"SELECT k FROM t WHERE {where} EMIT CHANGES", {})
        assert isinstance(feed, Feed)
        reads = []
        rows = 0
        while True:
            before = store.read
            events = await feed.next_events(1.0)
            reads.append(store.read - before)
            rows += sum(isinstance(e, SnapshotRow) for e in events)
            if any(isinstance(e, SnapshotEnd) for e in events):
                break
        assert rows == 30
        assert reads[0] == FIRST_SLICE_ROWS and max(reads[1:]) <= 2, reads
        feed.close()

    asyncio.run(scenario())


def test_a_store_closed_under_the_snapshot_ends_the_feed_without_its_end() -> None:
    async def scenario() -> None:
        hub = _hub(_Store(250, fail_after=150), step=100)
        feed = hub.open("SELECT * FROM t EMIT CHANGES", {})
        assert isinstance(feed, Feed)
        first = FIRST_SLICE_ROWS  # the first step's rows, then step_rows a step
        assert [len(await feed.next_events(1.0)) for _ in range(2)] == [first, 100]
        events = await feed.next_events(1.0)
        assert not any(isinstance(e, SnapshotEnd) for e in events)
        end = events[-1]
        assert isinstance(end, End) and end.reason is EndReason.REPLICA_GONE
        assert len(hub) == 0

    asyncio.run(scenario())


def test_a_resync_is_read_in_parts_and_the_feeds_position_moves_with_its_last() -> None:
    async def scenario() -> None:
        store = _Store(250)
        hub = _hub(store, step=100, log_start=5)  # the log no longer holds what follows position 1
        token = encode({(1, 0): 1}, cluster_tag("c"))
        feed = hub.open("SELECT * FROM t WHERE v >= 100 EMIT CHANGES", {"from_token": token})
        assert isinstance(feed, Feed)
        assert store.read == 0
        parts = []
        for _ in range(4):
            events = await feed.next_events(1.0)
            assert len(events) == 1 and isinstance(events[0], Resync)
            parts.append(events[0])
        assert store.read == 250
        first = FIRST_SLICE_ROWS  # the first step's rows (none of them v >= 100), then step_rows a step
        assert [(len(p.rows), p.more, p.continued) for p in parts] == [
            (0, True, False),
            (first, True, True),
            (100, True, True),
            (50 - first, False, True),
        ]
        assert {p.position for p in parts} == {10} and feed.subscription.positions == {0: 10}
        feed.close()

    asyncio.run(scenario())
