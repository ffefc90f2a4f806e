"""The push-query shell of one server: one tail per local partition feeding every subscription to it.

The replica manager (server/replicas.py) hands over every committed batch its replicas apply to their stores
(`on_applied`, in the same call that writes the store), and says when a replica goes away or is rebuilt
(`replica_gone`) and when the image changes (`on_image`: a dropped table). Nothing here reads RocksDB or
the log per change: a subscription reads them once, when it starts, to take its snapshot or to replay the
changes from its resume position up to the store's position, in the same event-loop turn as it joins the
tail, so nothing falls between the two. A local snapshot is a RocksDB iterator opened in that turn (a
consistent view as of then) and read by the feed's stream `step_rows` rows at a time, with a yield to the
event loop between steps, so a large table's snapshot never holds the server for long. The feed logic
(what a subscription takes, its bound) is query/feed.py. A partition held elsewhere has its current rows
read there in pages of one view the holder keeps (`serve_page`, query/pages.py): the view is at the
position the feed's tail then starts from, as a local snapshot's, so no change is lost or taken twice.
The transports (/query-stream, /v1/changes, Server-Sent Events) are server/http/changes.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hotstate.controller.image import MetadataImage, TableInfo
from hotstate.log.errors import LogError, OffsetOutOfRangeError
from hotstate.protocol.keys import partition_for
from hotstate.query import pull_query
from hotstate.query.execute import QueryError
from hotstate.query.feed import (
    Change,
    End,
    EndReason,
    Event,
    FeedIndex,
    PendingReplay,
    PendingResync,
    Resync,
    SnapshotEnd,
    Subscription,
)
from hotstate.query.pages import HeldView, ViewError, Views
from hotstate.query.plan import UnknownTableError, find_table
from hotstate.query.push import (
    FeedFilter,
    PushOptions,
    feed_filter,
    feed_outputs,
    parse_push,
    push_options,
)
from hotstate.query.scan import Output
from hotstate.query.tokens import encode
from hotstate.replica.core import ReplicaRole
from hotstate.replica.messages import (
    FeedPageRequest,
    FeedPageResponse,
    FeedReadRequest,
    FeedReadResponse,
    ReplicaError,
)
from hotstate.replica.store import StoreError
from hotstate.server.feed_log import SERVE_MAX_BYTES, ChangeLog
from hotstate.server.scan_pace import ScanPace

if TYPE_CHECKING:
    from hotstate.server.replicas import LocalReplica

log = logging.getLogger(__name__)

PartitionId = tuple[int, int]
# A resume replays at most this many changes per partition (sent in steps as they are read); further
# behind, it resyncs instead: the current rows are then the cheaper way to the present.
REPLAY_MAX_CHANGES = 1_000_000
# A replay read from another server is gathered before the feed joins the partition's tail here: at most
# this many of the feed's changes (memory), further behind it resyncs.
REMOTE_REPLAY_MAX_CHANGES = 100_000
REPLAY_READ_BYTES = SERVE_MAX_BYTES  # of changes asked of another server per read of a replay
# A tail of a partition held elsewhere: each long poll waits this long for a change, takes this much.
TAIL_WAIT_MS = 1000
TAIL_MAX_BYTES = 4 * 1024 * 1024
TAIL_RETRY_S = 0.05  # after a failed poll, before the next holder
REMOTE_TIMEOUT_S = 5.0  # an answer's time, beyond the wait asked for
# A remote snapshot or resync comes in pages of at most PAGE_STEPS steps (query.scan.step.rows each) and
# about PAGE_MAX_BYTES (at least one row), far below the 16 MiB RPC frame; the holder yields between steps.
PAGE_STEPS = 4
PAGE_MAX_BYTES = 1024 * 1024
PAGE_MAX_ROWS = 100_000  # what a holder reads for one page at most, whatever is asked
PAGE_ATTEMPTS = 3  # a paged read that fails part way (a view expired, a holder went) starts over this often
VIEWS_MAX = 16  # snapshot views a holder keeps open for other servers' feeds
VIEW_TTL_S = 30.0  # a view nobody asked a page of for this long is freed
RemoteRequest = Callable[[int, object, float], Awaitable[object]]
_query_ids = itertools.count(1)


class Wake:
    """What a feed's stream waits on: set when its subscription has something to send (or its client
    went). asyncio.Event under `wait_for` costs a task per wait, paid per delivery: this is one future and
    one timer."""

    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self, timeout_s: float) -> bool:
        """Whether it was set within `timeout_s`."""
        if self._set:
            return True
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        return self._set


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclass(eq=False)
class Feed:
    """One subscription as its stream sees it."""

    query_id: str
    table: TableInfo
    columns: tuple[str, ...] | None
    subscription: Subscription
    tag: bytes
    wake: Wake
    hub: FeedHub
    # SELECT's computed columns (query/push.py's feed_outputs): evaluated over each row; (): none.
    outputs: tuple[Output, ...] = ()
    # A snapshot's (or resync's) rows per step, sized so a step of rows a costly WHERE tests stays short.
    pace: ScanPace = field(init=False)

    def __post_init__(self) -> None:
        self.pace = ScanPace(self.hub.step_rows, self.hub.step_s)

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
        while subscription.pending is not None or subscription.resyncs:
            await asyncio.sleep(0)  # a step of the snapshot (or resync) per turn of the event loop
            pace = self.pace
            try:
                began = time.monotonic()
                events = subscription.take(pace.rows)
                pace.took(pace.rows, time.monotonic() - began)
            except LogError as error:  # a replay's next changes: the log no longer holds them, or it closed
                self.hub.replay_failed(self, error)
                continue
            except StoreError as error:
                subscription.break_off()
                subscription.end(
                    EndReason.REPLICA_GONE,
                    f"this server's replica closed while its current rows were read ({error})",
                )
                self.hub.wake(subscription)
                return subscription.take()
            if events:
                return events
        if not subscription.queue:
            self.wake.clear()
            if not await self.wake.wait(idle_s):
                progress = subscription.progress()
                return [] if progress is None else [progress]
        return subscription.take()

    def close(self) -> None:
        self.subscription.pending = None  # its snapshot's iterator (and the RocksDB view) go now
        self.subscription.resyncs.clear()
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
        step_rows: int = 1000,
        step_ms: int = 1,
        send_timeout_s: float = 60.0,
        on_end: Callable[[EndReason], object] = lambda reason: None,
        on_drop: Callable[[], object] = lambda: None,
        request: RemoteRequest | None = None,
        alive: Callable[[int], bool] = lambda node_id: True,
    ) -> None:
        self.node_id = node_id
        self.tag = tag
        self._image = image
        self._replicas = replicas
        self.max_subscriptions = max_subscriptions
        self.buffer_changes = buffer_changes
        self.step_rows = max(1, step_rows)  # a snapshot's rows read per event-loop turn, at most
        self.step_s = step_ms / 1000  # about this long (query.scan.step.ms): fewer rows when they are costly
        # A write to a feed's client that waits this long drops its connection (push.send.timeout.ms).
        self.send_timeout_s = send_timeout_s
        self.on_drop = on_drop  # such a drop (metrics)
        self._on_end = on_end  # a feed the server ended (metrics)
        self._indexes: dict[PartitionId, FeedIndex] = {}
        self._feeds: dict[int, Feed] = {}  # by subscription id
        self._ids = itertools.count(1)
        self._closed = False
        # Partitions with no replica here are read from a server that has one (FeedReadRequest): one tail
        # per partition, as a local replica's, at the position it reached.
        self._request = request
        self._alive = alive
        self._tails: dict[PartitionId, asyncio.Task[None]] = {}
        self._tail_positions: dict[PartitionId, int] = {}
        self._applied: dict[PartitionId, asyncio.Event] = {}  # peers' tails waiting for a change here
        # Views of local partitions other servers' feeds read in pages (serve_page).
        self.views = Views(VIEWS_MAX, VIEW_TTL_S)
        # Decoded changes of the local logs, shared by the replays of every feed (and other servers').
        self.changes = ChangeLog()
        self.page_rows = self.step_rows * PAGE_STEPS

    def __len__(self) -> int:
        return len(self._feeds)

    # ---------------------------------------------------------------------------------------- subscribe
    def open(self, statement: str, properties: Mapping[str, object]) -> Feed | Awaitable[Feed]:
        """A feed of `statement` (`... EMIT CHANGES`): at once from this server's replicas, else (some
        partition held elsewhere) once its start was read from the servers holding them. Raises
        QueryError."""
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
            columns, outputs = feed_outputs(query, table)
        except UnknownTableError as error:
            raise QueryError("not_found", str(error)) from None
        except pull_query.QueryError as error:
            raise QueryError("bad_request", str(error)) from None
        options = push_options(properties, table, self.tag)
        self._check_limit()
        local = self._replicas()
        remote = [p for p in sorted(wanted.partitions) if not _usable(local.get((table.table_id, p)))]
        if not remote or self._request is None:
            return self._register(table, columns, wanted, options, {}, outputs)
        return self._open_remote(table, columns, wanted, options, remote, outputs)

    def _check_limit(self) -> None:
        if self._closed:
            raise QueryError("unavailable", f"server {self.node_id} is stopping")
        if len(self._feeds) >= self.max_subscriptions:
            raise QueryError(
                "unavailable",
                f"server {self.node_id} serves {len(self._feeds)} subscriptions, its limit "
                f"(push.max.subscriptions={self.max_subscriptions}): subscribe on another server",
            )

    async def _open_remote(
        self,
        table: TableInfo,
        columns: tuple[str, ...] | None,
        wanted: FeedFilter,
        options: PushOptions,
        remote: list[int],
        outputs: tuple[Output, ...],
    ) -> Feed:
        starts = {p: await self._remote_start(table, p, wanted, options) for p in remote}
        # A partition's tail here may be past where its start was read: read on up to it, then join the
        # tail in the same turn as the last check (nothing falls between).
        for _ in range(100):
            behind = [
                p for p in remote if self._tail_positions.get((table.table_id, p), -1) > starts[p].position
            ]
            if not behind:
                self._check_limit()
                return self._register(table, columns, wanted, options, starts, outputs)
            for p in behind:
                await self._remote_catch_up(table, p, wanted, starts[p])
        raise QueryError("unavailable", "the feed could not catch up with its partitions' tails")

    def _register(
        self,
        table: TableInfo,
        columns: tuple[str, ...] | None,
        wanted: FeedFilter,
        options: PushOptions,
        remote: Mapping[int, RemoteStart],
        outputs: tuple[Output, ...] = (),
    ) -> Feed:
        """The feed, joined to its partitions' tails: `remote` gives the start of those read from other
        servers, the local replicas give the others' (now: nothing may change between)."""
        replicas = self._local(table, wanted, self._image(), exclude=frozenset(remote))
        events: list[Event] = []
        positions: dict[int, int] = {}
        snapshots: list[Iterator[tuple[int, bytes, bytes]]] = []
        resyncs: list[PendingResync | PendingReplay] = []
        for partition in sorted(wanted.partitions):
            start = remote.get(partition)
            if start is not None:
                positions[partition] = start.first
                if start.rows is not None:
                    snapshots.append(((partition, k, v) for k, v in start.rows))
                changes = [e for e in start.events if isinstance(e, Change)]
                if changes and len(changes) == len(start.events):  # sent in steps, as a local replay
                    resyncs.append(PendingReplay(partition, start.first, start.position, iter(changes)))
                    continue
                for event in start.events:
                    if isinstance(event, Resync):  # sent in steps as a local one, its token with its last
                        resyncs.append(
                            PendingResync(event.partition, event.position, event.epoch, iter(event.rows))
                        )
                    else:
                        events.append(event)
                continue
            replica = replicas[partition]
            if options.start is None:
                positions[partition] = replica.store.position
                if options.snapshot:
                    snapshots.append(_snapshot_rows(replica, wanted))
            else:
                positions[partition] = options.start[partition]
                replayed = self._replay(replica, wanted, options.start[partition])
                if replayed is not None:
                    resyncs.append(replayed)
        subscription = Subscription(
            next(self._ids), wanted, positions, self.buffer_changes, known=options.start is None
        )
        if options.start is None:
            events.append(SnapshotEnd(dict(positions)))
        subscription.start(events, itertools.chain.from_iterable(snapshots) if snapshots else None, resyncs)
        subscription.reported = dict(positions)  # the header's token: where the feed starts
        feed = Feed(
            f"push-{self.node_id}-{next(_query_ids)}",
            table,
            columns,
            subscription,
            self.tag,
            Wake(),
            self,
            outputs,
        )
        self._feeds[subscription.subscription_id] = feed
        for partition in wanted.partitions:
            pid = (table.table_id, partition)
            index = self._indexes.get(pid)
            if index is None:
                index = self._indexes[pid] = FeedIndex(partition)
            index.add(subscription)
            start = remote.get(partition)
            if start is not None and pid not in self._tails:
                self._tail_positions[pid] = start.position
                self._tails[pid] = asyncio.get_running_loop().create_task(
                    self._tail(table, partition), name=f"feed-tail-{pid}"
                )
        if subscription.waiting:
            feed.wake.set()
        return feed

    def _local(
        self, table: TableInfo, wanted: FeedFilter, image: MetadataImage, exclude: frozenset[int]
    ) -> dict[int, LocalReplica]:
        local = self._replicas()
        found: dict[int, LocalReplica] = {}
        missing = []
        for partition in sorted(wanted.partitions - exclude):
            replica = local.get((table.table_id, partition))
            if replica is None or not _usable(replica):
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

    def _replay(
        self, replica: LocalReplica, wanted: FeedFilter, start: int
    ) -> PendingReplay | PendingResync | None:
        """What a subscriber at `start` of `replica`'s partition gets to reach the store's position: the
        changes from the log (read as they are sent, through the shared ChangeLog), a resync when the log
        no longer holds them (or more than REPLAY_MAX_CHANGES), nothing when the replica is behind `start`
        (the tail then skips what it had)."""
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
            return None
        if start < replica.log.start_offset or position - start > REPLAY_MAX_CHANGES:
            return _pending_resync(replica, wanted)
        return PendingReplay(partition, start, position, self.changes.changes(replica, start, position))

    def replay_failed(self, feed: Feed, error: LogError) -> None:
        """The replay `feed` was sending could not be read on: a resync of its partition from here when
        the log no longer holds its next change, else (the replica closed) the feed ends where the replay
        got to, to resume elsewhere."""
        subscription = feed.subscription
        replay = subscription.resyncs[0]
        assert isinstance(replay, PendingReplay)
        replica = self._replicas().get((feed.table.table_id, replay.partition))
        resync = None
        if isinstance(error, OffsetOutOfRangeError) and replica is not None and _usable(replica):
            resync = _pending_resync(replica, subscription.filter)
        subscription.replay_failed(
            replay.partition,
            resync,
            f"this server's log of partition {replay.partition} could not be read on from {replay.next} "
            f"({error})",
        )
        self.wake(subscription)

    # ---------------------------------------------------------------------------------- other servers
    async def _remote_start(
        self, table: TableInfo, partition: int, wanted: FeedFilter, options: PushOptions
    ) -> RemoteStart:
        """Where a feed starts on a partition held elsewhere: its current rows there (a snapshot), or the
        changes after the feed's position read from there."""
        if options.start is None:
            rows = await self._remote_rows(table, partition, wanted if options.snapshot else None)
            return RemoteStart(rows.position, rows.position, [], list(rows.rows))
        start = RemoteStart(options.start[partition], options.start[partition], [])
        await self._remote_catch_up(table, partition, wanted, start)
        return start

    async def _remote_catch_up(
        self, table: TableInfo, partition: int, wanted: FeedFilter, start: RemoteStart
    ) -> None:
        """Read the changes after `start` from a server holding the partition until it has no more (or
        a Resync when it no longer holds them, or more than REPLAY_MAX_CHANGES, or more of the feed's than
        REMOTE_REPLAY_MAX_CHANGES), REPLAY_READ_BYTES of changes an answer: the holder reads them from its
        ChangeLog in bounded steps."""
        while True:
            request = FeedReadRequest(table.table_id, partition, start.position, 0, REPLAY_READ_BYTES)
            answer = await self._remote_read(table, partition, request)
            far = answer.position - start.first > REPLAY_MAX_CHANGES
            if answer.gone or far or len(start.events) > REMOTE_REPLAY_MAX_CHANGES:
                rows = await self._remote_rows(table, partition, wanted)
                start.events = [e for e in start.events if getattr(e, "partition", None) != partition]
                start.events.append(Resync(partition, rows.position, rows.epoch, rows.rows))
                start.position = max(start.position, rows.position)
                return
            for offset, epoch, key, row in answer.changes:
                if offset >= start.position and wanted.matches(key):
                    start.events.append(Change(partition, offset, epoch, key, row or None))
            if answer.position <= start.position:
                return  # caught up with that server (or it is behind: the tail waits for it)
            start.position = answer.position

    async def _remote_rows(
        self, table: TableInfo, partition: int, wanted: FeedFilter | None
    ) -> FeedReadResponse:
        """The partition's current rows of `wanted` (None: none, only its position) from a holder: read
        there in pages of one view (FeedPageRequest), so the holder never reads nor sends them whole."""
        if wanted is None:
            position_only = FeedReadRequest(table.table_id, partition, 0, 0, 0, rows=True, by_keys=True)
            return await self._remote_read(table, partition, position_only)
        assert self._request is not None
        keys = () if wanted.keys is None else tuple(sorted(wanted.keys))
        problems: list[str] = []
        for attempt in range(PAGE_ATTEMPTS):
            if attempt:
                await asyncio.sleep(TAIL_RETRY_S)
            for holder in self._holders(table.table_id, partition):
                rows: list[tuple[bytes, bytes]] = []
                view_id, cursor = 0, None
                while True:
                    request = FeedPageRequest(
                        table.table_id,
                        partition,
                        view_id,
                        cursor,
                        self.page_rows,
                        PAGE_MAX_BYTES,
                        by_keys=wanted.keys is not None,
                        keys=keys,
                        start=wanted.start,
                        end=wanted.end,
                    )
                    try:
                        answer = await self._request(holder, request, REMOTE_TIMEOUT_S)
                    except Exception as error:
                        problems.append(f"{holder}: {type(error).__name__}")
                        break
                    if not isinstance(answer, FeedPageResponse) or answer.error is not ReplicaError.NONE:
                        problems.append(f"{holder}: {getattr(answer, 'message', type(answer).__name__)}")
                        break
                    rows.extend(answer.rows)
                    if not answer.more:
                        return FeedReadResponse(
                            ReplicaError.NONE, "", answer.position, answer.epoch, rows=tuple(rows)
                        )
                    view_id, cursor = answer.view_id, answer.cursor
        raise QueryError(
            "unavailable",
            f"no server holding {table.name}/{partition} could send its current rows "
            f"({'; '.join(problems[-6:]) or 'none holds it'})",
        )

    def _holders(self, table_id: int, partition: int) -> list[int]:
        """The servers holding the partition: live ones first, the active first among them."""
        parts = self._image().partitions.get(table_id, ())
        if partition >= len(parts):
            return []
        part = parts[partition]
        holders = [n for n in part.replicas if n != self.node_id]
        return sorted(holders, key=lambda n: (not self._alive(n), n != part.active))

    async def _remote_read(
        self, table: TableInfo, partition: int, request: FeedReadRequest
    ) -> FeedReadResponse:
        assert self._request is not None
        problems = []
        for holder in self._holders(table.table_id, partition):
            try:
                answer = await self._request(holder, request, REMOTE_TIMEOUT_S + request.wait_ms / 1000)
            except Exception as error:
                problems.append(f"{holder}: {type(error).__name__}")
                continue
            if isinstance(answer, FeedReadResponse) and answer.error is ReplicaError.NONE:
                return answer
            problems.append(f"{holder}: {getattr(answer, 'message', type(answer).__name__)}")
        raise QueryError(
            "unavailable",
            f"no server holding {table.name}/{partition} could start the feed there "
            f"({'; '.join(problems) or 'none holds it'})",
        )

    async def _tail(self, table: TableInfo, partition: int) -> None:
        """The one tail here of a partition held elsewhere: long polls to a holder, each answer offered to
        the partition's subscriptions as a local replica's batches are."""
        assert self._request is not None
        pid = (table.table_id, partition)
        failures = 0
        try:
            while pid in self._indexes:
                holders = self._holders(*pid)
                if not holders:
                    self._end_partition(pid, EndReason.REPLICA_GONE, "no server holds it any more")
                    return
                holder = holders[failures % len(holders)]
                position = self._tail_positions[pid]
                request = FeedReadRequest(table.table_id, partition, position, TAIL_WAIT_MS, TAIL_MAX_BYTES)
                try:
                    answer = await self._request(holder, request, REMOTE_TIMEOUT_S + TAIL_WAIT_MS / 1000)
                except Exception:
                    answer = None
                if not isinstance(answer, FeedReadResponse) or answer.error is not ReplicaError.NONE:
                    failures += 1
                    await asyncio.sleep(TAIL_RETRY_S)
                    continue
                failures = 0
                if answer.gone:
                    self._end_partition(
                        pid, EndReason.REPLICA_GONE, f"server {holder} no longer holds position {position}"
                    )
                    return
                index = self._indexes.get(pid)
                if index is None or answer.position <= position:
                    continue
                changes = [
                    Change(partition, offset, epoch, key, row or None)
                    for offset, epoch, key, row in answer.changes
                    if offset >= position
                ]
                self._tail_positions[pid] = answer.position
                for subscription in index.offer(changes, answer.position):
                    self.wake(subscription)
        finally:
            if self._tails.get(pid) is asyncio.current_task():
                del self._tails[pid]
                self._tail_positions.pop(pid, None)

    def _end_partition(self, pid: PartitionId, reason: EndReason, why: str) -> None:
        index = self._indexes.get(pid)
        if index is None:
            return
        for subscription in index.subscriptions():
            subscription.end(reason, f"partition {pid[1]}: {why}")
            self.wake(subscription)

    async def serve_read(self, request: FeedReadRequest) -> FeedReadResponse:
        """A feed on another server reads this server's replica (its tail, or its start)."""
        pid = (request.table_id, request.partition)
        replica = self._replicas().get(pid)
        if replica is None or not _usable(replica):
            return FeedReadResponse(ReplicaError.UNKNOWN_PARTITION, f"no replica of {pid} on {self.node_id}")
        if request.rows:
            wanted = FeedFilter(
                frozenset({request.partition}),
                keys=frozenset(request.keys) if request.by_keys else None,
                start=request.start,
                end=request.end,
            )
            rows = tuple(_current_rows(replica, wanted))
            store = replica.store
            return FeedReadResponse(ReplicaError.NONE, "", store.position, store.epoch, rows=rows)
        if request.position >= replica.store.position and request.wait_ms > 0:
            applied = self._applied.get(pid)
            if applied is None:
                applied = self._applied[pid] = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(applied.wait(), min(request.wait_ms, 30_000) / 1000)
            replica = self._replicas().get(pid)
            if replica is None or not _usable(replica):
                return FeedReadResponse(ReplicaError.UNKNOWN_PARTITION, f"replica of {pid} went away")
        position = replica.store.position
        if request.position >= position:
            return FeedReadResponse(ReplicaError.NONE, "", request.position, replica.store.epoch)
        if request.position < replica.log.start_offset:
            return FeedReadResponse(ReplicaError.NONE, "", request.position, replica.store.epoch, gone=True)
        budget = max(1, min(request.max_bytes, SERVE_MAX_BYTES))
        changes: list[tuple[int, int, bytes, bytes]] = []
        reached = request.position
        try:
            while reached < position and budget > 0:
                for change in self.changes.chunk(replica, reached, position):
                    row = change.row or b""
                    changes.append((change.offset, change.epoch, change.key, row))
                    reached = change.position
                    budget -= len(change.key) + len(row) + 16
                    if budget <= 0:
                        break
        except OffsetOutOfRangeError:
            return FeedReadResponse(ReplicaError.NONE, "", request.position, replica.store.epoch, gone=True)
        except LogError as error:
            return FeedReadResponse(ReplicaError.UNKNOWN_PARTITION, f"replica of {pid}: {error}")
        return FeedReadResponse(ReplicaError.NONE, "", reached, replica.store.epoch, tuple(changes))

    async def serve_page(self, request: FeedPageRequest) -> FeedPageResponse:
        """A page of a partition's current rows for a feed on another server: from a view opened by its
        first page (the store's rows at its position then), read `step_rows` at a time with a yield to the
        event loop between steps."""
        pid = (request.table_id, request.partition)
        replica = self._replicas().get(pid)
        if replica is None or not _usable(replica):
            return FeedPageResponse(ReplicaError.UNKNOWN_PARTITION, f"no replica of {pid} on {self.node_id}")
        loop = asyncio.get_running_loop()
        try:
            if request.view_id == 0:
                wanted = FeedFilter(
                    frozenset({request.partition}),
                    keys=frozenset(request.keys) if request.by_keys else None,
                    start=request.start,
                    end=request.end,
                )
                store = replica.store
                rows = (
                    iter(_current_rows(replica, wanted))
                    if wanted.keys is not None
                    else store.scan(wanted.start, wanted.end)
                )
                view = self.views.open(rows, store.position, store.epoch, loop.time())
            else:
                view = self.views.resume(request.view_id, request.after, loop.time())
        except (ViewError, StoreError) as error:
            return FeedPageResponse(ReplicaError.UNKNOWN_PARTITION, str(error))
        try:
            page = await self._read_page(view, request)
        except StoreError as error:
            self.views.close(view.view_id)
            return FeedPageResponse(ReplicaError.UNKNOWN_PARTITION, f"replica of {pid} closed ({error})")
        finally:
            self.views.finish(view, loop.time())
        return FeedPageResponse(
            ReplicaError.NONE, "", view.view_id, view.position, view.epoch, page, not view.done, view.cursor
        )

    async def _read_page(self, view: HeldView, request: FeedPageRequest) -> tuple[tuple[bytes, bytes], ...]:
        view.busy = True
        max_rows = max(1, min(request.max_rows, PAGE_MAX_ROWS))
        max_bytes = max(1, min(request.max_bytes, 8 * PAGE_MAX_BYTES))
        rows: list[tuple[bytes, bytes]] = []
        size = 0
        while not view.done and len(rows) < max_rows and size < max_bytes:
            if rows:
                await asyncio.sleep(0)
            step = self.views.take(view, min(self.step_rows, max_rows - len(rows)), max_bytes - size)
            rows.extend(step)
            size += sum(len(k) + len(v) for k, v in step)
        return tuple(rows)

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
        applied = self._applied.pop(pid, None)
        if applied is not None:  # other servers' tails of this partition
            applied.set()
        index = self._indexes.get(pid)
        if index is None:
            return
        partition = pid[1]
        changes = [
            Change(partition, first_offset + i, epoch, key, row) for i, (key, row) in enumerate(records)
        ]
        for subscription in index.offer(changes, next_offset):
            self.wake(subscription)

    def replica_gone(self, pid: PartitionId, why: str) -> None:
        """`pid`'s replica here moved away, went offline or was rebuilt: its feeds resume elsewhere."""
        index = self._indexes.get(pid)
        if index is None:
            return
        for subscription in index.subscriptions():
            subscription.end(EndReason.REPLICA_GONE, f"this server's replica of partition {pid[1]} {why}")
            self.wake(subscription)

    def on_image(self, image: MetadataImage) -> None:
        """Subscriptions to a table the image no longer has get their final event."""
        live = {t.table_id for t in image.tables.values()}
        for feed in list(self._feeds.values()):
            if feed.table.table_id not in live:
                feed.subscription.end(EndReason.DROPPED, f"table {feed.table.name!r} was dropped")
                self.wake(feed.subscription)

    def close_all(self) -> None:
        """The server is stopping: every feed ends, to resume on another server."""
        self._closed = True
        self.views.close_all()
        for tail in self._tails.values():
            tail.cancel()
        for feed in list(self._feeds.values()):
            feed.subscription.end(EndReason.SHUTDOWN, f"server {self.node_id} is stopping")
            self.wake(feed.subscription)

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
                    tail = self._tails.pop(pid, None)
                    self._tail_positions.pop(pid, None)
                    if tail is not None:
                        tail.cancel()

    def wake(self, subscription: Subscription) -> None:
        feed = self._feeds.get(subscription.subscription_id)
        if feed is None:
            return
        if subscription.ended is not None:
            self._on_end(subscription.ended.reason)
            self.close(feed)  # it takes nothing more; its stream sends what is buffered, then the End
        feed.wake.set()


