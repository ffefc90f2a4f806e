"""The simulated controller: the partition's committed metadata, decided with the real controller's rules.

Sessions (a server that stops heartbeating is fenced), probes on hearsay (`controller/evidence.py`), a new
active on a fence and an offline partition's return, ISR changes (`controller/partition_rules.py`), and
reassignments walked with the real `partition_step`. Every commit is checked (the ISR is within the
replicas and holds the active; every member holds every committed record) and published to every server,
each of which learns it after its own delay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hotstate.assignor import Placement
from hotstate.controller.evidence import ProbeResult
from hotstate.controller.image import PartitionInfo
from hotstate.controller.partition_rules import IsrRefusal, alter_isr, elect_on_unfence
from hotstate.controller.reassign import partition_step
from hotstate.controller.records import PartitionAssignment, PartitionChange
from hotstate.replica.core import IsrChange, PartitionView
from hotstate.sim.replication.invariants import ReplicationInvariantViolation
from hotstate.sim.replication.profile import (
    ISR,
    META,
    PARTITION_ID,
    PROBE,
    PROBED,
    SESSION_TIMEOUT_MS,
    TABLE_ID,
)

if TYPE_CHECKING:
    from hotstate.sim.replication.world import ReplicationWorld


@dataclass
class _Move:
    """What the steps towards one placement did so far."""

    steps: int = 0
    added: set[int] = field(default_factory=set)
    removed: set[int] = field(default_factory=set)
    active_to_added: bool = False  # the active moved to a replica this move added (once it was in sync)


class ControllerModel:
    """The metadata the controller commits for the partition (the real one: QuorumController)."""

    def __init__(
        self, world: ReplicationWorld, replicas: tuple[int, ...], active: int | None, isr: tuple[int, ...]
    ) -> None:
        self.world = world
        self.replicas = replicas
        self.active = active
        self.leader_epoch = 0
        self.isr = isr
        self.partition_epoch = 1
        self.warmups: tuple[int, ...] = ()
        self.fenced: set[int] = set()
        self.last_heartbeat: dict[int, int] = {}
        # The process (boot count) each node last registered or heartbeat as: its incarnation.
        self.registered: dict[int, int] = {}
        # The replica's log end each node reported in its last heartbeat, keyed as the real controller keys
        # them: the input for choosing a new active.
        self.replica_ends: dict[tuple[int, int, int], int] = {}
        # The reassignment under way: the placement the controller walks the partition towards.
        self.desired: Placement | None = None
        self._move = _Move()

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

    # ------------------------------------------------------------------ sessions and fencing
    def tick(self) -> None:
        world = self.world
        now = world.now
        # Every running server heartbeats, with or without a replica (a spare is fenced and unfenced too:
        # it changes nothing unless it is in the ISR, and the ISR refuses to take it in while fenced).
        for node in world.nodes.values():
            if node.up and not node.cut_from_controller:
                self.last_heartbeat[node.id] = now
                self.registered[node.id] = node.boot
                # A heartbeat reports the replica's log end, or no replica (as QuorumController._heartbeat).
                if node.core is None:
                    self.replica_ends.pop((TABLE_ID, PARTITION_ID, node.id), None)
                else:
                    self.replica_ends[(TABLE_ID, PARTITION_ID, node.id)] = node.core.log_end_offset
                if node.id in self.fenced:
                    self._unfence(node.id)
            elif node.id not in self.fenced and (
                now - self.last_heartbeat.get(node.id, 0) > SESSION_TIMEOUT_MS
            ):
                self.fence(node.id)

    def hint(self, node: int) -> None:
        """The controller hears that `node` may be gone and probes it (server.suspects) a moment later."""
        world = self.world
        delay_max = world.profile.probe_delay_max_ms
        if delay_max:
            incarnation = self.registered.get(node, 0)
            world.kernel.schedule(world.now + world.probe_rng.randint(1, delay_max), PROBE, node, incarnation)

    def probe(self, node_id: int, incarnation: int) -> None:
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
        world.kernel.schedule(later, PROBED, node_id, (incarnation, result))

    def on_probe(self, node_id: int, incarnation: int, result: ProbeResult) -> None:
        world = self.world
        registered = self.registered.get(node_id)
        fence = world.fence_rule(
            result,
            probed_incarnation=str(incarnation),
            registered_incarnation=None if registered is None else str(registered),
            fenced=node_id in self.fenced,
        )
        if not fence:
            return
        node = world.nodes[node_id]
        if node.up and node.boot == registered:
            raise ReplicationInvariantViolation(
                f"node {node_id} fenced on a probe ({result.value}) while its registered process runs"
            )
        world.stats.probe_fences += 1
        world.note(f"probe of {node_id} {result.value}: fenced before its session expires")
        self.fence(node_id)

    def fence(self, node: int) -> None:
        self.fenced.add(node)
        change = self.world.elect_rule(self.info(), node, self.fenced, self.replica_ends)
        if change is not None:
            active, epoch, isr = change.active, change.leader_epoch, change.isr
            self.world.note(f"controller fences {node}: active {active} epoch {epoch} isr {isr}")
            self._commit(change)

    def _unfence(self, node: int) -> None:
        self.fenced.discard(node)
        change = elect_on_unfence(self.info(), node)
        if change is not None:
            self.world.note(f"controller unfences {node}: active again at epoch {change.leader_epoch}")
            self._commit(change)

    # ------------------------------------------------------------------ commits and their publication
    def _commit(self, change: PartitionChange) -> None:
        """Commits a PartitionChange as the metadata image applies one (the partition epoch goes up)."""
        self.active, self.leader_epoch, self.isr = change.active, change.leader_epoch, change.isr
        self.partition_epoch += 1
        self._committed_changed()

    def _committed_changed(self) -> None:
        checker = self.world.checker
        checker.partition_state()
        checker.isr_complete()
        for node in self.world.nodes.values():
            self.publish_to(node.id)

    def publish_to(self, node_id: int) -> None:
        world = self.world
        node = world.nodes[node_id]
        if not node.up or node.cut_from_controller:
            return
        delay = world.rng.randint(0, world.profile.meta_delay_max_ms)
        world.kernel.schedule(world.now + delay, META, node.id, (node.boot, self.info()))

    # ------------------------------------------------------------------ ISR changes
    def send_isr_change(self, src: int, change: IsrChange) -> None:
        """The active `src` asks for an ISR change (lost when it is cut off from the controller)."""
        world = self.world
        if world.nodes[src].cut_from_controller or world.rng.random() < world.profile.drop:
            return
        world.kernel.schedule(world.now + world.rng.randint(0, world.profile.delay_max_ms), ISR, src, change)

    def on_isr_change(self, src: int, change: IsrChange) -> None:
        world = self.world
        decision = alter_isr(
            self.info(),
            node_id=src,
            leader_epoch=change.leader_epoch,
            partition_epoch=change.partition_epoch,
            isr=tuple(change.isr),
            unavailable=self.fenced,
        )
        if isinstance(decision, IsrRefusal):
            node = world.nodes[src]
            # A stale request is left unanswered: the requester learns the outcome from the metadata.
            if not decision.stale and node.core is not None:
                node.core.isr_change_rejected(change, world.now)
                world.pump(node)
            return
        world.note(f"controller: ISR of epoch {self.leader_epoch} becomes {decision.isr}")
        self._commit(decision)

    # ------------------------------------------------------------------ reassignment
    def reassign(self) -> None:
        """One tick of the controller's reassignment: maybe draw a placement, then take the real
        controller's next safe step towards it (one record, or none once it is reached)."""
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
        record = partition_step(self.info(), desired)
        if record is not None:
            move = self._move
            move.steps += 1
            move.added |= set(record.replicas) - set(self.replicas)
            move.removed |= set(self.replicas) - set(record.replicas)
            if record.active != self.active and record.active in move.added:
                move.active_to_added = True
            self._commit_assignment(record)
            return
        # None means "nothing to do now": either the placement is reached, or the next step waits for the
        # new replicas to join the ISR (through the active's own ISR change) and comes on a later tick.
        warmups = {int(w) for w in desired.warmups} - {int(desired.active)}
        if (
            self.active == int(desired.active)
            and set(self.replicas) == {int(r) for r in desired.replicas()}
            and set(self.warmups) == warmups
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

    def _commit_assignment(self, record: PartitionAssignment) -> None:
        if record.partition_epoch != self.partition_epoch + 1:
            raise ReplicationInvariantViolation(
                f"reassignment record at partition epoch {record.partition_epoch}, expected "
                f"{self.partition_epoch + 1}"
            )
        if record.active != self.active:
            if record.leader_epoch <= self.leader_epoch:
                raise ReplicationInvariantViolation(
                    f"reassignment moves the active {self.active} -> {record.active} without a new leader "
                    "epoch"
                )
            self.world.stats.active_moves += 1
        self.world.stats.reassign_steps += 1
        self.world.note(
            f"controller reassigns: replicas {record.replicas}, active {record.active} epoch "
            f"{record.leader_epoch}, isr {record.isr}, warmups {record.warmups}"
        )
        self.replicas, self.active, self.leader_epoch = record.replicas, record.active, record.leader_epoch
        self.isr, self.warmups, self.partition_epoch = record.isr, record.warmups, record.partition_epoch
        self._committed_changed()
