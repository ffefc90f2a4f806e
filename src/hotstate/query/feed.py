"""The feed of a push query, pure: which committed changes each subscription takes, its bounded buffer,
and the events it hands to its stream.

A *change* is one committed record of a partition: key, new row or None (a delete: tombstones are records),
its offset and the leader epoch of its batch. Offsets of committed records mean the same on every replica
(query/tokens.py), so a subscription's *position* per partition (the offset after the last change it took
or passed over) resumes it anywhere: a change below the position is one it had, and is skipped, so a
subscriber that resumes from a replica that is behind waits for it instead of going back.

`FeedIndex` is one partition's tail as its server sees it: every committed batch the replica applies is
offered once to the subscriptions of that partition, found by key for lookups (a dict probe per change,
however many subscribe) and by a range test for the others. A subscription buffers at most `bound` events
beyond its start; past that it ends with `FELL_BEHIND` at the position after its last buffered event (the
client resumes from there), so a subscriber that does not read costs a bounded amount of memory and never
slows the writes or the other subscribers.

A feed with a WHERE beyond its keys (a filtered view of the table) tests each change's new row once per
group of subscriptions with the same condition (the verdict is kept on the change, by the condition's
normalized text). A change whose row matches is sent; one whose row does not (an update that moves the row
out of the filter, or a delete) is sent as a *left* change (row None, `left`) when the subscriber may hold
the key, so a client-side cache of the feed stays equal to the filtered table. A subscription knows which
keys its subscriber holds when it started from its snapshot or from nothing (`holding`: the keys it sent
as matching, at most MAX_HELD); resumed from a token, or past MAX_HELD keys, it does not, and sends every
non-matching change of its keys as a left change (one the subscriber may drop).

A snapshot may be handed over as an iterator (`pending`) read `take`'s `step` rows at a time, ahead of
everything queued, so a large table's snapshot is never read whole in one event-loop turn; the changes that
arrive meanwhile are queued after it, and held to the bound.

No sockets, clocks or tasks: server/feeds.py wakes the streams and writes the events.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from hotstate.query.push import FeedFilter

# A filtered subscription remembers at most this many keys its subscriber holds; beyond, it sends every
# non-matching change of its keys as a left change instead of only those of keys it sent.
MAX_HELD = 100_000
# A partition's range subscriptions are indexed by the segments between their bounds, rebuilt once more than
# FRESH_SPANS (or an eighth) of the ranges came since; past MAX_SEGMENT_ENTRIES (group, segment) entries
# (many wide ranges overlapping) each range is tested per change instead.
FRESH_SPANS = 16
MAX_SEGMENT_ENTRIES = 1_000_000

__all__ = [
    "MAX_HELD",
    "Change",
    "End",
    "EndReason",
    "FeedIndex",
    "PendingReplay",
    "PendingResync",
    "Progress",
    "Resync",
    "SnapshotEnd",
    "SnapshotRow",
    "Subscription",
]


@dataclass(slots=True)
class Change:
    """A committed change; `encoded`: its encodings, shared by the subscriptions sending it."""

    partition: int
    offset: int
    epoch: int
    key: bytes
    row: bytes | None  # None: the key was deleted (or, `left`, its row left the feed's filter)
    left: bool = False
    encoded: dict[object, bytes] = field(default_factory=dict, repr=False, compare=False)
    # Per filter (its normalized text): whether the row matches it, decided once for every feed sharing it.
    verdicts: dict[str, bool] = field(default_factory=dict, repr=False, compare=False)
    _left: Change | None = field(default=None, repr=False, compare=False)

    @property
    def position(self) -> int:
        return self.offset + 1

    def holds(self, feed_filter: FeedFilter) -> bool:
        """Whether the new row matches `feed_filter`'s WHERE (a delete never does)."""
        text = feed_filter.where_text
        if text is None:
            return self.row is not None
        verdict = self.verdicts.get(text)
        if verdict is None:
            verdict = self.verdicts[text] = self.row is not None and feed_filter.holds(self.row)
        return verdict

    def as_left(self) -> Change:
        """This change as a filtered feed sends a row that does not match: its key left the view."""
        if self.row is None and not self.left:
            return self  # a delete is a delete
        gone = self._left
        if gone is None:
            gone = self._left = Change(self.partition, self.offset, self.epoch, self.key, None, left=True)
        return gone


@dataclass(frozen=True, slots=True)
class SnapshotRow:
    """A current row of the feed's start (before any change)."""

    partition: int
    key: bytes
    row: bytes


