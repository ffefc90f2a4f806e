"""Where a fetcher's copy of a log parts from the leader's: one rule for the Raft and the replication cores.

`DivergingEpoch` is also a wire type (`protocol/wire.py` type id 3, inside the Raft FetchResponse); the
replication FetchResponse carries the same two numbers as plain fields, -1 when unset, and converts them
at its own boundary.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class DivergingEpoch:
    """The leader's largest epoch <= the fetcher's last epoch, and where that epoch ends in its log."""

    epoch: int
    end_offset: int


class EpochLog(Protocol):
    """What the rule reads of an in-memory log (`RaftLog`, `BatchLog`)."""

    @property
    def start_offset(self) -> int: ...

    @property
    def start_epoch(self) -> int: ...

    @property
    def end_offset(self) -> int: ...

    def end_offset_for_epoch(self, epoch: int) -> DivergingEpoch | None: ...


class NeedsSnapshot(enum.Enum):
    """The fetcher's position lies below what the leader's log still holds (a distinct type for `match`)."""

    NEEDS_SNAPSHOT = "snapshot needed"


NEEDS_SNAPSHOT = NeedsSnapshot.NEEDS_SNAPSHOT


def check_fetch(
    log: EpochLog, fetch_offset: int, last_fetched_epoch: int
) -> DivergingEpoch | NeedsSnapshot | None:
    """The leader's side: None when both logs agree up to `fetch_offset`, else where they part, or that only
    a snapshot can bring the fetcher back."""
    if fetch_offset < log.start_offset:
        return NEEDS_SNAPSHOT
    if fetch_offset == log.start_offset:
        if last_fetched_epoch == log.start_epoch:
            return None
        # Only an empty prefix is shared when nothing lies below the start; otherwise a snapshot replaced it.
        return DivergingEpoch(0, 0) if log.start_offset == 0 else NEEDS_SNAPSHOT
    found = log.end_offset_for_epoch(last_fetched_epoch)
    if found is not None and found.epoch == last_fetched_epoch and found.end_offset >= fetch_offset:
        return None
    if found is None and log.start_offset == 0:
        # We know none of the fetcher's epochs: the only prefix we share is the empty one.
        return DivergingEpoch(0, 0)
    if found is None or found.end_offset < log.start_offset:
        return NEEDS_SNAPSHOT
    return DivergingEpoch(found.epoch, min(found.end_offset, fetch_offset))


def truncation_offset(log: EpochLog, diverging: DivergingEpoch) -> int:
    """The fetcher's side: where to cut its log.

    Where the leader's copy of that epoch ends or where ours does, whichever is first: entries of later epochs
    that the leader never had diverge too, and must go in this same step.
    """
    own = log.end_offset_for_epoch(diverging.epoch)
    own_end = log.start_offset if own is None else own.end_offset
    return min(diverging.end_offset, own_end, log.end_offset)
