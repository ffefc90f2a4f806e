"""Pull queries on one server: parse, plan, route each partition to a replica, read or forward, merge.

The receiving server plans the query (hotstate.query), asks the router (hotstate.routing) for each
partition's candidates in order (active if alive, then standbys by lag, none over the bound, and replicas
of servers down by heartbeats last), and tries them in turn within the query's timeout. The coordinator
works in rounds: each partition's next
candidate is read directly when it is local, and the partitions whose candidate is remote are sent, one
`QueryPartitionsRequest` per server per round, to be answered from that server's replicas or refused,
never forwarded again. A partition refused or unanswered goes to its next candidate in the next round.
Whichever server serves a partition checks its own lag against the bound before answering, so a replica
without a lag report yet is judged where its data is.

The common case (every partition local, or one server) takes no task, gather or lock: this runs once per
HTTP request, and its cost is most of a lookup's CPU.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextvars
import dataclasses
import itertools
import logging
import operator
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, KeysView, Mapping
from dataclasses import dataclass, field
from typing import Any

from hotstate.controller.image import MetadataImage, PartitionInfo, TableInfo
from hotstate.query.plan import FullScan, KeyLookup, KeyRange, QueryPlan, UnknownTableError, find_table, plan
from hotstate.query.sql import SLOW_PARSE_CHARS, PullQuery, parse, parse_fast
from hotstate.query.tokens import Positions, TokenError, cluster_tag, decode, encode, merge
from hotstate.replica.core import ReplicaRole
from hotstate.replica.messages import (
    PartitionQueryRequest,
    PartitionQueryResponse,
    QueryPartitionsRequest,
    QueryPartitionsResponse,
    ReplicaError,
)
from hotstate.replica.rows import decode_rows, may_hold_non_finite
from hotstate.replica.store import StoreError
from hotstate.routing.freshness import END_UNKNOWN, bound_refusal, served_lag
from hotstate.routing.freshness import local_lag as local_lag  # where it lived before routing.freshness
from hotstate.routing.hedging import HedgeConfig, HedgePolicy, last_if_slow
from hotstate.routing.lags import LagTable
from hotstate.routing.router import Candidate, NoReplicaError, Route, Skip, route
from hotstate.rpc import NOT_SENT, RpcError, RpcTimeout
from hotstate.rpc.schema import CodecError
from hotstate.server.replicas import LocalReplica, ReplicaManager, replica_state

MAX_LAG_PROPERTIES = ("max_lag", "ksql.query.pull.max.allowed.offset.lag")
STANDBY_READS_PROPERTIES = ("standby_reads", "ksql.query.pull.enable.standby.reads")
TIMEOUT_PROPERTY = "timeout_ms"
HEDGING_PROPERTIES = ("hedging",)
TOKEN_PROPERTY = "consistency_token"
MIN_BATCH_PROPERTY = "min_batch"
# Reading a table a piece at a time (the Spark data source): only these partitions, and only keys after
# the `cursor` of an earlier answer (one whose LIMIT cut it short).
PARTITIONS_PROPERTY = "partitions"
AFTER_PROPERTY = "after"
KNOWN_PROPERTIES = frozenset(
    (
        *MAX_LAG_PROPERTIES,
        *STANDBY_READS_PROPERTIES,
        TIMEOUT_PROPERTY,
        *HEDGING_PROPERTIES,
        TOKEN_PROPERTY,
        MIN_BATCH_PROPERTY,
        PARTITIONS_PROPERTY,
        AFTER_PROPERTY,
    )
)
# A partition whose replicas are all behind the query's token is asked again this often (they apply what
# the active commits within milliseconds) until the query's timeout.
BEHIND_RETRY_S = 0.01
# Push-query settings that ksqlDB's clients send with every statement; they mean nothing to a pull query.
IGNORED_PROPERTIES = frozenset(("auto.offset.reset", "ksql.streams.auto.offset.reset"))
DEFAULT_TIMEOUT_MS = 10_000
MAX_TIMEOUT_MS = 300_000
MAX_LAG_LIMIT = 2**63 - 1  # what every API and the wire can carry; larger means unbounded: pass null
MAX_ROWS = 100_000  # the most rows one query returns; more needs a LIMIT and key ranges
# Heartbeats keep a connection open to every live peer, so one that is not connected is most likely dead:
# it gets this long to connect before the next candidate is tried (and so does a server down by heartbeats
# while a live replica waits to catch up with the query's token).
UNCONNECTED_ATTEMPT_S = 0.3
NOT_TRIED_IN_TIME = "query timed out before trying it"
MAX_KEPT_ROUTES = 65_536  # partitions x max_lag values a server keeps routes for, between lag reports

log = logging.getLogger(__name__)
# Who the HTTP request being answered is (set by the auth guard, server/http_auth.py, in the request's
# task; "" with auth off): forwarded partition queries carry it for the serving server's log.
CURRENT_USER: contextvars.ContextVar[str] = contextvars.ContextVar("hotstate_user", default="")


class QueryError(Exception):
    """A query that cannot be answered. `kind` decides the HTTP status and the ksqlDB error code."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # bad_request | not_found | unavailable | timeout | not_ready
        self.message = message


