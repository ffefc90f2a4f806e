"""The replication simulator's clients and the servers' routing state.

Writers send upserts with acks=all to the active (or, now and then, to whoever a stale view names).
Every server heartbeats the others and reports its replica's lag; clients send pull queries to any server,
which routes them with the real heartbeat status, lag table, router and lag rules (`routing/`). All of this
draws from the world's query stream, so the replicas run as they would without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hotstate.log.batch import RecordBatch
from hotstate.replica.messages import FetchResponse, LagInfo, ReplicaError, ReplicaMessage
from hotstate.routing.freshness import (
    UNKNOWN_LAG_REASON,
    bound_refusal,
    lag_report,
    replica_state,
)
from hotstate.routing.router import Candidate, route
from hotstate.sim.replication.invariants import ReplicationInvariantViolation
from hotstate.sim.replication.profile import (
    LAG_ARRIVE,
    QUERY_ATTEMPT_MS,
    QUERY_BOUNDS,
    QUERY_NEXT,
    SERVE,
    TABLE,
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
    """One pull query of a key, on its way through the candidates its coordinator routed it to."""

    coordinator: int
    boot: int
    key: bytes
    max_lag: int | None
    candidates: tuple[Candidate, ...]
    index: int = -1


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
        """A client asks a running server for one key, with a staleness bound or none."""
        world = self.world
        up = [n for n in world.nodes.values() if n.up and n.info is not None and n.status is not None]
        if not up:
            return
        coordinator = self.rng.choice(up)
        assert coordinator.info is not None and coordinator.status is not None
        key = f"k{self.rng.randrange(12)}".encode()
        max_lag = self.rng.choice(QUERY_BOUNDS)
        decision = route(
            coordinator.info,
            table=TABLE,
            alive=coordinator.status.alive,
            lags=coordinator.lags,
            local_node=coordinator.id,
            max_lag=max_lag,
        )
        world.stats.queries += 1
        world.stats.lag_unknown += sum(1 for skip in decision.skipped if skip.reason == UNKNOWN_LAG_REASON)
        self._next_candidate(_Query(coordinator.id, coordinator.boot, key, max_lag, decision.candidates))

    def next_candidate(self, query: _Query) -> None:
        coordinator = self.world.nodes[query.coordinator]
        if coordinator.up and coordinator.boot == query.boot:
            self._next_candidate(query)

    def _next_candidate(self, query: _Query) -> None:
        """Tries the query's next candidate: at once when it is the coordinator, else over the network."""
        world = self.world
        query.index += 1
        if query.index >= len(query.candidates):
            world.stats.unserved += 1
            return
        target = world.nodes[query.candidates[query.index].node_id]
        if target.id == query.coordinator:
            self.serve(target, query)
        elif world.kernel.cut(query.coordinator, target.id) or self.rng.random() < world.profile.drop:
            world.kernel.schedule(world.now + QUERY_ATTEMPT_MS, QUERY_NEXT, query.coordinator, query)
        else:
            later = world.now + self.rng.randint(0, world.profile.delay_max_ms)
            world.kernel.schedule(later, SERVE, target.id, (query,))

    def serve(self, node: Node, query: _Query) -> None:
        """The serving side (server/serving.py): answer from the local replica, or refuse."""
        world = self.world
        core, witness = node.core, node.witness
        if not node.up:
            world.kernel.schedule(world.now + QUERY_ATTEMPT_MS, QUERY_NEXT, query.coordinator, query)
            return
        refusal = "no replica here"
        if core is not None and witness is not None:
            lag = world.lag_rule(core, witness, node.lags, node.id)
            refusal = bound_refusal(query.max_lag, lag) or ""
            if not refusal:
                self._answered(node, query, node.store.data.get(query.key))
                return
            if lag is None:
                world.stats.lag_unknown += 1
        if node.id == query.coordinator:
            self._next_candidate(query)
        else:
            later = world.now + self.rng.randint(0, world.profile.delay_max_ms)
            world.kernel.schedule(later, QUERY_NEXT, query.coordinator, query)

    def _answered(self, node: Node, query: _Query, value: bytes | None) -> None:
        world = self.world
        stats = world.stats
        stats.answered += 1
        world.checker.answer(node, query.key, query.max_lag, value)
        if node.id != world.controller.active:
            stats.answered_by_standby += 1
        if query.max_lag is not None:
            stats.answered_bounded += 1
