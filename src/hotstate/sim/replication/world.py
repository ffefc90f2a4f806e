"""The replication world: the pool of nodes, their replica cores, disks and stores, and the network.

It runs on the simulator kernel (`sim/kernel.py`) and hands each event to its owner: the nodes' cores
(messages, ticks, disk writes, snapshots, metadata), each driven by the servers' own pump
(`replica/shell.py`) over the node's simulated disk (whose writes take time) and store; the controller
(`controller.py`); the writers and the query path (`clients.py`). After every event the controller takes
its session decisions and the invariants (`invariants.py`) are checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hotstate.controller.evidence import fences_on_probe
from hotstate.controller.image import PartitionInfo
from hotstate.controller.partition_rules import elect_after_fence
from hotstate.controller.records import PartitionChange
from hotstate.log.batch import RecordBatch
from hotstate.replica.batchlog import BatchLogError
from hotstate.replica.core import (
    LogOp,
    PartitionView,
    Ready,
    ReplicaCore,
    ReplicaRole,
    ReplicaSafetyError,
    SnapshotNeeded,
    TruncateTo,
)
from hotstate.replica.messages import ReplicaMessage
from hotstate.replica.shell import Effects, LogPort, ReplicaShell, StorePort
from hotstate.routing.freshness import EndWitness, served_lag
from hotstate.routing.heartbeat import HeartbeatStatus
from hotstate.routing.hedging import HedgePolicy
from hotstate.routing.lags import LagTable
from hotstate.sim.disk import SimDiskLog, SimStore
from hotstate.sim.kernel import (
    CALM,
    CRASH,
    DELIVER,
    DISK_DONE,
    HEAL,
    PARTITION,
    RESTART,
    TICK,
    Kernel,
    Link,
    SimFailure,
)
from hotstate.sim.replication.clients import Queries, Writers
from hotstate.sim.replication.controller import SimController
from hotstate.sim.replication.invariants import Checker, ReplicationInvariantViolation
from hotstate.sim.replication.profile import (
    APPLY,
    BEAT,
    BEAT_CHECK,
    HEARTBEATS,
    HEDGE,
    HEDGING,
    ISR,
    LAG_ARRIVE,
    LAG_REPORTS,
    META,
    PARTITION_ID,
    PROBE,
    PROBED,
    PRODUCE,
    QUERY,
    QUERY_REPLY,
    QUERY_RETRY,
    REASSIGN,
    SERVE,
    SNAP,
    TABLE_ID,
    ReplicationProfile,
)

CoreFactory = Callable[..., ReplicaCore]
# The replica pump (replica/shell.py's ReplicaShell, or a broken one in tests).
ShellFactory = Callable[[ReplicaCore, LogPort, StorePort, Effects], ReplicaShell]
# The controller's rule for a probe's result (controller.evidence.fences_on_probe, or a broken one in tests).
FenceRule = Callable[..., bool]
# The controller's choice of a new active when a server is fenced (partition_rules.elect_after_fence).
ElectRule = Callable[..., PartitionChange | None]
# A serving replica's lag for a query's bound, None when unknown (routing.freshness.served_lag).
LagRule = Callable[[ReplicaCore, EndWitness, LagTable, int], int | None]

# A run broke an invariant (or a core raised): the kernel's failure, with the command that replays it.
ReplicationSimFailure = SimFailure


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
    meta_offset: int = 0  # how far this process's metadata image is (its heartbeats say so)
    shell: ReplicaShell | None = None  # the core's pump, while it is open
    pending_ops: Sequence[LogOp] | None = None  # the log write in flight
    tick_at: int | None = None
    cut_from_controller: bool = False
    # The server's routing state, lost with its process: the newest metadata it learned, its heartbeat
    # status of the other servers, the lag reports it holds.
    info: PartitionInfo | None = None
    status: HeartbeatStatus | None = None
    lags: LagTable = field(default_factory=LagTable)
    # Its coordinator's hedging policy (the latencies it measured, the hedge budget) and the forwards it
    # sent, lost with the process too.
    hedging: HedgePolicy = field(default_factory=lambda: HedgePolicy(HEDGING))
    forwards: int = 0
    witness: EndWitness | None = None  # what the open core heard of the partition's end
    # The invariants' record of the committed offsets the replica heard of since it opened: the HWs in the
    # fetch answers its core took, and in the newest report of each other server (arrival, HW or None).
    opened_at: int = 0
    heard_hw: int | None = None
    report_hws: dict[int, tuple[int, int | None]] = field(default_factory=dict)


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
    token_queries: int = 0  # queries with a consistency token (the end of the last acknowledged write)
    answered_with_token: int = 0
    token_waits: int = 0  # rounds that waited for a replica to reach the query's token
    token_ahead: int = 0  # queries failed as asking beyond the partition's end (a deposed active said so)
    forwards: int = 0  # forwards sent by coordinators (their hedges not counted)
    hedged: int = 0  # forwards hedged: unanswered past their peer's hedge delay, sent to the next replica
    hedge_won: int = 0  # queries answered by a hedge first
    late_answers: int = 0  # answers that reached a coordinator after the query had its answer: dropped
    log: list[str] = field(default_factory=list)


class ReplicationWorld:
    def __init__(
        self,
        seed: int,
        profile: ReplicationProfile,
        *,
        core_factory: CoreFactory = ReplicaCore,
        shell_factory: ShellFactory = ReplicaShell,
        fence_rule: FenceRule = fences_on_probe,
        elect_rule: ElectRule = elect_after_fence,
        lag_rule: LagRule = served_lag,
        trace: bool = False,
    ) -> None:
        self.seed = seed
        self.profile = profile
        self.core_factory = core_factory
        self.shell_factory = shell_factory
        self.fence_rule = fence_rule
        self.elect_rule = elect_rule
        self.lag_rule = lag_rule
        self.trace = trace
        broken = getattr(core_factory, "rule", None)
        broken_shell = getattr(shell_factory, "rule", None)
        replay = (
            f"python -m hotstate.sim.replication --seed {seed}"
            + (f" --broken {broken}" if broken else "")
            + (f" --broken-shell {broken_shell}" if broken_shell else "")
        )
        self.kernel = Kernel(seed, "replication-world", replay)
        self.rng = self.kernel.rng
        # Probes draw from their own stream, so a seed without them runs exactly as before they existed.
        self.probe_rng = self.kernel.stream("replication-probes")
        # So do heartbeats, lag reports and queries: they read the replicas and change nothing in them.
        self.query_rng = self.kernel.stream("replication-queries")
        ids = tuple(range(1, profile.replicas + 1))
        self.nodes = {i: Node(i) for i in range(1, profile.replicas + profile.spares + 1)}
        self.controller = SimController(self, ids, ids[0], ids)
        self.checker = Checker(self.nodes, self.controller)
        self.writers = Writers(self)
        self.queries = Queries(self)
        self.stats = Stats(seed)
        self.calm = False

    # ------------------------------------------------------------------ running
    def run(self) -> Stats:
        profile = self.profile
        for node in self.nodes.values():
            self._boot(node)
        self.kernel.schedule(profile.chaos_ms, CALM, 0, None)
        self.kernel.schedule(1, PRODUCE, 0, None)
        if profile.crash_every_ms:
            self.kernel.schedule(self.kernel.gap(profile.crash_every_ms), CRASH, 0, None)
        if profile.partition_every_ms:
            self.kernel.schedule(self.kernel.gap(profile.partition_every_ms), PARTITION, 0, None)
        if profile.reassign_every_ms:
            self.kernel.schedule(self.kernel.gap(profile.reassign_every_ms), REASSIGN, 0, None)
        if profile.query_every_ms:
            self.kernel.schedule(HEARTBEATS.send_interval_ms, BEAT, 0, None)
            self.kernel.schedule(HEARTBEATS.check_interval_ms, BEAT_CHECK, 0, None)
            self.kernel.schedule(profile.lag_report_every_ms, LAG_REPORTS, 0, None)
            self.kernel.schedule(1 + self.query_rng.randrange(profile.query_every_ms), QUERY, 0, None)
        end = profile.chaos_ms + profile.calm_ms
        try:
            self.kernel.run(end, self._handle, after=self._after_event)
            self.checker.converged(self.controller.desired)
        # BatchLogError: the core asked its log for a gap or an older epoch after a newer one.
        except (ReplicationInvariantViolation, ReplicaSafetyError, BatchLogError, AssertionError) as error:
            raise self.kernel.failure(error) from error
        self.stats.committed_end = len(self.checker.committed)
        return self.stats

    @property
    def now(self) -> int:
        return self.kernel.now

    def _after_event(self) -> None:
        self.controller.tick()
        self.checker.after_event()

    def note(self, text: str) -> None:
        if self.trace:
            self.stats.log.append(f"{self.now:6d} {text}")

    def _handle(self, kind: int, target: int, payload: Any) -> None:
        node = self.nodes.get(target)
        if kind == DELIVER:
            message: ReplicaMessage = payload
            destination = self.nodes[message.dst]
            if destination.core is not None:
                destination.core.step(message, self.now)
                self.queries.heard(destination, message)
                self.pump(destination)
        elif kind == TICK:
            assert node is not None
            if node.core is not None and node.tick_at == self.now:
                node.tick_at = None
                node.core.tick(self.now)
                self.pump(node)
        elif kind == DISK_DONE:
            assert node is not None
            if node.core is not None and node.incarnation == payload:
                self._written(node)
        elif kind == APPLY:
            assert node is not None
            if node.core is not None and node.incarnation == payload:
                self.pump(node)
        elif kind == META:
            assert node is not None
            boot, info, offset = payload
            if node.up and node.boot == boot:
                node.meta_offset = max(node.meta_offset, offset)
                self._on_metadata(node, info)
        elif kind == ISR:
            self.controller.on_isr_change(target, payload)
        elif kind == SNAP:
            assert node is not None
            self._finish_snapshot(node, payload)
        elif kind == CRASH:
            if not self.calm:
                self._crash_someone()
                self.kernel.schedule(self.now + self.kernel.gap(self.profile.crash_every_ms), CRASH, 0, None)
        elif kind == RESTART:
            assert node is not None
            if not node.up:
                self._boot(node)
        elif kind == PARTITION:
            if not self.calm:
                self._make_partition()
                self.kernel.schedule(
                    self.now + self.kernel.gap(self.profile.partition_every_ms), PARTITION, 0, None
                )
        elif kind == HEAL:
            self._heal()
        elif kind == PRODUCE:
            self.writers.produce()
            if self.now < self.profile.chaos_ms + 1000:
                self.kernel.schedule(
                    self.now + self.kernel.gap(self.profile.produce_every_ms), PRODUCE, 0, None
                )
        elif kind == REASSIGN:
            self.controller.reassign()
            # In the calm no new placement is drawn, but the one under way is walked to its end.
            if not self.calm or self.controller.desired is not None:
                self.kernel.schedule(
                    self.now + self.kernel.gap(self.profile.reassign_every_ms), REASSIGN, 0, None
                )
        elif kind == PROBE:
            self.controller.probe(target, payload)
        elif kind == PROBED:
            self.controller.on_probe(target, *payload)
        elif kind == BEAT:
            self.queries.heartbeats()
            self.kernel.schedule(self.now + HEARTBEATS.send_interval_ms, BEAT, 0, None)
        elif kind == BEAT_CHECK:
            self.queries.check_heartbeats()
            self.kernel.schedule(self.now + HEARTBEATS.check_interval_ms, BEAT_CHECK, 0, None)
        elif kind == LAG_REPORTS:
            self.queries.lag_reports()
            self.kernel.schedule(self.now + self.profile.lag_report_every_ms, LAG_REPORTS, 0, None)
        elif kind == LAG_ARRIVE:
            assert node is not None
            self.queries.on_lag_report(node, *payload)
        elif kind == QUERY:
            self.queries.query()
            gap = 1 + self.query_rng.randrange(2 * self.profile.query_every_ms)
            self.kernel.schedule(self.now + gap, QUERY, 0, None)
        elif kind == SERVE:
            assert node is not None
            self.queries.serve(node, payload)
        elif kind == QUERY_REPLY:
            self.queries.replied(*payload)
        elif kind == QUERY_RETRY:
            self.queries.retry(payload)
        elif kind == HEDGE:
            self.queries.hedge_due(payload)
        elif kind == CALM:
            self.calm = True
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
        node.hedging = HedgePolicy(HEDGING)
        node.forwards = 0
        node.report_hws = {}
        node.meta_offset = 0
        self.note(f"node {node.id} starts: store at {node.store.position}, log end {node.disk.end}")
        if not node.cut_from_controller:
            # It registers, and the controller fences a restarted server before anything else: it must not
            # lead again in the epoch of its previous process, whose requests (an ISR change the new
            # process knows nothing of) may still be on their way. Cut off, it registers once it can.
            self.controller.register(node)  # published to every server, this one too

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
            self.pump(node)

    def _open(self, node: Node) -> None:
        node.incarnation += 1
        node.core = core = self.core_factory(
            node.id,
            TABLE_ID,
            PARTITION_ID,
            self.profile.config,
            log=node.disk.load(),
            store_position=node.store.position,
            store_epoch=node.store.epoch,
            now=self.now,
        )
        node.shell = self._shell(node, core)
        node.pending_ops = None
        node.tick_at = None
        node.witness = EndWitness(self.now)
        node.opened_at = self.now
        node.heard_hw = None
        self.note(f"replica {node.id} opens: store at {node.store.position}, log end {node.disk.end}")

    def _remove(self, node: Node) -> None:
        """The node learned it holds no replica: close it and delete its log and store."""
        if node.core is None and not node.disk.end and not node.store.position:
            return
        self.stats.replicas_removed += 1
        self.note(f"replica {node.id} removed: its log and store are deleted")
        node.core = None
        node.witness = None
        node.incarnation += 1  # what the closed core had in flight never lands
        node.shell = None
        node.pending_ops = None
        node.tick_at = None
        node.disk = SimDiskLog()
        node.store = SimStore()

    def _crash(self, node: Node, down_ms: int) -> None:
        self.note(f"node {node.id} crashes for {down_ms} ms")
        node.up = False
        node.core = None
        node.witness = None
        node.shell = None
        node.pending_ops = None
        node.tick_at = None
        self.kernel.schedule(self.now + down_ms, RESTART, node.id, None)
        self.controller.hint(node.id)  # its connections close: the controller hears of it at once

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

    # ------------------------------------------------------------------ the replica pump
    def _shell(self, node: Node, core: ReplicaCore) -> ReplicaShell:
        """The real pump (replica/shell.py) over the node's simulated disk and store."""
        incarnation = node.incarnation

        def observe(ready: Ready) -> None:
            if core.role is ReplicaRole.LEADER:
                self.checker.max_hw = max(self.checker.max_hw, ready.high_watermark)

        def snapshot_needed(needed: SnapshotNeeded) -> None:
            later = self.now + self.rng.randint(1, 20)
            self.kernel.schedule(later, SNAP, node.id, (incarnation, needed))

        effects = Effects(
            send=lambda message: self._send(node.id, message),
            answer=lambda result: self.writers.on_result(node, result),
            isr_change=lambda change: self.controller.send_isr_change(node.id, change),
            snapshot_needed=snapshot_needed,
            # The store is written in an event of its own, after the answers just handed out.
            defer=lambda: self.kernel.schedule(self.now, APPLY, node.id, incarnation),
            observe=observe,
        )
        return self.shell_factory(core, _NodeLog(self, node), _NodeStore(self.checker, node), effects)

    def pump(self, node: Node) -> None:
        shell = node.shell
        if shell is None:
            return
        busy = shell.writing is not None
        shell.pump()
        # A tick is armed once the pump stops without a write under way (or met one started earlier).
        if busy or shell.writing is None:
            self._arm_tick(node)

    def _written(self, node: Node) -> None:
        """The node's log write in flight reached its disk."""
        shell = node.shell
        assert shell is not None and node.pending_ops is not None
        ops, node.pending_ops = node.pending_ops, None
        _write_ops(self.checker, node, ops)
        shell.written()
        if shell.writing is None:
            self._arm_tick(node)

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
                self.note(f"replica {node.id} installs a snapshot at {snapshot.position} from {leader.id}")
                node.store = snapshot
                node.core.snapshot_installed(snapshot.position, snapshot.epoch, self.now)
        self.pump(node)

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
            self.note(f"node {victim.id} cut off from the controller")
            self.controller.hint(victim.id)  # hearsay: a peer tells the controller it lost the node
        else:
            self.kernel.partition = {i: self.rng.randint(0, 1) for i in ids}
            self.note(f"network partition {self.kernel.partition}")
            for i in ids:
                self.controller.hint(i)  # every node lost someone: hearsay about each of them
        self.kernel.schedule(self.now + self.rng.randint(50, self.profile.partition_max_ms), HEAL, 0, None)

    def _heal(self) -> None:
        self.kernel.partition = None
        for n in self.nodes.values():
            if n.cut_from_controller:
                n.cut_from_controller = False
                self.controller.publish_to(n.id)  # it catches up on the metadata log it missed


