"""The pull-query coordinator: the asyncio shell that fans a query out to replicas and merges the answers.

The receiving server parses and plans the query (hotstate.query), reads its options and per-partition work
(query/execute.py), serves the partitions whose active is here directly, and routes each other partition
(routing/router.py: active if alive, then standbys by lag, none over the bound, replicas of servers down by
heartbeats last). What happens next for a partition is decided by its `Attempts` (routing/attempts.py):
serve here, forward, wait for its token, or fail. This shell only does the IO those decisions ask for, in
rounds: each partition's next candidate is read directly when local, and the partitions whose candidate is
remote are sent, one `QueryPartitionsRequest` per server per round, to be answered from that server's
replicas or refused (server/serving.py), never forwarded again. A forward unanswered past its peer's hedge
delay (routing/hedging.py) also goes to the partitions' next candidates; the first answer wins.

The common case (every partition local, or one server) takes no task, gather or lock: this runs once per
HTTP request, and its cost is most of a lookup's CPU.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import operator
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from hotstate.controller.image import MetadataImage, PartitionInfo, TableInfo
from hotstate.protocol.replica_state import REPLICA_STATES
from hotstate.query.execute import (
    DEFAULT_TIMEOUT_MS,
    TIMEOUT_PROPERTY,
    TOKEN_PROPERTY,
    PartitionAnswer,
    PartitionServed,
    QueryError,
    QueryOptions,
    QueryResult,
    check_properties,
    given_positions,
    plain_work,
    result,
    work_for,
)
from hotstate.query.plan import QueryPlan, UnknownTableError, find_table, plan
from hotstate.query.scan import scanned_of
from hotstate.query.sql import SLOW_PARSE_CHARS, PullQuery, parse, parse_fast
from hotstate.query.tokens import Positions, cluster_tag
from hotstate.replica.messages import (
    PartitionQueryRequest,
    PartitionQueryResponse,
    QueryPartitionsRequest,
    QueryPartitionsResponse,
    ReplicaError,
)
from hotstate.routing.attempts import (
    BEHIND_RETRY_S,
    Attempts,
    Fail,
    Forward,
    ServeHere,
    WaitForToken,
    attempt_timeout,
    on_last,
)
from hotstate.routing.hedging import HedgeConfig, HedgePolicy, last_if_slow
from hotstate.routing.lags import LagTable
from hotstate.routing.router import NoReplicaError, Route, route
from hotstate.rpc import NOT_SENT, RpcError, RpcTimeout
from hotstate.rpc.schema import CodecError
from hotstate.server.serving import LocalReads

MAX_KEPT_ROUTES = 65_536  # partitions x max_lag values a server keeps routes for, between lag reports

# Who the HTTP request being answered is (set by the auth guard, server/http/auth.py, in the request's
# task; "" with auth off): forwarded partition queries carry it for the serving server's log.
CURRENT_USER: contextvars.ContextVar[str] = contextvars.ContextVar("hotstate_user", default="")

# Sends a request to a peer: (node id, message, timeout in seconds) -> the answer's future
# (PeerPool.request_soon), which a forward waits on without a task of its own.
RequestSoon = Callable[[int, object, float], "asyncio.Future[object]"]


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What the coordinator reads of the cluster, each asked for now.

    `alive_version`: a number that changes whenever `alive` may answer differently
    (HeartbeatStatus.version); with it, routes are kept until it or the lag table changes, else every
    partition of every query is routed afresh. `not_ready`: why this server cannot answer yet (its metadata
    image has not caught up since it started, server.metadata), None once it can."""

    image: Callable[[], MetadataImage]
    lags: LagTable
    alive: Callable[[int], bool]
    alive_version: Callable[[], int] | None = None
    connected: Callable[[int], bool] = lambda node: True
    not_ready: Callable[[], str | None] = lambda: None


@dataclass(slots=True)
class _Query:
    """One query past its local reads: what every round and forward of it reads."""

    plan: QueryPlan
    table: TableInfo
    parts: tuple[PartitionInfo, ...]
    deadline: float
    standby_reads: bool
    hedge: bool
    given: Positions
    started: float
    # The statement and its properties: to plan it again when the table's generation changed under it.
    statement: PullQuery | None = None
    properties: Mapping[str, object] | None = None