@dataclass(slots=True)  # not frozen: made for every partition of every answer, and never changed
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
    # Some row may hold a NaN or an infinity, which JSON has no number for (the answer's encoder decides).
    non_finite: bool = False
    # Where this answer read, merged with the token the query was given (query/tokens.py), and the
    # cluster's tag: the token's string is built only when an answer carries it (ksqlDB's /query does not).
    token_positions: Positions = field(default_factory=dict)
    token_tag: bytes = b""
    # The last key returned when the LIMIT cut the answer short: the next page starts after it.
    last_key: bytes | None = None

    @property
    def cursor(self) -> str | None:
        """`last_key` as the `after` of the next page's query (opaque to clients), None: no more rows."""
        return None if self.last_key is None else base64.urlsafe_b64encode(self.last_key).decode()

    @property
    def consistency_token(self) -> str:
        return encode(self.token_positions, self.token_tag) if self.token_tag else ""


# What a local replica serves: (state, position, offset lag, items).
_LocalRead = tuple[str, int, int, tuple[tuple[bytes, bytes], ...]]


@dataclass(slots=True)
class _PartitionAnswer:
    served: PartitionServed
    items: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...]


@dataclass(slots=True)
class _Attempts:
    """One partition's way through its route: the candidate being tried and what went wrong so far."""

    part: PartitionInfo
    spec: PartitionQueryRequest
    route: Route
    index: int = -1
    skipped: list[Skip] = field(default_factory=list)
    behind: bool = False  # some replica refused as behind the query's token
    # The previous round's failures, when the query waits for a replica to reach its token: what the error
    # says if time runs out before this round tries anyone.
    earlier: list[Skip] = field(default_factory=list)
    ahead: str | None = None  # the active refused the token as beyond the partition's log end

    def next_candidate(self) -> Candidate | None:
        self.index += 1
        return self.route.candidates[self.index] if self.index < len(self.route.candidates) else None

    def refused(self, answer: PartitionQueryResponse) -> None:
        if answer.error is ReplicaError.BEHIND_TOKEN:
            self.behind = True
        elif answer.error is ReplicaError.TOKEN_AHEAD:
            self.ahead = answer.message
        self.skipped.append(self.candidate.skip(f"refused: {answer.message}"))

    @property
    def candidate(self) -> Candidate:
        return self.route.candidates[self.index]

    @property
    def on_last(self) -> bool:
        return self.index == len(self.route.candidates) - 1


async def _settled_within(future: asyncio.Future[Any], seconds: float) -> bool:
    """Whether `future` is done within `seconds` (it is left running either way): asyncio.wait's job for
    one future, without its sets and callbacks per call, on every forwarded query's path."""
    if future.done():
        return True
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    timer = asyncio.get_running_loop().call_later(seconds, wake)
    future.add_done_callback(wake)
    try:
        await waiter
    finally:
        timer.cancel()
        future.remove_done_callback(wake)
    return future.done()


