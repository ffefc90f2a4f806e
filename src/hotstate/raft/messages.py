"""The messages quorum members exchange (KIP-595 Vote, BeginQuorumEpoch, Fetch; KIP-630 FetchSnapshot).

Plain frozen data: the core reads and writes these, the RPC layer encodes them. Every message names its
sender and receiver and carries the sender's epoch, so any message can teach a member of a newer epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from hotstate.log.divergence import DivergingEpoch
from hotstate.raft.records import Entry, SnapshotId


class ErrorCode(IntEnum):
    NONE = 0
    # The request's epoch is older than the receiver's: the answer carries the newer epoch and leader.
    FENCED_LEADER_EPOCH = 1
    # The receiver does not lead this epoch; `leader_id` is a hint when it knows who does.
    NOT_LEADER = 2
    # The request's epoch is newer than the receiver's; the receiver steps down and the sender retries.
    UNKNOWN_LEADER_EPOCH = 3
    # FetchSnapshot for a snapshot the leader no longer has.
    SNAPSHOT_NOT_FOUND = 4


@dataclass(frozen=True, slots=True)
class Vote:
    src: int
    dst: int
    epoch: int  # the candidate's epoch
    last_epoch: int  # epoch of the candidate's last entry (or its snapshot's)
    last_epoch_end_offset: int  # the candidate's end offset


@dataclass(frozen=True, slots=True)
class VoteResponse:
    src: int
    dst: int
    epoch: int
    granted: bool
    leader_id: int | None


@dataclass(frozen=True, slots=True)
class BeginQuorumEpoch:
    src: int
    dst: int
    epoch: int


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochResponse:
    src: int
    dst: int
    epoch: int
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class Fetch:
    src: int
    dst: int
    epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    max_bytes: int
    # The fetcher's HW: a leader whose HW is ahead answers at once instead of holding the request.
    high_watermark: int = 0


@dataclass(frozen=True, slots=True)
class FetchResponse:
    src: int
    dst: int
    epoch: int
    leader_id: int | None
    error: ErrorCode
    # Echo of the request, so a late or duplicated answer can be told from the current one.
    fetch_offset: int
    last_fetched_epoch: int
    high_watermark: int = 0
    entries: tuple[Entry, ...] = ()
    diverging: DivergingEpoch | None = None
    snapshot_id: SnapshotId | None = None  # set when the fetch offset is below the leader's log start


@dataclass(frozen=True, slots=True)
class FetchSnapshot:
    src: int
    dst: int
    epoch: int
    snapshot_id: SnapshotId
    position: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchSnapshotResponse:
    src: int
    dst: int
    epoch: int
    leader_id: int | None
    error: ErrorCode
    snapshot_id: SnapshotId
    position: int
    chunk: bytes = b""
    total_size: int = 0
    # The snapshot's voter set (`Snapshot.voters`), sent with every chunk; wire version 2.
    voters: frozenset[int] | None = None


Message = (
    Vote
    | VoteResponse
    | BeginQuorumEpoch
    | BeginQuorumEpochResponse
    | Fetch
    | FetchResponse
    | FetchSnapshot
    | FetchSnapshotResponse
)
