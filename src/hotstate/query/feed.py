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

No sockets, clocks or tasks: server/feeds.py wakes the streams and writes the events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from hotstate.query.push import FeedFilter

__all__ = [
    "Change",
    "End",
    "EndReason",
    "FeedIndex",
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
    row: bytes | None  # None: the key was deleted
    encoded: dict[object, bytes] = field(default_factory=dict, repr=False, compare=False)

    @property
    def position(self) -> int:
        return self.offset + 1


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
    behind to replay): its current rows (of the feed's keys) at `position` instead of the changes."""

    partition: int
    position: int
    epoch: int
    rows: tuple[tuple[bytes, bytes], ...]


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

    __slots__ = ("bound", "ended", "filter", "limit", "positions", "queue", "reported", "subscription_id")

    def __init__(
        self, subscription_id: int, feed_filter: FeedFilter, positions: Mapping[int, int], bound: int
    ) -> None:
        self.subscription_id = subscription_id
        self.filter = feed_filter
        # The next offset it takes, per partition of its filter.
        self.positions = {p: positions[p] for p in feed_filter.partitions}
        self.reported = dict(self.positions)  # the positions its last Progress (or start) told
        self.bound = bound
        self.limit = bound
        self.queue: deque[Event] = deque()
        self.ended: End | None = None

    def start(self, events: Iterable[Event]) -> None:
        """Its first events (current rows, resyncs, changes replayed from the log): not held to the bound."""
        for event in events:
            self.queue.append(event)
            if isinstance(event, Change):
                self.positions[event.partition] = event.position
            elif isinstance(event, Resync):
                self.positions[event.partition] = max(self.positions[event.partition], event.position)
        self.limit = len(self.queue) + self.bound

    def offer(self, change: Change) -> bool:
        """Take `change` if it is new to this subscription and matches; False if not taken (or it ended)."""
        if self.ended is not None:
            return False
        partition = change.partition
        at = self.positions.get(partition)
        if at is None or change.offset < at:
            return False
        if not self.filter.matches(change.key):
            self.positions[partition] = change.position
            return False
        if len(self.queue) >= self.limit:
            self.end(
                EndReason.FELL_BEHIND,
                f"more than {self.bound} changes waited to be sent (the subscriber reads slower than "
                "the table changes): resume from the positions given",
            )
            return False
        self.queue.append(change)
        self.positions[partition] = change.position
        return True

    def advance(self, partition: int, position: int) -> None:
        """Every change of `partition` below `position` was offered: none of them is still to come."""
        if self.ended is None and position > self.positions.get(partition, position):
            self.positions[partition] = position

    def end(self, reason: EndReason, message: str) -> End:
        """End it (once): the End event follows what is buffered; positions are past everything buffered."""
        if self.ended is None:
            self.ended = End(reason, dict(self.positions), message)
            self.queue.append(self.ended)
        return self.ended

    def progress(self) -> Progress | None:
        """A Progress event when its positions moved since the last one (and it has nothing buffered)."""
        if self.queue or self.ended is not None or self.positions == self.reported:
            return None
        self.reported = dict(self.positions)
        return Progress(self.reported)

    def take(self) -> list[Event]:
        events = list(self.queue)
        self.queue.clear()
        return events


class FeedIndex:
    """The subscriptions of one partition: each committed change is offered to those that may take it."""

    __slots__ = ("by_key", "others", "partition")

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.by_key: dict[bytes, set[Subscription]] = {}
        self.others: set[Subscription] = set()

    def __len__(self) -> int:
        return len(self.subscriptions())

    def subscriptions(self) -> set[Subscription]:
        found = set(self.others)
        for subscriptions in self.by_key.values():
            found |= subscriptions
        return found

    def add(self, subscription: Subscription) -> None:
        keys = subscription.filter.keys
        if keys is None:
            self.others.add(subscription)
            return
        for key in keys:
            self.by_key.setdefault(key, set()).add(subscription)

    def remove(self, subscription: Subscription) -> None:
        keys = subscription.filter.keys
        if keys is None:
            self.others.discard(subscription)
            return
        for key in keys:
            found = self.by_key.get(key)
            if found is not None:
                found.discard(subscription)
                if not found:
                    del self.by_key[key]

    def offer(self, changes: Sequence[Change], next_offset: int) -> set[Subscription]:
        """Offer a committed batch's `changes` (in offset order, ending below `next_offset`): the
        subscriptions that took one, or ended (their streams have something to send)."""
        woken: set[Subscription] = set()
        by_key = self.by_key
        others = self.others
        if by_key:
            for change in changes:
                for subscription in by_key.get(change.key, ()):
                    if subscription.offer(change) or subscription.ended is not None:
                        woken.add(subscription)
        if others:
            for change in changes:
                for subscription in others:
                    if subscription.offer(change) or subscription.ended is not None:
                        woken.add(subscription)
        partition = self.partition
        for subscription in self.subscriptions() if by_key else others:
            subscription.advance(partition, next_offset)
        return woken