class _WaitForApply(Exception):
    """Every replica of a partition is behind the query's token, and there is time to ask again."""


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
        request_soon: Callable[[int, object, float], asyncio.Future[object]] | None = None,
        on_forward: Callable[[str], None] = lambda outcome: None,
        not_ready: Callable[[], str | None] = lambda: None,
        hedging: HedgePolicy | None = None,
        cluster_id: str = "",
        alive_version: Callable[[], int] | None = None,
    ) -> None:
        """`not_ready`: why this server cannot answer yet (its metadata image has not caught up since it
        started, server.metadata), None once it can. `alive_version`: a number that changes whenever
        `alive` may answer differently (HeartbeatStatus.version); with it, routes are kept until it or the
        lag table changes, else every partition of every query is routed afresh."""
        self.node_id = node_id
        self._not_ready = not_ready
        self._image = image
        self._replicas = replicas
        self._lags = lags
        self._alive = alive
        # `request` as a future (PeerPool.request_soon): a forward waits on it without a task of its own.
        self._request_soon = request_soon or (
            lambda node, message, timeout: asyncio.ensure_future(request(node, message, timeout))
        )
        self._connected = connected
        self._on_forward = on_forward
        self.hedging = hedging if hedging is not None else HedgePolicy(HedgeConfig())
        self._tag = cluster_tag(cluster_id)
        # Hedged forwards left to run to their end (they keep their peer marked slow meanwhile).
        self._background: set[asyncio.Future[dict[int, _PartitionAnswer]]] = set()
        # Query ids: unique per server run without a uuid per query.
        self._id_prefix = f"{node_id}-{os.urandom(4).hex()}-"
        self._ids = itertools.count(1)
        self._alive_version = alive_version
        # (id of the image's PartitionInfo, max_lag) -> (that PartitionInfo, the table's name, its route),
        # valid while `_routes_made_at` is the current (alive version, lag table version): a route depends
        # on nothing else, and those change a few times a second, not per query.
        self._routes: dict[tuple[int, int | None], tuple[PartitionInfo, str, Route]] = {}
        self._routes_made_at = (-1, -1)

    # ------------------------------------------------------------------ the coordinator
    async def execute(self, sql: str, properties: Mapping[str, object] | None = None) -> QueryResult:
        started = self.start(sql, properties)
        return started if isinstance(started, QueryResult) else await started

    def start(
        self, sql: str, properties: Mapping[str, object] | None = None
    ) -> QueryResult | Coroutine[Any, Any, QueryResult]:
        """The answer, when this server gives it without waiting (every partition read here: most
        lookups), else a coroutine that finishes the query (forwards, a wait for a Spark batch, the full
        parser on a worker thread). What is wrong before any wait raises QueryError at once."""
        started = time.monotonic()
        reason = self._not_ready()
        if reason is not None:
            # Before anything else: a stale image would call a table that exists "not found".
            raise QueryError("not_ready", reason)
        if properties:
            check_properties(properties)
        try:
            query = parse_fast(sql)
        except ValueError as error:  # InvalidSqlError, UnsupportedQueryError: messages name the problem
            raise QueryError("bad_request", str(error)) from error
        if query is None:
            return self._parsed_later(sql, properties, started)
        return self._run(query, properties, started)

    async def _parsed_later(
        self, sql: str, properties: Mapping[str, object] | None, started: float
    ) -> QueryResult:
        outcome = self._run(await _parse(sql), properties, started)
        return outcome if isinstance(outcome, QueryResult) else await outcome

    def _run(
        self,
        query: PullQuery,
        properties: Mapping[str, object] | None,
        started: float,
        committed: TableInfo | None = None,
    ) -> QueryResult | Coroutine[Any, Any, QueryResult]:
        """`start` once the statement is parsed; `committed`: the table once its Spark batch the query
        asked for (min_batch) is committed."""
        image = self._image()
        if committed is not None:
            table = committed
        else:
            try:
                table = find_table(image.tables, query.table)
            except UnknownTableError as error:
                raise QueryError("not_found", str(error)) from error
        try:
            query_plan = plan(query, table)
        except ValueError as error:
            raise QueryError("bad_request", str(error)) from error
        if properties:
            max_lag = _max_lag(properties, table)
            deadline = started + _timeout_ms(properties) / 1000
            standby_reads = _flag(properties, STANDBY_READS_PROPERTIES, default=True)
            hedge = _flag(properties, HEDGING_PROPERTIES, default=True)
            min_batch = _min_batch(properties)
            if min_batch is not None and committed is None:
                return self._after_batch(query, properties, started, table, min_batch, deadline)
            given = self._token(properties, table)
            if min_batch is not None:
                batch = {(table.table_id, p): at for p, at in enumerate(table.batch_positions) if at}
                given = merge(given, batch)
            work = _partition_work(query_plan, table, max_lag, given)
            work = _page(work, _partitions(properties, table), _after(properties))
        else:  # every property at its default (most lookups): the same as above, without the look-ups
            deadline = started + DEFAULT_TIMEOUT_MS / 1000
            standby_reads = hedge = True
            given = {}
            work = _plain_work(query_plan, table, table.acceptable_lag)
        parts = image.partitions.get(table.table_id, ())
        here = self._serve_here(parts, work, deadline)
        if len(here) < len(work):
            return self._served_elsewhere(
                query_plan, table, parts, work, deadline, standby_reads, hedge, here, given, started
            )
        return self._result(
            query_plan, table, [here[partition] for partition in sorted(here)], given, started
        )

    async def _after_batch(
        self,
        query: PullQuery,
        properties: Mapping[str, object],
        started: float,
        table: TableInfo,
        batch_id: int,
        deadline: float,
    ) -> QueryResult:
        committed = await self._committed_batch(table, batch_id, deadline)
        outcome = self._run(query, properties, started, committed)
        return outcome if isinstance(outcome, QueryResult) else await outcome

    async def _served_elsewhere(
        self,
        query_plan: QueryPlan,
        table: TableInfo,
        parts: tuple[PartitionInfo, ...],
        work: dict[int, PartitionQueryRequest],
        deadline: float,
        standby_reads: bool,
        hedge: bool,
        here: dict[int, _PartitionAnswer],
        given: Positions,
        started: float,
    ) -> QueryResult:
        try:
            answers = await self._serve(table, parts, work, deadline, standby_reads, hedge, here)
        except NoReplicaError as error:
            raise QueryError("unavailable", str(error)) from error
        return self._result(query_plan, table, answers, given, started)

    def _result(
        self,
        query_plan: QueryPlan,
        table: TableInfo,
        answers: list[_PartitionAnswer],
        given: Positions,
        started: float,
    ) -> QueryResult:
        read = {(table.table_id, a.served.partition): a.served.position for a in answers}
        columns, rows, last_key = _rows(query_plan, table, answers)
        # One search over all rows: a mark spanning two rows is at worst a false alarm.
        non_finite = may_hold_non_finite(
            b"".join(map(_ROW, itertools.chain.from_iterable(a.items for a in answers)))
        )
        return QueryResult(
            f"{self._id_prefix}{next(self._ids)}",
            table,
            columns,
            rows,
            [a.served for a in answers],
            sum(1 for a in answers if a.served.served_by != self.node_id),
            (time.monotonic() - started) * 1000,
            non_finite,
            merge(given, read) if given else read,
            self._tag,
            last_key,
        )

    async def _committed_batch(self, table: TableInfo, batch_id: int, deadline: float) -> TableInfo:
        """`table` once its Spark sink has committed batch `batch_id` or a later one (server images learn
        of the commit a moment after the sink's driver does), else a 503 at the deadline."""
        while True:
            current = self._image().tables.get(table.name)
            if current is None or current.table_id != table.table_id:
                raise QueryError("not_found", f"table {table.name!r} was deleted while the query waited")
            if current.batch_id >= batch_id:
                return current
            if time.monotonic() + BEHIND_RETRY_S > deadline:
                last = "none" if current.batch_id < 0 else str(current.batch_id)
                raise QueryError(
                    "unavailable",
                    f"Spark batch {batch_id} of {table.name} is not committed yet (last committed: {last})",
                )
            await asyncio.sleep(BEHIND_RETRY_S)

    def _token(self, properties: Mapping[str, object], table: TableInfo) -> Positions:
        """The positions of the query's consistency token (all tables: the answer carries them on)."""
        value = properties.get(TOKEN_PROPERTY)
        if value is None:
            return {}
        if not isinstance(value, str):
            raise QueryError("bad_request", f"{TOKEN_PROPERTY}: must be a string")
        try:
            positions = decode(value, self._tag)
        except TokenError as error:
            raise QueryError("bad_request", f"{TOKEN_PROPERTY}: {error}") from None
        for table_id, partition in positions:
            if table_id == table.table_id and partition >= table.partitions:
                raise QueryError(
                    "bad_request",
                    f"{TOKEN_PROPERTY}: names partition {partition} of {table.name}, which has "
                    f"{table.partitions}: not a token of this table",
                )
        return positions

    def _serve_here(
        self, parts: tuple[PartitionInfo, ...], work: dict[int, PartitionQueryRequest], deadline: float
    ) -> dict[int, _PartitionAnswer]:
        """The answers of the partitions whose active is on this server and serves them: the router would
        put this server's active first whatever the lags say (a restoring one is held to the bound, which
        serve_local checks with its real lag), so these skip routing, and a query that needs no other
        server takes no task or coroutine of its own."""
        answers: dict[int, _PartitionAnswer] = {}
        node_id = self.node_id
        for partition, spec in work.items():
            if parts[partition].active == node_id and deadline > time.monotonic():
                read = self._read_local(spec)
                if not isinstance(read, PartitionQueryResponse):  # served, not refused
                    answers[partition] = _served(partition, node_id, *read)
        return answers

    async def _serve(
        self,
        table: TableInfo,
        parts: tuple[PartitionInfo, ...],
        work: dict[int, PartitionQueryRequest],
        deadline: float,
        standby_reads: bool,
        hedge: bool,
        answers: dict[int, _PartitionAnswer],
    ) -> list[_PartitionAnswer]:
        """Every partition's answer, in partition order, given those `_serve_here` found; raises
        NoReplicaError for the first partition (in partition order, within a round) that no candidate
        could serve."""
        pending = [
            self._route(table, parts[partition], spec, hedge)
            for partition, spec in work.items()
            if partition not in answers
        ]
        waiting: list[_Attempts] = []
        while pending or waiting:
            if not pending:
                # Every replica of these partitions is behind the query's token: they apply what the
                # active commits within milliseconds, so ask again (freshly routed) until the timeout.
                await asyncio.sleep(BEHIND_RETRY_S)
                pending = [self._route(table, a.part, a.spec, hedge, earlier=a.skipped) for a in waiting]
                waiting = []
            remote: dict[int, list[_Attempts]] = {}
            for attempts in pending:
                try:
                    answered = self._advance(attempts, deadline, standby_reads)
                except _WaitForApply:
                    waiting.append(attempts)
                    continue
                if answered is not None:
                    answers[attempts.part.partition] = answered
                else:
                    remote.setdefault(attempts.candidate.node_id, []).append(attempts)
            if remote:
                # Every server's forward runs at once: the first in this task, the others in their own
                # (cheaper than a gather, which would make a task of each).
                [(node_id, group), *others] = remote.items()
                tasks = [
                    asyncio.ensure_future(self._forward(n, g, deadline, standby_reads, hedge))
                    for n, g in others
                ]
                try:
                    answers.update(await self._forward(node_id, group, deadline, standby_reads, hedge))
                    for task in tasks:
                        answers.update(await task)
                except BaseException:
                    for task in tasks:
                        task.cancel()
                    raise
            pending = [a for group in remote.values() for a in group if a.part.partition not in answers]
            pending.sort(key=lambda a: a.part.partition)
        return [answers[partition] for partition in sorted(answers)]

    def _route(
        self,
        table: TableInfo,
        part: PartitionInfo,
        spec: PartitionQueryRequest,
        hedge: bool,
        earlier: list[Skip] | None = None,
    ) -> _Attempts:
        decision = self._routed(table.name, part, spec.max_lag)
        if hedge:
            decision = last_if_slow(decision, self._slow_now)
        return _Attempts(part, spec, decision, earlier=earlier or [])

    def _routed(self, table: str, part: PartitionInfo, max_lag: int | None) -> Route:
        if self._alive_version is None:
            return self._new_route(table, part, max_lag)
        made_at = (self._alive_version(), self._lags.version)
        if made_at != self._routes_made_at:
            self._routes.clear()
            self._routes_made_at = made_at
        key = (id(part), max_lag)
        kept = self._routes.get(key)
        if kept is not None and kept[0] is part and kept[1] == table:
            return kept[2]
        decision = self._new_route(table, part, max_lag)
        if len(self._routes) >= MAX_KEPT_ROUTES:
            self._routes.clear()
        self._routes[key] = (part, table, decision)
        return decision

    def _new_route(self, table: str, part: PartitionInfo, max_lag: int | None) -> Route:
        return route(
            part, table=table, alive=self._alive, lags=self._lags, local_node=self.node_id, max_lag=max_lag
        )

    def _slow_now(self, node_id: int) -> bool:
        return self.hedging.slow(node_id, time.monotonic() * 1000)

    def _advance(self, attempts: _Attempts, deadline: float, standby_reads: bool) -> _PartitionAnswer | None:
        """Moves to the partition's next candidate that can be tried: answers it here when it is local
        (None when it is remote, to be sent in this round); raises once no candidate is left."""
        while (candidate := attempts.next_candidate()) is not None:
            if not standby_reads and candidate.role != "active":
                attempts.skipped.append(candidate.passed("standby reads are off for this query"))
                continue
            if deadline - time.monotonic() <= 0:
                attempts.skipped.append(candidate.passed(NOT_TRIED_IN_TIME))
                continue
            if candidate.node_id != self.node_id:
                return None
            answer = self.serve_local(attempts.spec)
            if answer.error is ReplicaError.NONE:
                return _answered(attempts.part.partition, candidate.node_id, answer)
            attempts.refused(answer)
        if attempts.ahead is not None:
            part = attempts.part
            raise QueryError("bad_request", f"{TOKEN_PROPERTY}, partition {part.partition}: {attempts.ahead}")
        if attempts.behind and deadline - time.monotonic() > BEHIND_RETRY_S:
            raise _WaitForApply
        if attempts.earlier and all(skip.reason == NOT_TRIED_IN_TIME for skip in attempts.skipped):
            raise attempts.route.error(attempts.earlier)  # each replica's position against the token's
        raise attempts.route.error(attempts.skipped)

    async def _forward(
        self, node_id: int, group: list[_Attempts], deadline: float, standby_reads: bool, hedge: bool
    ) -> dict[int, _PartitionAnswer]:
        """`_ask`, hedged (routing/hedging.py): when `node_id` has not answered within its hedge delay, the
        partitions go to their next candidates as well, and each takes the first answer."""
        policy = self.hedging
        policy.forwarded()
        delay_ms = policy.delay_ms(node_id) if hedge else None
        if delay_ms is None or delay_ms / 1000 >= deadline - time.monotonic():
            return await self._ask(node_id, group, deadline)
        # Waited on with a timer, not in a task of its own: a task only once the hedge delay passes.
        sent, request_id = self._send_ask(node_id, group, deadline)
        try:
            settled = await _settled_within(sent, delay_ms / 1000)
        except asyncio.CancelledError:
            sent.cancel()
            self.hedging.done(node_id, request_id, time.monotonic() * 1000, answered=False)
            raise
        if settled:
            return self._asked(node_id, group, sent, request_id)
        first = asyncio.ensure_future(self._ask_rest(node_id, group, sent, request_id))
        local, remote = self._hedges(group, deadline, standby_reads)
        if not (local or remote) or not policy.take():
            return await first
        for _ in group:
            self._on_forward("hedged")
        return await self._race(first, local, remote, deadline, {a.part.partition for a in group})

    def _hedges(
        self, group: list[_Attempts], deadline: float, standby_reads: bool
    ) -> tuple[dict[int, _PartitionAnswer], dict[int, list[_Attempts]]]:
        """Each partition's next candidate after the one asked: answered here when local, else grouped by
        server. The copies share the originals' list of skipped replicas, so every refusal is reported."""
        local: dict[int, _PartitionAnswer] = {}
        remote: dict[int, list[_Attempts]] = {}
        for attempts in group:
            copy = _Attempts(attempts.part, attempts.spec, attempts.route, attempts.index, attempts.skipped)
            while (candidate := copy.next_candidate()) is not None:
                if not standby_reads and candidate.role != "active":
                    continue
                if candidate.node_id != self.node_id:
                    remote.setdefault(candidate.node_id, []).append(copy)
                    break
                answer = self.serve_local(copy.spec)
                if answer.error is ReplicaError.NONE:
                    local[copy.part.partition] = _answered(copy.part.partition, self.node_id, answer)
                    break
                copy.refused(answer)
        return local, remote

    async def _race(
        self,
        first: asyncio.Future[dict[int, _PartitionAnswer]],
        local: dict[int, _PartitionAnswer],
        remote: dict[int, list[_Attempts]],
        deadline: float,
        wanted: set[int],
    ) -> dict[int, _PartitionAnswer]:
        answers: dict[int, _PartitionAnswer] = {}
        hedge_won = dict(local)
        tasks: set[asyncio.Future[dict[int, _PartitionAnswer]]] = {first}
        tasks.update(asyncio.ensure_future(self._ask(n, g, deadline)) for n, g in remote.items())
        try:
            while tasks and not wanted <= answers.keys() | hedge_won.keys():
                done, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    for partition, answer in task.result().items():
                        if partition in answers or partition in hedge_won:
                            continue  # the slower copy: wasted work
                        (answers if task is first else hedge_won)[partition] = answer
        finally:
            for task in tasks:
                if task is first:
                    # Left to its own timeout: while it hangs, its peer counts as slow and later queries
                    # try the others first, without a hedge each.
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)
                else:
                    task.cancel()
        for _ in hedge_won:
            self._on_forward("hedge_won")
        return answers | hedge_won

    async def _ask(
        self, node_id: int, group: list[_Attempts], deadline: float
    ) -> dict[int, _PartitionAnswer]:
        """Asks `node_id` for every partition in `group` at once; what it could not serve stays pending,
        with the reason recorded."""
        sent, request_id = self._send_ask(node_id, group, deadline)
        return await self._ask_rest(node_id, group, sent, request_id)

    def _send_ask(
        self, node_id: int, group: list[_Attempts], deadline: float
    ) -> tuple[asyncio.Future[object], int]:
        """`_ask`'s request, sent: the future of its answer and its id for the hedging policy."""
        remaining = deadline - time.monotonic()
        # One slow or dead server must not eat the whole budget while others could answer. Nor may one that
        # looks down, even as a partition's last candidate: it may be paused, and while a live replica is
        # behind the query's token it is only a moment from serving (asked again once this one failed), so
        # such a server gets no longer than a connect. One that only flapped answers in milliseconds.
        down = any(a.candidate.down for a in group)
        attempt = remaining if any(a.on_last for a in group) and not down else max(0.5, remaining / 2)
        if not self._connected(node_id) or (down and any(a.behind for a in group)):
            attempt = min(attempt, UNCONNECTED_ATTEMPT_S)
        request = QueryPartitionsRequest(tuple(a.spec for a in group), CURRENT_USER.get())
        request_id = self.hedging.sent(node_id, time.monotonic() * 1000)
        return self._request_soon(node_id, request, min(attempt, remaining)), request_id

    async def _ask_rest(
        self, node_id: int, group: list[_Attempts], sent: asyncio.Future[object], request_id: int
    ) -> dict[int, _PartitionAnswer]:
        try:
            await sent
        except asyncio.CancelledError:
            self.hedging.done(node_id, request_id, time.monotonic() * 1000, answered=False)
            raise
        except Exception:  # _asked reads and reports it
            pass
        return self._asked(node_id, group, sent, request_id)

    def _asked(
        self, node_id: int, group: list[_Attempts], sent: asyncio.Future[object], request_id: int
    ) -> dict[int, _PartitionAnswer]:
        """The answers of `sent` (done), the refusals and failures recorded for each partition."""
        failure: tuple[str, str]
        answered = False
        try:
            reply = sent.result()
        except NOT_SENT as error:
            failure = ("unreachable", f"unreachable ({type(error).__name__})")
        except RpcTimeout:
            failure = ("timeout", "timed out")
        except (RpcError, CodecError) as error:
            failure = ("error", f"failed: {error}")
        else:
            if isinstance(reply, QueryPartitionsResponse) and len(reply.answers) == len(group):
                answered = True
            else:
                failure = ("error", f"failed: answered {type(reply).__name__} to {len(group)} partitions")
        finally:
            self.hedging.done(node_id, request_id, time.monotonic() * 1000, answered=answered)
        if answered:
            assert isinstance(reply, QueryPartitionsResponse)
            return self._answers(node_id, group, reply.answers)
        outcome, reason = failure
        for attempts in group:
            self._on_forward(outcome)
            attempts.skipped.append(attempts.candidate.skip(reason))
        return {}

    def _answers(
        self, node_id: int, group: list[_Attempts], replies: tuple[PartitionQueryResponse, ...]
    ) -> dict[int, _PartitionAnswer]:
        out: dict[int, _PartitionAnswer] = {}
        for attempts, answer in zip(group, replies, strict=True):
            if answer.error is ReplicaError.NONE:
                self._on_forward("ok")
                out[attempts.part.partition] = _answered(attempts.part.partition, node_id, answer)
            else:
                self._on_forward("refused")
                attempts.refused(answer)
        return out

    # ------------------------------------------------------------------ the serving side
    def serve_partitions(self, request: QueryPartitionsRequest) -> QueryPartitionsResponse:
        """Answer a coordinator's partitions from this server's replicas, each on its own."""
        if log.isEnabledFor(logging.DEBUG):
            parts = ", ".join(f"{p.table}/{p.partition}" for p in request.parts)
            log.debug("forwarded partition query for user %r: %s", request.user or "-", parts)
        return QueryPartitionsResponse(tuple(self.serve_local(part) for part in request.parts))

    def serve_local(self, request: PartitionQueryRequest) -> PartitionQueryResponse:
        """Answer one partition from this server's replica, or refuse; never forwards."""
        read = self._read_local(request)
        if isinstance(read, PartitionQueryResponse):
            return read
        state, position, offset_lag, items = read
        return PartitionQueryResponse(ReplicaError.NONE, "", state, position, offset_lag, items)

    def _read_local(self, request: PartitionQueryRequest) -> PartitionQueryResponse | _LocalRead:
        """serve_local's answer: its refusal, or what it serves as (state, position, offset lag, items),
        which the coordinator takes as it is for its own partitions (no message object in between)."""
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
        offset_lag = END_UNKNOWN if lag is None else lag
        refusal = bound_refusal(request.max_lag, lag)
        if refusal is not None:
            return PartitionQueryResponse(ReplicaError.LAG_OVER_BOUND, refusal, state, position, offset_lag)
        if request.min_position > position:
            return _behind_token(replica, request.min_position, state, position)
        store = replica.store
        items: tuple[tuple[bytes, bytes], ...]
        try:
            if request.scan:
                limit = MAX_ROWS + 1 if request.limit is None else min(request.limit, MAX_ROWS + 1)
                items = tuple(store.scan(request.start, request.end, limit=limit))
            elif len(request.keys) == 1:
                [key] = request.keys
                value = store.get(key)
                items = () if value is None else ((key, value),)
            else:
                values = store.get_many(request.keys)
                if None in values:
                    items = tuple((k, v) for k, v in zip(request.keys, values, strict=True) if v is not None)
                else:  # every key found (the common case): paired in C
                    items = tuple(zip(request.keys, values, strict=True))  # type: ignore[arg-type]
        except StoreError as error:
            # A damaged block or a failing disk: never a partial answer (the replica goes offline).
            assert self._replicas is not None
            self._replicas.store_failed(replica, error)
            return PartitionQueryResponse(
                ReplicaError.UNKNOWN_PARTITION, f"server {self.node_id}'s replica of it failed: {error}"
            )
        return state, position, offset_lag, items

    def _local_lag(self, replica: LocalReplica) -> tuple[str, int, int | None]:
        lag = served_lag(replica.core, replica.witness, self._lags, self.node_id)
        return replica_state(replica), replica.core.position, lag


