"""The simulated controller: the real QuorumController (`controller/controller.py`) over a metadata image.

The servers' requests reach it as they would: a server registers when it starts (and once it can reach the
controller again, when it started cut off from it), heartbeats after every event with its replica's log end
and the metadata offset it has learned, and its active sends ISR changes; the controller's ticks fence the
servers whose session expired, and probes on hearsay are answered as `evidence.fences_on_probe` says.
Reassignments: the simulator draws a placement now and then and hands it to the controller as the
assignor's answer (`apply_reassignment`), which walks the partition towards it with the real
`partition_step`. There is one controller and no Raft here, so what it proposes commits at once: every
commit is checked (the ISR is within the replicas and holds the active; every member holds every committed
record) and published to every server, each of which learns it after its own delay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hotstate.assignor import Assignment, AssignorConfig, CostSummary, Explanation, PartitionId, Placement
from hotstate.controller.controller import ControllerConfig, QuorumController
from hotstate.controller.evidence import ProbeResult
from hotstate.controller.image import ImageBuilder, MetadataImage, PartitionInfo
from hotstate.controller.reassign import ReassignJob
from hotstate.controller.records import (
    CreateTable,
    Endpoint,
    FenceServer,
    KeyColumn,
    KeyType,
    MetadataBatch,
    MetadataRecord,
    NoOp,
    PartitionAssignment,
    PartitionChange,
    RegisterServer,
    UnfenceServer,
)
from hotstate.controller.requests import (
    AlterPartitionRequest,
    ControllerError,
    RegisterServerRequest,
    ServerHeartbeatRequest,
)
from hotstate.replica.core import IsrChange, PartitionView
from hotstate.sim.replication.invariants import ReplicationInvariantViolation
from hotstate.sim.replication.profile import (
    ISR,
    META,
    PARTITION_ID,
    PROBE,
    PROBED,
    SESSION_TIMEOUT_MS,
    TABLE,
    TABLE_ID,
)

if TYPE_CHECKING:
    from hotstate.sim.replication.world import Node, ReplicationWorld

# The assignor's answer as the simulator hands it over: only its placements are read.
_EXPLANATION = Explanation((), (), (), CostSummary(0, 0, 0, 0, 0, 0), "simulated")


def incarnation(node: Node) -> str:
    """The incarnation id a server process registers with (a uuid in the real server)."""
    return f"{node.id}-{node.boot}"


@dataclass
class _Move:
    """What the steps towards one placement did so far."""

    steps: int = 0
    added: set[int] = field(default_factory=set)
    removed: set[int] = field(default_factory=set)
    active_to_added: bool = False  # the active moved to a replica this move added (once it was in sync)


class SimController:
    """The controller as the servers see it: a QuorumController whose proposals commit at once."""

    def __init__(
        self, world: ReplicationWorld, replicas: tuple[int, ...], active: int | None, isr: tuple[int, ...]
    ) -> None:
        self.world = world
        records: tuple[MetadataRecord, ...] = (
            CreateTable(TABLE, TABLE_ID, 1, len(replicas) - 1, (KeyColumn("k", KeyType.STRING),), None),
            PartitionAssignment(TABLE_ID, PARTITION_ID, replicas, active, (), 0, isr, 1),
        )
        builder = ImageBuilder(MetadataImage.empty())
        builder.apply_all(records, 0)
        config = ControllerConfig(
            session_timeout_ms=SESSION_TIMEOUT_MS,
            reassign_interval_ms=0,  # the simulator draws placements itself (reassign)
            broker_removal_delay_ms=0,  # a fenced broker does not hold reassignments back
            stall_grace_ms=SESSION_TIMEOUT_MS // 4,  # as servers run it
        )
        self.quorum = QuorumController(
            builder.build(1),
            config,
            now=0,
            next_offset=1,
            fence_rule=world.fence_rule,
            elect_rule=world.elect_rule,
        )
        self._info_of = self.quorum.view
        self._info: PartitionInfo = self._info_of.partitions[TABLE_ID][PARTITION_ID]
        self._part = self.info()
        self.registered: dict[int, int] = {}  # node -> the process (boot) it registered last
        # node -> (boot, metadata offset, log end, view) of its last heartbeat that changed nothing.
        self._repeats: dict[int, tuple[tuple[int, int, int | None], MetadataImage]] = {}
        self._quiet: tuple[int, MetadataImage] | None = None  # (time, view) of the last tick that did nothing
        # The reassignment under way: the placement the controller walks the partition towards.
        self.desired: Placement | None = None
        self._move = _Move()

    # ------------------------------------------------------------------ the committed partition
    @property
    def image(self) -> MetadataImage:
        return self.quorum.view

    def info(self) -> PartitionInfo:
        view = self.quorum.view
        if view is not self._info_of:
            # Read after every event (the invariants): looked up again only when the view changed.
            self._info_of = view
            self._info = view.partitions[TABLE_ID][PARTITION_ID]
        return self._info

    def view(self) -> PartitionView:
        part = self.info()
        return PartitionView(part.active, part.leader_epoch, part.isr, part.replicas, part.partition_epoch)

    @property
    def replicas(self) -> tuple[int, ...]:
        return self.info().replicas

    @property
    def active(self) -> int | None:
        return self.info().active

    @property
    def leader_epoch(self) -> int:
        return self.info().leader_epoch

    @property
    def isr(self) -> tuple[int, ...]:
        return self.info().isr

    @property
    def warmups(self) -> tuple[int, ...]:
        return self.info().warmups

    @property
    def partition_epoch(self) -> int:
        return self.info().partition_epoch

    @property
    def fenced(self) -> set[int]:
        return {n for n, s in self.quorum.view.servers.items() if s.fenced}

    # ------------------------------------------------------------------ servers
    def register(self, node: Node) -> None:
        """A server process registers (a restarted one is fenced first: QuorumController._register)."""
        world = self.world
        request = RegisterServerRequest(
            node.id, incarnation(node), Endpoint("sim", node.id), None, None, (), ("broker",)
        )
        self.registered[node.id] = node.boot
        self._commit(self.quorum.handle(request, world.now, self.image.offset).batches)

    def tick(self) -> None:
        """After every event: every server that can reach the controller registers or heartbeats (with its
        replica's log end, or none, and its metadata offset), then the controller's tick fences the servers
        whose session expired."""
        world = self.world
        now = world.now
        quorum = self.quorum
        repeats = self._repeats
        for node in world.nodes.values():
            if not node.up or node.cut_from_controller:
                continue
            if self.registered.get(node.id) != node.boot:
                self.register(node)
                continue
            end = None if node.core is None else node.core.log_end_offset
            # Nearly every heartbeat repeats the server's previous one on the view that answered it: its only
            # effect is then the renewed session (QuorumController.renew_session), and building and
            # deciding the request again made up much of a run's time.
            view = quorum.view
            repeat = (node.boot, node.meta_offset, end)
            last = repeats.get(node.id)
            if last is not None and last[1] is view and last[0] == repeat:
                quorum.renew_session(node.id, now)
                continue
            ends = () if end is None else ((TABLE_ID, PARTITION_ID, end),)
            request = ServerHeartbeatRequest(node.id, incarnation(node), node.meta_offset, False, ends)
            decision = quorum.handle(request, now, self.image.offset)
            if not decision.batches and decision.reply.error is ControllerError.NONE:
                repeats[node.id] = (repeat, view)
            else:
                repeats.pop(node.id, None)
            self._commit(decision.batches)
        # A tick at the same time on the same view as one that proposed nothing proposes nothing either:
        # the sessions it reads were renewed to now at most, so none newly expired. Many events share a ms.
        quiet = self._quiet
        if quiet is not None and quiet[0] == now and quiet[1] is quorum.view:
            return
        batches = tuple(quorum.tick(now, self.image.offset, reassign=False))
        self._quiet = None if batches else (now, quorum.view)
        self._commit(batches)

    def hint(self, node: int) -> None:
        """The controller hears that `node` may be gone and probes it (server.suspects) a moment later."""
        world = self.world
        delay_max = world.profile.probe_delay_max_ms
        if delay_max:
            server = self.image.servers.get(node)
            registered = "" if server is None else server.incarnation_id
            world.kernel.schedule(world.now + world.probe_rng.randint(1, delay_max), PROBE, node, registered)

    def probe(self, node_id: int, registered: str) -> None:
        """One connect to the node: refused when its process is down, silence when it is cut off from the
        controller, answered otherwise. The controller acts on the result a moment later."""
        world = self.world
        node = world.nodes[node_id]
        if not node.up:
            result = ProbeResult.REFUSED
        elif node.cut_from_controller:
            result = ProbeResult.SILENT
        else:
            result = ProbeResult.ANSWERED
        later = world.now + world.probe_rng.randint(0, world.profile.probe_delay_max_ms)
        world.kernel.schedule(later, PROBED, node_id, (registered, result))

    def on_probe(self, node_id: int, probed: str, result: ProbeResult) -> None:
        world = self.world
        batch = self.quorum.on_probe(node_id, probed, result, self.image.offset)
        if batch is None:
            return
        node = world.nodes[node_id]
        server = self.image.servers.get(node_id)
        if node.up and server is not None and server.incarnation_id == incarnation(node):
            raise ReplicationInvariantViolation(
                f"node {node_id} fenced on a probe ({result.value}) while its registered process runs"
            )
        world.stats.probe_fences += 1
        world.note(f"probe of {node_id} {result.value}: fenced before its session expires")
        self._commit((batch,))

    # ------------------------------------------------------------------ commits and their publication
    def _commit(self, batches: tuple[MetadataBatch, ...]) -> None:
        """The batches the controller proposed, committed (they are in its view already): noted, checked
        and published."""
        world = self.world
        changed = False
        for batch in batches:
            for record in batch.records:
                if isinstance(record, NoOp):
                    continue
                changed = True
                match record:
                    case RegisterServer(node_id, incarnation_id):
                        world.note(f"controller registers {node_id} ({incarnation_id})")
                    case FenceServer(node_id, reason):
                        world.note(f"controller fences {node_id} ({reason})")
                    case UnfenceServer(node_id):
                        world.note(f"controller unfences {node_id}")
                    case PartitionChange(_, _, active, epoch, isr):
                        world.note(f"controller: active {active} epoch {epoch} isr {isr}")
                    case PartitionAssignment():
                        self._assignment(record)
        if not changed:
            return
        self._part = self.info()
        checker = world.checker
        checker.partition_state()
        checker.isr_complete()
        for node in world.nodes.values():
            self.publish_to(node.id)

    def _assignment(self, record: PartitionAssignment) -> None:
        before = self._part
        stats = self.world.stats
        if record.partition_epoch != before.partition_epoch + 1:
            raise ReplicationInvariantViolation(
                f"reassignment record at partition epoch {record.partition_epoch}, expected "
                f"{before.partition_epoch + 1}"
            )
        if record.active != before.active:
            if record.leader_epoch <= before.leader_epoch:
                raise ReplicationInvariantViolation(
                    f"reassignment moves the active {before.active} -> {record.active} without a new "
                    "leader epoch"
                )
            stats.active_moves += 1
        stats.reassign_steps += 1
        self.world.note(
            f"controller reassigns: replicas {record.replicas}, active {record.active} epoch "
            f"{record.leader_epoch}, isr {record.isr}, warmups {record.warmups}"
        )

    def publish_to(self, node_id: int) -> None:
        world = self.world
        node = world.nodes[node_id]
        if not node.up or node.cut_from_controller:
            return
        delay = world.rng.randint(0, world.profile.meta_delay_max_ms)
        payload = (node.boot, self.info(), self.image.offset)
        world.kernel.schedule(world.now + delay, META, node.id, payload)

    # ------------------------------------------------------------------ ISR changes
    def send_isr_change(self, src: int, change: IsrChange) -> None:
        """The active `src` asks for an ISR change (lost when it is cut off from the controller)."""
        world = self.world
        if world.nodes[src].cut_from_controller or world.rng.random() < world.profile.drop:
            return
        world.kernel.schedule(world.now + world.rng.randint(0, world.profile.delay_max_ms), ISR, src, change)

    def on_isr_change(self, src: int, change: IsrChange) -> None:
        world = self.world
        request = AlterPartitionRequest(
            src, TABLE_ID, PARTITION_ID, change.leader_epoch, change.partition_epoch, tuple(change.isr)
        )
        decision = self.quorum.handle(request, world.now, self.image.offset)
        error = decision.reply.error
        if error is ControllerError.NONE:
            part = self.info()
            world.note(f"controller: ISR of epoch {part.leader_epoch} becomes {part.isr}")
        self._commit(decision.batches)
        node = world.nodes[src]
        # A stale request is left unanswered: the requester learns the outcome from the metadata (as the
        # server's _alter_isr, which reports only INVALID_REQUEST to its core).
        if error is ControllerError.INVALID_REQUEST and node.core is not None:
            node.core.isr_change_rejected(change, world.now)
            world.pump(node)

    # ------------------------------------------------------------------ reassignment
    def reassign(self) -> None:
        """One tick of reassignment: maybe draw a placement, then hand it to the controller as the
        assignor's answer, which takes its next safe step towards it (one record, or none: reached, waiting
        for new replicas to join the ISR, or the cluster not settled)."""
        world = self.world
        # Now and then a new placement comes before the last one was reached.
        if not world.calm and world.rng.random() < (0.6 if self.desired is None else 0.15):
            self.desired = self._random_placement()
            self._move = _Move()
            world.note(
                f"controller wants active {self.desired.active}, standbys {self.desired.standbys}, "
                f"warmups {self.desired.warmups}"
            )
        if self.desired is None or self.active is None:
            return  # an offline partition waits for an in-sync replica to return (as reassignment_records)
        desired = self.desired
        before = self.info()
        image = self.image
        job = ReassignJob(image, tuple(image.live_brokers()), {}, AssignorConfig())
        answer = Assignment({PartitionId(TABLE, PARTITION_ID): desired}, _EXPLANATION)
        batch = self.quorum.apply_reassignment(job, answer, world.now, image.offset)
        if batch is not None:
            [record] = batch.records
            assert isinstance(record, PartitionAssignment)
            move = self._move
            move.steps += 1
            move.added |= set(record.replicas) - set(before.replicas)
            move.removed |= set(before.replicas) - set(record.replicas)
            if record.active != before.active and record.active in move.added:
                move.active_to_added = True
            self._commit((batch,))
            return
        warmups = {int(w) for w in desired.warmups} - {int(desired.active)}
        if (
            before.active == int(desired.active)
            and set(before.replicas) == {int(r) for r in desired.replicas()}
            and set(before.warmups) == warmups
        ):
            move = self._move
            stats = world.stats
            if move.steps:
                stats.moves_done += 1
            if move.steps > 1:
                stats.multi_step_moves += 1
                if move.active_to_added and move.removed:
                    stats.full_moves += 1
            world.note(f"controller: placement reached in {move.steps} step(s)")
            self.desired = None

    def _random_placement(self) -> Placement:
        world = self.world
        rng = world.rng
        nodes = list(world.nodes)
        # Mostly the live nodes, as the real controller places on live brokers only; sometimes any node,
        # so a down or fenced one can be wanted too (it must then wait to catch up before it counts).
        live = [n for n in nodes if world.nodes[n].up and n not in self.fenced]
        pool = live if live and rng.random() < 0.8 else nodes
        size = rng.choice([1, 0, 0, -1]) + world.profile.replicas
        size = max(1, min(size, len(pool)))
        chosen = rng.sample(pool, size)
        if self.active in chosen and rng.random() < 0.4:
            chosen.remove(self.active)  # keep the active where it is: a move of standbys only
            chosen.insert(0, self.active)
        rest = [n for n in nodes if n not in chosen]
        warmups = rng.sample(rest, 1) if rest and rng.random() < 0.3 else []
        return Placement(str(chosen[0]), tuple(map(str, chosen[1:])), tuple(map(str, warmups)))
