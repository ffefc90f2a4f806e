"""Writing upserts to a table: what the Spark sink does on each executor, usable on its own.

Rows are encoded once (replica.rows), keyed and partitioned with the one shared function (replica.keys),
grouped by partition and sent as Produce requests to each partition's active, in order per partition.
NOT_LEADER, FENCED_EPOCH, an unreachable server and the other retriable answers refresh the table's
metadata and retry with backoff until the deadline: rows are full upserts, so sending one twice is
harmless. A bad row fails the whole call before anything is sent.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hotstate.replica.keys import encode_key, key_from_row, partition_for
from hotstate.replica.messages import (
    RETRIABLE,
    ProduceRequest,
    ProduceResponse,
    ReplicaError,
    TableMetadataRequest,
    TableMetadataResponse,
)
from hotstate.replica.rows import encode_row
from hotstate.rpc import PeerPool, RpcError
from hotstate.server.wire import MESSAGES

CLIENT_NODE_ID = 0
MAX_REQUEST_BYTES = 4 * 1024 * 1024
# How long a table unknown to every server is waited for (a create that has not reached the images yet).
UNKNOWN_TABLE_WAIT_S = 3.0
# While a Produce is unanswered, the table's metadata is checked this often for a new active.
METADATA_WATCH_S = 1.0


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
    ) -> None:
        if not servers:
            raise ValueError("no servers to talk to")
        self.table = table
        # The writer's rack (spark.hotstate.rack / HOTSTATE_RACK). The controller learns it once per job,
        # from the driver (spark.table.ensure_table: CreateTable / RegisterWriter), not from every writer:
        # executors open writers per task, and each report would be a metadata commit.
        self.rack = rack
        self._bootstrap = list(servers)
        self._cluster_id = cluster_id
        self._secret = secret
        # Node ids from the metadata; bootstrap addresses go under negative ids so they never collide.
        self._pool = PeerPool(CLIENT_NODE_ID, cluster_id, secret, MESSAGES, backoff_max=0.25)
        self._addresses: dict[int, tuple[str, int]] = {-(i + 1): a for i, a in enumerate(self._bootstrap)}
        self._pool.update(self._addresses)
        self._request_timeout_s = request_timeout_s
        self._metadata: TableMetadataResponse | None = None
        self._refreshing: asyncio.Task[TableMetadataResponse] | None = None
        self._last_error: Exception | None = None

    async def close(self) -> None:
        await self._pool.close()

    async def __aenter__(self) -> TableWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ metadata
    async def metadata(self, *, refresh: bool = False) -> TableMetadataResponse:
        if self._metadata is None or refresh:
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = asyncio.ensure_future(self._fetch_metadata())
            self._metadata = await asyncio.shield(self._refreshing)
        return self._metadata

    async def _fetch_metadata(self) -> TableMetadataResponse:
        end = time.monotonic() + UNKNOWN_TABLE_WAIT_S
        while True:
            unknown_at: list[int] = []
            reply = await self._metadata_round(unknown_at)
            if reply is not None:
                return reply
            if not unknown_at or time.monotonic() >= end:
                break
            await asyncio.sleep(0.1)
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
                last = WriteError(reply.error, reply.message)
                continue
            current = self._metadata
            if current is not None and current.metadata_offset > reply.metadata_offset:
                return current  # a server further behind than what we know already
            for server in reply.servers:
                self._addresses[server.node_id] = (server.host, server.port)
            self._pool.update(self._addresses)
            return reply
        self._last_error = last
        return None

    # ------------------------------------------------------------------ writes
    async def upsert(self, rows: Sequence[Mapping[str, object]], *, deadline_s: float = 60.0) -> WriteResult:
        """Write `rows`; returns once every partition has committed its rows (acks=all)."""
        meta = await self.metadata()
        by_partition: dict[int, list[bytes]] = {}
        for index, row in enumerate(rows):
            try:
                key = encode_key(key_from_row(row, meta.key_columns))
                encoded = encode_row(row)
            except ValueError as error:
                raise WriteError(ReplicaError.INVALID_ROW, f"row {index} of {self.table}: {error}") from error
            by_partition.setdefault(partition_for(key, len(meta.partitions)), []).append(encoded)
        end = time.monotonic() + deadline_s
        results = await asyncio.gather(
            *(self._write_partition(p, encoded, end) for p, encoded in sorted(by_partition.items()))
        )
        return WriteResult(len(rows), sum(r[0] for r in results), sum(r[1] for r in results))

    async def _write_partition(self, partition: int, rows: list[bytes], end: float) -> tuple[int, int]:
        requests = retries = 0
        for chunk in _chunks(rows, MAX_REQUEST_BYTES):
            backoff = 0.02
            while True:
                meta = await self.metadata()
                part = meta.partitions[partition]
                reply: ProduceResponse | None = None
                problem = ""
                if part.active is None:
                    problem = "no active (every in-sync replica is down)"
                else:
                    timeout_s = max(0.1, min(self._request_timeout_s, end - time.monotonic()))
                    request = ProduceRequest(
                        self.table, partition, part.leader_epoch, tuple(chunk), int(timeout_s * 1000)
                    )
                    try:
                        answer = await self._send_watching(partition, part.active, part.leader_epoch, request)
                    except RpcError as error:
                        problem = f"server {part.active}: {error}"
                    else:
                        if answer is None:
                            problem = "the partition moved to another active while waiting"
                        else:
                            reply = answer
                requests += 1
                if reply is not None and reply.error is ReplicaError.NONE:
                    break
                if reply is not None:
                    if reply.error not in RETRIABLE:
                        raise WriteError(reply.error, f"{self.table}/{partition}: {reply.message}")
                    problem = f"{reply.error.name}: {reply.message}"
                if time.monotonic() >= end:
                    raise WriteError(
                        ReplicaError.TIMEOUT, f"{self.table}/{partition} not written in time: {problem}"
                    )
                retries += 1
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, 0.25)
                await self.metadata(refresh=True)
        return requests, retries

    async def _send_watching(
        self, partition: int, active: int, leader_epoch: int, request: ProduceRequest
    ) -> ProduceResponse | None:
        """Send a Produce and wait for its answer, but give up (None) once the metadata shows the partition
        has a new active: a server that stopped answering (paused, partitioned away) must not hold the
        write for the whole timeout when the controller has already moved on."""
        timeout_s = request.timeout_ms / 1000 + 1.0
        sent = asyncio.ensure_future(self._pool.request(active, request, timeout_s))
        try:
            while True:
                done, _ = await asyncio.wait({sent}, timeout=METADATA_WATCH_S)
                if done:
                    answer = sent.result()
                    assert isinstance(answer, ProduceResponse)
                    return answer
                try:
                    fresh = (await self.metadata(refresh=True)).partitions[partition]
                except WriteError:
                    continue
                if (fresh.active, fresh.leader_epoch) != (active, leader_epoch):
                    return None
        finally:
            if not sent.done():
                sent.cancel()


def _chunks(rows: list[bytes], max_bytes: int) -> list[list[bytes]]:
    out: list[list[bytes]] = [[]]
    size = 0
    for row in rows:
        if out[-1] and size + len(row) > max_bytes:
            out.append([])
            size = 0
        out[-1].append(row)
        size += len(row)
    return out