def _behind_token(replica: LocalReplica, wanted: int, state: str, position: int) -> PartitionQueryResponse:
    """The refusal of a store behind the token's position. The active tells a token no write reached
    (beyond its log end, which holds every committed record) from one its store has not applied yet."""
    core = replica.core
    if core.role is ReplicaRole.LEADER and wanted > core.log_end_offset:
        return PartitionQueryResponse(
            ReplicaError.TOKEN_AHEAD,
            f"the token asks for position {wanted}, beyond the partition's log end {core.log_end_offset}",
            state,
            position,
        )
    return PartitionQueryResponse(
        ReplicaError.BEHIND_TOKEN, f"at position {position}, the token asks for {wanted}", state, position
    )


def _answered(partition: int, node_id: int, answer: PartitionQueryResponse) -> _PartitionAnswer:
    return _served(partition, node_id, answer.state, answer.position, answer.offset_lag, answer.items)


def _served(
    partition: int,
    node_id: int,
    state: str,
    position: int,
    offset_lag: int,
    items: tuple[tuple[bytes, bytes], ...],
) -> _PartitionAnswer:
    return _PartitionAnswer(PartitionServed(partition, node_id, state, offset_lag, position), items)


async def _parse(sql: str) -> PullQuery:
    """The statement parsed; one that only the full parser reads and that is long is parsed on a worker
    thread, so that no statement holds the event loop (heartbeats, RPC) for the milliseconds to seconds
    the full parser can take on it."""
    try:
        query = parse_fast(sql)
        if query is not None:
            return query
        if len(sql) > SLOW_PARSE_CHARS:
            return await asyncio.to_thread(parse, sql)
        return parse(sql)
    except ValueError as error:  # InvalidSqlError, UnsupportedQueryError: messages name the problem
        raise QueryError("bad_request", str(error)) from error


