"""The deterministic simulator for partition replication: replica cores, the controller's rules, routing.

One partition, N replicas on a pool of N + 1 or N + 2 nodes, on the simulator kernel (`sim/kernel.py`).
Everything is drawn from the seed: message delays, drops, duplicates, network partitions (between nodes,
and between a node and the controller, which then fences a replica that is still running: a zombie
active), crashes that lose the write in flight (a restarted node registers again and is fenced first),
stale metadata (each node learns the controller's decisions after its own delay), store snapshots for
replicas that fall behind the log start, clients writing upserts with acks=all, and reassignments: the
controller draws a placement now and then and walks the partition towards it with the real controller's
`partition_step` (add the new replicas, let them join the ISR, move the active, drop the old copies). The
controller decides everything else with the real rules too: a new active when a server is fenced, an
offline partition's return and ISR changes (`controller/partition_rules.py`), fencing on a probe
(`controller/evidence.py`). A node holds a replica only while the metadata it last learned lists it, as the
real server does: it opens an empty one when it is added and deletes the replica's log and store when it
is removed. Every server heartbeats the others and reports its replica's lag, and clients send pull
queries to any server, which routes them with the real heartbeat status, lag table, router and lag rules
(`routing/`); those draw from their own random stream, so the replicas run as they would without them.

Invariants, checked after every event:
- one active per leader epoch, and only the one the controller chose;
- the committed ISR is a subset of the replicas and holds the active (checked at every commit);
- every replica of the controller's committed ISR holds every committed record (durably, unchanged):
  this is what makes an acknowledged write survive while any in-sync replica does;
- stores at equal positions are equal (each applied record is the one every other store applied there);
- no store holds a record above the highest HW an active ever reached;
- an acknowledged write's records are the committed records at its offsets;
- every query is answered by a replica within its bound, never from a store ahead of the HW: the store is
  at most at the highest HW and holds the committed value at its position, and a bounded read is served
  only by a replica that heard the partition's end since it opened (an active knows its own HW) and is
  within the bound of the highest committed end it heard.
After the faults stop (a reassignment under way is finished, none is started), every replica of the final
replica set must converge to the same store holding every acknowledged write, and no other node may hold
anything.

`python -m hotstate.sim.replication --seed N` replays one seed with its event log.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hotstate.assignor import Placement
from hotstate.controller.evidence import ProbeResult, fences_on_probe
from hotstate.controller.image import PartitionInfo
from hotstate.controller.partition_rules import IsrRefusal, alter_isr, elect_after_fence, elect_on_unfence
from hotstate.controller.reassign import partition_step
from hotstate.controller.records import PartitionAssignment, PartitionChange
from hotstate.log.batch import RecordBatch
from hotstate.replica.batchlog import BatchLogError
from hotstate.replica.core import (
    IsrChange,
    PartitionView,
    Ready,
    ReplicaConfig,
    ReplicaCore,
    ReplicaRole,
    ReplicaSafetyError,
    TruncateTo,
)
from hotstate.replica.messages import FetchResponse, LagInfo, ReplicaError, ReplicaMessage
from hotstate.routing.freshness import (
    UNKNOWN_LAG_REASON,
    EndWitness,
    bound_refusal,
    lag_report,
    replica_state,
    served_lag,
)
from hotstate.routing.heartbeat import HeartbeatConfig, HeartbeatStatus
from hotstate.routing.lags import LagTable
from hotstate.routing.router import Candidate, route
from hotstate.sim.disk import SimDiskLog, SimStore
from hotstate.sim.kernel import (
    CALM,
    CRASH,
    DELIVER,
    DISK_DONE,
    EVENT_KINDS_USED,
    HEAL,
    PARTITION,
    RESTART,
    TICK,
    Kernel,
    Link,
    SimFailure,
)

CoreFactory = Callable[..., ReplicaCore]
# The controller's rule for a probe's result (controller.evidence.fences_on_probe, or a broken one in tests).
FenceRule = Callable[..., bool]
# The controller's choice of a new active when a server is fenced (partition_rules.elect_after_fence).
ElectRule = Callable[..., PartitionChange | None]
# A serving replica's lag for a query's bound, None when unknown (routing.freshness.served_lag).
LagRule = Callable[[ReplicaCore, EndWitness, LagTable, int], int | None]

(
    _PRODUCE,
    _META,
    _ISR,
    _SNAP,
    _REASSIGN,
    _PROBE,
    _PROBED,
    _BEAT,
    _BEAT_CHECK,
    _LAG_REPORTS,
    _LAG_ARRIVE,
    _QUERY,
    _SERVE,
    _QUERY_NEXT,
) = range(EVENT_KINDS_USED, EVENT_KINDS_USED + 14)
SESSION_TIMEOUT_MS = 300
TABLE_ID, PARTITION_ID = 1, 0  # the one partition simulated
TABLE = "t"
# The servers' failure detection, scaled down with the rest of the simulated timeouts.
HEARTBEATS = HeartbeatConfig(send_interval_ms=20, check_interval_ms=40, window_ms=400)
# A forward to a server that does not answer is given up after this long.
QUERY_ATTEMPT_MS = 30
# Query bounds: unbounded (None) reads may use a replica of unknown lag, bounded ones never.
QUERY_BOUNDS = (None, None, 0, 0, 0, 3, 30)


class ReplicationInvariantViolation(Exception):
    pass


# A run broke an invariant (or a core raised): the kernel's failure, with the command that replays it.
ReplicationSimFailure = SimFailure


@dataclass(frozen=True, slots=True)
class ReplicationProfile:
    replicas: int
    min_insync: int
    chaos_ms: int
    calm_ms: int
    delay_max_ms: int
    drop: float
    duplicate: float
    crash_every_ms: int
    down_max_ms: int
    partition_every_ms: int
    partition_max_ms: int
    produce_every_ms: int
    disk_max_ms: int
    meta_delay_max_ms: int
    config: ReplicaConfig
    spares: int = 0  # nodes of the pool beyond the initial replicas: where reassignments can move to
    reassign_every_ms: int = 0  # mean gap between the controller's reassignment ticks (0: never)
    # Fast fencing (controller.evidence): a hint makes the controller probe a node, whose result it acts on
    # up to this long later. 0: the controller fences on session expiry only.
    probe_delay_max_ms: int = 0
    # Pull queries through the real router, heartbeat status and lag rules (0: none).
    query_every_ms: int = 0
    lag_report_every_ms: int = 100

    @staticmethod
    def from_seed(seed: int) -> ReplicationProfile:
        rng = random.Random(f"replication-profile/{seed}")
        replicas = rng.choice([2, 3, 3, 4])
        profile = ReplicationProfile(
            replicas=replicas,
            min_insync=rng.randint(1, min(2, replicas)),
            chaos_ms=rng.choice([2000, 3000]),
            calm_ms=6000,
            delay_max_ms=rng.choice([2, 10, 40]),
            drop=rng.choice([0.0, 0.02, 0.1]),
            duplicate=rng.choice([0.0, 0.05]),
            crash_every_ms=rng.choice([0, 300, 800]),
            down_max_ms=rng.choice([50, 400, 1200]),
            partition_every_ms=rng.choice([0, 500, 1200]),
            partition_max_ms=rng.choice([200, 800]),
            produce_every_ms=rng.choice([5, 15, 40]),
            disk_max_ms=rng.choice([0, 2, 8]),
            meta_delay_max_ms=rng.choice([1, 30, 150]),
            config=ReplicaConfig(  # min_insync_replicas is set from min_insync below
                fetch_max_wait_ms=rng.choice([20, 100]),
                fetch_max_bytes=rng.choice([1000, 8000, 1 << 20]),
                fetch_timeout_ms=rng.choice([150, 400]),
                fetch_backoff_ms=rng.choice([5, 30]),
                replica_lag_time_max_ms=rng.choice([150, 500, 2000]),
                isr_change_retry_ms=rng.choice([50, 300]),
                min_insync_replicas=1,
                log_retention_records=rng.choice([5, 40, 100_000]),
            ),
        )
        config = dataclasses.replace(profile.config, min_insync_replicas=profile.min_insync)
        # Drawn after everything else, so every other choice of a seed is what it was before reassignments.
        return dataclasses.replace(
            profile,
            config=config,
            spares=rng.choice([1, 2]),
            reassign_every_ms=rng.choice([0, 80, 200, 500]),
            probe_delay_max_ms=rng.choice([0, 5, 40]),
            query_every_ms=rng.choice([4, 15]),
            lag_report_every_ms=rng.choice([30, 100]),
        )


@dataclass
class Node:
    """One server of the pool: its disk outlives crashes; it holds a replica only while assigned one."""

    id: int
    disk: SimDiskLog = field(default_factory=SimDiskLog)
    store: SimStore = field(default_factory=SimStore)
    core: ReplicaCore | None = None
    up: bool = True
    boot: int = 0  # the server process: metadata sent to an earlier one is lost with it
    incarnation: int = 0  # the replica core: disk writes, snapshots and produces of an earlier one are void
    meta_epoch: int = 0  # newest partition epoch this process learned: only newer metadata adds or removes
    writing: Ready | None = None
    tick_at: int | None = None
    cut_from_controller: bool = False
    # The server's routing state, lost with its process: the newest metadata it learned, its heartbeat
    # status of the other servers, the lag reports it holds.
    info: PartitionInfo | None = None
    status: HeartbeatStatus | None = None
    lags: LagTable = field(default_factory=LagTable)
    witness: EndWitness | None = None  # what the open core heard of the partition's end
    # The invariants' record of the committed offsets the replica heard of since it opened: the HWs in the
    # fetch answers its core took, and in the newest report of each other server (arrival, HW or None).
    opened_at: int = 0
    heard_hw: int | None = None
    report_hws: dict[int, tuple[int, int | None]] = field(default_factory=dict)


@dataclass
class ControllerModel:
    """The metadata the controller commits for the partition (the real one: QuorumController)."""

    replicas: tuple[int, ...]
    active: int | None
    leader_epoch: int
    isr: tuple[int, ...]
    partition_epoch: int = 1
    warmups: tuple[int, ...] = ()
    fenced: set[int] = field(default_factory=set)
    last_heartbeat: dict[int, int] = field(default_factory=dict)
    # The process (boot count) each node last registered or heartbeat as: its incarnation.
    registered: dict[int, int] = field(default_factory=dict)
    # The replica's log end each node reported in its last heartbeat, keyed as the real controller keys them:
    # the input for choosing a new active.
    replica_ends: dict[tuple[int, int, int], int] = field(default_factory=dict)

    def view(self) -> PartitionView:
        return PartitionView(self.active, self.leader_epoch, self.isr, self.replicas, self.partition_epoch)

    def info(self) -> PartitionInfo:
        return PartitionInfo(
            TABLE_ID,
            PARTITION_ID,
            self.replicas,
            self.active,
            self.warmups,
            self.leader_epoch,
            self.isr,
            self.partition_epoch,
        )


@dataclass
class Stats:
    seed: int
    acked: int = 0
    produce_errors: int = 0
    committed_end: int = 0
    actives: int = 0
    snapshots: int = 0
    reassign_steps: int = 0  # PartitionAssignment records committed
    moves_done: int = 0  # placements reached that took at least one record
    multi_step_moves: int = 0  # of those, the ones that took more than one record
    # Of those, the whole KIP-441 walk: a new replica added, in sync, made the active, an old copy dropped.
    full_moves: int = 0
    active_moves: int = 0  # reassignment records that moved the active
    replicas_removed: int = 0  # replicas a node deleted on learning it no longer holds one
    probe_fences: int = 0  # fences on a refused probe, before the session expired
    queries: int = 0
    answered: int = 0
    answered_bounded: int = 0  # of those, reads with a bound (a staleness check passed)
    answered_by_standby: int = 0
    lag_unknown: int = 0  # candidates skipped or refused because their lag could not be known
    unserved: int = 0  # queries no candidate could answer
    log: list[str] = field(default_factory=list)


@dataclass
class _Query:
    """One pull query of a key, on its way through the candidates its coordinator routed it to."""

    coordinator: int
    boot: int
    key: bytes
    max_lag: int | None
    candidates: tuple[Candidate, ...]
    index: int = -1


@dataclass
class _Move:
    """What the steps towards one placement did so far."""

    steps: int = 0
    added: set[int] = field(default_factory=set)
    removed: set[int] = field(default_factory=set)
    active_to_added: bool = False  # the active moved to a replica this move added (once it was in sync)


class ReplicationWorld:
    def __init__(
        self,
        seed: int,
        profile: ReplicationProfile,
        *,
        core_factory: CoreFactory = ReplicaCore,
        fence_rule: FenceRule = fences_on_probe,
        elect_rule: ElectRule = elect_after_fence,
        lag_rule: LagRule = served_lag,
        trace: bool = False,
    ) -> None:
        self.seed = seed
        self.profile = profile
        self.core_factory = core_factory
        self.fence_rule = fence_rule
        self.elect_rule = elect_rule
        self.lag_rule = lag_rule
        self.trace = trace
        broken = getattr(core_factory, "rule", None)
        replay = f"python -m hotstate.sim.replication --seed {seed}" + (
            f" --broken {broken}" if broken else ""
        )
        self.kernel = Kernel(seed, "replication-world", replay)
        self.rng = self.kernel.rng
        # Probes draw from their own stream, so a seed without them runs exactly as before they existed.
        self.probe_rng = self.kernel.stream("replication-probes")
        # So do heartbeats, lag reports and queries: they read the replicas and change nothing in them.
        self.query_rng = self.kernel.stream("replication-queries")
        ids = tuple(range(1, profile.replicas + 1))
        self.nodes = {i: Node(i) for i in range(1, profile.replicas + profile.spares + 1)}
        self.controller = ControllerModel(ids, ids[0], 0, ids)
        self.stats = Stats(seed)
        self._calm = False
        self._value = 0
        self._produce_tokens: dict[tuple[int, int, int], tuple[RecordBatch | None, tuple[bytes, ...]]] = {}
        # The reassignment under way: the placement the controller walks the partition towards.
        self._desired: Placement | None = None
        self._move = _Move()
        # The invariants' memory.
        self.committed: list[bytes] = []  # committed[o] = the record every store applies at offset o
        self.max_hw = 0
        self.epoch_leaders: dict[int, int] = {}
        self.acked: list[tuple[int, tuple[bytes, ...]]] = []
        # key -> [(offset, value)] of the committed records: what a store at a position holds for a key.
        self.key_history: dict[bytes, list[tuple[int, bytes]]] = {}

    # ------------------------------------------------------------------ running
    def run(self) -> Stats:
        profile = self.profile
        for node in self.nodes.values():
            self._boot(node)
        self.kernel.schedule(profile.chaos_ms, CALM, 0, None)
        self.kernel.schedule(1, _PRODUCE, 0, None)
        if profile.crash_every_ms:
            self.kernel.schedule(self.kernel.gap(profile.crash_every_ms), CRASH, 0, None)
        if profile.partition_every_ms:
            self.kernel.schedule(self.kernel.gap(profile.partition_every_ms), PARTITION, 0, None)
        if profile.reassign_every_ms:
            self.kernel.schedule(self.kernel.gap(profile.reassign_every_ms), _REASSIGN, 0, None)
        if profile.query_every_ms:
            self.kernel.schedule(HEARTBEATS.send_interval_ms, _BEAT, 0, None)
            self.kernel.schedule(HEARTBEATS.check_interval_ms, _BEAT_CHECK, 0, None)
            self.kernel.schedule(profile.lag_report_every_ms, _LAG_REPORTS, 0, None)
            self.kernel.schedule(1 + self.query_rng.randrange(profile.query_every_ms), _QUERY, 0, None)
        end = profile.chaos_ms + profile.calm_ms
        try:
            self.kernel.run(end, self._handle, after=self._after_event)
            self._check_converged()
        # BatchLogError: the core asked its log for a gap or an older epoch after a newer one.
        except (ReplicationInvariantViolation, ReplicaSafetyError, BatchLogError, AssertionError) as error:
            raise self.kernel.failure(error) from error
        self.stats.committed_end = len(self.committed)
        return self.stats

    @property
    def now(self) -> int:
        return self.kernel.now

    def _after_event(self) -> None:
        self._controller_tick()
        self._check()

    def _note(self, text: str) -> None:
        if self.trace:
            self.stats.log.append(f"{self.now:6d} {text}")

    def _handle(self, kind: int, target: int, payload: Any) -> None:
        node = self.nodes.get(target)
        if kind == DELIVER:
            message: ReplicaMessage = payload
            destination = self.nodes[message.dst]
            if destination.core is not None:
                destination.core.step(message, self.now)
                self._heard(destination, message)
                self._pump(destination)
        elif kind == TICK:
            assert node is not None
            if node.core is not None and node.tick_at == self.now:
                node.tick_at = None
                node.core.tick(self.now)
                self._pump(node)
        elif kind == DISK_DONE:
            assert node is not None
            if node.core is not None and node.incarnation == payload:
                self._finish_write(node)
        elif kind == _META:
            assert node is not None
            boot, info = payload
            if node.up and node.boot == boot:
                self._on_metadata(node, info)
        elif kind == _ISR:
            self._on_isr_change(target, payload)
        elif kind == _SNAP:
            assert node is not None
            self._finish_snapshot(node, payload)
        elif kind == CRASH:
            if not self._calm:
                self._crash_someone()
                self.kernel.schedule(self.now + self.kernel.gap(self.profile.crash_every_ms), CRASH, 0, None)
        elif kind == RESTART:
            assert node is not None
            if not node.up:
                self._boot(node)
        elif kind == PARTITION:
            if not self._calm:
                self._make_partition()
                self.kernel.schedule(
                    self.now + self.kernel.gap(self.profile.partition_every_ms), PARTITION, 0, None
                )
        elif kind == HEAL:
            self._heal()
        elif kind == _PRODUCE:
            self._produce()
            if self.now < self.profile.chaos_ms + 1000:
                self.kernel.schedule(
                    self.now + self.kernel.gap(self.profile.produce_every_ms), _PRODUCE, 0, None
                )
        elif kind == _REASSIGN:
            self._reassign()
            # In the calm no new placement is drawn, but the one under way is walked to its end.
            if not self._calm or self._desired is not None:
                self.kernel.schedule(
                    self.now + self.kernel.gap(self.profile.reassign_every_ms), _REASSIGN, 0, None
                )
        elif kind == _PROBE:
            self._probe(target, payload)
        elif kind == _PROBED:
            self._on_probe(target, *payload)
        elif kind == _BEAT:
            self._heartbeats()
            self.kernel.schedule(self.now + HEARTBEATS.send_interval_ms, _BEAT, 0, None)
        elif kind == _BEAT_CHECK:
            for n in self.nodes.values():
                if n.up and n.status is not None:
                    n.status.check(self.now)
            self.kernel.schedule(self.now + HEARTBEATS.check_interval_ms, _BEAT_CHECK, 0, None)
        elif kind == _LAG_REPORTS:
            self._lag_reports()
            self.kernel.schedule(self.now + self.profile.lag_report_every_ms, _LAG_REPORTS, 0, None)
        elif kind == _LAG_ARRIVE:
            assert node is not None
            self._on_lag_report(node, *payload)
        elif kind == _QUERY:
            self._query()
            gap = 1 + self.query_rng.randrange(2 * self.profile.query_every_ms)
            self.kernel.schedule(self.now + gap, _QUERY, 0, None)
        elif kind == _SERVE:
            assert node is not None
            self._serve(node, *payload)
        elif kind == _QUERY_NEXT:
            query: _Query = payload
            coordinator = self.nodes[query.coordinator]
            if coordinator.up and coordinator.boot == query.boot:
                self._next_candidate(query)
        elif kind == CALM:
            self._calm = True
            self._heal()
            for n in self.nodes.values():
                if not n.up:
                    self._boot(n)

    # ------------------------------------------------------------------ nodes and their replicas
    def _boot(self, node: Node) -> None:
        """The server (re)starts: it opens its replica once the metadata says it has one (as on_image)."""
        node.up = True
        node.boot += 1
        node.meta_epoch = 0
        node.info = None
        node.status = HeartbeatStatus(node.id, HEARTBEATS, self.now)
        # Every node of the pool is a registered server of the image.
        node.status.set_peers((n for n in self.nodes if n != node.id), self.now)
        node.lags = LagTable()
        node.report_hws = {}
        self.controller.last_heartbeat[node.id] = self.now
        self._note(f"node {node.id} starts: store at {node.store.position}, log end {node.disk.end}")
        if node.boot > 1 and not node.cut_from_controller and node.id not in self.controller.fenced:
            # It registers again, and the controller fences a restarted server before anything else (as
            # QuorumController._register): it must not lead again in the epoch of its previous process,
            # whose requests (an ISR change the new process knows nothing of) may still be on their way.
            self._fence(node.id)
        self._publish_to(node)

    def _on_metadata(self, node: Node, info: PartitionInfo) -> None:
        view = PartitionView(info.active, info.leader_epoch, info.isr, info.replicas, info.partition_epoch)
        if node.info is None or info.partition_epoch > node.info.partition_epoch:
            node.info = info
        if view.partition_epoch > node.meta_epoch:
            node.meta_epoch = view.partition_epoch
            if node.id in view.replicas:
                if node.core is None:
                    self._open(node)
            else:
                self._remove(node)
        # An older view still reaches an open core (metadata arrives out of order): it must ignore it.
        if node.core is not None:
            node.core.set_metadata(view, self.now)
            self._pump(node)

    def _open(self, node: Node) -> None:
        node.incarnation += 1
        node.core = self.core_factory(
            node.id,
            TABLE_ID,
            PARTITION_ID,
            self.profile.config,
            log=node.disk.load(),
            store_position=node.store.position,
            store_epoch=node.store.epoch,
            now=self.now,
        )
        node.writing = None
        node.tick_at = None
        node.witness = EndWitness(self.now)
        node.opened_at = self.now
        node.heard_hw = None
        self._note(f"replica {node.id} opens: store at {node.store.position}, log end {node.disk.end}")

    def _remove(self, node: Node) -> None:
        """The node learned it holds no replica: close it and delete its log and store."""
        if node.core is None and not node.disk.end and not node.store.position:
            return
        self.stats.replicas_removed += 1
        self._note(f"replica {node.id} removed: its log and store are deleted")
        node.core = None
        node.witness = None
        node.incarnation += 1  # what the closed core had in flight never lands
        node.writing = None
        node.tick_at = None
        node.disk = SimDiskLog()
        node.store = SimStore()

    def _crash(self, node: Node, down_ms: int) -> None:
        self._note(f"node {node.id} crashes for {down_ms} ms")
        node.up = False
        node.core = None
        node.witness = None
        node.writing = None
        node.tick_at = None
        self.kernel.schedule(self.now + down_ms, RESTART, node.id, None)
        self._hint(node.id)  # its connections close: the controller hears of it at once

    def _crash_someone(self) -> None:
        up = [n for n in self.nodes.values() if n.up]
        if not up:
            return
        active = self.controller.active
        if active is not None and self.rng.random() < 0.5 and self.nodes[active].up:
            victim = self.nodes[active]
        else:
            victim = self.rng.choice(up)
        self._crash(victim, self.rng.randint(1, self.profile.down_max_ms))

    def _pump(self, node: Node) -> None:
        core = node.core
        if core is None or node.writing is not None:
            self._arm_tick(node)
            return
        ready = core.ready()
        if ready.is_empty():
            self._arm_tick(node)
            return
        node.writing = ready
        if ready.log_ops and self.profile.disk_max_ms:
            self.kernel.schedule(
                self.now + self.rng.randint(0, self.profile.disk_max_ms),
                DISK_DONE,
                node.id,
                node.incarnation,
            )
        else:
            self._finish_write(node)

    def _finish_write(self, node: Node) -> None:
        ready = node.writing
        core = node.core
        assert ready is not None and core is not None
        if core.role is ReplicaRole.LEADER:
            self.max_hw = max(self.max_hw, ready.high_watermark)
        for op in ready.log_ops:
            if isinstance(op, TruncateTo) and op.offset < node.store.position:
                raise ReplicationInvariantViolation(
                    f"replica {node.id} truncates to {op.offset}, below its store position "
                    f"{node.store.position}"
                )
            node.disk.apply(op)
        for message in ready.messages:
            self._send(node.id, message)
        for result in ready.produce_results:
            self._on_produce_result(node, result)
        for batch in ready.committed:
            if batch.next_offset <= node.store.position:
                continue
            if batch.base_offset != node.store.position:
                raise ReplicationInvariantViolation(
                    f"replica {node.id} applies {batch.base_offset} but its store is at {node.store.position}"
                )
            node.store.apply(batch)
            self._check_applied(node, batch)
        if ready.isr_change is not None:
            self._send_isr_change(node.id, ready.isr_change)
        if ready.snapshot_needed is not None:
            self.kernel.schedule(
                self.now + self.rng.randint(1, 20),
                _SNAP,
                node.id,
                (node.incarnation, ready.snapshot_needed),
            )
        node.writing = None
        core.advance(ready)
        self._pump(node)

    def _arm_tick(self, node: Node) -> None:
        core = node.core
        if core is None:
            return
        deadline = core.next_deadline()
        if deadline is None:
            deadline = self.now + 100
        deadline = max(deadline, self.now + 1)
        if node.tick_at is None or deadline < node.tick_at:
            node.tick_at = deadline
            self.kernel.schedule(deadline, TICK, node.id, None)

    def _finish_snapshot(self, node: Node, payload: Any) -> None:
        incarnation, needed = payload
        if node.core is None or node.incarnation != incarnation:
            return
        leader = self.nodes[needed.leader]
        if (
            leader.core is None
            or leader.core.role is not ReplicaRole.LEADER
            or leader.core.leader_epoch != needed.leader_epoch
            or self.kernel.cut(leader.id, node.id)
        ):
            node.core.snapshot_failed(self.now)
        else:
            snapshot = leader.store.copy()
            if snapshot.position < node.store.position:
                node.core.snapshot_failed(self.now)
            else:
                self.stats.snapshots += 1
                self._note(f"replica {node.id} installs a snapshot at {snapshot.position} from {leader.id}")
                node.store = snapshot
                node.core.snapshot_installed(snapshot.position, snapshot.epoch, self.now)
        self._pump(node)

    # ------------------------------------------------------------------ network
    def _send(self, src: int, message: ReplicaMessage) -> None:
        profile = self.profile
        link = Link(profile.drop, profile.duplicate, 0, profile.delay_max_ms)
        self.kernel.send(src, message.dst, DELIVER, 0, message, link)

    def _make_partition(self) -> None:
        ids = list(self.nodes)
        if self.rng.random() < 0.3:
            # Cut one node off from the controller only: it is fenced while it keeps running.
            victim = self.nodes[self.rng.choice(ids)]
            victim.cut_from_controller = True
            self._note(f"node {victim.id} cut off from the controller")
            self._hint(victim.id)  # hearsay: a peer tells the controller it lost the node
        else:
            self.kernel.partition = {i: self.rng.randint(0, 1) for i in ids}
            self._note(f"network partition {self.kernel.partition}")
            for i in ids:
                self._hint(i)  # every node lost someone: hearsay about each of them
        self.kernel.schedule(self.now + self.rng.randint(50, self.profile.partition_max_ms), HEAL, 0, None)

    def _heal(self) -> None:
        self.kernel.partition = None
        for n in self.nodes.values():
            if n.cut_from_controller:
                n.cut_from_controller = False
                self._publish_to(n)  # it catches up on the metadata log it missed

    # ------------------------------------------------------------------ controller model
    def _controller_tick(self) -> None:
        c = self.controller
        # Every running server heartbeats, with or without a replica (a spare is fenced and unfenced too:
        # it changes nothing unless it is in the ISR, and the ISR refuses to take it in while fenced).
        for node in self.nodes.values():
            if node.up and not node.cut_from_controller:
                c.last_heartbeat[node.id] = self.now
                c.registered[node.id] = node.boot
                # A heartbeat reports the replica's log end, or no replica (as QuorumController._heartbeat).
                if node.core is None:
                    c.replica_ends.pop((TABLE_ID, PARTITION_ID, node.id), None)
                else:
                    c.replica_ends[(TABLE_ID, PARTITION_ID, node.id)] = node.core.log_end_offset
                if node.id in c.fenced:
                    self._unfence(node.id)
            elif node.id not in c.fenced and self.now - c.last_heartbeat.get(node.id, 0) > SESSION_TIMEOUT_MS:
                self._fence(node.id)

    def _hint(self, node: int) -> None:
        """The controller hears that `node` may be gone and probes it (server.suspects) a moment later."""
        delay_max = self.profile.probe_delay_max_ms
        if delay_max:
            incarnation = self.controller.registered.get(node, 0)
            self.kernel.schedule(self.now + self.probe_rng.randint(1, delay_max), _PROBE, node, incarnation)

    def _probe(self, node_id: int, incarnation: int) -> None:
        """One connect to the node: refused when its process is down, silence when it is cut off from the
        controller, answered otherwise. The controller acts on the result a moment later."""
        node = self.nodes[node_id]
        if not node.up:
            result = ProbeResult.REFUSED
        elif node.cut_from_controller:
            result = ProbeResult.SILENT
        else:
            result = ProbeResult.ANSWERED
        later = self.now + self.probe_rng.randint(0, self.profile.probe_delay_max_ms)
        self.kernel.schedule(later, _PROBED, node_id, (incarnation, result))

    def _on_probe(self, node_id: int, incarnation: int, result: ProbeResult) -> None:
        c = self.controller
        registered = c.registered.get(node_id)
        fence = self.fence_rule(
            result,
            probed_incarnation=str(incarnation),
            registered_incarnation=None if registered is None else str(registered),
            fenced=node_id in c.fenced,
        )
        if not fence:
            return
        node = self.nodes[node_id]
        if node.up and node.boot == registered:
            raise ReplicationInvariantViolation(
                f"node {node_id} fenced on a probe ({result.value}) while its registered process runs"
            )
        self.stats.probe_fences += 1
        self._note(f"probe of {node_id} {result.value}: fenced before its session expires")
        self._fence(node_id)

    def _fence(self, node: int) -> None:
        c = self.controller
        c.fenced.add(node)
        change = self.elect_rule(c.info(), node, c.fenced, c.replica_ends)
        if change is not None:
            active, epoch, isr = change.active, change.leader_epoch, change.isr
            self._note(f"controller fences {node}: active {active} epoch {epoch} isr {isr}")
            self._commit(change)

    def _unfence(self, node: int) -> None:
        c = self.controller
        c.fenced.discard(node)
        change = elect_on_unfence(c.info(), node)
        if change is not None:
            self._note(f"controller unfences {node}: active again at epoch {change.leader_epoch}")
            self._commit(change)

    def _commit(self, change: PartitionChange) -> None:
        """Commits a PartitionChange as the metadata image applies one (the partition epoch goes up)."""
        c = self.controller
        c.active, c.leader_epoch, c.isr = change.active, change.leader_epoch, change.isr
        c.partition_epoch += 1
        self._committed_changed()

    def _committed_changed(self) -> None:
        self._check_partition_state()
        self._check_isr_complete()
        for node in self.nodes.values():
            self._publish_to(node)

    def _publish_to(self, node: Node) -> None:
        if not node.up or node.cut_from_controller:
            return
        delay = self.rng.randint(0, self.profile.meta_delay_max_ms)
        self.kernel.schedule(self.now + delay, _META, node.id, (node.boot, self.controller.info()))

    def _send_isr_change(self, src: int, change: IsrChange) -> None:
        if self.nodes[src].cut_from_controller or self.rng.random() < self.profile.drop:
            return
        self.kernel.schedule(self.now + self.rng.randint(0, self.profile.delay_max_ms), _ISR, src, change)

    def _on_isr_change(self, src: int, change: IsrChange) -> None:
        c = self.controller
        decision = alter_isr(
            c.info(),
            node_id=src,
            leader_epoch=change.leader_epoch,
            partition_epoch=change.partition_epoch,
            isr=tuple(change.isr),
            unavailable=c.fenced,
        )
        if isinstance(decision, IsrRefusal):
            node = self.nodes[src]
            # A stale request is left unanswered: the requester learns the outcome from the metadata.
            if not decision.stale and node.core is not None:
                node.core.isr_change_rejected(change, self.now)
                self._pump(node)
            return
        self._note(f"controller: ISR of epoch {c.leader_epoch} becomes {decision.isr}")
        self._commit(decision)

    # ------------------------------------------------------------------ heartbeats, lag reports, queries
    def _heartbeats(self) -> None:
        """Every running server's heartbeat to every other one (server.liveness), lost on a cut or a drop."""
        for src in self.nodes.values():
            if not src.up:
                continue
            for dst in self.nodes.values():
                if dst is src or not dst.up or dst.status is None or self.kernel.cut(src.id, dst.id):
                    continue
                if self.query_rng.random() >= self.profile.drop:
                    dst.status.received(src.id, self.now)

    def _lag_reports(self) -> None:
        """Every running server reports its replica's lag to itself and to the servers it thinks alive."""
        for src in self.nodes.values():
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
            src.lags.update(src.id, reports, self.now)
            for dst in self.nodes.values():
                if dst is src or not src.status.alive(dst.id) or self.kernel.cut(src.id, dst.id):
                    continue
                if self.query_rng.random() < self.profile.drop:
                    continue
                later = self.now + self.query_rng.randint(0, self.profile.delay_max_ms)
                self.kernel.schedule(later, _LAG_ARRIVE, dst.id, (dst.boot, src.id, reports))

    def _on_lag_report(self, node: Node, boot: int, src: int, reports: tuple[LagInfo, ...]) -> None:
        if not node.up or node.boot != boot:
            return
        node.lags.update(src, reports, self.now)
        hw = next((r.high_watermark for r in reports if r.end_offset_position >= 0), None)
        node.report_hws[src] = (self.now, hw)

    def _heard(self, node: Node, message: ReplicaMessage) -> None:
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

    def _query(self) -> None:
        """A client asks a running server for one key, with a staleness bound or none."""
        up = [n for n in self.nodes.values() if n.up and n.info is not None and n.status is not None]
        if not up:
            return
        coordinator = self.query_rng.choice(up)
        assert coordinator.info is not None and coordinator.status is not None
        key = f"k{self.query_rng.randrange(12)}".encode()
        max_lag = self.query_rng.choice(QUERY_BOUNDS)
        decision = route(
            coordinator.info,
            table=TABLE,
            alive=coordinator.status.alive,
            lags=coordinator.lags,
            local_node=coordinator.id,
            max_lag=max_lag,
        )
        self.stats.queries += 1
        self.stats.lag_unknown += sum(1 for skip in decision.skipped if skip.reason == UNKNOWN_LAG_REASON)
        self._next_candidate(_Query(coordinator.id, coordinator.boot, key, max_lag, decision.candidates))

    def _next_candidate(self, query: _Query) -> None:
        """Tries the query's next candidate: at once when it is the coordinator, else over the network."""
        query.index += 1
        if query.index >= len(query.candidates):
            self.stats.unserved += 1
            return
        target = self.nodes[query.candidates[query.index].node_id]
        if target.id == query.coordinator:
            self._serve(target, query)
        elif self.kernel.cut(query.coordinator, target.id) or self.query_rng.random() < self.profile.drop:
            self.kernel.schedule(self.now + QUERY_ATTEMPT_MS, _QUERY_NEXT, query.coordinator, query)
        else:
            later = self.now + self.query_rng.randint(0, self.profile.delay_max_ms)
            self.kernel.schedule(later, _SERVE, target.id, (query,))

    def _serve(self, node: Node, query: _Query) -> None:
        """The serving side (server/serving.py): answer from the local replica, or refuse."""
        core, witness = node.core, node.witness
        if not node.up:
            self.kernel.schedule(self.now + QUERY_ATTEMPT_MS, _QUERY_NEXT, query.coordinator, query)
            return
        refusal = "no replica here"
        if core is not None and witness is not None:
            lag = self.lag_rule(core, witness, node.lags, node.id)
            refusal = bound_refusal(query.max_lag, lag) or ""
            if not refusal:
                self._check_answer(node, query, node.store.data.get(query.key))
                return
            if lag is None:
                self.stats.lag_unknown += 1
        if node.id == query.coordinator:
            self._next_candidate(query)
        else:
            later = self.now + self.query_rng.randint(0, self.profile.delay_max_ms)
            self.kernel.schedule(later, _QUERY_NEXT, query.coordinator, query)

    def _check_answer(self, node: Node, query: _Query, value: bytes | None) -> None:
        """Every query is answered by a replica within its bound, never from a store ahead of the HW.

        The bound is checked against what the replica heard since it opened, independently of the lag
        rules under test: the committed ends (HWs) in the fetch answers its core took and in the newest lag
        report of each other server; an active also knows its own HW. A follower that heard nothing cannot
        know its lag, so it must not answer a bounded read at all."""
        position = node.store.position
        self.stats.answered += 1
        core = node.core
        assert core is not None
        if position > self.max_hw:
            raise ReplicationInvariantViolation(
                f"replica {node.id} answered from its store at {position}, above every HW ({self.max_hw})"
            )
        history = self.key_history.get(query.key, [])
        before = bisect.bisect_left(history, (position, b""))
        expected = history[before - 1][1] if before else None
        if value != expected:
            raise ReplicationInvariantViolation(
                f"replica {node.id} at {position} answered {query.key!r}={value!r}, the committed records "
                f"up to there say {expected!r}"
            )
        if node.id != self.controller.active:
            self.stats.answered_by_standby += 1
        if query.max_lag is None:
            return
        self.stats.answered_bounded += 1
        heard = [node.heard_hw] if node.heard_hw is not None else []
        heard += [
            hw
            for src, (at, hw) in node.report_hws.items()
            if src != node.id and hw is not None and at >= node.opened_at
        ]
        if core.role is ReplicaRole.LEADER:
            heard.append(core.high_watermark)
        if not heard:
            acked = max((base + len(records) for base, records in self.acked), default=0)
            raise ReplicationInvariantViolation(
                f"replica {node.id} ({core.role.value}, store at {position}) answered a read bounded by "
                f"{query.max_lag} with no word of the partition's end since it opened at t={node.opened_at} "
                f"({acked} records were acknowledged)"
            )
        if position < max(heard) - query.max_lag:
            raise ReplicationInvariantViolation(
                f"replica {node.id} ({core.role.value}) answered a read bounded by {query.max_lag} from its "
                f"store at {position}, having heard that {max(heard)} records are committed"
            )

    # ------------------------------------------------------------------ reassignment
    def _reassign(self) -> None:
        """One tick of the controller's reassignment: maybe draw a placement, then take the real
        controller's next safe step towards it (one record, or none once it is reached)."""
        c = self.controller
        # Now and then a new placement comes before the last one was reached.
        if not self._calm and self.rng.random() < (0.6 if self._desired is None else 0.15):
            self._desired = self._random_placement()
            self._move = _Move()
            self._note(
                f"controller wants active {self._desired.active}, standbys {self._desired.standbys}, "
                f"warmups {self._desired.warmups}"
            )
        if self._desired is None or c.active is None:
            return  # an offline partition waits for an in-sync replica to return (as reassignment_records)
        desired = self._desired
        record = partition_step(c.info(), desired)
        if record is not None:
            move = self._move
            move.steps += 1
            move.added |= set(record.replicas) - set(c.replicas)
            move.removed |= set(c.replicas) - set(record.replicas)
            if record.active != c.active and record.active in move.added:
                move.active_to_added = True
            self._commit_assignment(record)
            return
        # None means "nothing to do now": either the placement is reached, or the next step waits for the
        # new replicas to join the ISR (through the active's own ISR change) and comes on a later tick.
        warmups = {int(w) for w in desired.warmups} - {int(desired.active)}
        if (
            c.active == int(desired.active)
            and set(c.replicas) == {int(r) for r in desired.replicas()}
            and set(c.warmups) == warmups
        ):
            move = self._move
            if move.steps:
                self.stats.moves_done += 1
            if move.steps > 1:
                self.stats.multi_step_moves += 1
                if move.active_to_added and move.removed:
                    self.stats.full_moves += 1
            self._note(f"controller: placement reached in {move.steps} step(s)")
            self._desired = None

    def _random_placement(self) -> Placement:
        c = self.controller
        nodes = list(self.nodes)
        # Mostly the live nodes, as the real controller places on live brokers only; sometimes any node,
        # so a down or fenced one can be wanted too (it must then wait to catch up before it counts).
        live = [n for n in nodes if self.nodes[n].up and n not in c.fenced]
        pool = live if live and self.rng.random() < 0.8 else nodes
        size = self.rng.choice([1, 0, 0, -1]) + self.profile.replicas
        size = max(1, min(size, len(pool)))
        chosen = self.rng.sample(pool, size)
        if c.active in chosen and self.rng.random() < 0.4:
            chosen.remove(c.active)  # keep the active where it is: a move of standbys only
            chosen.insert(0, c.active)
        rest = [n for n in nodes if n not in chosen]
        warmups = self.rng.sample(rest, 1) if rest and self.rng.random() < 0.3 else []
        return Placement(str(chosen[0]), tuple(map(str, chosen[1:])), tuple(map(str, warmups)))

    def _commit_assignment(self, record: PartitionAssignment) -> None:
        c = self.controller
        if record.partition_epoch != c.partition_epoch + 1:
            raise ReplicationInvariantViolation(
                f"reassignment record at partition epoch {record.partition_epoch}, expected "
                f"{c.partition_epoch + 1}"
            )
        if record.active != c.active:
            if record.leader_epoch <= c.leader_epoch:
                raise ReplicationInvariantViolation(
                    f"reassignment moves the active {c.active} -> {record.active} without a new leader epoch"
                )
            self.stats.active_moves += 1
        self.stats.reassign_steps += 1
        self._note(
            f"controller reassigns: replicas {record.replicas}, active {record.active} epoch "
            f"{record.leader_epoch}, isr {record.isr}, warmups {record.warmups}"
        )
        c.replicas, c.active, c.leader_epoch = record.replicas, record.active, record.leader_epoch
        c.isr, c.warmups, c.partition_epoch = record.isr, record.warmups, record.partition_epoch
        self._committed_changed()

    # ------------------------------------------------------------------ clients
    def _produce(self) -> None:
        c = self.controller
        # The client's idea of the active may be stale: it uses an earlier view now and then.
        target = c.active if self.rng.random() < 0.8 else self.rng.choice(list(self.nodes))
        if target is None:
            return
        node = self.nodes[target]
        if node.core is None:
            return
        count = self.rng.randint(1, 4)
        records = []
        for _ in range(count):
            self._value += 1
            records.append(f"k{self.rng.randrange(12)}={self._value}".encode())
        epoch = c.leader_epoch if self.rng.random() < 0.9 else max(0, c.leader_epoch - 1)
        result = node.core.produce(records, epoch, self.now, 1000)
        if isinstance(result, int):
            self._produce_tokens[(target, node.incarnation, result)] = (None, tuple(records))
        else:
            self.stats.produce_errors += 1
        self._pump(node)

    def _on_produce_result(self, node: Node, result: Any) -> None:
        entry = self._produce_tokens.pop((node.id, node.incarnation, result.token), None)
        if entry is None:
            return
        records = entry[1]
        if result.error is ReplicaError.NONE:
            if result.end_offset - result.base_offset != len(records):
                raise ReplicationInvariantViolation("an ack for the wrong number of records")
            self.stats.acked += 1
            self.acked.append((result.base_offset, records))
            if result.end_offset > self.max_hw:
                raise ReplicationInvariantViolation(
                    f"ack up to {result.end_offset} above every HW {self.max_hw}"
                )
            self._check_acked(result.base_offset, records)
        else:
            self.stats.produce_errors += 1

    # ------------------------------------------------------------------ invariants
    def _check(self) -> None:
        c = self.controller
        for node in self.nodes.values():
            core = node.core
            if core is None:
                continue
            if core.role is ReplicaRole.LEADER:
                leader = self.epoch_leaders.setdefault(core.leader_epoch, node.id)
                if leader != node.id:
                    raise ReplicationInvariantViolation(
                        f"two actives in epoch {core.leader_epoch}: {leader} and {node.id}"
                    )
                self.max_hw = max(self.max_hw, core.high_watermark)
        for member in c.isr:
            self._check_holds_hw(member)

    def _check_holds_hw(self, member: int) -> Node:
        c = self.controller
        node = self.nodes[member]
        held = max(node.disk.end, node.store.position)
        if held < self.max_hw:
            raise ReplicationInvariantViolation(
                f"ISR {c.isr} (epoch {c.leader_epoch}) has replica {member} holding {held} < HW {self.max_hw}"
            )
        return node

    def _check_partition_state(self) -> None:
        """The committed ISR only names replicas and holds the active: an election from it is safe."""
        c = self.controller
        if not c.isr or not set(c.isr) <= set(c.replicas):
            raise ReplicationInvariantViolation(
                f"ISR {c.isr} is not a non-empty subset of replicas {c.replicas}"
            )
        if c.active is not None and c.active not in c.isr:
            raise ReplicationInvariantViolation(f"active {c.active} is not in the ISR {c.isr}")
        if len(set(c.replicas)) != len(c.replicas) or not set(c.warmups) <= set(c.replicas):
            raise ReplicationInvariantViolation(f"replicas {c.replicas} with warmups {c.warmups}")

    def _check_applied(self, node: Node, batch: RecordBatch) -> None:
        if node.store.position > self.max_hw:
            raise ReplicationInvariantViolation(
                f"replica {node.id} store at {node.store.position}, above every HW ({self.max_hw})"
            )
        for offset, record in enumerate(batch.records, start=batch.base_offset):
            if offset < len(self.committed):
                if self.committed[offset] != record:
                    raise ReplicationInvariantViolation(
                        f"replica {node.id} applied {record!r} at {offset}, others applied "
                        f"{self.committed[offset]!r}"
                    )
            elif offset == len(self.committed):
                self.committed.append(record)
                key, _, value = record.partition(b"=")
                self.key_history.setdefault(key, []).append((offset, value))
            else:
                raise ReplicationInvariantViolation(f"replica {node.id} applied {offset} past a gap")

    def _check_acked(self, base: int, records: tuple[bytes, ...]) -> None:
        for offset, record in enumerate(records, start=base):
            if offset < len(self.committed) and self.committed[offset] != record:
                raise ReplicationInvariantViolation(
                    f"acked {record!r} at {offset} but {self.committed[offset]!r} committed"
                )

    def _durable_record(self, node: Node, offset: int) -> bytes | None:
        disk = node.disk
        for batch in disk.batches:
            if batch.base_offset <= offset < batch.next_offset:
                return batch.records[offset - batch.base_offset]
        return None

    def _check_isr_complete(self) -> None:
        """Every member of the committed ISR durably holds every record below the highest HW."""
        c = self.controller
        for member in c.isr:
            node = self._check_holds_hw(member)
            for offset in range(
                max(node.disk.start, node.store.position), min(self.max_hw, len(self.committed))
            ):
                record = self._durable_record(node, offset)
                if record is not None and record != self.committed[offset]:
                    raise ReplicationInvariantViolation(
                        f"ISR replica {member} holds {record!r} at committed offset {offset}"
                    )

    def _check_converged(self) -> None:
        c = self.controller
        if self._desired is not None:
            raise ReplicationInvariantViolation(
                f"the reassignment to {self._desired} did not finish in the calm period: replicas "
                f"{c.replicas}, active {c.active}, isr {c.isr}"
            )
        assert c.active is not None, "no active after the calm period"
        leader = self.nodes[c.active]
        assert leader.core is not None and leader.core.role is ReplicaRole.LEADER, (
            "the chosen active is not leading"
        )
        end = leader.core.log_end_offset
        for node in self.nodes.values():
            if node.id not in c.replicas:
                if node.core is not None or node.disk.end or node.store.position:
                    raise ReplicationInvariantViolation(f"node {node.id} keeps a replica it is not assigned")
                continue
            if node.store.position != end:
                raise ReplicationInvariantViolation(
                    f"no convergence: replica {node.id} store at {node.store.position}, "
                    f"the active's log ends at {end}"
                )
            if node.store.chain[-1] != leader.store.chain[-1] or node.store.data != leader.store.data:
                raise ReplicationInvariantViolation(f"replica {node.id} store differs from the active's")
        for base, records in self.acked:
            for offset, record in enumerate(records, start=base):
                if offset >= len(self.committed) or self.committed[offset] != record:
                    raise ReplicationInvariantViolation(f"acked {record!r} at {offset} was lost")
        final: dict[bytes, bytes] = {}
        for record in self.committed[:end]:
            key, _, value = record.partition(b"=")
            final[key] = value
        if final != leader.store.data:
            raise ReplicationInvariantViolation("the store is not the replay of the committed records")