class _NodeLog:
    """The shell's log port: the node's simulated disk, whose writes take up to disk_max_ms."""

    def __init__(self, world: ReplicationWorld, node: Node) -> None:
        self.world = world
        self.node = node

    def write(self, ops: Sequence[LogOp]) -> bool:
        world, node = self.world, self.node
        if ops and world.profile.disk_max_ms:
            node.pending_ops = ops
            later = world.now + world.rng.randint(0, world.profile.disk_max_ms)
            world.kernel.schedule(later, DISK_DONE, node.id, node.incarnation)
            return False
        _write_ops(world.checker, node, ops)
        return True


def _write_ops(checker: Checker, node: Node, ops: Sequence[LogOp]) -> None:
    for op in ops:
        if isinstance(op, TruncateTo):
            checker.truncation(node, op.offset)
        node.disk.apply(op)


class _NodeStore:
    """The shell's store port: the node's simulated store (its current one: a snapshot replaces it), each
    batch checked as it is applied."""

    def __init__(self, checker: Checker, node: Node) -> None:
        self.checker = checker
        self.node = node

    @property
    def position(self) -> int:
        return self.node.store.position

    def apply(self, batch: RecordBatch) -> None:
        node = self.node
        self.checker.applying(node, batch)
        node.store.apply(batch)
        self.checker.applied(node, batch)


def run_seed(
    seed: int,
    *,
    core_factory: CoreFactory = ReplicaCore,
    shell_factory: ShellFactory = ReplicaShell,
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
        shell_factory=shell_factory,
        fence_rule=fence_rule,
        elect_rule=elect_rule,
        lag_rule=lag_rule,
        trace=trace,
    )
    return world.run()
