"""What replicas of one partition say to each other, and the errors a replica answers with."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import IntEnum

from hotstate.controller.records import KeyColumn
from hotstate.log.batch import RecordBatch
from hotstate.log.divergence import DivergingEpoch


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
    LAG_OVER_BOUND = 14  # this replica is further behind than the query allows
    # The server (re)started and its metadata image has not yet replayed its own registration: it cannot
    # tell whether a table exists or who is active. Ask another server, or this one again shortly.
    NOT_READY = 15
    # The replica's store is behind the position the query's consistency token asks for: try another, or
    # this one again once it has applied more.
    BEHIND_TOKEN = 16
    # The token asks for a position beyond the active's log end: no write of this partition's history got
    # there (a token of a deleted and recreated table, or a forged one).
    TOKEN_AHEAD = 17
    # A scan's expressions failed on a row, or it passed a cap (rows scanned, groups): the query is at
    # fault, not the replica, so no other replica is tried (a 400). Also: the server runs as many scans
    # as it may (SCAN_BUSY), which another replica may not.
    BAD_QUERY = 18
    SCAN_BUSY = 19


RETRIABLE = frozenset(
    {
        ReplicaError.NOT_LEADER,
        ReplicaError.FENCED_EPOCH,
        ReplicaError.UNKNOWN_EPOCH,
        ReplicaError.NOT_ENOUGH_REPLICAS,
        ReplicaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ReplicaError.TIMEOUT,
        ReplicaError.UNKNOWN_PARTITION,
        ReplicaError.NOT_READY,
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
    # Two plain fields, -1 when unset, are the wire format; the core sees them as `diverging`.
    diverging_epoch: int = -1
    diverging_end_offset: int = -1

    @property
    def diverging(self) -> DivergingEpoch | None:
        if self.diverging_epoch < 0:
            return None
        return DivergingEpoch(self.diverging_epoch, self.diverging_end_offset)

    def with_diverging(self, diverging: DivergingEpoch) -> FetchResponse:
        return dataclasses.replace(
            self, diverging_epoch=diverging.epoch, diverging_end_offset=diverging.end_offset
        )


ReplicaMessage = FetchRequest | FetchResponse


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    """Upserts and deletes for one partition (what the Spark sink sends), applied in order. Each entry of
    `rows` is a row, a msgpack map (protocol.rows) that holds the table's key columns, or a tombstone, the
    msgpack bin of the encoded key to delete (`rows.encode_tombstone`); the active derives or checks the
    keys, so an entry sent to the wrong partition, or a tombstone whose bytes are not a key of the table's
    key types, is refused. Answered once committed (acks=all) or with an error."""

    table: str
    partition: int
    leader_epoch: int
    rows: tuple[bytes, ...]
    timeout_ms: int = 30_000


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    error: ReplicaError
    message: str
    base_offset: int = -1
    end_offset: int = -1
    active: int | None = None  # with NOT_LEADER / FENCED_EPOCH: who the answering server thinks is active
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class PartitionRows:
    """One partition's part of a `ProducePartitionsRequest`: what a `ProduceRequest` holds but the table."""

    partition: int
    leader_epoch: int
    rows: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class ProducePartitionsRequest:
    """Upserts and deletes (entries as in `ProduceRequest`) for several partitions of one table, sent to the
    server the writer knows as their active: one round trip per server rather than per partition. Each part
    is checked, written and answered on its own, exactly as the `ProduceRequest` of its partition would be
    (its own errors, hints and produce.max.bytes); one part's error writes nothing of that part and does
    not touch the others."""

    table: str
    parts: tuple[PartitionRows, ...]
    timeout_ms: int = 30_000


@dataclass(frozen=True, slots=True)
class ProducePartitionsResponse:
    answers: tuple[ProduceResponse, ...]  # in the order of the request's parts