class Coordinator:
    def __init__(
        self,
        node_id: int,
        cluster: ClusterView,
        reads: LocalReads,
        request_soon: RequestSoon,
        *,
        hedging: HedgePolicy | None = None,
        cluster_id: str = "",
        on_forward: Callable[[str], None] = lambda outcome: None,
        default_timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> None:
        self.node_id = node_id
        # A query's budget when it gives no timeout_ms (the server's query.timeout.ms).
        self.default_timeout_ms = default_timeout_ms
        self.cluster = cluster
        self.reads = reads
        self._request_soon = request_soon
        self._on_forward = on_forward
        self.hedging = hedging if hedging is not None else HedgePolicy(HedgeConfig())
        self._tag = cluster_tag(cluster_id)
        # Hedged forwards left to run to their end (they keep their peer marked slow meanwhile).
        self._background: set[asyncio.Future[dict[int, PartitionAnswer]]] = set()
        # Query ids: unique per server run without a uuid per query.
        self._id_prefix = f"{node_id}-{os.urandom(4).hex()}-"
        self._ids = itertools.count(1)
        # (id of the image's PartitionInfo, max_lag) -> (that PartitionInfo, the table's name, its route),
        # valid while `_routes_made_at` is the current (alive version, lag table version): a route depends
        # on nothing else, and those change a few times a second, not per query.
        self._routes: dict[tuple[int, int | None], tuple[PartitionInfo, str, Route]] = {}
        self._routes_made_at = (-1, -1)

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
        reason = self.cluster.not_ready()
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
        image = self.cluster.image()
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
            options = QueryOptions.read(properties, table, self._tag)
            timeout_ms = options.timeout_ms if TIMEOUT_PROPERTY in properties else self.default_timeout_ms
            deadline = started + timeout_ms / 1000
            if options.min_batch is not None and committed is None:
                return self._after_batch(query, properties, started, table, options.min_batch, deadline)
            standby_reads, hedge = options.standby_reads, options.hedge
            given = given_positions(table, options)
            work = work_for(query_plan, table, options, given)
        else:  # every property at its default (most lookups): the same as above, without the look-ups
            deadline = started + self.default_timeout_ms / 1000
            standby_reads = hedge = True
            given = {}
            work = plain_work(query_plan, table, table.acceptable_lag)
        # A scan's forwards are not hedged: it takes as long as its rows, not a lookup's round trip, and a
        # copy would double the work it is slow for.
        hedge = hedge and query_plan.scan is None
        parts = image.partitions.get(table.table_id, ())
        # A scan's local partitions are read in steps, awaited (`_scan_here`), never in this call.
        here = {} if query_plan.scan is not None else self._serve_actives_here(parts, work, deadline)
        if len(here) < len(work):
            elsewhere = _Query(query_plan, table, parts, deadline, standby_reads, hedge, given, started)
            if committed is None:
                elsewhere.statement, elsewhere.properties = query, properties
            return self._served_elsewhere(elsewhere, work, here)
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
        self, query: _Query, work: dict[int, PartitionQueryRequest], here: dict[int, PartitionAnswer]
    ) -> QueryResult:
        try:
            answers = await self._serve(query, work, here)
        except NoReplicaError as error:
            current = self.cluster.image().tables.get(query.table.name)
            replaced = current is not None and current.table_id != query.table.table_id
            if query.statement is not None and replaced:
                # An overwrite swapped the table's generation while this query read it, and the replicas
                # of the one it was planned against are gone: plan it again against the new one (never
                # a mix: every partition is read from one generation, request.table_id).
                outcome = self._run(query.statement, query.properties, query.started)
                return outcome if isinstance(outcome, QueryResult) else await outcome
            raise QueryError("unavailable", str(error)) from error
        return self._result(query.plan, query.table, answers, query.given, query.started)

    def _result(
        self,
        query_plan: QueryPlan,
        table: TableInfo,
        answers: list[PartitionAnswer],
        given: Positions,
        started: float,
    ) -> QueryResult:
        if query_plan.scan is not None:
            scanned = scanned_of(a.partial for a in answers)
            if scanned > self.reads.scan_max_rows:
                raise QueryError(
                    "bad_request",
                    f"the query scanned {scanned:,} rows, more than {self.reads.scan_max_rows:,} (the "
                    "server's query.scan.max.rows): narrow the WHERE on key columns",
                )
        took_ms = (time.monotonic() - started) * 1000
        query_id = f"{self._id_prefix}{next(self._ids)}"
        return result(query_id, self.node_id, self._tag, query_plan, table, answers, given, took_ms)

    async def _committed_batch(self, table: TableInfo, batch_id: int, deadline: float) -> TableInfo:
        """`table` once its Spark sink has committed batch `batch_id` or a later one (server images learn
        of the commit a moment after the sink's driver does), else a 503 at the deadline."""
        while True:
            current = self.cluster.image().tables.get(table.name)
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

    def _serve_actives_here(
        self, parts: tuple[PartitionInfo, ...], work: dict[int, PartitionQueryRequest], deadline: float
    ) -> dict[int, PartitionAnswer]:
        """The answers of the partitions whose active is on this server and serves them: the router would
        put this server's active first whatever the lags say (a restoring one is held to the bound, which
        the local read checks with its real lag), so these skip routing, and a query that needs no other
        server takes no task or coroutine of its own."""
        answers: dict[int, PartitionAnswer] = {}
        node_id = self.node_id
        read = self.reads.read
        for partition, spec in work.items():
            if parts[partition].active == node_id and deadline > time.monotonic():
                served = read(spec)
                if not isinstance(served, PartitionQueryResponse):  # served, not refused
                    state, position, offset_lag, items = served
                    answers[partition] = PartitionAnswer(
                        PartitionServed(partition, node_id, state, offset_lag, position), items
                    )
        return answers

    async def _serve(
        self, query: _Query, work: dict[int, PartitionQueryRequest], answers: dict[int, PartitionAnswer]
    ) -> list[PartitionAnswer]:
        """Every partition's answer, in partition order, given those read here already; raises
        NoReplicaError for the first partition (in partition order, within a round) that no candidate
        could serve."""
        pending = [
            self._attempts(query, query.parts[partition], spec)
            for partition, spec in work.items()
            if partition not in answers
        ]
        waiting: list[Attempts] = []
        while pending or waiting:
            if not pending:
                # Every replica of these partitions is behind the query's token: they apply what the
                # active commits within milliseconds, so ask again (freshly routed) until the timeout.
                await asyncio.sleep(BEHIND_RETRY_S)
                pending = [
                    a.again(self._route(query, query.parts[a.partition], a.spec.max_lag)) for a in waiting
                ]
                waiting = []
            remote: dict[int, list[Attempts]] = {}
            for attempts in pending:
                step = self._next(attempts, query.deadline)
                if isinstance(step, PartitionAnswer):
                    answers[attempts.partition] = step
                elif isinstance(step, Forward):
                    remote.setdefault(step.node_id, []).append(attempts)
                elif isinstance(step, WaitForToken):
                    waiting.append(attempts)
                else:
                    raise _failure(step, attempts.partition)
            if remote:
                # Every server's forward runs at once: the first in this task, the others in their own
                # (cheaper than a gather, which would make a task of each).
                [(node_id, group), *others] = remote.items()
                tasks: list[asyncio.Future[dict[int, PartitionAnswer]]] = []
                for n, g in others:  # (a loop, not a comprehension: most queries have no other server)
                    tasks.append(asyncio.ensure_future(self._forward(n, g, query)))
                try:
                    answers.update(await self._forward(node_id, group, query))
                    for task in tasks:
                        answers.update(await task)
                except BaseException:
                    for task in tasks:
                        task.cancel()
                    raise
            if len(answers) == len(work):  # every partition answered (a lookup's one forward, most often)
                break
            pending = [a for group in remote.values() for a in group if a.partition not in answers]
            pending.sort(key=_PARTITION)
        if len(answers) == 1:
            return list(answers.values())
        return [answers[partition] for partition in sorted(answers)]

    def _next(self, attempts: Attempts, deadline: float) -> PartitionAnswer | Forward | WaitForToken | Fail:
        """The partition's next step, its local candidates read here on the way: the one place a
        coordinator serves a routed partition from its own replica."""
        while True:
            step = attempts.next(time.monotonic(), deadline)
            if not isinstance(step, ServeHere):
                return step
            if attempts.spec.program:  # a scan: read here in steps, as a forward to this server
                return Forward(self.node_id)
            answer = self.reads.serve(attempts.spec)
            if answer.error is ReplicaError.NONE:
                return PartitionAnswer.of(attempts.partition, self.node_id, answer)
            attempts.refused(answer)

    def _attempts(self, query: _Query, part: PartitionInfo, spec: PartitionQueryRequest) -> Attempts:
        decision = self._route(query, part, spec.max_lag)
        return Attempts(part.partition, spec, decision, self.node_id, query.standby_reads)

    def _route(self, query: _Query, part: PartitionInfo, max_lag: int | None) -> Route:
        decision = self._routed(query.table.name, part, max_lag)
        if query.hedge:
            decision = last_if_slow(decision, self._slow_now)
        return decision

    def _routed(self, table: str, part: PartitionInfo, max_lag: int | None) -> Route:
        cluster = self.cluster
        if cluster.alive_version is None:
            return self._new_route(table, part, max_lag)
        made_at = (cluster.alive_version(), cluster.lags.version)
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
        cluster = self.cluster
        return route(
            part,
            table=table,
            alive=cluster.alive,
            lags=cluster.lags,
            local_node=self.node_id,
            max_lag=max_lag,
        )

    def _slow_now(self, node_id: int) -> bool:
        return self.hedging.slow(node_id, time.monotonic() * 1000)

    async def _forward(
        self, node_id: int, group: list[Attempts], query: _Query
    ) -> dict[int, PartitionAnswer]:
        """`_ask`, hedged (routing/hedging.py): when `node_id` has not answered within its hedge delay, the
        partitions go to their next candidates as well, and each takes the first answer."""
        if node_id == self.node_id:
            return await self._scan_here(group, query.deadline)
        policy = self.hedging
        counted = query.plan.scan is None
        if counted:
            policy.forwarded()
        deadline = query.deadline
        delay_ms = policy.delay_ms(node_id) if query.hedge else None
        if (
            delay_ms is None
            or delay_ms / 1000 >= deadline - time.monotonic()
            or on_last(group)  # a hedge would find no one else to ask: no timer for one
        ):
            return await self._ask(node_id, group, deadline, counted=counted)
        # Waited on with a timer, not in a task of its own: a task only once the hedge delay passes.
        sent, request_id = self._send_ask(node_id, group, deadline, counted=True)
        try:
            settled = await _settled_within(sent, delay_ms / 1000)
        except asyncio.CancelledError:
            sent.cancel()
            self.hedging.done(node_id, request_id, time.monotonic() * 1000, answered=False)
            raise
        if settled:
            return self._asked(node_id, group, sent, request_id)
        first = asyncio.ensure_future(self._ask_rest(node_id, group, sent, request_id))
        local, remote = self._hedges(group, deadline)
        if not (local or remote) or not policy.take():
            return await first
        for _ in group:
            self._on_forward("hedged")
        return await self._race(first, local, remote, deadline, {a.partition for a in group})

    def _hedges(
        self, group: list[Attempts], deadline: float
    ) -> tuple[dict[int, PartitionAnswer], dict[int, list[Attempts]]]:
        """Each partition's next candidate after the one asked: answered here when local, else grouped by
        server. The copies share the originals' list of skipped replicas, so every refusal is reported."""
        local: dict[int, PartitionAnswer] = {}
        remote: dict[int, list[Attempts]] = {}
        for attempts in group:
            copy = attempts.hedged()
            step = self._next(copy, deadline)
            if isinstance(step, PartitionAnswer):
                local[copy.partition] = step
            elif isinstance(step, Forward):
                remote.setdefault(step.node_id, []).append(copy)
            # A copy with nowhere to go leaves the partition to the forward already sent.
        return local, remote

    async def _race(
        self,
        first: asyncio.Future[dict[int, PartitionAnswer]],
        local: dict[int, PartitionAnswer],
        remote: dict[int, list[Attempts]],
        deadline: float,
        wanted: set[int],
    ) -> dict[int, PartitionAnswer]:
        answers: dict[int, PartitionAnswer] = {}
        hedge_won = dict(local)
        tasks: set[asyncio.Future[dict[int, PartitionAnswer]]] = {first}
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
        self, node_id: int, group: list[Attempts], deadline: float, *, counted: bool = True
    ) -> dict[int, PartitionAnswer]:
        """Asks `node_id` for every partition in `group` at once; what it could not serve stays pending,
        with the reason recorded. `counted`: by the hedging policy (not a scan's, `_send_ask`)."""
        if node_id == self.node_id:
            return await self._scan_here(group, deadline)
        sent, request_id = self._send_ask(node_id, group, deadline, counted)
        return await self._ask_rest(node_id, group, sent, request_id)

    def _send_ask(
        self, node_id: int, group: list[Attempts], deadline: float, counted: bool
    ) -> tuple[asyncio.Future[object], int]:
        """`_ask`'s request, sent: the future of its answer and its id for the hedging policy."""
        timeout = attempt_timeout(group, deadline - time.monotonic(), self.cluster.connected(node_id))
        specs = (group[0].spec,) if len(group) == 1 else tuple(a.spec for a in group)
        request = QueryPartitionsRequest(specs, CURRENT_USER.get())
        # A scan's is not counted by the hedging policy: its time would raise the peer's hedge delay, and
        # while it runs make the peer look slow to every lookup.
        request_id = self.hedging.sent(node_id, time.monotonic() * 1000) if counted else -1
        return self._request_soon(node_id, request, timeout), request_id

    async def _ask_rest(
        self, node_id: int, group: list[Attempts], sent: asyncio.Future[object], request_id: int
    ) -> dict[int, PartitionAnswer]:
        try:
            await sent
        except asyncio.CancelledError:
            self.hedging.done(node_id, request_id, time.monotonic() * 1000, answered=False)
            raise
        except Exception:  # _asked reads and reports it
            pass
        return self._asked(node_id, group, sent, request_id)

    def _asked(
        self, node_id: int, group: list[Attempts], sent: asyncio.Future[object], request_id: int
    ) -> dict[int, PartitionAnswer]:
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
            attempts.failed(reason)
        return {}

    async def _scan_here(self, group: list[Attempts], deadline: float) -> dict[int, PartitionAnswer]:
        """Scans of partitions this server's replicas serve, each in steps (LocalReads.scan), stopped at
        the query's deadline."""
        out: dict[int, PartitionAnswer] = {}
        for attempts in group:
            try:
                answer = await asyncio.wait_for(self.reads.scan(attempts.spec), deadline - time.monotonic())
            except TimeoutError:
                attempts.failed("timed out")
                continue
            if answer.error is ReplicaError.NONE:
                out[attempts.partition] = PartitionAnswer.of(attempts.partition, self.node_id, answer)
            elif answer.error is ReplicaError.BAD_QUERY:
                raise QueryError("bad_request", answer.message)
            else:
                attempts.refused(answer)
        return out

    def _answers(
        self, node_id: int, group: list[Attempts], replies: tuple[PartitionQueryResponse, ...]
    ) -> dict[int, PartitionAnswer]:
        out: dict[int, PartitionAnswer] = {}
        for attempts, answer in zip(group, replies, strict=True):
            error = answer.error
            if error is ReplicaError.NONE and answer.state in REPLICA_STATES:  # served (the common case)
                self._on_forward("ok")
                out[attempts.partition] = PartitionAnswer.of(attempts.partition, node_id, answer)
            elif error is ReplicaError.BAD_QUERY:
                # The query's fault, which every replica would find: a 400, not the next replica.
                raise QueryError("bad_request", answer.message)
            elif error is ReplicaError.NONE:
                # A peer of another version: its rows may mean something else, so ask the next replica.
                self._on_forward("error")
                attempts.failed(f"failed: answered in an unknown replica state {answer.state!r}")
            else:
                self._on_forward("refused")
                attempts.refused(answer)
        return out


_PARTITION = operator.attrgetter("partition")


def request_soon_of(
    request: Callable[[int, object, float], Coroutine[Any, Any, object]],
) -> RequestSoon:
    """A coroutine function that sends a request, as the future-returning form the coordinator takes."""
    return lambda node, message, timeout: asyncio.ensure_future(request(node, message, timeout))


def _failure(step: Fail, partition: int) -> Exception:
    if step.token_ahead is not None:
        return QueryError("bad_request", f"{TOKEN_PROPERTY}, partition {partition}: {step.token_ahead}")
    return step.error


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
