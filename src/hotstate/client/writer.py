"""Writing upserts and deletes to a table: what the Spark sink does on each executor, usable on its own.

Rows are encoded once (protocol.rows), keyed and partitioned with the one shared function (protocol.keys),
grouped by partition and sent as Produce requests to each partition's active; the partitions of one
server travel in one message (a ProducePartitionsRequest, each part answered on its own), and each
partition's retries are its own.

Writes are pipelined: concurrent `upsert` / `write` / `delete` / `upsert_encoded` calls on one writer send
a partition's Produces without waiting for each other's answers, up to `max_in_flight` unanswered per
partition, and the partition applies them in the order the calls were made, failures included. Each
partition has a `PartitionSequencer` (client/sequencer.py, pure: the rule and why it holds are there and in
docs/replication.md "Pipelined writes"); this shell sends what it grants, in its order, from one
synchronous place (`_release`), and tells it every outcome. A retriable failure closes the partition's
gate; once nothing of it is in flight, the failed Produces are resent one at a time, in order, without the
rows a later Produce committed.

A bad row (not encodable, nested too deep, or larger than one Produce may carry) fails the whole call
before anything is sent.

The writer learns where partitions move without polling. Once it has the table's metadata it keeps
*metadata watches* open (`TableMetadataRequest` with `known_offset` and `max_wait_ms`: the server parks
the request until its image holds a change of the table newer than what the writer knows), on
WATCH_FANOUT servers at once so that one paused or cut-off server cannot hide a change. So:

- while a Produce is unanswered, a change that moves its partition to another active (or epoch)
  abandons it at once and the rows go to the new active;
- a Produce that failed because the active is gone (connection refused or lost, NOT_LEADER,
  FENCED_EPOCH, NOT_READY) is retried as soon as a watch shows the partition moved; a NOT_LEADER or
  FENCED_EPOCH answer that names a newer active and epoch is used at once;
- answers that give no better information (and the failures above, in case nothing moves: a dropped
  connection to a live server) are retried after a short jittered backoff (RETRY_BACKOFF_*_S).

Every retriable answer (RETRIABLE, including NOT_READY from a server still catching up with the
metadata after a restart) is retried until the call's deadline: rows are full upserts and deletes are
tombstones, so sending one twice is harmless, as long as it does not land after a later write of the same
key (the sequencer's part).

Deletes (`delete`, or `Delete` entries among the rows of `write`) travel in the same Produces as rows, in
their place in the call's order: a tombstone entry (`protocol.rows.encode_tombstone`, the msgpack bin of the
encoded key, where a row is a msgpack map), which the active checks and logs as the record [key, nil]
(docs/replication.md, "Tombstones").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from hotstate.client.sequencer import Grant, PartitionSequencer
from hotstate.controller.records import KeyColumn
from hotstate.protocol.keys import (
    InvalidKeyError,
    KeyValue,
    coerce_key,
    encode_key,
    encode_keys,
    key_from_row,
    partition_for,
    partitions_of,
    window_suffix,
)
from hotstate.protocol.rows import encode_row, encode_tombstone, row_keys
from hotstate.protocol.wire import MESSAGES
from hotstate.query.tokens import cluster_tag
from hotstate.query.tokens import encode as encode_token
from hotstate.replica.messages import (
    RETRIABLE,
    PartitionMetadata,
    PartitionRows,
    ProducePartitionsRequest,
    ProducePartitionsResponse,
    ProduceRequest,
    ProduceResponse,
    ReadPartitionRequest,
    ReadPartitionResponse,
    ReplicaError,
    TableMetadataRequest,
    TableMetadataResponse,
)
from hotstate.rpc import (
    DEFAULT_MAX_FRAME_BYTES,
    ERROR_BAD_MESSAGE,
    PeerPool,
    RemoteError,
    RpcError,
    bootstrap_peers,
)
from hotstate.tls import TlsOption, to_client_context

log = logging.getLogger(__name__)

CLIENT_NODE_ID = 0
# Rows in one Produce message (of one partition or several). The server appends a partition's rows to its
# log in one write on its event loop, so 1 MiB, not 4 (measured, 2 cores, bench/bulk_load.py: the same
# throughput, and no 4 MiB log write holding the loop in the middle of a bulk load's lookups).
MAX_REQUEST_BYTES = 1024 * 1024
# The server's default produce.max.bytes, for an answer that does not say (a server before version 2 of
# TableMetadataResponse).
DEFAULT_PRODUCE_MAX_BYTES = 8 * 1024 * 1024
# Room in one RPC frame for everything of a Produce but its rows (names, numbers, msgpack headers).
FRAME_RESERVE_BYTES = 64 * 1024
# How long a table unknown to every server is waited for (a create that has not reached the images yet).
UNKNOWN_TABLE_WAIT_S = 3.0
# How long one metadata watch is parked on a server; the RPC waits WATCH_SLACK_S longer for the answer.
WATCH_MAX_WAIT_MS = 10_000
WATCH_SLACK_S = 2.0
# Watches open at once, each on another server: a paused server answers no watch, and a change must
# still reach the writer through another.
WATCH_FANOUT = 2
# Retries of answers that give no better information, jittered: the first after about 20 ms.
RETRY_BACKOFF_MIN_S = 0.02
RETRY_BACKOFF_MAX_S = 0.25
# A server whose watch failed (unreachable, not ready, behind) is not asked again for this long if
# another can be.
WATCH_AVOID_S = 1.0
# Rows one ReadPartitionRequest of `partition_keys` asks for.
KEY_PAGE = 10_000
# Produces of one partition unanswered at once, by default (TableWriter's max_in_flight).
DEFAULT_MAX_IN_FLIGHT = 5


class WriteError(Exception):
    """A write that cannot succeed as sent (bad row, unknown table, too large), or ran out of time."""

    def __init__(self, error: ReplicaError | None, message: str) -> None:
        super().__init__(message)
        self.error = error


@dataclass(frozen=True, slots=True)
class WriteResult:
    rows: int
    requests: int
    retries: int
    # Where the written partitions are now (query/tokens.py): pass it to a query as consistency_token to
    # read these rows back from any server, whatever fails meanwhile (read-your-writes).
    consistency_token: str = ""


@dataclass(slots=True)
class WriterStats:
    """What the writer asked and learned, over its life (for tests, benchmarks and logs)."""

    metadata_requests: int = 0  # plain TableMetadataRequests (the first fetch, and when watches stop)
    watch_requests: int = 0  # metadata watches sent
    watch_changes: int = 0  # watch answers that brought newer metadata
    moved_while_waiting: int = 0  # Produces abandoned because a watch showed their partition moved
    # Retries sent as soon as the partition was seen moved (a watch answer, or a hint), rather than
    # after a backoff timer.
    retried_on_move: int = 0
    produce_requests: int = 0  # one partition's rows sent once (a part of a shared message counts once)
    produce_failures: int = 0  # of those, the ones that failed (an error answer, or none)
    # Produce messages sent: a ProducePartitionsRequest carrying several partitions for one server is one.
    produce_messages: int = 0
    hints_used: int = 0  # NOT_LEADER / FENCED_EPOCH answers whose named active was used at once
    # Rows left out of retries because a later write of the same partition had committed their keys.
    rows_superseded: int = 0


class TableWriter:
    def __init__(
        self,
        servers: Sequence[tuple[str, int]],
        table: str,
        *,
        cluster_id: str,
        secret: str,
        request_timeout_s: float = 10.0,
        rack: str | None = None,
        tls: TlsOption = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        """`tls`: the servers' RPC port uses TLS; the CA certificate file to trust, or an ssl.SSLContext
        (tls.client_context: with a client certificate when the servers require one).

        `max_in_flight`: how many Produce requests of one partition may be unanswered at once (Kafka's
        max.in.flight.requests.per.connection). Concurrent `upsert` / `upsert_encoded` calls on this
        writer send without waiting for each other's answers up to that bound; the rows of a partition are
        applied in the order the calls were made, also when a Produce fails and is retried
        (client/sequencer.py, docs/replication.md "Pipelined writes"). 1 sends one at a time."""
        if not servers:
            raise ValueError("no servers to talk to")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {max_in_flight}")
        self.max_in_flight = max_in_flight
        self.table = table
        # The writer's rack (spark.hotstate.rack / HOTSTATE_RACK). The controller learns it once per job,
        # from the driver (spark.table.ensure_table: CreateTable / RegisterWriter), not from every writer:
        # executors open writers per task, and each report would be a metadata commit.
        self.rack = rack
        self._bootstrap = list(servers)
        self._cluster_id = cluster_id
        self._tag = cluster_tag(cluster_id)
        self._secret = secret
        # Node ids from the metadata; bootstrap addresses go under negative ids so they never collide.
        self._pool = PeerPool(
            CLIENT_NODE_ID,
            cluster_id,
            secret,
            MESSAGES,
            max_frame_bytes=DEFAULT_MAX_FRAME_BYTES,
            backoff_max=0.25,
            tls=to_client_context(tls),
        )
        self._addresses: dict[int, tuple[str, int]] = bootstrap_peers(self._bootstrap)
        self._pool.update(self._addresses)
        self._request_timeout_s = request_timeout_s
        self._metadata: TableMetadataResponse | None = None
        self._refreshing: asyncio.Task[TableMetadataResponse] | None = None
        self._last_error: Exception | None = None
        self.stats = WriterStats()
        # Set (and replaced) whenever newer metadata is installed: what waiting writes wake on.
        self._changed = asyncio.Event()
        # A NOT_LEADER / FENCED_EPOCH answer's newer active, per partition, until the metadata catches up.
        self._hints: dict[int, PartitionMetadata] = {}
        self._watchers: list[asyncio.Task[None]] = []
        self._watching: dict[int, int] = {}  # watcher slot -> the server it asks
        self._avoid: dict[int, float] = {}  # server -> until when a watch should not go to it
        # Produces asked for in this event-loop turn, per server: they leave together (_flush_produces).
        self._outgoing: dict[int, list[_Outgoing]] = {}
        self._sending: set[asyncio.Task[None]] = set()
        # Servers that refused a ProducePartitionsRequest as unknown (an older version): one per partition.
        self._single_only: set[int] = set()
        # Produces for a server being connected to, to send in this order once it is (_send_once_connected).
        self._connecting: dict[int, list[list[_Outgoing]]] = {}
        # Per partition: the order of its Produces and the writes waiting on them.
        self._lanes: dict[int, _Lane] = {}
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        for task in self._watchers:
            task.cancel()
        for task in self._watchers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._watchers.clear()
        for sending in list(self._sending):
            sending.cancel()
        for sending in list(self._sending):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sending
        await self._pool.close()

    async def __aenter__(self) -> TableWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ metadata
    async def metadata(
        self, *, refresh: bool = False, deadline_s: float | None = None
    ) -> TableMetadataResponse:
        """The table's metadata as this writer knows it (fetched on first use, or with `refresh`).

        A server still catching up after a restart (NOT_READY) or unreachable is skipped; with no server
        able to answer, the fetch is retried until `deadline_s` (default: the request timeout)."""
        if self._metadata is None or refresh:
            if self._refreshing is None or self._refreshing.done():
                end = time.monotonic() + (self._request_timeout_s if deadline_s is None else deadline_s)
                self._refreshing = asyncio.ensure_future(self._fetch_metadata(end))
            self._install(await asyncio.shield(self._refreshing))
        assert self._metadata is not None
        return self._metadata

    async def _fetch_metadata(self, end: float) -> TableMetadataResponse:
        unknown_until = time.monotonic() + UNKNOWN_TABLE_WAIT_S
        backoff = RETRY_BACKOFF_MIN_S
        while True:
            unknown_at: list[int] = []
            reply = await self._metadata_round(unknown_at)
            if reply is not None:
                return reply
            now = time.monotonic()
            if (unknown_at and now >= unknown_until) or now >= end:
                break
            # Nobody could answer (unreachable, or starting and not caught up), or the table is not in
            # any image yet (a create on its way): ask again shortly.
            await asyncio.sleep(min(_jittered(max(backoff, 0.1 if unknown_at else 0.0)), max(0.0, end - now)))
            backoff = min(backoff * 2, RETRY_BACKOFF_MAX_S)
        if unknown_at:
            raise WriteError(ReplicaError.UNKNOWN_TABLE, f"no table {self.table!r}")
        raise WriteError(
            None, f"no server answered for table {self.table!r} (last error: {self._last_error})"
        )

    async def _metadata_round(self, unknown_at: list[int]) -> TableMetadataResponse | None:
        known = [n for n in self._addresses if n > 0] + [n for n in self._addresses if n < 0]
        random.shuffle(known)
        last: Exception | None = None
        # Once connected somewhere, a server we hold no connection to is likely down: it gets a short try,
        # so that it does not hold up a refresh (a first refresh, connected nowhere, waits for the handshake).
        connected_somewhere = any(self._pool.is_connected(n) for n in known)
        for node in known:
            try:
                timeout = 2.0 if self._pool.is_connected(node) or not connected_somewhere else 0.3
                self.stats.metadata_requests += 1
                reply = await self._pool.request(node, TableMetadataRequest(self.table), timeout)
            except RpcError as error:
                last = error
                continue
            assert isinstance(reply, TableMetadataResponse)
            if reply.error is ReplicaError.UNKNOWN_TABLE:
                # A table just created may not have reached every server's image yet: ask the others.
                unknown_at.append(node)
                continue
            if reply.error is not ReplicaError.NONE:
                # NOT_READY included: a restarted server whose image has not caught up; ask the others.
                last = WriteError(reply.error, reply.message)
                continue
            current = self._metadata
            if current is not None and current.metadata_offset > reply.metadata_offset:
                return current  # a server further behind than what we know already
            return reply
        self._last_error = last
        return None

    def _install(self, reply: TableMetadataResponse) -> bool:
        """Take `reply` as the table's metadata if it is newer than what the writer holds; wake every write
        waiting for a change. True if it was newer."""
        current = self._metadata
        if current is reply or (current is not None and reply.metadata_offset <= current.metadata_offset):
            return False
        self._metadata = reply
        for server in reply.servers:
            self._addresses[server.node_id] = (server.host, server.port)
        self._pool.update(self._addresses)
        for partition, hint in list(self._hints.items()):
            if (
                partition >= len(reply.partitions)
                or reply.partitions[partition].leader_epoch >= hint.leader_epoch
            ):
                del self._hints[partition]
        self._wake()
        return True

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _partition(self, partition: int) -> PartitionMetadata:
        """The partition as the writer knows it: the metadata, or a newer active an answer named."""
        assert self._metadata is not None
        parts = self._metadata.partitions
        if partition >= len(parts):
            raise WriteError(
                ReplicaError.UNKNOWN_PARTITION,
                f"{self.table} now has {len(parts)} partitions, not {partition + 1} or more: it was deleted "
                "and created again while rows for it were being written",
            )
        return self._hints.get(partition) or parts[partition]

    def _moved(self, partition: int, sent_to: PartitionMetadata) -> bool:
        """The partition has another active or leader epoch than `sent_to` (an ISR change is no move:
        an active waiting for a follower to leave the ISR is about to answer)."""
        now = self._partition(partition)
        return (now.active, now.leader_epoch) != (sent_to.active, sent_to.leader_epoch)

    def _max_row_bytes(self, meta: TableMetadataResponse) -> int:
        """The most bytes one encoded row may have: the server's produce.max.bytes (a Produce of that
        row alone), and what one RPC frame of this writer carries."""
        produce_max = meta.produce_max_bytes if meta.produce_max_bytes > 0 else DEFAULT_PRODUCE_MAX_BYTES
        return min(produce_max, DEFAULT_MAX_FRAME_BYTES - FRAME_RESERVE_BYTES)

    # ------------------------------------------------------------------ metadata watches
    def _start_watching(self) -> None:
        if self._closed:
            return
        self._watchers = [t for t in self._watchers if not t.done()]
        for slot in range(len(self._watchers), WATCH_FANOUT):
            self._watchers.append(asyncio.ensure_future(self._watch_loop(slot)))

    def _watch_server(self, slot: int) -> int:
        """A server for watcher `slot`: known from the metadata (bootstrap addresses only before), not
        watched by another slot, preferably connected and not recently failed."""
        meta = self._metadata
        nodes = [s.node_id for s in meta.servers if not s.fenced] if meta is not None else []
        nodes = nodes or [n for n in self._addresses if n > 0] or list(self._addresses)
        taken = {node for other, node in self._watching.items() if other != slot}
        now = time.monotonic()
        random.shuffle(nodes)
        nodes.sort(key=lambda n: (n in taken, self._avoid.get(n, 0.0) > now, not self._pool.is_connected(n)))
        return nodes[0]

    async def _watch_loop(self, slot: int) -> None:
        backoff = RETRY_BACKOFF_MIN_S
        while not self._closed:
            meta = self._metadata
            if meta is None:
                return
            node = self._watch_server(slot)
            self._watching[slot] = node
            request = TableMetadataRequest(self.table, meta.metadata_offset, WATCH_MAX_WAIT_MS)
            self.stats.watch_requests += 1
            try:
                reply = await self._pool.request(node, request, WATCH_MAX_WAIT_MS / 1000 + WATCH_SLACK_S)
            except RpcError as error:
                log.debug("metadata watch on server %d failed: %s", node, error)
                reply = None
            assert reply is None or isinstance(reply, TableMetadataResponse)
            if reply is not None and reply.error is ReplicaError.NONE:
                if self._install(reply):
                    self.stats.watch_changes += 1
                    backoff = RETRY_BACKOFF_MIN_S
                    continue
                if reply.metadata_offset >= meta.metadata_offset:
                    continue  # the wait ended with nothing new
            # Unreachable, starting (NOT_READY), behind, or the table is gone: another server, after a
            # pause (without one, a table deleted under the writer would be asked about in a loop).
            self._avoid[node] = time.monotonic() + WATCH_AVOID_S
            await asyncio.sleep(_jittered(backoff))
            backoff = min(backoff * 2, 1.0)

    # ------------------------------------------------------------------ writes
    async def upsert(self, rows: Sequence[Mapping[str, object]], *, deadline_s: float = 60.0) -> WriteResult:
        """Write `rows`; returns once every partition has committed its rows (acks=all). Calls may run
        concurrently: each partition applies their rows in the order the calls were made (pipelined up to
        `max_in_flight`), so a key ends with the value of the last call that wrote it.

        Raises WriteError: INVALID_ROW or TOO_LARGE (naming the row) before anything is sent, a
        non-retriable answer, or TIMEOUT once a partition made no progress for `deadline_s`: it bounds
        each wait (for the metadata, for a Produce's turn, for its answer), and every Produce of a
        partition that commits gives the partition's waiting Produces `deadline_s` again, so a large
        write that keeps being acknowledged runs as long as it needs."""
        end = time.monotonic() + deadline_s
        meta = await self.metadata(deadline_s=deadline_s)
        max_row = self._max_row_bytes(meta)
        by_partition = _encode_in_bulk(rows, meta, max_row)
        if by_partition is None:
            by_partition = self._encode_one_by_one(rows, meta, max_row)
        self._start_watching()
        # Added to the partitions' sequencers before the first await: the order of writes is the order of
        # the calls.
        queued = self._enqueue(by_partition, meta.table_id, end, deadline_s, min(MAX_REQUEST_BYTES, max_row))
        results = await asyncio.gather(*(self._write_partition(p, pending) for p, pending in queued))
        return self._result(len(rows), meta, by_partition, results)

    async def delete(self, keys: Iterable[Key], *, deadline_s: float = 60.0) -> WriteResult:
        """Delete the rows of `keys`; returns once every partition has committed the deletes (acks=all), as
        `upsert` does: ordered with the writer's other calls (a key deleted here and written by a later
        call ends with that row), and the token returned reads the keys gone. A key absent from the table
        is no error (a delete is a tombstone for the key, whatever the table holds).

        A key is a tuple (or list) of the key columns' values in key order, a mapping holding the key
        columns (other entries are ignored, so a row deletes itself), or, for a table with one key column,
        the value alone. Raises WriteError INVALID_ROW naming the first bad key before anything is sent."""
        return await self.write([Delete(key) for key in keys], deadline_s=deadline_s)

    async def write(
        self, changes: Sequence[Mapping[str, object] | Delete], *, deadline_s: float = 60.0
    ) -> WriteResult:
        """Upserts and deletes in one call, applied in the order given: each change is a row (a mapping, as
        for `upsert`) or a `Delete(key)` (a key as for `delete`), so a key written then deleted in one call
        ends deleted, and deleted then written ends with the row. `WriteResult.rows` counts both. Otherwise
        exactly `upsert`: acks=all, ordered and pipelined with the writer's other calls, a bad row or key
        fails the whole call before anything is sent."""
        if not any(isinstance(change, Delete) for change in changes):
            return await self.upsert(cast(Sequence[Mapping[str, object]], changes), deadline_s=deadline_s)
        end = time.monotonic() + deadline_s
        meta = await self.metadata(deadline_s=deadline_s)
        max_row = self._max_row_bytes(meta)
        by_partition = self._encode_one_by_one(changes, meta, max_row)
        self._start_watching()
        queued = self._enqueue(by_partition, meta.table_id, end, deadline_s, min(MAX_REQUEST_BYTES, max_row))
        results = await asyncio.gather(*(self._write_partition(p, pending) for p, pending in queued))
        return self._result(len(changes), meta, by_partition, results)

    def _encode_one_by_one(
        self,
        rows: Sequence[Mapping[str, object] | Delete],
        meta: TableMetadataResponse,
        max_row: int,
    ) -> dict[int, list[bytes]]:
        """The rows (and deletes) encoded and grouped by partition, in order; WriteError naming the first
        row or key that cannot be sent."""
        by_partition: dict[int, list[bytes]] = {}
        suffix = window_suffix(meta.key_columns)
        for index, row in enumerate(rows):
            try:
                if isinstance(row, Delete):
                    key = encode_key(delete_key(row.key, meta.key_columns))
                    encoded = encode_tombstone(key)
                else:
                    key = encode_key(key_from_row(row, meta.key_columns))
                    encoded = encode_row(row)
            except ValueError as error:
                what = "delete" if isinstance(row, Delete) else "row"
                message = f"{what} {index} of {self.table}: {error}"
                raise WriteError(ReplicaError.INVALID_ROW, message) from error
            if len(encoded) > max_row:
                raise WriteError(
                    ReplicaError.TOO_LARGE,
                    f"row {index} of {self.table}: {len(encoded):,} bytes encoded, the limit is {max_row:,} "
                    "(the servers' produce.max.bytes: one Produce carries at most that many row bytes)",
                )
            by_partition.setdefault(partition_for(key, len(meta.partitions), suffix), []).append(encoded)
        return by_partition

    # ------------------------------------------------------------------ pipelined, in order
    def _enqueue(
        self,
        by_partition: Mapping[int, Sequence[bytes]],
        table_id: int,
        end: float,
        window_s: float,
        chunk_bytes: int,
    ) -> list[tuple[int, list[_Pending]]]:
        """Every partition's rows, in Produces of at most `chunk_bytes`, added to the partition's sequencer
        (after every write added before) and sent now as far as its order and `max_in_flight` allow."""
        loop = asyncio.get_running_loop()
        queued = []
        for partition, rows in sorted(by_partition.items()):
            if not rows:
                continue
            lane = self._lanes.get(partition)
            if lane is None:
                lane = self._lanes[partition] = _Lane(
                    PartitionSequencer(self.max_in_flight, self._keys_of), table_id
                )
            elif lane.table_id != table_id:
                # The table was deleted and created again under this writer: its offsets start over, and a
                # position of the old one in a token would be beyond the new log end (a 400 for the reader).
                # The order of calls still holds across the two: the lane is the same.
                lane.table_id = table_id
                lane.sequencer.position = 0
            pending = []
            for chunk in _chunks(rows, chunk_bytes):
                seq = lane.sequencer.add(chunk)
                pending.append(
                    lane.pending.setdefault(
                        seq, _Pending(seq, len(chunk), end, window_s, loop.create_future(), table_id)
                    )
                )
            self._release(partition, lane)
            queued.append((partition, pending))
        return queued

    def _keys_of(self, rows: Sequence[bytes]) -> list[bytes] | None:
        """Each entry's encoded key, a row's or the one a tombstone deletes (a retry's filter, on the failure
        path only: a later committed delete supersedes an earlier row of its key as a later row does, and
        the other way round); None if an entry is bad."""
        assert self._metadata is not None
        try:
            return row_keys(rows, self._metadata.key_columns)
        except (ValueError, TypeError, OverflowError, KeyError, UnicodeError):
            return None

    def _release(self, partition: int, lane: _Lane) -> None:
        """Send what the partition's sequencer lets go now, in its order: the one place a first send of a
        Produce leaves (synchronously, so nothing can come between two of them). A retry is handed to the
        write it belongs to, which sends it after its backoff: it holds the partition meanwhile."""
        while grants := lane.sequencer.take():
            for grant in grants:
                pending = lane.pending.get(grant.seq)
                if pending is None or pending.ready.done():  # its write gave up meanwhile
                    lane.sequencer.dropped(grant.seq)
                    continue
                attempt = None if grant.retry else self._dispatch(partition, grant.rows, pending.end)
                pending.ready.set_result((grant, attempt))

    def _dispatch(self, partition: int, rows: Sequence[bytes], end: float) -> _Attempt:
        """One Produce of `rows` to the partition's active as the writer knows it, on its way."""
        try:
            part = self._partition(partition)
        except WriteError as error:
            return _Attempt(None, None, error=error)
        if part.active is None:
            return _Attempt(part, None, "no active (every in-sync replica is down)")
        timeout_s = max(0.1, min(self._request_timeout_s, end - time.monotonic()))
        request = ProduceRequest(self.table, partition, part.leader_epoch, tuple(rows), int(timeout_s * 1000))
        return _Attempt(part, self._produce_via(part.active, request, timeout_s + 1.0))

    async def _write_partition(self, partition: int, pending: list[_Pending]) -> tuple[int, int, int]:
        """(requests, retries, the partition's position after the last row: its end offset)."""
        lane = self._lanes[partition]
        if len(pending) == 1:
            return await self._settle(partition, lane, pending[0])
        results = await asyncio.gather(*(self._settle(partition, lane, one) for one in pending))
        return sum(r[0] for r in results), sum(r[1] for r in results), max(r[2] for r in results)

    async def _settle(self, partition: int, lane: _Lane, pending: _Pending) -> tuple[int, int, int]:
        """Follow one Produce until it committed (requests, retries, position) or raise WriteError; a failure
        is resent when the partition's sequencer says so (client/sequencer.py)."""
        requests = retries = 0
        backoff = RETRY_BACKOFF_MIN_S
        at_once = False
        problem = "it waited behind earlier writes of the partition"
        failed_at: PartitionMetadata | None = None
        commits_seen = 0
        try:
            while True:
                grant, attempt = await self._granted(partition, pending, problem)
                if grant.superseded:  # every row was committed since by a later write
                    self.stats.rows_superseded += pending.rows
                    return requests, retries, lane.sequencer.position
                if attempt is None:  # a retry: the partition waits for it alone
                    self.stats.rows_superseded += pending.rows - len(grant.rows)
                    pending.rows = len(grant.rows)
                    # A Produce of the partition committed since this one failed: the partition takes
                    # writes again, so no backoff (the retries behind a failure go one after another).
                    if not at_once and failed_at is not None and lane.commits == commits_seen:
                        await self._wait_for_move(partition, failed_at, _jittered(backoff), pending.end)
                        backoff = min(backoff * 2, RETRY_BACKOFF_MAX_S)
                    attempt = pending.attempt = self._dispatch(partition, grant.rows, pending.end)
                else:
                    pending.attempt = attempt
                reply, problem, moved, at_once = await self._outcome(partition, attempt)
                requests += 1
                self.stats.produce_requests += 1
                if reply is not None and reply.error is ReplicaError.NONE:
                    lane.commits += 1
                    # Progress: every Produce of the partition still waiting (behind this one, or in
                    # flight beside it) gets its whole window again, so the deadline bounds a stall,
                    # not the length of a write that keeps being acknowledged.
                    now = time.monotonic()
                    for waiting in lane.pending.values():
                        waiting.end = max(waiting.end, now + waiting.window_s)
                    # A write made before the table was created again, answered after: its end offset is
                    # not of the log the lane's position now follows.
                    current = pending.table_id == lane.table_id
                    lane.sequencer.committed(grant.seq, reply.end_offset if current else 0)
                    self._release(partition, lane)
                    return requests, retries, reply.end_offset
                assert attempt.part is not None
                self.stats.produce_failures += 1
                if reply is not None:
                    if reply.error is ReplicaError.UNKNOWN_TABLE:
                        # The active's image may not hold a table created a moment ago, which the metadata
                        # this writer got from another server does. A table gone from every image fails
                        # this refresh (WriteError); one that exists is written again after the backoff.
                        await self.metadata(refresh=True)
                    elif reply.error not in RETRIABLE:
                        raise WriteError(reply.error, f"{self.table}/{partition}: {reply.message}")
                    problem = f"{reply.error.name}: {reply.message}"
                    moved = self._take_hint(partition, attempt.part, reply)
                if time.monotonic() >= pending.end:
                    raise self._stalled(partition, pending, problem)
                retries += 1
                if moved:
                    self.stats.retried_on_move += 1
                at_once = at_once or moved
                failed_at = attempt.part
                commits_seen = lane.commits
                # Resent when the sequencer says: once nothing of the partition is in flight, after every
                # earlier failure, without the rows a later write committed meanwhile.
                pending.ready = asyncio.get_running_loop().create_future()
                lane.sequencer.failed(grant.seq)
                self._release(partition, lane)
        finally:
            del lane.pending[pending.seq]
            if lane.sequencer.state(pending.seq) != "settled":
                lane.sequencer.dropped(pending.seq)  # given up: never resent, filters nothing
                self._release(partition, lane)
            if pending.attempt is not None and pending.attempt.answer is not None:
                pending.attempt.answer.cancel()  # a no-op once answered

    async def _granted(
        self, partition: int, pending: _Pending, problem: str
    ) -> tuple[Grant, _Attempt | None]:
        """What the sequencer handed `pending` (a send on its way, or a retry to send), once it did."""
        ready = pending.ready
        # asyncio.wait, not a timeout around `await ready`: the end moves later whenever the partition
        # commits a Produce, and a wait that ran out must not cancel the future (it waits again).
        while not ready.done():
            remaining = pending.end - time.monotonic()
            if remaining <= 0:
                ready.cancel()  # _release skips it (and finally drops it from the sequencer)
                raise self._stalled(partition, pending, problem)
            await asyncio.wait((ready,), timeout=remaining)
        return ready.result()

    def _stalled(self, partition: int, pending: _Pending, problem: str) -> WriteError:
        """The TIMEOUT of a partition that made no progress (no Produce of it committed) for the window."""
        server = ""
        part = pending.attempt.part if pending.attempt is not None else None
        if part is None and self._metadata is not None and 0 <= partition < len(self._metadata.partitions):
            part = self._metadata.partitions[partition]
        if part is not None and part.active is not None:
            server = f" (active: server {part.active})"
        return WriteError(
            ReplicaError.TIMEOUT,
            f"{self.table}/{partition}{server}: no write of the partition acknowledged for "
            f"{pending.window_s:g} s: {problem} (the write deadline bounds a time without progress: "
            "raise it, deadline_s or the Spark option writeTimeoutMs, if the servers are this slow)",
        )

    async def _outcome(
        self, partition: int, attempt: _Attempt
    ) -> tuple[ProduceResponse | None, str, bool, bool]:
        """(the answer, or the problem; whether the partition is known to have moved; whether to resend
        without a backoff) of one send."""
        if attempt.error is not None:
            raise attempt.error
        if attempt.answer is None:
            return None, attempt.problem, False, False
        assert attempt.part is not None
        try:
            answer = await self._answer_watching(partition, attempt.part, attempt.answer)
        except RpcError as error:
            return None, f"server {attempt.part.active}: {error}", False, isinstance(error, _Resend)
        if answer is None:
            return None, "the partition moved to another active while waiting", True, True
        return answer, "", False, False

    def _take_hint(self, partition: int, sent_to: PartitionMetadata, reply: ProduceResponse) -> bool:
        """Use the active a NOT_LEADER / FENCED_EPOCH answer names, if it is newer than what the writer
        knows and its address is known. True if the partition now has another active or epoch."""
        if reply.error not in (ReplicaError.NOT_LEADER, ReplicaError.FENCED_EPOCH) or reply.active is None:
            return self._moved(partition, sent_to)
        known = self._partition(partition)
        if reply.leader_epoch > known.leader_epoch and reply.active in self._addresses:
            self._hints[partition] = replace(known, active=reply.active, leader_epoch=reply.leader_epoch)
            self.stats.hints_used += 1
        return self._moved(partition, sent_to)

    async def _wait_for_move(
        self, partition: int, failed: PartitionMetadata, backoff_s: float, end: float
    ) -> None:
        """Wait until the metadata shows the partition with another active or epoch than `failed` (a watch
        answered), or `backoff_s` passed: the failure may have been passing (a dropped connection to a
        server that is fine), and nothing else would retry it."""
        until = min(end, time.monotonic() + backoff_s)
        while not self._moved(partition, failed):
            remaining = until - time.monotonic()
            if remaining <= 0:
                return
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)
        self.stats.retried_on_move += 1

    async def _answer_watching(
        self, partition: int, part: PartitionMetadata, sent: asyncio.Future[ProduceResponse]
    ) -> ProduceResponse | None:
        """The answer to a Produce sent to `part`'s active, or None as soon as a metadata watch shows the
        partition has another active or epoch: a server that stopped answering (killed, paused,
        partitioned away) must not hold the write for the whole timeout when the controller has moved on."""
        try:
            while True:
                if self._moved(partition, part):
                    self.stats.moved_while_waiting += 1
                    return None
                changed = asyncio.ensure_future(self._changed.wait())
                waiting: set[asyncio.Future[Any]] = {sent, changed}
                try:
                    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                if sent.done():
                    return sent.result()
        finally:
            if not sent.done():
                sent.cancel()

    # ------------------------------------------------------------------ one message per server
    def _produce_via(
        self, node: int, request: ProduceRequest, timeout_s: float
    ) -> asyncio.Future[ProduceResponse]:
        """The answer to `request`, sent to `node`. Every partition's Produce for the same server asked
        for in this event-loop turn (upsert starts every partition at once) leaves in one message."""
        loop = asyncio.get_running_loop()
        queued = self._outgoing.get(node)
        if queued is None:
            queued = self._outgoing[node] = []
            loop.call_soon(self._flush_produces, node)
        answer: asyncio.Future[ProduceResponse] = loop.create_future()
        queued.append(_Outgoing(request, timeout_s, answer))
        return answer

    def _flush_produces(self, node: int) -> None:
        queued = [o for o in self._outgoing.pop(node, ()) if not o.answer.done()]
        groups: list[list[_Outgoing]] = []
        size = MAX_REQUEST_BYTES
        for outgoing in queued:
            rows = sum(map(len, outgoing.request.rows))
            if node in self._single_only or size + rows > MAX_REQUEST_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(outgoing)
            size += rows
        waiting = self._connecting.get(node)
        if waiting is None and not self._pool.is_connected(node):
            waiting = self._connecting[node] = []
            self._track(self._send_once_connected(node))
        if waiting is not None:
            waiting.extend(groups)
            return
        for group in groups:
            # Connected: each request is written in its task's first step, so they leave in this order.
            self._track(self._send_produces(node, group))

    def _track(self, sending: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(sending)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send_once_connected(self, node: int) -> None:
        """Send the Produces asked of a server not connected yet once it is, all in the order they were
        asked for (a partition's Produces must reach its active in order): a request left to wait for the
        connection itself could be overtaken by one made while it resumes. Every Produce fails as a
        request would if the connection cannot be had."""
        failure: BaseException | None = None
        try:
            await self._pool.connection(node).ensure_channel(self._request_timeout_s)
        except asyncio.CancelledError as error:
            failure = error
            raise
        except RpcError as error:
            failure = error
        finally:
            for group in self._connecting.pop(node, []):
                if failure is not None:
                    _fail_all(group, failure)
                elif live := [o for o in group if not o.answer.done()]:  # not abandoned meanwhile
                    self._track(self._send_produces(node, live))

    async def _send_produces(self, node: int, group: list[_Outgoing]) -> None:
        """One message to `node` for `group`: a ProduceRequest for one partition, a
        ProducePartitionsRequest for several; each answer (or the failure) goes to its partition."""
        timeout_s = max(o.timeout_s for o in group)
        self.stats.produce_messages += 1
        try:
            if len(group) == 1:
                reply = await self._pool.request(node, group[0].request, timeout_s)
                assert isinstance(reply, ProduceResponse)
                answers: tuple[ProduceResponse, ...] = (reply,)
            else:
                request = ProducePartitionsRequest(
                    self.table,
                    tuple(
                        PartitionRows(o.request.partition, o.request.leader_epoch, o.request.rows)
                        for o in group
                    ),
                    max(o.request.timeout_ms for o in group),
                )
                reply = await self._pool.request(node, request, timeout_s)
                assert isinstance(reply, ProducePartitionsResponse)
                answers = reply.answers
                if len(answers) != len(group):
                    raise RpcError(f"server {node} answered {len(answers)} parts of {len(group)}")
        except RemoteError as error:
            if len(group) > 1 and error.code == ERROR_BAD_MESSAGE:
                # A server of an older version: one Produce per partition from now on.
                log.info("server %d does not take multi-partition Produce requests: %s", node, error)
                self._single_only.add(node)
                # Not written: sent again one partition at a time, each through its partition's order (a
                # later Produce of the same partition may have gone out already).
                _fail_all(group, _Resend(f"server {node} takes one partition per Produce: sent again"))
                return
            _fail_all(group, error)
            return
        except asyncio.CancelledError as error:
            _fail_all(group, error)
            raise
        except Exception as error:  # RpcError, or an answer of the wrong type: the callers raise it
            _fail_all(group, error)
            return
        for outgoing, answer in zip(group, answers, strict=True):
            if not outgoing.answer.done():
                outgoing.answer.set_result(answer)

    async def upsert_encoded(
        self, by_partition: Mapping[int, Sequence[bytes]], *, deadline_s: float = 60.0
    ) -> WriteResult:
        """Write rows encoded already (`protocol.rows` maps) and grouped by partition (`keys.partition_for`
        of each row's encoded key over the partition count of `metadata()`): what `upsert` does once it has
        encoded, for callers that encode in bulk (the Spark sink, from Arrow batches). An entry may be a
        tombstone instead (`protocol.rows.encode_tombstone` of an encoded key): a delete, in its place. The
        actives check every entry's key and partition as for `upsert`: one in the wrong partition fails with
        INVALID_ROW. A partition outside the table or a row over the size limit fails before anything is
        sent. Ordered and pipelined with the writer's other calls as `upsert` is."""
        end = time.monotonic() + deadline_s
        meta = await self.metadata(deadline_s=deadline_s)
        max_row = self._max_row_bytes(meta)
        for partition, rows in by_partition.items():
            if not 0 <= partition < len(meta.partitions):
                raise WriteError(ReplicaError.INVALID_REQUEST, f"{self.table} has no partition {partition}")
            largest = max(map(len, rows), default=0)
            if largest > max_row:
                raise WriteError(
                    ReplicaError.TOO_LARGE,
                    f"{self.table}/{partition}: a row of {largest:,} bytes encoded, the limit is {max_row:,} "
                    "(the servers' produce.max.bytes: one Produce carries at most that many row bytes)",
                )
        self._start_watching()
        queued = self._enqueue(by_partition, meta.table_id, end, deadline_s, min(MAX_REQUEST_BYTES, max_row))
        results = await asyncio.gather(*(self._write_partition(p, pending) for p, pending in queued))
        written = sum(len(rows) for rows in by_partition.values())
        return self._result(written, meta, [p for p, rows in sorted(by_partition.items()) if rows], results)

    async def partition_keys(
        self, partition: int, *, at_least: int = 0, deadline_s: float = 60.0
    ) -> list[bytes]:
        """Every encoded key the partition holds, in key order, read from its active's store once that
        store is at `at_least` or past it (a position from a `WriteResult` token: everything written up to
        there is in it), in pages of `KEY_PAGE` rows. For a sink that must delete what a complete result no
        longer holds (`spark.sink.delete_absent`): a full read of the partition. Retries as writes do
        (another active, a store still behind) until `deadline_s`."""
        end = time.monotonic() + deadline_s
        meta = await self.metadata(deadline_s=deadline_s)
        if not 0 <= partition < len(meta.partitions):
            raise WriteError(ReplicaError.INVALID_REQUEST, f"{self.table} has no partition {partition}")
        keys: list[bytes] = []
        after: bytes | None = None
        problem = ""
        backoff = RETRY_BACKOFF_MIN_S
        while True:
            part = self._partition(partition)
            reply = None
            if part.active is None:
                problem = "no active (every in-sync replica is down)"
            else:
                request = ReadPartitionRequest(self.table, partition, after, KEY_PAGE)
                try:
                    reply = await self._pool.request(part.active, request, self._request_timeout_s)
                except RpcError as error:
                    problem = f"server {part.active}: {error}"
            if isinstance(reply, ReadPartitionResponse):
                if reply.error is ReplicaError.NONE and reply.position >= at_least:
                    keys.extend(key for key, _ in reply.items)
                    if len(reply.items) < KEY_PAGE:
                        return keys
                    after = reply.items[-1][0]
                    backoff = RETRY_BACKOFF_MIN_S
                    continue
                problem = reply.message or f"its store is at {reply.position}, not yet at {at_least}"
            if time.monotonic() >= end:
                raise WriteError(
                    ReplicaError.TIMEOUT, f"{self.table}/{partition} not read in time: {problem}"
                )
            await asyncio.sleep(_jittered(backoff))
            backoff = min(backoff * 2, RETRY_BACKOFF_MAX_S)
            with contextlib.suppress(WriteError):
                await self.metadata(refresh=True, deadline_s=max(0.1, end - time.monotonic()))

    def _result(
        self,
        rows: int,
        meta: TableMetadataResponse,
        partitions: Iterable[int],
        results: Sequence[tuple[int, int, int]],
    ) -> WriteResult:
        positions = {(meta.table_id, p): r[2] for p, r in zip(sorted(partitions), results, strict=True)}
        return WriteResult(
            rows,
            sum(r[0] for r in results),
            sum(r[1] for r in results),
            encode_token(positions, self._tag),
        )


# What names a row to delete (see `Delete`).
Key = Mapping[str, object] | tuple[object, ...] | list[object] | KeyValue


@dataclass(frozen=True, slots=True)
class Delete:
    """A delete among the rows of `TableWriter.write`: the row of `key` goes. `key`: a tuple (or list) of
    the key columns' values in key order, a mapping holding the key columns (others ignored), or the value
    alone for a table with one key column."""

    key: Key


def delete_key(key: Key, key_columns: Sequence[KeyColumn]) -> tuple[KeyValue, ...]:
    """The checked key tuple of a `Delete`'s key (InvalidKeyError naming the column when it does not fit)."""
    if isinstance(key, Mapping):
        return key_from_row(key, key_columns)
    if isinstance(key, tuple | list):
        return coerce_key(key, key_columns)
    if len(key_columns) != 1:
        names = ", ".join(column.name for column in key_columns)
        raise InvalidKeyError("", key, f"of a table keyed by ({names}) must be a tuple or a mapping")
    return coerce_key((key,), key_columns)


class _Resend(RpcError):
    """A Produce the server did not take as sent (nothing written): to be sent again without a backoff."""


@dataclass(slots=True)
class _Attempt:
    """One send of a Produce: where it went and its answer to come, or why nothing went."""

    part: PartitionMetadata | None
    answer: asyncio.Future[ProduceResponse] | None
    problem: str = ""
    error: WriteError | None = None


@dataclass(slots=True)
class _Pending:
    """One Produce of a write, from its adding to its partition's sequencer until it settles. `ready`: what
    the sequencer grants it next (a send under way, or a retry to send)."""

    seq: int
    rows: int
    end: float  # moved later by each commit of the partition (progress): see _settle
    window_s: float  # the write's deadline_s: how long it may wait without progress
    ready: asyncio.Future[tuple[Grant, _Attempt | None]]
    table_id: int  # the table's incarnation when the write was made
    attempt: _Attempt | None = None


@dataclass(slots=True)
class _Lane:
    sequencer: PartitionSequencer
    table_id: int  # of the table's incarnation its position belongs to
    pending: dict[int, _Pending] = field(default_factory=dict)
    commits: int = 0  # Produces of the partition committed, over the writer's life


@dataclass(frozen=True, slots=True)
class _Outgoing:
    request: ProduceRequest
    timeout_s: float
    answer: asyncio.Future[ProduceResponse]


def _fail_all(group: list[_Outgoing], error: BaseException) -> None:
    for outgoing in group:
        if not outgoing.answer.done():
            if isinstance(error, asyncio.CancelledError):
                outgoing.answer.cancel()
            else:
                outgoing.answer.set_exception(error)


def _encode_in_bulk(
    rows: Sequence[Mapping[str, object]], meta: TableMetadataResponse, max_row: int
) -> dict[int, list[bytes]] | None:
    """The rows encoded and grouped by partition, a pass at a time (keys.encode_keys: about half the cost
    of taking each row on its own); None when any row needs a closer look (a bad row, one too large, a key
    shape without a bulk encoder): `_encode_one_by_one` then gives the same groups or names the row."""
    keys = encode_keys(rows, meta.key_columns)
    if keys is None:
        return None
    try:
        encoded = [encode_row(row) for row in rows]
    except ValueError:
        return None
    if max(map(len, encoded), default=0) > max_row:
        return None
    groups: list[list[bytes]] = [[] for _ in meta.partitions]
    for partition, row in zip(
        partitions_of(keys, len(groups), window_suffix(meta.key_columns)), encoded, strict=True
    ):
        groups[partition].append(row)
    return {partition: group for partition, group in enumerate(groups) if group}


def _jittered(seconds: float) -> float:
    return seconds * (0.5 + random.random())


def _chunks(rows: Sequence[bytes], max_bytes: int) -> list[tuple[bytes, ...]]:
    """`rows` in order, in runs of at most `max_bytes` (a longer row alone). Tuples: what a ProduceRequest
    carries (no copy there), and a snapshot the sequencer may read after the call returned (a later write
    committed them), whatever the caller does with its list."""
    if sum(map(len, rows)) <= max_bytes:  # the common case, without a Python step per row
        return [tuple(rows)]
    out: list[tuple[bytes, ...]] = []
    chunk: list[bytes] = []
    size = 0
    for row in rows:
        if chunk and size + len(row) > max_bytes:
            out.append(tuple(chunk))
            chunk, size = [], 0
        chunk.append(row)
        size += len(row)
    out.append(tuple(chunk))
    return out