def check_properties(properties: Mapping[str, object]) -> None:
    """Refuses property names this server does not know: a typo must not run an unbounded query."""
    unknown = [name for name in properties if name not in KNOWN_PROPERTIES and name not in IGNORED_PROPERTIES]
    if unknown:
        names = ", ".join(repr(name) for name in sorted(unknown))
        raise QueryError(
            "bad_request",
            f"unknown {'property' if len(unknown) == 1 else 'properties'} {names}; "
            f"known: {', '.join(sorted(KNOWN_PROPERTIES))}",
        )


def _max_lag(properties: Mapping[str, object], table: TableInfo) -> int | None:
    for key in MAX_LAG_PROPERTIES:
        if key in properties:
            value = properties[key]
            if value is None:
                return None
            problem = f"{key}={value!r}: must be an integer from 0 to {MAX_LAG_LIMIT}, or null for no bound"
            try:
                number = int(str(value))
            except ValueError:
                raise QueryError("bad_request", problem) from None
            if not 0 <= number <= MAX_LAG_LIMIT:
                raise QueryError("bad_request", problem)
            return number
    return table.acceptable_lag


def _min_batch(properties: Mapping[str, object]) -> int | None:
    value = properties.get(MIN_BATCH_PROPERTY)
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise QueryError(
            "bad_request", f"{MIN_BATCH_PROPERTY}={value!r}: must be a Spark batch id (an integer >= 0)"
        )
    return value