@dataclass(frozen=True, slots=True)
class FetchStoreSnapshotRequest:
    """A chunk of the active's store snapshot, for a follower below the active's log start.

    `snapshot_id` 0 asks for a new snapshot; the answer names it, and later chunks ask for that one."""

    replica_id: int
    table_id: int
    partition: int
    leader_epoch: int
    snapshot_id: int
    after_key: bytes | None
    max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchStoreSnapshotResponse:
    error: ReplicaError
    message: str
    snapshot_id: int
    position: int
    epoch: int
    items: tuple[tuple[bytes, bytes], ...]
    next_after: bytes | None  # None: that was the last chunk


@dataclass(frozen=True, slots=True)
class LagInfo:
    """KIP-535's LagInfo for one local replica."""

    table: str
    table_id: int
    partition: int
    state: str  # active, restoring, standby, warmup
    current_offset_position: int  # the store's position
    end_offset_position: int  # the highest end offset this server knows for the partition
    offset_lag: int
    leader_epoch: int
    high_watermark: int
    in_sync: bool


@dataclass(frozen=True, slots=True)
class LagInfoRequest:
    pass


@dataclass(frozen=True, slots=True)
class LagInfoResponse:
    node_id: int
    replicas: tuple[LagInfo, ...]


@dataclass(frozen=True, slots=True)
class MetadataForKeyRequest:
    table: str
    key_row: bytes  # the key columns as a row (protocol.rows.encode_row)


@dataclass(frozen=True, slots=True)
class MetadataForKeyResponse:
    error: ReplicaError
    message: str
    partition: int = -1
    active: int | None = None
    standbys: tuple[int, ...] = ()
    warmups: tuple[int, ...] = ()
    leader_epoch: int = -1


# The longest a metadata watch is parked on a server, whatever the request asks.
MAX_METADATA_WATCH_MS = 30_000


@dataclass(frozen=True, slots=True)
class TableMetadataRequest:
    """Where a table's partitions live, from the answering server's image.

    With `max_wait_ms` > 0 it is a *metadata watch* (a long poll): the server answers once its image holds
    a change of the table (its definition or any of its partitions) newer than `known_offset` (the
    `metadata_offset` of the answer the caller holds), or once `max_wait_ms` (capped at
    MAX_METADATA_WATCH_MS) has passed, whichever is first; either way with the table's current metadata.
    Version 2 added `known_offset` and `max_wait_ms`; a version 1 request (the table alone) is answered at
    once, as before."""

    table: str
    known_offset: int = -1
    max_wait_ms: int = 0


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    partition: int
    active: int | None
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ServerAddress:
    node_id: int
    host: str
    port: int
    rack: str | None
    fenced: bool


@dataclass(frozen=True, slots=True)
class TableMetadataResponse:
    error: ReplicaError
    message: str
    table_id: int = -1
    key_columns: tuple[KeyColumn, ...] = ()
    acceptable_lag: int | None = None
    partitions: tuple[PartitionMetadata, ...] = ()
    servers: tuple[ServerAddress, ...] = ()
    metadata_offset: int = 0
    # The answering server's produce.max.bytes (version 2): the most row bytes one Produce may carry, so
    # a writer refuses a row that can never be sent before sending anything. 0: not said (version 1).
    produce_max_bytes: int = 0


@dataclass(frozen=True, slots=True)
class ReadPartitionRequest:
    """Rows of this server's local replica of a partition, in key order (after `after_key`)."""

    table: str
    partition: int
    after_key: bytes | None = None
    limit: int = 10_000


@dataclass(frozen=True, slots=True)
class ReadPartitionResponse:
    error: ReplicaError
    message: str
    position: int = 0
    items: tuple[tuple[bytes, bytes], ...] = ()  # (encoded key, row)


@dataclass(frozen=True, slots=True)
class FeedReadRequest:
    """A push-query feed on another server reading this server's replica of a partition (server/feeds.py):
    its committed changes from `position` (waiting up to `wait_ms` for one when there is none yet); or,
    with `rows`, its current rows at its position: those of `keys` when `by_keys`, else those in
    [start, end)."""

    table_id: int
    partition: int
    position: int
    wait_ms: int
    max_bytes: int
    rows: bool = False
    by_keys: bool = False
    keys: tuple[bytes, ...] = ()
    start: bytes | None = None
    end: bytes | None = None


