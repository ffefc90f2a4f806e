"""Log entries of the metadata quorum and the ids that name snapshots."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class EntryKind(IntEnum):
    DATA = 0
    # Written by every new leader in its own epoch: lets the HW advance without waiting for a proposal
    # (the own-epoch commit rule) and tells observers who leads.
    LEADER_CHANGE = 1


@dataclass(frozen=True, slots=True)
class Entry:
    offset: int
    epoch: int
    data: bytes
    kind: EntryKind = EntryKind.DATA

    def size(self) -> int:
        # Close enough to the encoded size for fetch budgeting.
        return len(self.data) + 24


@dataclass(frozen=True, slots=True, order=True)
class SnapshotId:
    """The state after applying every entry below `end_offset`; `epoch` is that last entry's."""

    end_offset: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    id: SnapshotId
    data: bytes
