"""The replication simulator's clients and the servers' routing state.

Writers send upserts with acks=all to the active (or, now and then, to whoever a stale view names).
Every server heartbeats the others and reports its replica's lag; clients send pull queries to any server,
which routes them with the real heartbeat status, lag table, router and lag rules (`routing/`), and drives
each query's `Attempts` (routing/attempts.py) as the coordinator's shell (server/coordinator.py) does for
one partition: read here, forward with the attempt's timeout, wait for the query's token, or give up. All
of this draws from the world's query stream, so it changes none of the replicas' random choices.
"""

from __future__ import annotations

from dataclasses import dataclass
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
from hotstate.routing.router import Route, route
from hotstate.sim.replication.invariants import ReplicationInvariantViolation
from hotstate.sim.replication.profile import (
    LAG_ARRIVE,
    PARTITION_ID,
    QUERY_BOUNDS,
    QUERY_REPLY,
    QUERY_RETRY,
    SERVE,
    TABLE,
    TOKEN_QUERIES,
    query_clock,
    sim_ms,
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


@dataclass
class _Query:
    """One pull query of a key, its partition's attempts driven by the real state machine."""

    coordinator: int
    boot: int
    key: bytes
    attempts: Attempts
    deadline: float  # on the query clock
    attempt: int = 0  # the forward under way: a reply or timeout of an earlier one is void
    done: bool = False


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
        spec = PartitionQueryRequest(
            TABLE, PARTITION_ID, (key,), False, None, None, None, max_lag, min_position
        )
        decision = self._route(coordinator, max_lag)
        world.stats.queries += 1
        attempts = Attempts(PARTITION_ID, spec, decision, coordinator.id)
        deadline = query_clock(world.now) + DEFAULT_TIMEOUT_MS / 1000
        self._step(_Query(coordinator.id, coordinator.boot, key, attempts, deadline))

    def _route(self, coordinator: Node, max_lag: int | None) -> Route:
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
        return decision

    def _step(self, query: _Query) -> None:
        """The coordinator does what the query's attempts say next (server/coordinator.py's shell, one
        partition): read here, forward, wait for the token, or give up."""
        world = self.world
        attempts = query.attempts
        coordinator = world.nodes[query.coordinator]
        while True:
            action = attempts.next(query_clock(world.now), query.deadline)
            if isinstance(action, ServeHere):
                answer = self._read(coordinator, query)
                if answer is None:
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
        """Sends the partition to `node_id`, and gives it up when no answer came within the attempt's
        timeout (routing/attempts.attempt_timeout, as the coordinator's)."""
        world = self.world
        query.attempt += 1
        connected = not world.kernel.cut(query.coordinator, node_id)
        remaining = query.deadline - query_clock(world.now)
        timeout = attempt_timeout([query.attempts], remaining, connected)
        world.kernel.schedule(
            world.now + sim_ms(timeout), QUERY_REPLY, query.coordinator, (query, query.attempt, "timed out")
        )
        if connected and self.rng.random() >= world.profile.drop:
            later = world.now + self.rng.randint(0, world.profile.delay_max_ms)
            world.kernel.schedule(later, SERVE, node_id, (query, query.attempt))

    def serve(self, node: Node, query: _Query, attempt: int) -> None:
        """The serving side of a forward: answer from the local replica, or send the refusal back (a
        server that is down refuses the connection)."""
        world = self.world
        if query.done or attempt != query.attempt:
            return  # the coordinator gave up on this forward: what the server reads is dropped
        if not node.up:
            reply: PartitionQueryResponse | str = "unreachable (connection refused)"
        else:
            answer = self._read(node, query)
            if answer is None:
                return
            reply = answer
        later = world.now + self.rng.randint(0, world.profile.delay_max_ms)
        world.kernel.schedule(later, QUERY_REPLY, query.coordinator, (query, attempt, reply))

    def replied(self, query: _Query, attempt: int, reply: PartitionQueryResponse | str) -> None:
        """A refusal, a failure or the attempt's timeout reached the coordinator."""
        coordinator = self.world.nodes[query.coordinator]
        if query.done or attempt != query.attempt or not coordinator.up or coordinator.boot != query.boot:
            return
        query.attempt += 1  # whatever else comes of this attempt is void
        if isinstance(reply, str):
            query.attempts.failed(reply)
        else:
            query.attempts.refused(reply)
        self._step(query)

    def retry(self, query: _Query) -> None:
        """The query's next round after a wait for its token, freshly routed by its coordinator."""
        coordinator = self.world.nodes[query.coordinator]
        if not coordinator.up or coordinator.boot != query.boot:
            return
        query.attempts = query.attempts.again(self._route(coordinator, query.attempts.spec.max_lag))
        self._step(query)

    def _read(self, node: Node, query: _Query) -> PartitionQueryResponse | None:
        """server/serving.py's local read: the refusal, or None once the node answered (checked)."""
        world = self.world
        spec = query.attempts.spec
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
        query.done = True
        value = node.store.data.get(query.key)
        stats = world.stats
        stats.answered += 1
        world.checker.answer(node, query.key, spec.max_lag, value, spec.min_position)
        if node.id != world.controller.active:
            stats.answered_by_standby += 1
        if spec.max_lag is not None:
            stats.answered_bounded += 1
        if spec.min_position:
            stats.answered_with_token += 1
        return None