@dataclass(frozen=True, slots=True)
class SnapshotEnd:
    """The feed's start: every change after `positions` follows (per partition)."""

    positions: Mapping[int, int]


@dataclass(frozen=True, slots=True)
class Resync:
    """The log no longer holds what followed the subscriber's position on `partition` (or it is too far
    behind to replay): its current rows (of the feed's keys) at `position` instead of the changes. Read in
    steps, it comes in parts: the first replaces what the subscriber held of the partition, each but the
    last has `more`, the ones after the first are `continued`."""

    partition: int
    position: int
    epoch: int
    rows: tuple[tuple[bytes, bytes], ...]
    more: bool = False
    continued: bool = False


@dataclass(slots=True)
class PendingResync:
    """A resync whose rows (of the partition at `position`) are still to be read, a step at a time."""

    partition: int
    position: int
    epoch: int
    rows: Iterator[tuple[bytes, bytes]]
    started: bool = False


@dataclass(slots=True)
class PendingReplay:
    """The changes of `partition` from a resume position up to `position` (where its tail's changes
    start), read (by the server, from its log) a step at a time as they are sent, before the changes queued
    since: a resume seconds behind a busy table gets every change, however many, and no read holds the
    server for long. `next`: the offset of the first change not yet sent."""

    partition: int
    next: int
    position: int
    changes: Iterator[Change]


@dataclass(frozen=True, slots=True)
class Progress:
    """The positions the subscription has passed (changes it does not take move them too)."""

    positions: Mapping[int, int]


class EndReason(StrEnum):
    FELL_BEHIND = "fell_behind"  # its buffer filled: resume from `positions`
    REPLICA_GONE = "replica_gone"  # this server's replica moved away or was rebuilt: resume elsewhere
    SHUTDOWN = "shutdown"  # the server is stopping: resume elsewhere
    DROPPED = "dropped"  # the table was dropped: final


@dataclass(frozen=True, slots=True)
class End:
    reason: EndReason
    positions: Mapping[int, int]
    message: str

    @property
    def final(self) -> bool:
        return self.reason is EndReason.DROPPED


Event = Change | SnapshotRow | SnapshotEnd | Resync | Progress | End


