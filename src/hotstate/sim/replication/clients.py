"""The replication simulator's clients and the servers' routing state.

Writers send upserts with acks=all to the active (or, now and then, to whoever a stale view names).
Every server heartbeats the others and reports its replica's lag; clients send pull queries to any server,
which routes them with the real heartbeat status, lag table, router and lag rules (`routing/`), and drives
each query's `Attempts` (routing/attempts.py) as the coordinator's shell (server/coordinator.py) does for
one partition: read here, forward with the attempt's timeout, wait for the query's token, or give up; and
hedges a forward as its `_forward`, `_hedges` and `_race` do, with each server's own `HedgePolicy`
(routing/hedging.py) fed the answer times it measured on the query clock. All of this draws from the
world's query stream, so it changes none of the replicas' random choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hotstate.log.batch import RecordBatch
from hotstate.query.execute import DEFAULT_TIMEOUT_MS
from hotstate.replica.messages import (
    FetchResponse,
    LagInfo,
    PartitionQueryRequest,
    PartitionQueryResponse,
    ReplicaError,
    ReplicaMessage,
)
from hotstate.routing.attempts import (
    BEHIND_RETRY_S,
    Attempts,
    Forward,
    ServeHere,
    WaitForToken,
    attempt_timeout,
)
from hotstate.routing.freshness import (
    UNKNOWN_LAG_REASON,
    bound_refusal,
    lag_report,
    replica_state,
    token_refusal,
)
from hotstate.routing.hedging import HedgePolicy, last_if_slow
from hotstate.routing.router import Route, route
from hotstate.sim.replication.invariants import ReplicationInvariantViolation
from hotstate.sim.replication.profile import (
    HEDGE,
    LAG_ARRIVE,
    PARTITION_ID,
    QUERY_BOUNDS,
    QUERY_CLOCK,
    QUERY_REPLY,
    QUERY_RETRY,
    SERVE,
    TABLE,
    TOKEN_QUERIES,
    UNHEDGED_QUERIES,
    query_clock,
    sim_ms,
    sim_ms_after,
)

if TYPE_CHECKING:
    from hotstate.sim.replication.world import Node, ReplicationWorld


class Writers:
    """Clients writing upserts with acks=all; an acknowledged write must be the committed records."""

    def __init__(self, world: ReplicationWorld) -> None:
        self.world = world
        self._value = 0
        self._tokens: dict[tuple[int, int, int], tuple[RecordBatch | None, tuple[bytes, ...]]] = {}

    def produce(self) -> None:
        world = self.world
        c = world.controller
        rng = world.rng
        # The client's idea of the active may be stale: it uses an earlier view now and then.
        target = c.active if rng.random() < 0.8 else rng.choice(list(world.nodes))
        if target is None:
            return
        node = world.nodes[target]
        if node.core is None:
            return
        count = rng.randint(1, 4)
        records = []
        for _ in range(count):
            self._value += 1
            records.append(f"k{rng.randrange(12)}={self._value}".encode())
        epoch = c.leader_epoch if rng.random() < 0.9 else max(0, c.leader_epoch - 1)
        result = node.core.produce(records, epoch, world.now, 1000)
        if isinstance(result, int):
            self._tokens[(target, node.incarnation, result)] = (None, tuple(records))
        else:
            world.stats.produce_errors += 1
        world.pump(node)

    def on_result(self, node: Node, result: Any) -> None:
        entry = self._tokens.pop((node.id, node.incarnation, result.token), None)
        if entry is None:
            return
        records = entry[1]
        stats = self.world.stats
        if result.error is ReplicaError.NONE:
            if result.end_offset - result.base_offset != len(records):
                raise ReplicationInvariantViolation("an ack for the wrong number of records")
            stats.acked += 1
            self.world.checker.acknowledged(result.base_offset, result.end_offset, records)
        else:
            stats.produce_errors += 1


@dataclass(eq=False)
class _Query:
    """One pull query of a key, its partition's attempts driven by the real state machine."""

    id: int
    coordinator: int
    boot: int
    key: bytes
    spec: PartitionQueryRequest  # as the client asked it
    attempts: Attempts
    deadline: float  # on the query clock
    hedge: bool = True  # the `hedging` query property
    # The forwards the coordinator waits on: the one under way and, once it is hedged, the hedge. A reply or
    # timeout of any other is void (one left running after a hedge won still ends in the hedging policy).
    asks: list[_Ask] = field(default_factory=list)
    done: bool = False


