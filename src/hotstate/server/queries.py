"""Pull queries on one server: parse, plan, route each partition to a replica, read or forward, merge.

The receiving server plans the query (hotstate.query), asks the router (hotstate.routing) for each
partition's candidates in order (active if alive, then standbys by lag, none over the bound), and tries
them in turn within the query's timeout: the local replica is read directly, a remote one is asked with a
`PartitionQueryRequest`, which that server answers from its own replica or refuses, never forwarding it
again. Whichever server serves a partition checks its own lag against the bound before answering, so a
replica without a lag report yet is judged where its data is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from hotstate.controller.image import MetadataImage, PartitionInfo, TableInfo
from hotstate.query.plan import FullScan, KeyLookup, KeyRange, QueryPlan, UnknownTableError, find_table, plan
from hotstate.query.sql import parse
from hotstate.replica.core import Role
from hotstate.replica.messages import (
    PartitionQueryRequest,
    PartitionQueryResponse,
    ReplicaError,
)
from hotstate.replica.rows import decode_row
from hotstate.routing.lags import LagTable
from hotstate.routing.router import NoReplicaError, Skip, route
from hotstate.rpc import NOT_SENT, RpcError, RpcTimeout
from hotstate.server.replicas import LocalReplica, ReplicaManager, replica_state

MAX_LAG_PROPERTIES = ("max_lag", "ksql.query.pull.max.allowed.offset.lag")
STANDBY_READS_PROPERTIES = ("standby_reads", "ksql.query.pull.enable.standby.reads")
DEFAULT_TIMEOUT_MS = 10_000
MAX_TIMEOUT_MS = 300_000
MAX_ROWS = 100_000  # the most rows one query returns; more needs a LIMIT and key ranges
# Heartbeats keep a connection open to every live peer, so one that is not connected is most likely dead:
# it gets this long to connect before the next candidate is tried.
UNCONNECTED_ATTEMPT_S = 0.3


class QueryError(Exception):
    """A query that cannot be answered. `kind` decides the HTTP status and the ksqlDB error code."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # bad_request | not_found | unavailable | timeout
        self.message = message


@dataclass(frozen=True, slots=True)
class PartitionServed:
    partition: int
    served_by: int
    state: str
    offset_lag: int
    position: int


@dataclass(slots=True)
class QueryResult:
    query_id: str
    table: TableInfo
    columns: list[str]
    rows: list[list[object]]
    partitions: list[PartitionServed] = field(default_factory=list)
    forwarded: int = 0
    took_ms: float = 0.0


@dataclass(slots=True)
class _PartitionAnswer:
    served: PartitionServed
    items: list[tuple[bytes, bytes]]