@dataclass(frozen=True, slots=True)
class FeedReadResponse:
    error: ReplicaError
    message: str
    position: int = 0  # the changes reach up to here; the rows are at it
    epoch: int = 0
    # (offset, leader epoch, key, row); an empty row is a delete (a row is never empty bytes)
    changes: tuple[tuple[int, int, bytes, bytes], ...] = ()
    rows: tuple[tuple[bytes, bytes], ...] = ()
    gone: bool = False  # the log no longer holds `position`: the feed needs the current rows instead


@dataclass(frozen=True, slots=True)
class FeedPageRequest:
    """A push-query feed on another server reading a partition's current rows here a page at a time
    (server/feeds.py): `view_id` 0 opens a view of the store now (its rows of `keys` when `by_keys`, else
    those in [start, end)); a later page names the view and the cursor it has (`after`: the last key of
    the page before), so a lost or repeated page is refused rather than skipped or sent twice."""

    table_id: int
    partition: int
    view_id: int
    after: bytes | None
    max_rows: int
    max_bytes: int
    by_keys: bool = False
    keys: tuple[bytes, ...] = ()
    start: bytes | None = None
    end: bytes | None = None


@dataclass(frozen=True, slots=True)
class FeedPageResponse:
    error: ReplicaError
    message: str
    view_id: int = 0
    position: int = 0  # every page's rows are the store's at this position
    epoch: int = 0
    rows: tuple[tuple[bytes, bytes], ...] = ()
    more: bool = False  # another page follows (the view stays open until it is read or expires)
    cursor: bytes | None = None  # the last key sent so far: the next request's `after`


@dataclass(frozen=True, slots=True)
class PartitionQueryRequest:
    """One partition's part of a pull query, forwarded (inside a `QueryPartitionsRequest`) to the server
    chosen to serve it. Never forwarded again: the receiver answers from its local replica or refuses
    (KLIP-12)."""

    table: str
    partition: int
    keys: tuple[bytes, ...]  # point lookups; empty with `scan`
    scan: bool
    start: bytes | None
    end: bytes | None
    limit: int | None
    max_lag: int | None
    # From the query's consistency token (version 2): serve only from a store at least at this position.
    min_position: int = 0
    # The generation of the table the query was planned against (version 3): only a replica of it serves
    # (an overwrite swaps generations; a query must read one of them in full). -1: whichever the name is.
    table_id: int = -1
    # A scan's program (version 4, query/scan.py ScanProgram): filter, top-n or partial aggregates of the
    # rows read; empty: send the rows read.
    program: bytes = b""


@dataclass(frozen=True, slots=True)
class PartitionQueryResponse:
    error: ReplicaError  # NONE, or why this server refused (LAG_OVER_BOUND, UNKNOWN_PARTITION, ...)
    message: str
    state: str = ""
    position: int = 0
    offset_lag: int = 0
    items: tuple[tuple[bytes, bytes], ...] = ()
    # A scan's partial answer (version 2): rows scanned and partial aggregates (query/scan.py).
    partial: bytes = b""


@dataclass(frozen=True, slots=True)
class QueryPartitionsRequest:
    """Every partition of one pull query that the coordinator sends to one server: one round trip per
    server, not per partition or key. Each part is answered (or refused) on its own."""

    parts: tuple[PartitionQueryRequest, ...]
    # The user or token the coordinator's HTTP authentication admitted ("": auth off), for the serving
    # server's log: the request itself is the coordinator's, authenticated by the cluster's handshake.
    user: str = ""


@dataclass(frozen=True, slots=True)
class QueryPartitionsResponse:
    answers: tuple[PartitionQueryResponse, ...]  # in the order of the request's parts


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """KLIP-12's heartbeat: its arrival time on the receiver's clock is all that counts."""

    src: int


@dataclass(frozen=True, slots=True)
class LagReport:
    src: int
    replicas: tuple[LagInfo, ...]