def _partitions(properties: Mapping[str, object], table: TableInfo) -> frozenset[int] | None:
    value = properties.get(PARTITIONS_PROPERTY)
    if value is None:
        return None
    problem = f"{PARTITIONS_PROPERTY}: must be a list of partition numbers of {table.name} (0 to "
    problem += f"{table.partitions - 1})"
    if not isinstance(value, list | tuple) or not value:
        raise QueryError("bad_request", problem)
    for number in value:
        if type(number) is not int or not 0 <= number < table.partitions:
            raise QueryError("bad_request", f"{problem}, got {number!r}")
    return frozenset(value)


def _after(properties: Mapping[str, object]) -> bytes | None:
    value = properties.get(AFTER_PROPERTY)
    if value is None:
        return None
    problem = f"{AFTER_PROPERTY}: must be the cursor of an earlier answer"
    if not isinstance(value, str) or not value:
        raise QueryError("bad_request", problem)
    try:
        return base64.b64decode(value.encode("ascii"), altchars=b"-_", validate=True)
    except (ValueError, binascii.Error):
        raise QueryError("bad_request", problem) from None


def _page(
    work: dict[int, PartitionQueryRequest], partitions: frozenset[int] | None, after: bytes | None
) -> dict[int, PartitionQueryRequest]:
    """`work` restricted to `partitions` and to keys greater than `after`."""
    if partitions is not None:
        work = {partition: spec for partition, spec in work.items() if partition in partitions}
    if after is None:
        return work
    # The least key greater than `after`: keys compare as bytes.
    start = after + b"\x00"
    paged = {}
    for partition, spec in work.items():
        if spec.scan:
            spec = dataclasses.replace(spec, start=start if spec.start is None else max(spec.start, start))
        else:
            keys = tuple(key for key in spec.keys if key > after)
            if not keys:
                continue
            spec = dataclasses.replace(spec, keys=keys)
        paged[partition] = spec
    return paged


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
    value = properties.get(TIMEOUT_PROPERTY, DEFAULT_TIMEOUT_MS)
    try:
        number = int(str(value))
    except ValueError:
        raise QueryError("bad_request", f"timeout_ms={value!r}: must be a positive integer") from None
    if not 1 <= number <= MAX_TIMEOUT_MS:
        raise QueryError("bad_request", f"timeout_ms={value!r}: must be 1..{MAX_TIMEOUT_MS}")
    return number