class QueryService:
    def __init__(
        self,
        node_id: int,
        *,
        image: Callable[[], MetadataImage],
        replicas: ReplicaManager | None,
        lags: LagTable,
        alive: Callable[[int], bool],
        request: Callable[[int, object, float], Awaitable[object]],
        connected: Callable[[int], bool] = lambda node: True,
        on_forward: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        self.node_id = node_id
        self._image = image
        self._replicas = replicas
        self._lags = lags
        self._alive = alive
        self._request = request
        self._connected = connected
        self._on_forward = on_forward

    # ------------------------------------------------------------------ the coordinator
    async def execute(self, sql: str, properties: Mapping[str, object] | None = None) -> QueryResult:
        started = time.monotonic()
        properties = properties or {}
        try:
            query = parse(sql)
        except ValueError as error:  # InvalidSqlError, UnsupportedQueryError: messages name the problem
            raise QueryError("bad_request", str(error)) from error
        image = self._image()
        try:
            table = find_table(image.tables, query.table)
        except UnknownTableError as error:
            raise QueryError("not_found", str(error)) from error
        try:
            query_plan = plan(query, table)
        except ValueError as error:
            raise QueryError("bad_request", str(error)) from error
        max_lag = _max_lag(properties, table)
        timeout_ms = _timeout_ms(properties)
        standby_reads = _flag(properties, STANDBY_READS_PROPERTIES, default=True)
        deadline = started + timeout_ms / 1000
        parts = image.partitions.get(table.table_id, ())
        work = _partition_work(query_plan, table)
        answers = await asyncio.gather(
            *(
                self._serve_partition(table, parts[p], spec, max_lag, deadline, standby_reads)
                for p, spec in work.items()
            ),
            return_exceptions=True,
        )
        problems = [a for a in answers if isinstance(a, BaseException)]
        if problems:
            first = problems[0]
            if isinstance(first, QueryError):
                raise first
            if isinstance(first, NoReplicaError):
                raise QueryError("unavailable", str(first)) from first
            raise first
        done = [a for a in answers if isinstance(a, _PartitionAnswer)]
        columns, rows = _rows(query_plan, table, done)
        result = QueryResult(
            uuid.uuid4().hex[:16],
            table,
            columns,
            rows,
            sorted((a.served for a in done), key=lambda s: s.partition),
            sum(1 for a in done if a.served.served_by != self.node_id),
            (time.monotonic() - started) * 1000,
        )
        return result

    async def _serve_partition(
        self,
        table: TableInfo,
        part: PartitionInfo,
        spec: PartitionQueryRequest,
        max_lag: int | None,
        deadline: float,
        standby_reads: bool,
    ) -> _PartitionAnswer:
        spec = dataclasses.replace(spec, max_lag=max_lag)
        decision = route(
            part,
            table=table.name,
            alive=self._alive,
            lags=self._lags,
            local_node=self.node_id,
            max_lag=max_lag,
        )
        skipped: list[Skip] = []
        for index, candidate in enumerate(decision.candidates):
            if not standby_reads and candidate.role != "active":
                skipped.append(candidate.skip("standby reads are off for this query"))
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                skipped.append(Skip(candidate.node_id, "query timed out before trying it"))
                continue
            if candidate.node_id == self.node_id:
                answer = self.serve_local(spec)
            else:
                # One slow or dead server must not eat the whole budget while others could answer.
                attempt = remaining if index == len(decision.candidates) - 1 else max(0.5, remaining / 2)
                if not self._connected(candidate.node_id):
                    attempt = min(attempt, UNCONNECTED_ATTEMPT_S)
                try:
                    reply = await self._request(candidate.node_id, spec, min(attempt, remaining))
                except NOT_SENT as error:
                    self._on_forward("unreachable")
                    skipped.append(Skip(candidate.node_id, f"unreachable ({type(error).__name__})"))
                    continue
                except RpcTimeout:
                    self._on_forward("timeout")
                    skipped.append(Skip(candidate.node_id, "timed out"))
                    continue
                except RpcError as error:
                    self._on_forward("error")
                    skipped.append(Skip(candidate.node_id, f"failed: {error}"))
                    continue
                assert isinstance(reply, PartitionQueryResponse)
                answer = reply
                self._on_forward("ok" if reply.error is ReplicaError.NONE else "refused")
            if answer.error is not ReplicaError.NONE:
                skipped.append(Skip(candidate.node_id, f"refused: {answer.message}"))
                continue
            served = PartitionServed(
                part.partition, candidate.node_id, answer.state, answer.offset_lag, answer.position
            )
            return _PartitionAnswer(served, list(answer.items))
        raise decision.error(skipped)

    # ------------------------------------------------------------------ the serving side
    def serve_local(self, request: PartitionQueryRequest) -> PartitionQueryResponse:
        """Answer one partition from this server's replica, or refuse; never forwards."""
        image = self._image()
        table = image.tables.get(request.table)
        if table is None:
            return PartitionQueryResponse(ReplicaError.UNKNOWN_TABLE, f"no table {request.table!r} here")
        replica = self._replicas.replicas.get((table.table_id, request.partition)) if self._replicas else None
        if replica is None:
            return PartitionQueryResponse(
                ReplicaError.UNKNOWN_PARTITION, f"server {self.node_id} holds no replica of it"
            )
        state, position, lag = self._local_lag(replica)
        if request.max_lag is not None and lag > request.max_lag:
            return PartitionQueryResponse(
                ReplicaError.LAG_OVER_BOUND, f"lag {lag} > bound {request.max_lag}", state, position, lag
            )
        store = replica.store
        if request.scan:
            limit = MAX_ROWS + 1 if request.limit is None else min(request.limit, MAX_ROWS + 1)
            items = tuple(store.scan(request.start, request.end, limit=limit))
        else:
            values = store.get_many(list(request.keys))
            items = tuple((k, v) for k, v in zip(request.keys, values, strict=True) if v is not None)
        return PartitionQueryResponse(ReplicaError.NONE, "", state, position, lag, items)

    def _local_lag(self, replica: LocalReplica) -> tuple[str, int, int]:
        core = replica.core
        reported_end = self._lags.partition_end(replica.table.table_id, replica.partition)
        lag = local_lag(
            leader=core.role is Role.LEADER,
            position=core.position,
            high_watermark=core.high_watermark,
            epoch_start=core.epoch_start_offset,
            known_end=max(core.known_end_offset, reported_end),
        )
        return replica_state(replica), core.position, lag


def local_lag(*, leader: bool, position: int, high_watermark: int, epoch_start: int, known_end: int) -> int:
    """How far a local replica's store is behind, for the query's staleness bound.

    The active's log end includes records appended but not yet committed, which no replica can serve: its
    store is behind only by what is committed and not yet applied (0 when running, more while restoring).
    Otherwise a write of more rows than the bound, while in flight, would make the freshest replica refuse.
    Until its high watermark reaches its epoch's start, though, a new active may hold records its
    predecessor acknowledged above that HW: then it is behind its log end, like a follower. A follower is
    behind the partition's end as far as anyone knows it (KIP-535)."""
    end = high_watermark if leader and high_watermark >= epoch_start else known_end
    return max(0, end - position)


def _max_lag(properties: Mapping[str, object], table: TableInfo) -> int | None:
    for key in MAX_LAG_PROPERTIES:
        if key in properties:
            value = properties[key]
            if value is None:
                return None
            try:
                number = int(str(value))
            except ValueError:
                raise QueryError("bad_request", f"{key}={value!r}: must be a non-negative integer") from None
            if number < 0:
                raise QueryError("bad_request", f"{key}={value!r}: must be a non-negative integer")
            return number
    return table.acceptable_lag


def _flag(properties: Mapping[str, object], names: tuple[str, ...], *, default: bool) -> bool:
    for name in names:
        if name in properties:
            value = properties[name]
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise QueryError("bad_request", f"{name}={value!r}: must be true or false")
    return default


def _timeout_ms(properties: Mapping[str, object]) -> int:
    value = properties.get("timeout_ms", DEFAULT_TIMEOUT_MS)
    try:
        number = int(str(value))
    except ValueError:
        raise QueryError("bad_request", f"timeout_ms={value!r}: must be a positive integer") from None
    if not 1 <= number <= MAX_TIMEOUT_MS:
        raise QueryError("bad_request", f"timeout_ms={value!r}: must be 1..{MAX_TIMEOUT_MS}")
    return number


def _partition_work(query_plan: QueryPlan, table: TableInfo) -> dict[int, PartitionQueryRequest]:
    access = query_plan.access
    out: dict[int, PartitionQueryRequest] = {}
    if isinstance(access, KeyLookup):
        by_partition: dict[int, list[bytes]] = {}
        for key, partition in zip(access.keys, access.partitions, strict=True):
            by_partition.setdefault(partition, []).append(key)
        for partition, keys in by_partition.items():
            out[partition] = PartitionQueryRequest(
                table.name, partition, tuple(keys), False, None, None, None, None
            )
        return out
    start, end = (access.start, access.end) if isinstance(access, KeyRange) else (None, None)
    assert isinstance(access, KeyRange | FullScan)
    for partition in range(table.partitions):
        out[partition] = PartitionQueryRequest(
            table.name, partition, (), True, start, end, query_plan.limit, None
        )
    return out


def _rows(
    query_plan: QueryPlan, table: TableInfo, answers: Iterable[_PartitionAnswer]
) -> tuple[list[str], list[list[object]]]:
    """Merge the partitions' rows in key order, apply the LIMIT, and project the columns."""
    ordered = heapq.merge(*(a.items for a in answers), key=lambda item: item[0])
    limit = query_plan.limit if query_plan.limit is not None else MAX_ROWS + 1
    items = list(itertools.islice(ordered, limit))
    if query_plan.limit is None and len(items) > MAX_ROWS:
        raise QueryError("bad_request", f"more than {MAX_ROWS} rows: add a LIMIT or narrow the key range")
    decoded = [decode_row(row) for _, row in items]
    key_names = [c.name for c in table.key_columns]
    if query_plan.columns is None:
        columns = list(key_names)
        for row in decoded:
            for name in row:
                if name not in columns:
                    columns.append(name)
    else:
        columns = list(query_plan.columns)
    lookup = [_column_resolver(name) for name in columns]
    rows = [[resolve(row) for resolve in lookup] for row in decoded]
    if query_plan.columns is not None and decoded:
        for name in columns:
            if all(_missing(row, name) for row in decoded):
                raise QueryError("bad_request", f"column {name!r} is not in table {table.name!r}")
    return columns, rows


def _column_resolver(name: str) -> Callable[[dict[str, object]], object]:
    lowered = name.lower()

    def resolve(row: dict[str, object]) -> object:
        if name in row:
            return row[name]
        for key, value in row.items():
            if key.lower() == lowered:
                return value
        return None

    return resolve


def _missing(row: dict[str, object], name: str) -> bool:
    lowered = name.lower()
    return not any(key.lower() == lowered for key in row)