class Subscription:
    """One feed's state: its filter, its position per partition, its buffered events."""

    __slots__ = (
        "_at",
        "bound",
        "ended",
        "filter",
        "holding",
        "limit",
        "pending",
        "queue",
        "reported",
        "resyncs",
        "subscription_id",
        "tails",
        "touched",
    )

    def __init__(
        self,
        subscription_id: int,
        feed_filter: FeedFilter,
        positions: Mapping[int, int],
        bound: int,
        *,
        known: bool = True,
    ) -> None:
        """`known`: the subscriber holds nothing of the feed but what it sends from now on (it starts from
        a snapshot, or from nothing); False when it resumes from a token."""
        self.subscription_id = subscription_id
        self.filter = feed_filter
        # The next offset it takes, per partition of its filter, as far as its own changes moved it: the
        # partitions' tails (`tails`, its FeedIndex per partition) passed everything below their `position`,
        # which `positions` adds (no walk over every subscription per batch).
        self._at = {p: positions[p] for p in feed_filter.partitions}
        self.tails: dict[int, FeedIndex] = {}
        self.reported = dict(self._at)  # the positions its last Progress (or start) told
        self.bound = bound
        self.limit = bound
        self.queue: deque[Event] = deque()
        self.ended: End | None = None
        # A filtered feed: per partition, the keys its subscriber holds (None: not known).
        self.holding: dict[int, set[bytes]] | None = None
        if feed_filter.where is not None and known:
            self.holding = {p: set() for p in feed_filter.partitions}
        # A snapshot still to be read (`take`), and the keys changed meanwhile (their snapshot row is older).
        self.pending: Iterator[tuple[int, bytes, bytes]] | None = None
        self.touched: set[bytes] | None = None
        # Read by `take` in steps, before the queue.
        self.resyncs: deque[PendingResync | PendingReplay] = deque()

    @property
    def positions(self) -> dict[int, int]:
        """The next offset it takes, per partition: every change below was taken or passed over."""
        at = self._at
        if self.ended is None:
            for partition, tail in self.tails.items():
                if tail.position > at[partition]:
                    at[partition] = tail.position
        return at

    def start(
        self,
        events: Iterable[Event],
        pending: Iterator[tuple[int, bytes, bytes]] | None = None,
        resyncs: Sequence[PendingResync | PendingReplay] = (),
    ) -> None:
        """Its first events (current rows, resyncs, changes replayed from the log): not held to the bound.
        `pending`: current rows (partition, key, row) to send before them all, and `resyncs` (resyncs and
        replays, of other partitions than the events'), read by `take` in steps."""
        at = self._at
        for resync in resyncs:
            at[resync.partition] = max(at[resync.partition], resync.position)
            self.resyncs.append(resync)
        for event in events:
            if isinstance(event, Change):
                at[event.partition] = event.position
                taken = self._through_filter(event)
                if taken is not None:
                    self.queue.append(taken)
                continue
            if isinstance(event, SnapshotRow):
                if self._admit_row(event.partition, event.key, event.row):
                    self.queue.append(event)
                continue
            if isinstance(event, Resync):
                at[event.partition] = max(at[event.partition], event.position)
                event = self._filtered_resync(event)
            self.queue.append(event)
        if pending is not None:
            self.pending = pending
            self.touched = set()
        self.limit = len(self.queue) + self.bound

    def _admit_row(self, partition: int, key: bytes, row: bytes) -> bool:
        """Whether a current row goes to the subscriber (it matches the filter); remembers it held."""
        if self.filter.where is None:
            return True
        if not self.filter.holds(row):
            return False
        if self.touched is None or key not in self.touched:
            self._hold(partition, key)
        return True

    def _filtered_resync(self, event: Resync) -> Resync:
        if self.filter.where is None:
            return event
        rows = tuple((k, r) for k, r in event.rows if self.filter.holds(r))
        if self.holding is not None:
            self.holding[event.partition] = set()
            for k, _ in rows:
                self._hold(event.partition, k)
        return Resync(event.partition, event.position, event.epoch, rows)

    def _hold(self, partition: int, key: bytes) -> None:
        holding = self.holding
        if holding is None:
            return
        held = holding.setdefault(partition, set())
        held.add(key)
        if len(held) > MAX_HELD // max(1, len(holding)):
            self.holding = None  # too many to remember: every non-matching change is sent as left

    def _through_filter(self, change: Change) -> Change | None:
        """What a change of its keys sends through its WHERE: the change, a left change, or nothing (a
        row that neither matches nor was held)."""
        feed_filter = self.filter
        if feed_filter.where is None:
            return change
        if self.touched is not None:
            self.touched.add(change.key)
        if change.holds(feed_filter):
            self._hold(change.partition, change.key)
            return change
        holding = self.holding
        held = None if holding is None else holding.get(change.partition)
        was_held = held is not None and change.key in held
        if held is not None:
            held.discard(change.key)
        # Unknown, or a snapshot still to come may give it the key: it may hold it.
        if was_held or holding is None or self.touched is not None:
            return change.as_left()
        return None

    def offer(self, change: Change) -> bool:
        """Take `change` if it is new to this subscription and matches; False if not taken (or it ended)."""
        if self.ended is not None:
            return False
        partition = change.partition
        positions = self._at
        at = positions.get(partition)
        if at is None or change.offset < at:
            return False
        if not self.filter.matches(change.key):
            positions[partition] = change.position
            return False
        taken = self._through_filter(change)
        if taken is None:
            positions[partition] = change.position
            return False
        if len(self.queue) >= self.limit:
            self.end(
                EndReason.FELL_BEHIND,
                f"more than {self.bound} changes waited to be sent (the subscriber reads slower than "
                "the table changes): resume from the positions given",
            )
            return False
        self.queue.append(taken)
        positions[partition] = change.position
        return True

    def end(self, reason: EndReason, message: str) -> End:
        """End it (once): the End event follows what is buffered; positions are past everything buffered."""
        if self.ended is None:
            self.ended = End(reason, dict(self.positions), message)
            self.queue.append(self.ended)
        return self.ended

    def progress(self) -> Progress | None:
        """A Progress event when its positions moved since the last one (and it has nothing buffered)."""
        if self.waiting or self.ended is not None:
            return None
        if self.positions == self.reported:
            return None
        self.reported = dict(self.positions)
        return Progress(self.reported)

    @property
    def waiting(self) -> bool:
        """Whether it has something to send."""
        return bool(self.queue) or self.pending is not None or bool(self.resyncs)

    def take(self, step: int = 1000) -> list[Event]:
        """What is to be sent: the next `step` rows read of a pending snapshot (those matching; maybe
        none), else everything queued."""
        pending = self.pending
        if pending is not None:
            rows = list(itertools.islice(pending, step))
            if len(rows) < step:
                self.pending = None
                self.touched = None
            return [SnapshotRow(p, k, r) for p, k, r in rows if self._admit_row(p, k, r)]
        if self.resyncs:
            head = self.resyncs[0]
            if isinstance(head, PendingReplay):
                return self._replay_step(head, step)
            return [self._resync_step(step)]
        events = list(self.queue)
        self.queue.clear()
        return events

    def _replay_step(self, replay: PendingReplay, step: int) -> list[Event]:
        """The next `step` changes of a replay that this feed takes (maybe none). What the iterator raises
        (the log no longer holds the rest) leaves `next` at the first change not sent: `replay_failed`."""
        changes = list(itertools.islice(replay.changes, step))
        if len(changes) < step:
            self.resyncs.popleft()
        if not changes:
            return []
        replay.next = changes[-1].position
        matches = self.filter.matches
        through = self._through_filter
        return [taken for c in changes if matches(c.key) and (taken := through(c)) is not None]

    def replay_failed(self, partition: int, resync: PendingResync | None, message: str) -> None:
        """`partition`'s replay cannot be read on (the log no longer holds its next change, or the replica
        went). `resync`: the partition's current rows at a position take the rest's place, and the changes
        queued since that they hold already are not sent; None: the feed ends, at the position the replay
        reached on that partition (the client resumes from there elsewhere)."""
        replay = next(
            (r for r in self.resyncs if isinstance(r, PendingReplay) and r.partition == partition), None
        )
        if replay is None:
            return
        # The partition's queued changes follow the replay: below a resync's position its rows hold them;
        # with the feed ending at the replay's position, they come again on its resume.
        below = None if resync is None else resync.position
        self.queue = deque(
            e
            for e in self.queue
            if not (
                isinstance(e, Change) and e.partition == partition and (below is None or e.offset < below)
            )
        )
        at = self._at
        if resync is not None:
            self.resyncs[self.resyncs.index(replay)] = resync
            at[partition] = max(at[partition], resync.position)
            return
        self.resyncs.remove(replay)
        tail = self.tails.get(partition)
        if tail is not None:
            tail.remove(self)
        at[partition] = replay.next
        ended = self.ended
        if ended is None:
            self.end(EndReason.REPLICA_GONE, message)
        elif ended.positions.get(partition, 0) > replay.next:  # it told positions past what it will send
            self.ended = End(ended.reason, {**ended.positions, partition: replay.next}, ended.message)
            self.queue = deque(self.ended if e is ended else e for e in self.queue)

    def _resync_step(self, step: int) -> Resync:
        pending = self.resyncs[0]
        assert isinstance(pending, PendingResync)
        rows = list(itertools.islice(pending.rows, step))
        more = len(rows) == step
        if not more:
            self.resyncs.popleft()
        continued, pending.started = pending.started, True
        partition = pending.partition
        if self.filter.where is not None:
            rows = [(k, r) for k, r in rows if self.filter.holds(r)]
            if self.holding is not None:
                if not continued:
                    self.holding[partition] = set()
                for k, _ in rows:
                    self._hold(partition, k)
        return Resync(partition, pending.position, pending.epoch, tuple(rows), more, continued)

    def break_off(self) -> None:
        """Its pending snapshot could not be read to the end: nothing of the start is sent (the subscriber
        takes the whole snapshot again)."""
        self.pending = None
        self.touched = None
        self.resyncs.clear()
        self.queue.clear()
        if self.ended is not None:
            self.queue.append(self.ended)