def _partition_work(
    query_plan: QueryPlan, table: TableInfo, max_lag: int | None = None, token: Positions | None = None
) -> dict[int, PartitionQueryRequest]:
    """What to ask of each partition the plan touches, in partition order, each no older than `token`."""
    work = _plain_work(query_plan, table, max_lag)
    if token:
        for partition, spec in work.items():
            wanted = token.get((table.table_id, partition), 0)
            if wanted:
                work[partition] = dataclasses.replace(spec, min_position=wanted)
    return work


def _plain_work(
    query_plan: QueryPlan, table: TableInfo, max_lag: int | None
) -> dict[int, PartitionQueryRequest]:
    access = query_plan.access
    if isinstance(access, KeyLookup):
        if len(access.keys) == 1:  # a point lookup
            [partition] = access.partitions
            return {
                partition: PartitionQueryRequest(
                    table.name, partition, access.keys, False, None, None, None, max_lag
                )
            }
        by_partition: dict[int, list[bytes]] = {}
        for key, partition in zip(access.keys, access.partitions, strict=True):
            by_partition.setdefault(partition, []).append(key)
        return {
            partition: PartitionQueryRequest(
                table.name, partition, tuple(by_partition[partition]), False, None, None, None, max_lag
            )
            for partition in sorted(by_partition)
        }
    start, end = (access.start, access.end) if isinstance(access, KeyRange) else (None, None)
    assert isinstance(access, KeyRange | FullScan)
    # One row past the LIMIT tells whether more follow (the answer's cursor); a LIMIT above what one query
    # returns reads no more than that (and fits the wire).
    limit = None if query_plan.limit is None else min(query_plan.limit + 1, MAX_ROWS + 1)
    return {
        partition: PartitionQueryRequest(table.name, partition, (), True, start, end, limit, max_lag)
        for partition in range(table.partitions)
    }