@dataclass(eq=False)
class _Ask:
    """One forward of a query's partition to a peer, as the coordinator's `_send_ask` sends it: the forward
    of its attempts' candidate, or a hedge (the next candidate of a copy made by `Attempts.hedged`). The
    coordinator's hedging policy counts it outstanding until it is answered, fails, times out or is
    cancelled (`ended`)."""

    query: _Query
    node_id: int
    attempts: Attempts
    policy: HedgePolicy
    request_id: int
    sent_ms: float  # on the query clock, as the policy's
    hedge: bool = False
    delay_ms: float | None = None  # the hedge delay it was sent with (None: never hedged)
    hedges: int = 0
    ended: bool = False


@dataclass(frozen=True, slots=True)
class _Served:
    """A replica's answer to a query: what it read, and for the counters, who read it."""

    node_id: int
    value: bytes | None
    by_standby: bool


class Queries:
    """The servers' heartbeats and lag reports, and clients' pull queries through the real router."""

    def __init__(self, world: ReplicationWorld) -> None:
        self.world = world
        self.rng = world.query_rng

    def heartbeats(self) -> None:
        """Every running server's heartbeat to every other one (server.liveness), lost on a cut or a drop."""
        world = self.world
        for src in world.nodes.values():
            if not src.up:
                continue
            for dst in world.nodes.values():
                if dst is src or not dst.up or dst.status is None or world.kernel.cut(src.id, dst.id):
                    continue
                if self.rng.random() >= world.profile.drop:
                    dst.status.received(src.id, world.now)

    def check_heartbeats(self) -> None:
        for node in self.world.nodes.values():
            if node.up and node.status is not None:
                node.status.check(self.world.now)

    def lag_reports(self) -> None:
        """Every running server reports its replica's lag to itself and to the servers it thinks alive."""
        world = self.world
        for src in world.nodes.values():
            if not src.up or src.status is None:
                continue
            reports: tuple[LagInfo, ...] = ()
            core = src.core
            if core is not None and src.witness is not None and src.info is not None:
                info = src.info
                state = replica_state(core, info.warmups)
                in_sync = src.id in info.isr
                reports = (
                    lag_report(
                        core, src.witness, src.lags, src.id, table=TABLE, state=state, in_sync=in_sync
                    ),
                )
            src.lags.update(src.id, reports, world.now)
            for dst in world.nodes.values():
                if dst is src or not src.status.alive(dst.id) or world.kernel.cut(src.id, dst.id):
                    continue
                if self.rng.random() < world.profile.drop:
                    continue
                later = world.now + self.rng.randint(0, world.profile.delay_max_ms)
                world.kernel.schedule(later, LAG_ARRIVE, dst.id, (dst.boot, src.id, reports))

    def on_lag_report(self, node: Node, boot: int, src: int, reports: tuple[LagInfo, ...]) -> None:
        if not node.up or node.boot != boot:
            return
        node.lags.update(src, reports, self.world.now)
        hw = next((r.high_watermark for r in reports if r.end_offset_position >= 0), None)
        node.report_hws[src] = (self.world.now, hw)

    @staticmethod
    def heard(node: Node, message: ReplicaMessage) -> None:
        """After a message reached the node's core: a fetch answer the core took tells it a committed end."""
        core, witness = node.core, node.witness
        assert core is not None and witness is not None
        witness.observe(message, core)
        if (
            isinstance(message, FetchResponse)
            and message.error is ReplicaError.NONE
            and message.leader_epoch == core.leader_epoch
            and core.known_end_offset >= message.log_end_offset
        ):
            node.heard_hw = max(node.heard_hw or 0, message.high_watermark)

    def query(self) -> None:
        """A client asks a running server for one key, with a staleness bound or none, and now and then
        with a consistency token naming the end of the last acknowledged write (read your writes)."""
        world = self.world
        up = [n for n in world.nodes.values() if n.up and n.info is not None and n.status is not None]
        if not up:
            return
        coordinator = self.rng.choice(up)
        assert coordinator.info is not None and coordinator.status is not None
        key = f"k{self.rng.randrange(12)}".encode()
        max_lag = self.rng.choice(QUERY_BOUNDS)
        acked = world.checker.acked
        min_position = 0
        if acked and self.rng.random() < TOKEN_QUERIES:
            base, records = acked[-1]
            min_position = base + len(records)
            world.stats.token_queries += 1
        hedge = self.rng.random() >= UNHEDGED_QUERIES
        spec = PartitionQueryRequest(
            TABLE, PARTITION_ID, (key,), False, None, None, None, max_lag, min_position
        )
        decision = self._route(coordinator, max_lag, hedge)
        world.stats.queries += 1
        attempts = Attempts(PARTITION_ID, spec, decision, coordinator.id)
        deadline = query_clock(world.now) + DEFAULT_TIMEOUT_MS / 1000
        query = _Query(
            world.stats.queries, coordinator.id, coordinator.boot, key, spec, attempts, deadline, hedge
        )
        self._step(query)

    def _route(self, coordinator: Node, max_lag: int | None, hedge: bool) -> Route:
        """The coordinator's `_route`: the router's decision, with the peers its hedging policy finds slow
        moved last unless the query turned hedging off."""
        assert coordinator.info is not None and coordinator.status is not None
        decision = route(
            coordinator.info,
            table=TABLE,
            alive=coordinator.status.alive,
            lags=coordinator.lags,
            local_node=coordinator.id,
            max_lag=max_lag,
        )
        self.world.stats.lag_unknown += sum(1 for s in decision.skipped if s.reason == UNKNOWN_LAG_REASON)
        if hedge:
            now_ms, policy = self._now_ms(), coordinator.hedging
            decision = last_if_slow(decision, lambda node_id: policy.slow(node_id, now_ms))
        return decision

    def _now_ms(self) -> float:
        """The hedging policy's clock: the query clock, in ms."""
        return float(self.world.now * QUERY_CLOCK)

    def _step(self, query: _Query) -> None:
        """The coordinator does what the query's attempts say next (server/coordinator.py's shell, one
        partition): read here, forward, wait for the token, or give up."""
        world = self.world
        attempts = query.attempts
        coordinator = world.nodes[query.coordinator]
        while True:
            action = attempts.next(query_clock(world.now), query.deadline)
            if isinstance(action, ServeHere):
                answer = self._read(coordinator, query, attempts.spec)
                if isinstance(answer, _Served):
                    self._deliver(query, answer, hedge=False)
                    return
                attempts.refused(answer)
            elif isinstance(action, Forward):
                self._forward(query, action.node_id)
                return
            elif isinstance(action, WaitForToken):
                world.stats.token_waits += 1
                later = world.now + sim_ms(BEHIND_RETRY_S)
                world.kernel.schedule(later, QUERY_RETRY, query.coordinator, query)
                return
            else:
                world.stats.unserved += 1
                if action.token_ahead is not None:
                    world.stats.token_ahead += 1
                return

    def _forward(self, query: _Query, node_id: int) -> None:
        """The coordinator's `_forward`: the forward earns its share of a hedge, and when the query hedges
        and the peer's hedge delay (the policy's, from the answer times this coordinator measured) ends
        before the query's deadline, a hedge is due then unless the forward ended first (`hedge_due`)."""
        world = self.world
        coordinator = world.nodes[query.coordinator]
        policy = coordinator.hedging
        policy.forwarded()
        coordinator.forwards += 1
        world.stats.forwards += 1
        delay_ms = policy.delay_ms(node_id) if query.hedge else None
        ask = self._send(query, node_id, query.attempts, hedge=False)
        query.asks = [ask]
        if delay_ms is not None and delay_ms / 1000 < query.deadline - query_clock(world.now):
            ask.delay_ms = delay_ms
            world.kernel.schedule(world.now + sim_ms_after(delay_ms), HEDGE, query.coordinator, ask)

    def _send(self, query: _Query, node_id: int, attempts: Attempts, *, hedge: bool) -> _Ask:
        """The coordinator's `_send_ask`: sends the partition to `node_id`, given up when no answer came
        within the attempt's timeout (routing/attempts.attempt_timeout, as the coordinator's)."""
        world = self.world
        policy = world.nodes[query.coordinator].hedging
        connected = not world.kernel.cut(query.coordinator, node_id)
        remaining = query.deadline - query_clock(world.now)
        timeout = attempt_timeout([attempts], remaining, connected)
        now_ms = self._now_ms()
        ask = _Ask(query, node_id, attempts, policy, policy.sent(node_id, now_ms), now_ms, hedge)
        world.kernel.schedule(world.now + sim_ms(timeout), QUERY_REPLY, query.coordinator, (ask, "timed out"))
        if connected and self.rng.random() >= world.profile.drop:
            later = world.now + self.rng.randint(0, world.profile.delay_max_ms)
            world.kernel.schedule(later, SERVE, node_id, ask)
        return ask

    def hedge_due(self, ask: _Ask) -> None:
        """The forward's hedge delay passed: unless it was answered meanwhile, the coordinator's `_hedges`
        (a copy of the attempts goes on from the next candidate, read here when local) and, when the
        budget has a hedge (`HedgePolicy.take`), the race of `_race`: the first answer wins."""
        world = self.world
        query = ask.query
        coordinator = world.nodes[query.coordinator]
        if ask.ended or ask not in query.asks or not coordinator.up or coordinator.boot != query.boot:
            return  # settled within the delay, or its coordinator is gone
        copy = query.attempts.hedged()
        local: _Served | None = None
        target: int | None = None
        while True:
            action = copy.next(query_clock(world.now), query.deadline)
            if isinstance(action, ServeHere):
                answer = self._read(coordinator, query, copy.spec)
                if isinstance(answer, _Served):
                    local = answer
                    break
                copy.refused(answer)
            elif isinstance(action, Forward):
                target = action.node_id
                break
            else:
                break  # a copy with nowhere to go leaves the partition to the forward already sent
        if (local is None and target is None) or not coordinator.hedging.take():
            return
        hedge_to = coordinator.id if target is None else target
        world.checker.hedged(
            query.id,
            ask.node_id,
            hedge_to,
            hedges_before=ask.hedges,
            waited_ms=self._now_ms() - ask.sent_ms,
            delay_ms=ask.delay_ms,
            policy=coordinator.hedging,
            forwards=coordinator.forwards,
        )
        ask.hedges += 1
        world.stats.hedged += 1
        world.note(f"query {query.id} at {coordinator.id}: its forward to {ask.node_id} hedged to {hedge_to}")
        if local is not None:
            query.asks = []  # the forward runs on to its own end, its peer slow meanwhile
            self._deliver(query, local, hedge=True)
        else:
            query.asks.append(self._send(query, hedge_to, copy, hedge=True))

    def serve(self, node: Node, ask: _Ask) -> None:
        """The serving side of a forward: answer from the local replica, or send the refusal back (a
        server that is down refuses the connection)."""
        world = self.world
        if ask.ended:
            return  # the coordinator gave up on this forward: what the server reads is dropped
        reply: PartitionQueryResponse | _Served | str
        if not node.up:
            reply = "unreachable (connection refused)"
        else:
            reply = self._read(node, ask.query, ask.attempts.spec)
        later = world.now + self.rng.randint(0, world.profile.delay_max_ms)
        world.kernel.schedule(later, QUERY_REPLY, ask.query.coordinator, (ask, reply))

    def replied(self, ask: _Ask, reply: PartitionQueryResponse | _Served | str) -> None:
        """An answer, a refusal, a failure or the forward's timeout reached the coordinator (`_asked`, and
        `_race` when the forward was hedged)."""
        if ask.ended:
            return  # whatever else comes of this forward is void
        ask.ended = True
        ask.policy.done(ask.node_id, ask.request_id, self._now_ms(), answered=not isinstance(reply, str))
        query = ask.query
        coordinator = self.world.nodes[query.coordinator]
        if not coordinator.up or coordinator.boot != query.boot:
            return
        if ask not in query.asks:
            # A forward left running after its hedge won (or a hedge cancelled): the slower copy, dropped.
            if isinstance(reply, _Served):
                self.world.stats.late_answers += 1
            return
        query.asks.remove(ask)
        if isinstance(reply, _Served):
            for other in query.asks:
                if other.hedge:
                    self._cancel(other)  # a hedge outrun: cancelled; a forward outrun runs on
            query.asks = []
            self._deliver(query, reply, hedge=ask.hedge)
            return
        if isinstance(reply, str):
            ask.attempts.failed(reply)
        else:
            ask.attempts.refused(reply)
        if not query.asks:
            # Neither copy answered: the partition goes on from the forward's candidate.
            self._step(query)

    def _cancel(self, ask: _Ask) -> None:
        ask.ended = True
        ask.policy.done(ask.node_id, ask.request_id, self._now_ms(), answered=False)

    def _deliver(self, query: _Query, served: _Served, *, hedge: bool) -> None:
        """The coordinator's answer to the client."""
        self.world.checker.delivered(query.id, served.node_id, query.key, served.value)
        query.done = True
        spec = query.spec
        stats = self.world.stats
        stats.answered += 1
        if hedge:
            stats.hedge_won += 1
        if served.by_standby:
            stats.answered_by_standby += 1
        if spec.max_lag is not None:
            stats.answered_bounded += 1
        if spec.min_position:
            stats.answered_with_token += 1

    def retry(self, query: _Query) -> None:
        """The query's next round after a wait for its token, freshly routed by its coordinator."""
        coordinator = self.world.nodes[query.coordinator]
        if not coordinator.up or coordinator.boot != query.boot:
            return
        route_ = self._route(coordinator, query.spec.max_lag, query.hedge)
        query.attempts = query.attempts.again(route_)
        self._step(query)

    def _read(
        self, node: Node, query: _Query, spec: PartitionQueryRequest
    ) -> PartitionQueryResponse | _Served:
        """server/serving.py's local read of `spec` (the query's partition as the coordinator sent it): the
        refusal, or the answer, checked as it is read against what the client asked (`query.spec`), so a
        copy that lost the bound or token on its way (a hedge's, a later round's) is caught."""
        world = self.world
        core, witness = node.core, node.witness
        if core is None or witness is None:
            return PartitionQueryResponse(
                ReplicaError.UNKNOWN_PARTITION, f"server {node.id} holds no replica"
            )
        lag = world.lag_rule(core, witness, node.lags, node.id)
        refusal = bound_refusal(spec.max_lag, lag)
        if refusal is not None:
            if lag is None:
                world.stats.lag_unknown += 1
            return PartitionQueryResponse(ReplicaError.LAG_OVER_BOUND, refusal)
        behind = token_refusal(core, spec.min_position)
        if behind is not None:
            return PartitionQueryResponse(*behind)
        key, asked = query.key, query.spec
        value = node.store.data.get(key)
        world.checker.answer(node, key, asked.max_lag, value, asked.min_position)
        return _Served(node.id, value, node.id != world.controller.active)
