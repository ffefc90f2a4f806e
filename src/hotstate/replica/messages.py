"""What replicas of one partition say to each other, and the errors a replica answers with."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from hotstate.log.batch import RecordBatch


class ReplicaError(IntEnum):
    NONE = 0
    NOT_LEADER = 1  # this replica is not the partition's active; the answer names who is, when known
    FENCED_EPOCH = 2  # the caller's leader epoch is older than this replica's: refresh metadata
    UNKNOWN_EPOCH = 3  # the caller's leader epoch is newer than this replica knows yet: retry shortly
    NOT_ENOUGH_REPLICAS = 4  # fewer in-sync replicas than min.insync.replicas; nothing was written
    # Written, but the in-sync set shrank below min.insync.replicas before it committed. Retrying an
    # upsert is harmless.
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 5
    UNKNOWN_TABLE = 6
    INVALID_ROW = 7  # nothing of the request was written
    TOO_LARGE = 8  # nothing of the request was written
    TIMEOUT = 9  # written, not seen committed in time: the outcome is unknown, an upsert retry is harmless
    NOT_REPLICA = 10  # the fetcher is not a replica of this partition
    SNAPSHOT_NEEDED = 11  # the fetch offset is below the log start: rebuild from a store snapshot
    UNKNOWN_PARTITION = 12  # this server hosts no replica of that partition (yet)
    INVALID_REQUEST = 13


RETRIABLE = frozenset(
    {
        ReplicaError.NOT_LEADER,
        ReplicaError.FENCED_EPOCH,
        ReplicaError.UNKNOWN_EPOCH,
        ReplicaError.NOT_ENOUGH_REPLICAS,
        ReplicaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ReplicaError.TIMEOUT,
        ReplicaError.UNKNOWN_PARTITION,
    }
)


@dataclass(frozen=True, slots=True)
class FetchRequest:
    src: int
    dst: int
    table_id: int
    partition: int
    leader_epoch: int
    fetch_id: int  # echoed back, so a late or duplicated answer is recognised and dropped
    fetch_offset: int
    last_fetched_epoch: int
    # The fetcher's HW: the active answers at once when its own is newer, instead of parking the fetch.
    high_watermark: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchResponse:
    src: int
    dst: int
    table_id: int
    partition: int
    leader_epoch: int
    fetch_id: int
    error: ReplicaError
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    batches: tuple[RecordBatch, ...] = ()
    # Set when the fetcher's log diverged: the largest epoch both know, and where the active's copy ends.
    diverging_epoch: int = -1
    diverging_end_offset: int = -1


ReplicaMessage = FetchRequest | FetchResponse
