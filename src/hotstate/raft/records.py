"""Log entries of the metadata quorum and the ids that name snapshots."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum

import msgpack


class EntryKind(IntEnum):
    DATA = 0
    # Written by every new leader in its own epoch: lets the HW advance without waiting for a proposal
    # (the own-epoch commit rule) and tells observers who leads.
    LEADER_CHANGE = 1
    # KIP-853's VotersRecord: the whole voter set from this offset on. It takes effect on every member as
    # soon as the member appends it, committed or not (Raft's single-server membership change).
    VOTERS = 2


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
    # The voter set in effect at `id.end_offset` (the last VotersRecord below it); None when no record is
    # below it, so that the voters are still the bootstrap ones of `controller.quorum.voters`.
    voters: frozenset[int] | None = None


def encode_voters(voters: Iterable[int]) -> bytes:
    return msgpack.packb(sorted(voters))


def decode_voters(data: bytes) -> frozenset[int]:
    ids = msgpack.unpackb(data)
    if not isinstance(ids, list) or not ids or not all(type(i) is int for i in ids):
        raise ValueError(f"a VotersRecord must hold a non-empty list of node ids, not {ids!r}")
    return frozenset(ids)