_KEY = operator.itemgetter(0)  # of a (key, row) item: keys are unique, so items order by key alone
_ROW = operator.itemgetter(1)


def _rows(
    query_plan: QueryPlan, table: TableInfo, answers: Iterable[_PartitionAnswer]
) -> tuple[list[str], list[list[object]], bytes | None]:
    """Merge the partitions' rows in key order, apply the LIMIT, and project the columns; the last key
    when the LIMIT cut the rows short (maybe more follow)."""
    sources = [a.items for a in answers if a.items]
    limit = MAX_ROWS + 1 if query_plan.limit is None else min(query_plan.limit, MAX_ROWS + 1)
    # Each partition's items are already in key order. A key lives in one partition, so (key, row) pairs
    # order by key alone; a sort in C beats a merge in Python at every size one query returns (each
    # partition sends at most `limit` + 1 items).
    merged = sources[0] if len(sources) == 1 else sorted(itertools.chain.from_iterable(sources), key=_KEY)
    items = merged[:limit]
    if query_plan.limit is None and len(items) > MAX_ROWS:
        raise QueryError("bad_request", f"more than {MAX_ROWS} rows: add a LIMIT or narrow the key range")
    # Rows past the LIMIT: the next page starts after the last key returned. Each partition sent its
    # first items in key order, so every key up to that one is among those returned.
    last_key = items[-1][0] if query_plan.limit is not None and items and len(merged) > len(items) else None
    decoded = decode_rows([row for _, row in items])
    if query_plan.columns is None:
        columns = [c.name for c in table.key_columns]
        if decoded:
            columns += [name for name in decoded[0] if name not in columns]
            # One writer's rows share their columns: all names at once (in C), and the slow way (each
            # row's new names in order) only when some row has a column the first lacks.
            if len(decoded) > 1 and not set().union(*decoded).issubset(columns):
                _add_columns(columns, decoded)
    else:
        columns = list(query_plan.columns)
        for name in columns:
            if decoded and all(_missing(row, name) for row in decoded):
                raise QueryError("bad_request", f"column {name!r} is not in table {table.name!r}")
    return columns, _projected(decoded, columns), last_key


def _add_columns(columns: list[str], decoded: list[dict[str, object]]) -> None:
    """Every row's columns not in `columns` yet, appended in the order the rows first name them."""
    shape: KeysView[str] | None = None
    for row in decoded:
        names = row.keys()
        if names == shape:  # compared as sets, in C
            continue
        shape = names
        for name in names:
            if name not in columns:
                columns.append(name)


def _projected(decoded: list[dict[str, object]], columns: list[str]) -> list[list[object]]:
    """Each row's values in `columns` order; a column a row lacks (or names only when case is ignored)
    is looked up the slow way, for that row."""
    pick = operator.itemgetter(*columns)
    if len(columns) > 1:
        try:  # every row has every column (the common case): in C
            return list(map(list, map(pick, decoded)))
        except KeyError:
            pass
    rows: list[list[object]] = []
    for row in decoded:
        try:
            values = pick(row)
        except KeyError:
            rows.append([_value(row, name) for name in columns])
            continue
        rows.append(list(values) if len(columns) > 1 else [values])
    return rows


def _value(row: dict[str, object], name: str) -> object:
    if name in row:
        return row[name]
    lowered = name.lower()
    for key, value in row.items():
        if key.lower() == lowered:
            return value
    return None


def _missing(row: dict[str, object], name: str) -> bool:
    lowered = name.lower()
    return not any(key.lower() == lowered for key in row)