class FeedIndex:
    """The subscriptions of one partition: each committed change is offered to those that may take it,
    found by key (a dict probe) for lookups and by a binary search over the ranges' bounds for the others,
    so a change costs the subscriptions that take it, not every subscription of the partition. `position`:
    every change below it was offered to every subscription here (their `positions` add it)."""

    __slots__ = (
        "_added",
        "_bounds",
        "_fresh",
        "_segments",
        "_spans",
        "_stale",
        "by_key",
        "members",
        "partition",
        "position",
    )

    def __init__(self, partition: int, position: int = 0) -> None:
        self.partition = partition
        self.position = position
        self.members: set[Subscription] = set()
        self.by_key: dict[bytes, set[Subscription]] = {}
        # The range (and whole-table) subscriptions, grouped by their [start, end) bounds.
        self._spans: dict[tuple[bytes | None, bytes | None], set[Subscription]] = {}
        # The groups whose range holds the keys of each segment between consecutive bounds (`_build`), and
        # those added since, tested one by one until the next build.
        self._bounds: list[bytes] = []
        self._segments: list[tuple[set[Subscription], ...]] = [()]
        self._fresh: list[tuple[bytes | None, bytes | None, set[Subscription]]] = []
        self._added = 0  # groups added since the last build
        self._stale = 0  # groups emptied since the last build (still in `_segments`, harmless)

    def __len__(self) -> int:
        return len(self.members)

    def subscriptions(self) -> set[Subscription]:
        return set(self.members)

    def add(self, subscription: Subscription) -> None:
        self.members.add(subscription)
        subscription.tails[self.partition] = self
        at = subscription._at.get(self.partition)
        if at is not None and at < self.position:
            # It starts below the tail (a replica rebuilt lower): until the next batch, `position` tells
            # no subscription here more than this one's.
            self.position = at
        feed_filter = subscription.filter
        keys = feed_filter.keys
        if keys is not None:
            for key in keys:
                self.by_key.setdefault(key, set()).add(subscription)
            return
        span = (feed_filter.start, feed_filter.end)
        group = self._spans.get(span)
        if group is None:
            group = self._spans[span] = set()
            self._fresh.append((span[0], span[1], group))
            self._added += 1
            if self._added > max(FRESH_SPANS, len(self._spans) // 8):
                self._build()
        group.add(subscription)

    def remove(self, subscription: Subscription) -> None:
        self.members.discard(subscription)
        if subscription.tails.get(self.partition) is self:
            del subscription.tails[self.partition]
        feed_filter = subscription.filter
        keys = feed_filter.keys
        if keys is not None:
            for key in keys:
                found = self.by_key.get(key)
                if found is not None:
                    found.discard(subscription)
                    if not found:
                        del self.by_key[key]
            return
        span = (feed_filter.start, feed_filter.end)
        group = self._spans.get(span)
        if group is not None:
            group.discard(subscription)
            if not group:
                del self._spans[span]
                self._stale += 1
                if self._stale > max(FRESH_SPANS, len(self._spans)):
                    self._build()

    def _build(self) -> None:
        """Index the range groups by segment (unless that takes more than MAX_SEGMENT_ENTRIES entries:
        then every group is tested per change)."""
        spans = [(start, end, group) for (start, end), group in self._spans.items()]
        bounds = sorted({b for start, end, _ in spans for b in (start, end) if b is not None})
        last = len(bounds) + 1
        reach = [
            (
                0 if start is None else bisect.bisect_right(bounds, start),
                last if end is None else bisect.bisect_right(bounds, end),
                group,
            )
            for start, end, group in spans
        ]
        self._stale = self._added = 0
        if sum(high - low for low, high, _ in reach) > MAX_SEGMENT_ENTRIES:
            self._bounds, self._segments, self._fresh = [], [()], spans
            return
        segments: list[list[set[Subscription]]] = [[] for _ in range(last)]
        for low, high, group in reach:
            for segment in range(low, high):
                segments[segment].append(group)
        self._bounds = bounds
        self._segments = [tuple(groups) for groups in segments]
        self._fresh = []

    def offer(self, changes: Sequence[Change], next_offset: int) -> set[Subscription]:
        """Offer a committed batch's `changes` (in offset order, ending below `next_offset`): the
        subscriptions that took one, or ended (their streams have something to send)."""
        woken: set[Subscription] = set()
        by_key = self.by_key
        if by_key:
            for change in changes:
                found = by_key.get(change.key)
                if found:
                    for subscription in found:
                        if subscription.offer(change) or subscription.ended is not None:
                            woken.add(subscription)
        if self._spans:
            bounds, segments, fresh = self._bounds, self._segments, self._fresh
            for change in changes:
                key = change.key
                for group in segments[bisect.bisect_right(bounds, key)] if bounds else segments[0]:
                    for subscription in group:
                        if subscription.offer(change) or subscription.ended is not None:
                            woken.add(subscription)
                for start, end, group in fresh:
                    if (start is None or key >= start) and (end is None or key < end):
                        for subscription in group:
                            if subscription.offer(change) or subscription.ended is not None:
                                woken.add(subscription)
        self.position = next_offset
        return woken
