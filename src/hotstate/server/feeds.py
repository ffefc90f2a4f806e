"""The push-query shell of one server: one tail per local partition feeding every subscription to it.

The replica manager (server/replicas.py) hands over every committed batch its replicas apply to their stores
(`on_applied`, in the same call that writes the store), and says when a replica goes away or is rebuilt
(`replica_gone`) and when the image changes (`on_image`: a dropped table). Nothing here reads RocksDB or
the log per change: a subscription reads them once, when it starts, to take its snapshot or to replay the
changes from its resume position up to the store's position, in the same event-loop turn as it joins the
tail, so nothing falls between the two. The feed logic (what a subscription takes, its bound) is
query/feed.py; the transports (/query-stream, /v1/changes, Server-Sent Events) are server/http/changes.py.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hotstate.controller.image import MetadataImage, TableInfo
from hotstate.log.errors import OffsetOutOfRangeError
from hotstate.protocol.keys import partition_for
from hotstate.protocol.rows import decode_records
from hotstate.query import pull_query
from hotstate.query.execute import QueryError
from hotstate.query.feed import (
    Change,
    End,
    EndReason,
    Event,
    FeedIndex,
    Resync,
    SnapshotEnd,
    SnapshotRow,
    Subscription,
)
from hotstate.query.plan import UnknownTableError, find_table
from hotstate.query.push import FeedFilter, feed_filter, parse_push, push_options
from hotstate.query.tokens import encode
from hotstate.replica.core import ReplicaRole

if TYPE_CHECKING:
    from hotstate.server.replicas import LocalReplica

log = logging.getLogger(__name__)

PartitionId = tuple[int, int]
# A resume replays at most this many bytes of log per partition; further behind, it resyncs instead.
REPLAY_MAX_BYTES = 64 * 1024 * 1024
_query_ids = itertools.count(1)


@dataclass(eq=False)
class Feed:
    """One subscription as its stream sees it."""

    query_id: str
    table: TableInfo
    columns: tuple[str, ...] | None
    subscription: Subscription
    tag: bytes
    wake: asyncio.Event
    hub: FeedHub

    @property
    def start_token(self) -> str:
        return self.token(self.subscription.reported)

    def token(self, positions: Mapping[int, int]) -> str:
        table_id = self.table.table_id
        return encode({(table_id, p): position for p, position in positions.items()}, self.tag)

    async def next_events(self, idle_s: float) -> list[Event]:
        """What it has to send; after `idle_s` with nothing, a Progress event if its positions moved ([]
        if not). Ends with an End event (then nothing more comes)."""
        subscription = self.subscription
        if not subscription.queue:
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), idle_s)
            except TimeoutError:
                progress = subscription.progress()
                return [] if progress is None else [progress]
        return subscription.take()

    def close(self) -> None:
        self.hub.close(self)


class FeedHub:
    def __init__(
        self,
        node_id: int,
        tag: bytes,
        image: Callable[[], MetadataImage],
        replicas: Callable[[], Mapping[PartitionId, LocalReplica]],
        *,
        max_subscriptions: int,
        buffer_changes: int,
        on_end: Callable[[EndReason], object] = lambda reason: None,
    ) -> None:
        self.node_id = node_id
        self.tag = tag
        self._image = image
        self._replicas = replicas
        self.max_subscriptions = max_subscriptions
        self.buffer_changes = buffer_changes
        self._on_end = on_end  # a feed the server ended (metrics)
        self._indexes: dict[PartitionId, FeedIndex] = {}
        self._feeds: dict[int, Feed] = {}  # by subscription id
        self._ids = itertools.count(1)
        self._closed = False

    def __len__(self) -> int:
        return len(self._feeds)

    # ---------------------------------------------------------------------------------------- subscribe
    def open(self, statement: str, properties: Mapping[str, object]) -> Feed:
        """A feed of `statement` (`... EMIT CHANGES`) from this server's replicas; raises QueryError."""
        if self._closed:
            raise QueryError("unavailable", f"server {self.node_id} is stopping")
        try:
            query = parse_push(statement)
        except pull_query.QueryError as error:
            raise QueryError("bad_request", str(error)) from None
        image = self._image()
        try:
            table = find_table(image.tables, query.table)
            wanted = feed_filter(query, table)
        except UnknownTableError as error:
            raise QueryError("not_found", str(error)) from None
        except pull_query.QueryError as error:
            raise QueryError("bad_request", str(error)) from None
        options = push_options(properties, table, self.tag)
        if len(self._feeds) >= self.max_subscriptions:
            raise QueryError(
                "unavailable",
                f"server {self.node_id} serves {len(self._feeds)} subscriptions, its limit "
                f"(push.max.subscriptions={self.max_subscriptions}): subscribe on another server",
            )
        replicas = self._local(table, wanted, image)
        events: list[Event] = []
        positions: dict[int, int] = {}
        for partition in sorted(wanted.partitions):
            replica = replicas[partition]
            if options.start is None:
                positions[partition] = replica.store.position
                if options.snapshot:
                    events.extend(
                        SnapshotRow(partition, key, row) for key, row in _current_rows(replica, wanted)
                    )
            else:
                positions[partition] = options.start[partition]
                events.extend(self._replay(replica, wanted, options.start[partition]))
        subscription = Subscription(next(self._ids), wanted, positions, self.buffer_changes)
        if options.start is None:
            events.append(SnapshotEnd(dict(positions)))
        subscription.start(events)
        subscription.reported = dict(positions)  # the header's token: where the feed starts
        feed = Feed(
            f"push-{self.node_id}-{next(_query_ids)}",
            table,
            query.columns,
            subscription,
            self.tag,
            asyncio.Event(),
            self,
        )
        self._feeds[subscription.subscription_id] = feed
        for partition in wanted.partitions:
            pid = (table.table_id, partition)
            index = self._indexes.get(pid)
            if index is None:
                index = self._indexes[pid] = FeedIndex(partition)
            index.add(subscription)
        if subscription.queue:
            feed.wake.set()
        return feed

    def _local(self, table: TableInfo, wanted: FeedFilter, image: MetadataImage) -> dict[int, LocalReplica]:
        local = self._replicas()
        found: dict[int, LocalReplica] = {}
        missing = []
        for partition in sorted(wanted.partitions):
            replica = local.get((table.table_id, partition))
            if replica is None or replica.installing:
                missing.append(partition)
            else:
                found[partition] = replica
        if missing:
            parts = image.partitions.get(table.table_id, ())
            holders = sorted({n for p in missing if p < len(parts) for n in parts[p].replicas})
            raise QueryError(
                "unavailable",
                f"server {self.node_id} has no replica of {table.name} partition"
                f"{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing[:20]))}: subscribe on a "
                f"server holding {'them' if len(missing) > 1 else 'it'} (servers {holders}), or narrow "
                "the WHERE to keys of partitions held here",
            )
        return found

    def _replay(self, replica: LocalReplica, wanted: FeedFilter, start: int) -> list[Event]:
        """What a subscriber at `start` of `replica`'s partition gets to reach the store's position: the
        changes from the log, a Resync when the log no longer holds them (or too many), nothing when the
        replica is behind `start` (the tail then skips what it had)."""
        partition = replica.partition
        position = replica.store.position
        if start >= position:
            if replica.core.role is ReplicaRole.LEADER and start > replica.core.log_end_offset:
                raise QueryError(
                    "bad_request",
                    f"from_token: position {start} of {replica.table.name}/{partition} is beyond its log end "
                    f"{replica.core.log_end_offset}: no write ever got there (a token of a table dropped and "
                    "created again?)",
                )
            return []
        plog = replica.log
        if start < plog.start_offset:
            return [_resync(replica, wanted)]
        try:
            batches = plog.read(start, REPLAY_MAX_BYTES)
        except OffsetOutOfRangeError:
            return [_resync(replica, wanted)]
        changes: list[Event] = []
        reached = start
        for batch in batches:
            if batch.base_offset >= position:
                break
            records = decode_records(batch.records)
            for index, (key, row) in enumerate(records):
                offset = batch.base_offset + index
                if offset < start or offset >= position:
                    continue
                reached = offset + 1
                if wanted.matches(key):
                    changes.append(Change(partition, offset, batch.leader_epoch, key, row))
        if reached < position or len(changes) > self.buffer_changes:
            return [_resync(replica, wanted)]  # too far behind to replay change by change
        return changes

    # ---------------------------------------------------------------------------------------- the tail
    def on_applied(
        self,
        pid: PartitionId,
        first_offset: int,
        epoch: int,
        records: Sequence[tuple[bytes, bytes | None]],
        next_offset: int,
    ) -> None:
        """The committed `records` (from `first_offset` on) were applied to the store of `pid`'s replica."""
        index = self._indexes.get(pid)
        if index is None:
            return
        partition = pid[1]
        changes = [
            Change(partition, first_offset + i, epoch, key, row) for i, (key, row) in enumerate(records)
        ]
        for subscription in index.offer(changes, next_offset):
            self._wake(subscription)

    def replica_gone(self, pid: PartitionId, why: str) -> None:
        """`pid`'s replica here moved away, went offline or was rebuilt: its feeds resume elsewhere."""
        index = self._indexes.get(pid)
        if index is None:
            return
        for subscription in index.subscriptions():
            subscription.end(EndReason.REPLICA_GONE, f"this server's replica of partition {pid[1]} {why}")
            self._wake(subscription)

    def on_image(self, image: MetadataImage) -> None:
        """Subscriptions to a table the image no longer has get their final event."""
        live = {t.table_id for t in image.tables.values()}
        for feed in list(self._feeds.values()):
            if feed.table.table_id not in live:
                feed.subscription.end(EndReason.DROPPED, f"table {feed.table.name!r} was dropped")
                self._wake(feed.subscription)

    def close_all(self) -> None:
        """The server is stopping: every feed ends, to resume on another server."""
        self._closed = True
        for feed in list(self._feeds.values()):
            feed.subscription.end(EndReason.SHUTDOWN, f"server {self.node_id} is stopping")
            self._wake(feed.subscription)

    def close(self, feed: Feed) -> None:
        """The stream of `feed` ended (sent its End, or the client went): stop feeding it."""
        subscription = feed.subscription
        if self._feeds.pop(subscription.subscription_id, None) is None:
            return
        for partition in subscription.filter.partitions:
            pid = (feed.table.table_id, partition)
            index = self._indexes.get(pid)
            if index is not None:
                index.remove(subscription)
                if not len(index):
                    del self._indexes[pid]

    def _wake(self, subscription: Subscription) -> None:
        feed = self._feeds.get(subscription.subscription_id)
        if feed is None:
            return
        if subscription.ended is not None:
            self._on_end(subscription.ended.reason)
            self.close(feed)  # it takes nothing more; its stream sends what is buffered, then the End
        feed.wake.set()


def _current_rows(replica: LocalReplica, wanted: FeedFilter) -> list[tuple[bytes, bytes]]:
    store = replica.store
    if wanted.keys is not None:
        keys = sorted(k for k in wanted.keys if _partition_of(replica, k))
        return [(k, v) for k, v in zip(keys, store.get_many(keys), strict=True) if v is not None]
    return list(store.scan(wanted.start, wanted.end))


def _partition_of(replica: LocalReplica, key: bytes) -> bool:
    return partition_for(key, replica.table.partitions) == replica.partition


def _resync(replica: LocalReplica, wanted: FeedFilter) -> Resync:
    return Resync(
        replica.partition, replica.store.position, replica.store.epoch, tuple(_current_rows(replica, wanted))
    )


__all__ = ["End", "Feed", "FeedHub"]