@dataclass
class RemoteStart:
    """A feed's start on a partition held elsewhere: its position there (`first`: where it began) and the
    events before it (current rows, changes replayed, a resync)."""

    first: int
    position: int
    events: list[Event]
    rows: list[tuple[bytes, bytes]] | None = None  # its snapshot's current rows (sent in steps)


def _usable(replica: LocalReplica | None) -> bool:
    return replica is not None and not replica.installing


def _snapshot_rows(replica: LocalReplica, wanted: FeedFilter) -> Iterator[tuple[int, bytes, bytes]]:
    """`replica`'s current rows of `wanted` as (partition, key, row): the view is the store's now (the
    iterator is opened in this call), however late it is read."""
    partition = replica.partition
    if wanted.keys is not None:
        return ((partition, k, v) for k, v in _current_rows(replica, wanted))
    return ((partition, k, v) for k, v in replica.store.scan(wanted.start, wanted.end))


def _current_rows(replica: LocalReplica, wanted: FeedFilter) -> list[tuple[bytes, bytes]]:
    store = replica.store
    if wanted.keys is not None:
        keys = sorted(k for k in wanted.keys if _partition_of(replica, k))
        return [(k, v) for k, v in zip(keys, store.get_many(keys), strict=True) if v is not None]
    return list(store.scan(wanted.start, wanted.end))


def _partition_of(replica: LocalReplica, key: bytes) -> bool:
    return partition_for(key, replica.table.partitions) == replica.partition


def _pending_resync(replica: LocalReplica, wanted: FeedFilter) -> PendingResync:
    """A resync of `replica`'s partition at the store's position now, its rows read later in steps (a
    view opened now: a RocksDB iterator)."""
    store = replica.store
    rows = (
        iter(_current_rows(replica, wanted))
        if wanted.keys is not None
        else store.scan(wanted.start, wanted.end)
    )
    return PendingResync(replica.partition, store.position, store.epoch, rows)


__all__ = ["End", "Feed", "FeedHub"]
