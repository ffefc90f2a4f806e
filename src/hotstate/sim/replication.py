"""The deterministic simulator for partition replication: replica cores, a model controller, clients.

One partition, N replicas. Everything is drawn from the seed: message delays, drops, duplicates,
network partitions (between replicas, and between a replica and the controller, which then fences a
replica that is still running: a zombie active), crashes that lose the write in flight, stale metadata
(each replica learns the controller's decisions after its own delay), store snapshots for replicas
that fall behind the log start, and clients writing upserts with acks=all.

Invariants, checked after every event:
- one active per leader epoch, and only the one the controller chose;
- every replica of the controller's committed ISR holds every committed record (durably, unchanged):
  this is what makes an acknowledged write survive while any in-sync replica does;
- stores at equal positions are equal (each applied record is the one every other store applied there);
- no store holds a record above the highest HW an active ever reached;
- an acknowledged write's records are the committed records at its offsets.
After the faults stop, every replica must converge to the same store holding every acknowledged write.

`python -m hotstate.sim.replication --seed N` replays one seed with its event log.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import heapq
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hotstate.log.batch import RecordBatch
from hotstate.replica.batchlog import BatchLog
from hotstate.replica.core import (
    AdvanceStart,
    AppendBatches,
    IsrChange,
    PartitionView,
    Ready,
    ReplicaConfig,
    ReplicaCore,
    ReplicaSafetyError,
    ResetLog,
    Role,
    TruncateTo,
)
from hotstate.replica.messages import ReplicaError, ReplicaMessage

CoreFactory = Callable[..., ReplicaCore]

_DELIVER, _TICK, _DISK_DONE, _CRASH, _RESTART, _PARTITION, _HEAL, _PRODUCE, _CALM, _META, _ISR, _SNAP = range(
    12
)
SESSION_TIMEOUT_MS = 300


class ReplicationInvariantViolation(Exception):
    pass


class ReplicationSimFailure(Exception):
    def __init__(self, seed: int, time: int, reason: str, broken: str | None = None) -> None:
        replay = f"python -m hotstate.sim.replication --seed {seed}" + (
            f" --broken {broken}" if broken else ""
        )
        super().__init__(f"seed {seed}: {reason} (at t={time} ms)\n  replay: {replay}")
        self.seed = seed
        self.reason = reason


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
        return dataclasses.replace(profile, config=config)


@dataclass
class SimStore:
    """A store as the invariants see it: what the real RocksDB store holds, plus a hash per position."""

    position: int = 0
    epoch: int = 0
    data: dict[bytes, bytes] = field(default_factory=dict)
    chain: list[bytes] = field(default_factory=list)  # chain[p] = hash of every record below p

    def __post_init__(self) -> None:
        if not self.chain:
            self.chain = [b""]

    def apply(self, batch: RecordBatch) -> None:
        for record in batch.records:
            key, _, value = record.partition(b"=")
            self.data[key] = value
            self.chain.append(hashlib.blake2b(self.chain[-1] + record, digest_size=8).digest())
        self.position = batch.next_offset
        self.epoch = batch.leader_epoch

    def copy(self) -> SimStore:
        return SimStore(self.position, self.epoch, dict(self.data), list(self.chain))


@dataclass
class SimDiskLog:
    """The durable partition log of one replica."""

    start: int = 0
    start_epoch: int = 0
    batches: list[RecordBatch] = field(default_factory=list)

    def load(self) -> BatchLog:
        return BatchLog(self.start, self.start_epoch, self.batches)

    def apply(self, op: Any) -> None:
        log = self.load()
        match op:
            case AppendBatches(batches):
                for batch in batches:
                    log.append(batch)
            case TruncateTo(offset):
                log.truncate_to(offset)
            case AdvanceStart(offset):
                log.advance_start(offset)
            case ResetLog(offset, epoch):
                log.reset(offset, epoch)
        self.start, self.start_epoch = log.start_offset, log.start_epoch
        self.batches = log.read(log.start_offset, 1 << 62)

    @property
    def end(self) -> int:
        return self.batches[-1].next_offset if self.batches else self.start


@dataclass
class Replica:
    id: int
    disk: SimDiskLog = field(default_factory=SimDiskLog)
    store: SimStore = field(default_factory=SimStore)
    core: ReplicaCore | None = None
    incarnation: int = 0
    writing: Ready | None = None
    tick_at: int | None = None
    cut_from_controller: bool = False


@dataclass
class ControllerModel:
    """The metadata the controller commits for the partition (the real one: QuorumController)."""

    replicas: tuple[int, ...]
    active: int | None
    leader_epoch: int
    isr: tuple[int, ...]
    partition_epoch: int = 1
    fenced: set[int] = field(default_factory=set)
    last_heartbeat: dict[int, int] = field(default_factory=dict)

    def view(self) -> PartitionView:
        return PartitionView(self.active, self.leader_epoch, self.isr, self.replicas, self.partition_epoch)


@dataclass
class Stats:
    seed: int
    acked: int = 0
    produce_errors: int = 0
    committed_end: int = 0
    actives: int = 0
    snapshots: int = 0
    log: list[str] = field(default_factory=list)


class ReplicationWorld:
    def __init__(
        self,
        seed: int,
        profile: ReplicationProfile,
        *,
        core_factory: CoreFactory = ReplicaCore,
        trace: bool = False,
    ) -> None:
        self.seed = seed
        self.profile = profile
        self.core_factory = core_factory
        self.trace = trace
        self.rng = random.Random(f"replication-world/{seed}")
        self.now = 0
        self._seq = 0
        self._events: list[tuple[int, int, int, int, Any]] = []
        ids = tuple(range(1, profile.replicas + 1))
        self.replicas = {i: Replica(i) for i in ids}
        self.controller = ControllerModel(ids, ids[0], 0, ids)
        self.stats = Stats(seed)
        self._partition: dict[int, int] | None = None
        self._calm = False
        self._value = 0
        self._produce_tokens: dict[tuple[int, int, int], tuple[RecordBatch | None, tuple[bytes, ...]]] = {}
        # The invariants' memory.
        self.committed: list[bytes] = []  # committed[o] = the record every store applies at offset o
        self.max_hw = 0
        self.epoch_leaders: dict[int, int] = {}
        self.acked: list[tuple[int, tuple[bytes, ...]]] = []

    # ------------------------------------------------------------------ running
    def run(self) -> Stats:
        profile = self.profile
        for replica in self.replicas.values():
            self._start(replica)
        self._schedule(profile.chaos_ms, _CALM, 0, None)
        self._schedule(1, _PRODUCE, 0, None)
        if profile.crash_every_ms:
            self._schedule(self._gap(profile.crash_every_ms), _CRASH, 0, None)
        if profile.partition_every_ms:
            self._schedule(self._gap(profile.partition_every_ms), _PARTITION, 0, None)
        end = profile.chaos_ms + profile.calm_ms
        try:
            while self._events and self._events[0][0] <= end:
                when, _, kind, target, payload = heapq.heappop(self._events)
                self.now = when
                self._handle(kind, target, payload)
                self._controller_tick()
                self._check()
            self._check_converged()
        except (ReplicationInvariantViolation, ReplicaSafetyError, AssertionError) as error:
            broken = getattr(self.core_factory, "rule", None)
            raise ReplicationSimFailure(
                self.seed, self.now, f"{type(error).__name__}: {error}", broken
            ) from error
        self.stats.committed_end = len(self.committed)
        return self.stats

    def _gap(self, mean_ms: int) -> int:
        return 1 + int(self.rng.expovariate(1 / mean_ms))

    def _schedule(self, when: int, kind: int, target: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, kind, target, payload))

    def _note(self, text: str) -> None:
        if self.trace:
            self.stats.log.append(f"{self.now:6d} {text}")

    def _handle(self, kind: int, target: int, payload: Any) -> None:
        replica = self.replicas.get(target)
        if kind == _DELIVER:
            message: ReplicaMessage = payload
            destination = self.replicas[message.dst]
            if destination.core is not None:
                destination.core.step(message, self.now)
                self._pump(destination)
        elif kind == _TICK:
            assert replica is not None
            if replica.core is not None and replica.tick_at == self.now:
                replica.tick_at = None
                replica.core.tick(self.now)
                self._pump(replica)
        elif kind == _DISK_DONE:
            assert replica is not None
            if replica.core is not None and replica.incarnation == payload:
                self._finish_write(replica)
        elif kind == _META:
            assert replica is not None
            incarnation, view = payload
            if replica.core is not None and replica.incarnation == incarnation:
                replica.core.set_metadata(view, self.now)
                self._pump(replica)
        elif kind == _ISR:
            self._on_isr_change(target, payload)
        elif kind == _SNAP:
            assert replica is not None
            self._finish_snapshot(replica, payload)
        elif kind == _CRASH:
            if not self._calm:
                self._crash_someone()
                self._schedule(self.now + self._gap(self.profile.crash_every_ms), _CRASH, 0, None)
        elif kind == _RESTART:
            assert replica is not None
            if replica.core is None:
                self._start(replica)
        elif kind == _PARTITION:
            if not self._calm:
                self._make_partition()
                self._schedule(self.now + self._gap(self.profile.partition_every_ms), _PARTITION, 0, None)
        elif kind == _HEAL:
            self._heal()
        elif kind == _PRODUCE:
            self._produce()
            if self.now < self.profile.chaos_ms + 1000:
                self._schedule(self.now + self._gap(self.profile.produce_every_ms), _PRODUCE, 0, None)
        elif kind == _CALM:
            self._calm = True
            self._heal()
            for r in self.replicas.values():
                if r.core is None:
                    self._start(r)

    # ------------------------------------------------------------------ replicas
    def _start(self, replica: Replica) -> None:
        replica.incarnation += 1
        replica.core = self.core_factory(
            replica.id,
            1,
            0,
            self.profile.config,
            log=replica.disk.load(),
            store_position=replica.store.position,
            store_epoch=replica.store.epoch,
            now=self.now,
        )
        replica.writing = None
        replica.tick_at = None
        self.controller.last_heartbeat[replica.id] = self.now
        self._note(
            f"replica {replica.id} starts: store at {replica.store.position}, log end {replica.disk.end}"
        )
        self._publish_to(replica)
        self._pump(replica)

    def _crash(self, replica: Replica, down_ms: int) -> None:
        self._note(f"replica {replica.id} crashes for {down_ms} ms")
        replica.core = None
        replica.writing = None
        replica.tick_at = None
        self._schedule(self.now + down_ms, _RESTART, replica.id, None)

    def _crash_someone(self) -> None:
        up = [r for r in self.replicas.values() if r.core is not None]
        if not up:
            return
        active = self.controller.active
        if active is not None and self.rng.random() < 0.5 and self.replicas[active].core is not None:
            victim = self.replicas[active]
        else:
            victim = self.rng.choice(up)
        self._crash(victim, self.rng.randint(1, self.profile.down_max_ms))

    def _pump(self, replica: Replica) -> None:
        core = replica.core
        if core is None or replica.writing is not None:
            self._arm_tick(replica)
            return
        ready = core.ready()
        if ready.is_empty():
            self._arm_tick(replica)
            return
        replica.writing = ready
        if ready.log_ops and self.profile.disk_max_ms:
            self._schedule(
                self.now + self.rng.randint(0, self.profile.disk_max_ms),
                _DISK_DONE,
                replica.id,
                replica.incarnation,
            )
        else:
            self._finish_write(replica)

    def _finish_write(self, replica: Replica) -> None:
        ready = replica.writing
        core = replica.core
        assert ready is not None and core is not None
        if core.role is Role.LEADER:
            self.max_hw = max(self.max_hw, ready.high_watermark)
        for op in ready.log_ops:
            if isinstance(op, TruncateTo) and op.offset < replica.store.position:
                raise ReplicationInvariantViolation(
                    f"replica {replica.id} truncates to {op.offset}, below its store position "
                    f"{replica.store.position}"
                )
            replica.disk.apply(op)
        for message in ready.messages:
            self._send(replica.id, message)
        for result in ready.produce_results:
            self._on_produce_result(replica, result)
        for batch in ready.committed:
            if batch.next_offset <= replica.store.position:
                continue
            if batch.base_offset != replica.store.position:
                raise ReplicationInvariantViolation(
                    f"replica {replica.id} applies {batch.base_offset} but its store is at "
                    f"{replica.store.position}"
                )
            replica.store.apply(batch)
            self._check_applied(replica, batch)
        if ready.isr_change is not None:
            self._send_isr_change(replica.id, ready.isr_change)
        if ready.snapshot_needed is not None:
            self._schedule(
                self.now + self.rng.randint(1, 20),
                _SNAP,
                replica.id,
                (replica.incarnation, ready.snapshot_needed),
            )
        replica.writing = None
        core.advance(ready)
        self._pump(replica)

    def _arm_tick(self, replica: Replica) -> None:
        core = replica.core
        if core is None:
            return
        deadline = core.next_deadline()
        if deadline is None:
            deadline = self.now + 100
        deadline = max(deadline, self.now + 1)
        if replica.tick_at is None or deadline < replica.tick_at:
            replica.tick_at = deadline
            self._schedule(deadline, _TICK, replica.id, None)

    def _finish_snapshot(self, replica: Replica, payload: Any) -> None:
        incarnation, needed = payload
        if replica.core is None or replica.incarnation != incarnation:
            return
        leader = self.replicas[needed.leader]
        if (
            leader.core is None
            or leader.core.role is not Role.LEADER
            or leader.core.leader_epoch != needed.leader_epoch
            or self._cut(leader.id, replica.id)
        ):
            replica.core.snapshot_failed(self.now)
        else:
            snapshot = leader.store.copy()
            if snapshot.position < replica.store.position:
                replica.core.snapshot_failed(self.now)
            else:
                self.stats.snapshots += 1
                self._note(
                    f"replica {replica.id} installs a snapshot at {snapshot.position} from {leader.id}"
                )
                replica.store = snapshot
                replica.core.snapshot_installed(snapshot.position, snapshot.epoch, self.now)
        self._pump(replica)

    # ------------------------------------------------------------------ network
    def _cut(self, a: int, b: int) -> bool:
        return self._partition is not None and self._partition.get(a, 0) != self._partition.get(b, 0)

    def _send(self, src: int, message: ReplicaMessage) -> None:
        if self._cut(src, message.dst) or self.rng.random() < self.profile.drop:
            return
        copies = 2 if self.rng.random() < self.profile.duplicate else 1
        for _ in range(copies):
            self._schedule(self.now + self.rng.randint(0, self.profile.delay_max_ms), _DELIVER, 0, message)

    def _make_partition(self) -> None:
        ids = list(self.replicas)
        if self.rng.random() < 0.3:
            # Cut one replica off from the controller only: it is fenced while it keeps running.
            victim = self.replicas[self.rng.choice(ids)]
            victim.cut_from_controller = True
            self._note(f"replica {victim.id} cut off from the controller")
        else:
            self._partition = {i: self.rng.randint(0, 1) for i in ids}
            self._note(f"network partition {self._partition}")
        self._schedule(self.now + self.rng.randint(50, self.profile.partition_max_ms), _HEAL, 0, None)

    def _heal(self) -> None:
        self._partition = None
        for r in self.replicas.values():
            if r.cut_from_controller:
                r.cut_from_controller = False
                self._publish_to(r)  # it catches up on the metadata log it missed

    # ------------------------------------------------------------------ controller model
    def _controller_tick(self) -> None:
        c = self.controller
        for replica in self.replicas.values():
            if replica.core is not None and not replica.cut_from_controller:
                c.last_heartbeat[replica.id] = self.now
                if replica.id in c.fenced:
                    self._unfence(replica.id)
            elif (
                replica.id not in c.fenced
                and self.now - c.last_heartbeat.get(replica.id, 0) > SESSION_TIMEOUT_MS
            ):
                self._fence(replica.id)

    def _fence(self, node: int) -> None:
        c = self.controller
        c.fenced.add(node)
        isr = tuple(r for r in c.isr if r != node) or c.isr
        active = c.active
        epoch = c.leader_epoch
        if active == node:
            candidates = [r for r in isr if r not in c.fenced]
            # Prefer the most caught-up in-sync replica (as the real controller does from heartbeats).
            candidates.sort(key=lambda r: -self.replicas[r].disk.end)
            active = candidates[0] if candidates else None
            epoch += 1
        self._note(f"controller fences {node}: active {active} epoch {epoch} isr {isr}")
        self._commit(active, epoch, isr)

    def _unfence(self, node: int) -> None:
        c = self.controller
        c.fenced.discard(node)
        if c.active is None and node in c.isr:
            self._note(f"controller unfences {node}: active again at epoch {c.leader_epoch + 1}")
            self._commit(node, c.leader_epoch + 1, c.isr)

    def _commit(self, active: int | None, epoch: int, isr: tuple[int, ...]) -> None:
        c = self.controller
        if (active, epoch, isr) == (c.active, c.leader_epoch, c.isr):
            return
        c.active, c.leader_epoch, c.isr = active, epoch, isr
        c.partition_epoch += 1
        self._check_isr_complete()
        for replica in self.replicas.values():
            self._publish_to(replica)

    def _publish_to(self, replica: Replica) -> None:
        if replica.core is None or replica.cut_from_controller:
            return
        delay = self.rng.randint(0, self.profile.meta_delay_max_ms)
        self._schedule(self.now + delay, _META, replica.id, (replica.incarnation, self.controller.view()))

    def _send_isr_change(self, src: int, change: IsrChange) -> None:
        if self.replicas[src].cut_from_controller or self.rng.random() < self.profile.drop:
            return
        self._schedule(self.now + self.rng.randint(0, self.profile.delay_max_ms), _ISR, src, change)

    def _on_isr_change(self, src: int, change: IsrChange) -> None:
        c = self.controller
        if (
            change.leader_epoch != c.leader_epoch
            or change.partition_epoch != c.partition_epoch
            or src != c.active
        ):
            return  # stale: the requester learns the outcome from the metadata
        if (
            src not in change.isr
            or not set(change.isr) <= set(c.replicas)
            or set(change.isr) & (c.fenced - set(c.isr))
        ):
            replica = self.replicas[src]
            if replica.core is not None:
                replica.core.isr_change_rejected(change, self.now)
                self._pump(replica)
            return
        self._note(f"controller: ISR of epoch {c.leader_epoch} becomes {change.isr}")
        self._commit(c.active, c.leader_epoch, tuple(change.isr))

    # ------------------------------------------------------------------ clients
    def _produce(self) -> None:
        c = self.controller
        # The client's idea of the active may be stale: it uses an earlier view now and then.
        target = c.active if self.rng.random() < 0.8 else self.rng.choice(list(self.replicas))
        if target is None:
            return
        replica = self.replicas[target]
        if replica.core is None:
            return
        count = self.rng.randint(1, 4)
        records = []
        for _ in range(count):
            self._value += 1
            records.append(f"k{self.rng.randrange(12)}={self._value}".encode())
        epoch = c.leader_epoch if self.rng.random() < 0.9 else max(0, c.leader_epoch - 1)
        result = replica.core.produce(records, epoch, self.now, 1000)
        if isinstance(result, int):
            self._produce_tokens[(target, replica.incarnation, result)] = (None, tuple(records))
        else:
            self.stats.produce_errors += 1
        self._pump(replica)

    def _on_produce_result(self, replica: Replica, result: Any) -> None:
        entry = self._produce_tokens.pop((replica.id, replica.incarnation, result.token), None)
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
        for replica in self.replicas.values():
            core = replica.core
            if core is None:
                continue
            if core.role is Role.LEADER:
                leader = self.epoch_leaders.setdefault(core.leader_epoch, replica.id)
                if leader != replica.id:
                    raise ReplicationInvariantViolation(
                        f"two actives in epoch {core.leader_epoch}: {leader} and {replica.id}"
                    )
                self.max_hw = max(self.max_hw, core.high_watermark)
        for member in c.isr:
            self._check_holds_hw(member)

    def _check_holds_hw(self, member: int) -> Replica:
        c = self.controller
        replica = self.replicas[member]
        held = max(replica.disk.end, replica.store.position)
        if held < self.max_hw:
            raise ReplicationInvariantViolation(
                f"ISR {c.isr} (epoch {c.leader_epoch}) has replica {member} holding {held} < HW {self.max_hw}"
            )
        return replica

    def _check_applied(self, replica: Replica, batch: RecordBatch) -> None:
        if replica.store.position > self.max_hw:
            raise ReplicationInvariantViolation(
                f"replica {replica.id} store at {replica.store.position}, above every HW ({self.max_hw})"
            )
        for offset, record in enumerate(batch.records, start=batch.base_offset):
            if offset < len(self.committed):
                if self.committed[offset] != record:
                    raise ReplicationInvariantViolation(
                        f"replica {replica.id} applied {record!r} at {offset}, others applied "
                        f"{self.committed[offset]!r}"
                    )
            elif offset == len(self.committed):
                self.committed.append(record)
            else:
                raise ReplicationInvariantViolation(f"replica {replica.id} applied {offset} past a gap")

    def _check_acked(self, base: int, records: tuple[bytes, ...]) -> None:
        for offset, record in enumerate(records, start=base):
            if offset < len(self.committed) and self.committed[offset] != record:
                raise ReplicationInvariantViolation(
                    f"acked {record!r} at {offset} but {self.committed[offset]!r} committed"
                )

    def _durable_record(self, replica: Replica, offset: int) -> bytes | None:
        disk = replica.disk
        for batch in disk.batches:
            if batch.base_offset <= offset < batch.next_offset:
                return batch.records[offset - batch.base_offset]
        return None

    def _check_isr_complete(self) -> None:
        """Every member of the committed ISR durably holds every record below the highest HW."""
        c = self.controller
        for member in c.isr:
            replica = self._check_holds_hw(member)
            for offset in range(
                max(replica.disk.start, replica.store.position), min(self.max_hw, len(self.committed))
            ):
                record = self._durable_record(replica, offset)
                if record is not None and record != self.committed[offset]:
                    raise ReplicationInvariantViolation(
                        f"ISR replica {member} holds {record!r} at committed offset {offset}"
                    )

    def _check_converged(self) -> None:
        c = self.controller
        assert c.active is not None, "no active after the calm period"
        leader = self.replicas[c.active]
        assert leader.core is not None and leader.core.role is Role.LEADER, "the chosen active is not leading"
        end = leader.core.log_end_offset
        for replica in self.replicas.values():
            if replica.store.position != end:
                raise ReplicationInvariantViolation(
                    f"no convergence: replica {replica.id} store at {replica.store.position}, "
                    f"the active's log ends at {end}"
                )
            if replica.store.chain[-1] != leader.store.chain[-1] or replica.store.data != leader.store.data:
                raise ReplicationInvariantViolation(f"replica {replica.id} store differs from the active's")
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


def run_seed(seed: int, *, core_factory: CoreFactory = ReplicaCore, trace: bool = False) -> Stats:
    world = ReplicationWorld(seed, ReplicationProfile.from_seed(seed), core_factory=core_factory, trace=trace)
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
            f"{stats.snapshots} snapshots, {stats.produce_errors} produce errors"
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