def run_seed(
    seed: int,
    *,
    core_factory: CoreFactory = ReplicaCore,
    fence_rule: FenceRule = fences_on_probe,
    elect_rule: ElectRule = elect_after_fence,
    lag_rule: LagRule = served_lag,
    trace: bool = False,
    hw_delay_ms: int = 0,
) -> Stats:
    """`hw_delay_ms`: the cores' fetch_hw_delay_ms (a seed's own choices stay as they were without it)."""
    profile = ReplicationProfile.from_seed(seed)
    if hw_delay_ms:
        config = dataclasses.replace(profile.config, fetch_hw_delay_ms=hw_delay_ms)
        profile = dataclasses.replace(profile, config=config)
    world = ReplicationWorld(
        seed,
        profile,
        core_factory=core_factory,
        fence_rule=fence_rule,
        elect_rule=elect_rule,
        lag_rule=lag_rule,
        trace=trace,
    )
    return world.run()


def main(argv: list[str] | None = None) -> int:
    from hotstate.sim.broken_replica import BROKEN_REPLICA_RULES

    parser = argparse.ArgumentParser(prog="python -m hotstate.sim.replication", description=__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--seed", type=int)
    group.add_argument("--seeds", type=int)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--broken", choices=sorted(BROKEN_REPLICA_RULES))
    args = parser.parse_args(argv)
    factory = BROKEN_REPLICA_RULES[args.broken] if args.broken else ReplicaCore
    if args.seed is not None:
        world = ReplicationWorld(
            args.seed, ReplicationProfile.from_seed(args.seed), core_factory=factory, trace=True
        )
        try:
            stats = world.run()
        except ReplicationSimFailure as failure:
            print("\n".join(world.stats.log[-60:]))
            print(failure, file=sys.stderr)
            return 1
        print("\n".join(stats.log[-30:]))
        print(
            f"seed {args.seed}: ok; {stats.acked} acked writes, {stats.committed_end} records committed, "
            f"{stats.snapshots} snapshots, {stats.produce_errors} produce errors; {stats.moves_done} "
            f"placements reached ({stats.multi_step_moves} in several steps, {stats.full_moves} moving the "
            f"active to a new replica) in {stats.reassign_steps} "
            f"reassignment steps, {stats.active_moves} moving the active, {stats.replicas_removed} replicas "
            f"deleted; {stats.probe_fences} fenced on a refused probe; {stats.queries} queries, "
            f"{stats.answered} answered ({stats.answered_bounded} bounded, {stats.answered_by_standby} by a "
            f"standby), {stats.unserved} unserved, {stats.lag_unknown} times a replica's lag was unknown"
        )
        return 0
    started = time.monotonic()
    failures = 0
    for seed in range(args.start, args.start + args.seeds):
        try:
            run_seed(seed, core_factory=factory)
        except ReplicationSimFailure as failure:
            failures += 1
            print(failure, file=sys.stderr)
    print(f"{args.seeds - failures} passed, {failures} failed ({time.monotonic() - started:.1f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
