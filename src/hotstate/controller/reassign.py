"""Moving existing partitions towards the assignor's placement, safely (KIP-441's probing rebalances).

The controller runs the assignor over the live brokers with the current placement as the previous
assignment and the replicas' reported log ends as lags, then turns its answer into one
`PartitionAssignment` per partition that must change. Each step is safe on its own, so the placement
converges over several runs while every partition stays writable and readable:

- the active moves only to a replica in the ISR (it holds every committed record), with a new leader epoch;
- a new owner is added as a replica (a warmup when the assignor says so) and catches up by fetching;
- an in-sync replica the assignor no longer wants is dropped only once every replica it wants is in sync,
  so a partition never has fewer in-sync copies than before the move began; dropping one bumps the leader
  epoch, which fences the dropped replica's late fetches.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass

import msgpack

from hotstate.assignor import Assignment, AssignorConfig, PartitionId, Placement, Server, Table, assign
from hotstate.controller.image import MetadataImage, PartitionInfo, ServerInfo
from hotstate.controller.placement import (
    assignor_table,
    config_from_items,
    config_items,
    placement_of,
    previous_placement,
)
from hotstate.controller.records import PartitionAssignment

# (table id, partition, node id) -> the log end offset that node last reported for its replica.
ReplicaEnds = Mapping[tuple[int, int, int], int]


# Partitions read per step of `ReassignJob.input_steps` on the loop: 5-10 us each on this machine, so
# 10-20 ms a step. At 10,000 a step (about 100 ms) the Raft driver, whose every write waits for the loop
# to take its result, lost whole steps several times in a row: the metadata leader answered no Fetch for
# 0.5-1 s and a follower stood for election, 1 run in 9 of a 100,000-partition create (3 voters).
INPUT_STEP_PARTITIONS = 2_000


@dataclass(frozen=True, slots=True)
class ReassignJob:
    """The assignor's inputs at one moment. Plain immutable data, so a shell may run it on a worker thread
    (it takes about a second for 10,000 partitions) while the controller goes on."""

    image: MetadataImage
    brokers: tuple[ServerInfo, ...]
    ends: Mapping[tuple[int, int, int], int]
    config: AssignorConfig

    def run(self) -> Assignment:
        return desired_placement(self.image, list(self.brokers), self.ends, self.config)

    def input_steps(self, step: int = INPUT_STEP_PARTITIONS) -> Generator[None, None, bytes]:
        """The assignor's inputs msgpack-encoded for `reassign_encoded` in a worker process, built
        `step` partitions at a time: the generator yields between steps (a shell on the event loop lets
        other work run there) and returns the bytes. The same inputs `run` gives the assignor."""
        servers = [[str(b.node_id), b.rack, [list(t) for t in b.tags]] for b in self.brokers]
        tables = [
            [t.name, t.partitions, t.standby_replicas, list(t.writer_racks)]
            for t in self.image.tables.values()
        ]
        # Each partition's entry is packed at once and only its bytes kept: bytes are not tracked by the
        # cyclic collector, while a million entries kept as lists were, and the full collections that they
        # set off walked them all on the loop (0.5-1 s each at 1,000,000 partitions). msgpack arrays
        # concatenate: a header and the packed items are the bytes of the whole array.
        pack = msgpack.Packer(use_bin_type=True).pack
        previous: list[bytes] = []
        lags: list[bytes] = []
        acceptable = self.config.acceptable_recovery_lag
        done = 0
        for table in self.image.tables.values():
            for part in self.image.partitions.get(table.table_id, ()):
                if part.active is not None:
                    placed = placement_of(part)
                    previous.append(
                        pack(
                            [
                                table.name,
                                part.partition,
                                placed.active,
                                list(placed.standbys),
                                list(placed.warmups),
                            ]
                        )
                    )
                lag = partition_lags(table.table_id, part, self.ends, acceptable)
                if lag:
                    lags.append(pack([table.name, part.partition, list(lag.items())]))
                done += 1
                if done % step == 0:
                    yield
        header = msgpack.Packer(use_bin_type=True)
        return b"".join(
            (
                header.pack_array_header(5),
                pack(servers),
                pack(tables),
                header.pack_array_header(len(previous)),
                *previous,
                header.pack_array_header(len(lags)),
                *lags,
                pack(config_items(self.config)),
            )
        )


@dataclass(frozen=True, slots=True)
class Desired:
    """The assignor's answer from a worker process, reduced to the partitions whose placement differs from
    the job's image: the event loop then reads only those (`reassignment_records`). A partition that
    changed in the view since the job was made is not among them; the next run, due because the view
    changed, sees it."""

    partitions: Mapping[PartitionId, Placement]
    strategy: str
    active_cost: int


def reassign_encoded(inputs: bytes, limit: int | None = None) -> bytes:
    """`ReassignJob.input_steps`' inputs assigned (pure: runs in any process): msgpack [strategy, active
    cost, [table, partition, active, standbys, warmups] of every partition placed otherwise than before, in
    (table, partition) order]. With `limit`, only the first `limit` of them: the worker cuts the answer, so
    the event loop never decodes and sorts a million changes to apply ten thousand (1.2 s of the loop at
    1,000,000 partitions)."""
    servers, tables, previous, lags, config = msgpack.unpackb(inputs)
    before = {PartitionId(t, p): Placement(a, tuple(s), tuple(w)) for t, p, a, s, w in previous}
    answer = assign(
        [Server(node, rack, dict(tags)) for node, rack, tags in servers],
        [Table(name, count, standbys, tuple(racks)) for name, count, standbys, racks in tables],
        before,
        {PartitionId(t, p): dict(lag) for t, p, lag in lags},
        config_from_items(config),
    )
    changed = []
    for pid, placed in answer.partitions.items():
        old = before.get(pid)
        if (
            old is None
            or old.active != placed.active
            or set(old.standbys) != set(placed.standbys)
            or set(old.warmups) != set(placed.warmups)
        ):
            changed.append(
                [pid.table, pid.partition, placed.active, list(placed.standbys), list(placed.warmups)]
            )
    changed.sort(key=lambda c: (c[0], c[1]))
    if limit is not None:
        changed = changed[:limit]
    return msgpack.packb(
        [answer.explanation.strategy, answer.explanation.cost.active, changed], use_bin_type=True
    )


def decode_desired(answer: bytes) -> Desired:
    """`reassign_encoded`'s answer (already in order and cut to its limit by the worker: the rest wait for
    the next run, each step being safe on its own)."""
    strategy, cost, changed = msgpack.unpackb(answer)
    return Desired(
        {PartitionId(t, p): Placement(a, tuple(s), tuple(w)) for t, p, a, s, w in changed}, strategy, cost
    )


def desired_placement(
    image: MetadataImage, brokers: list[ServerInfo], ends: ReplicaEnds, config: AssignorConfig
) -> Assignment:
    """The assignor's placement of every table over `brokers`, from the current one."""
    return assign(
        [Server(str(b.node_id), b.rack, dict(b.tags)) for b in brokers],
        [assignor_table(t) for t in image.tables.values()],
        previous_placement(image, exclude=""),
        replica_lags(image, ends, config.acceptable_recovery_lag),
        config,
    )


def replica_lags(
    image: MetadataImage, ends: ReplicaEnds, acceptable_lag: int
) -> dict[PartitionId, dict[str, int]]:
    """Offset lag per partition and server, as the assignor reads it: the ISR decides who is caught up.

    An in-sync replica holds every committed record, so it is caught up (0), whatever its server's last
    report says: reports are taken at different moments, and comparing them would make the active look
    behind its own follower under load and swap back and forth. A replica outside the ISR is never caught
    up (the active may only move to an in-sync one); its lag behind the in-sync replicas' ends orders the
    warmups (closest first)."""
    out: dict[PartitionId, dict[str, int]] = {}
    for table in image.tables.values():
        for part in image.partitions.get(table.table_id, ()):
            lags = partition_lags(table.table_id, part, ends, acceptable_lag)
            if lags:
                out[PartitionId(table.name, part.partition)] = lags
    return out


def partition_lags(
    table_id: int, part: PartitionInfo, ends: ReplicaEnds, acceptable_lag: int
) -> dict[str, int]:
    """One partition's lags per server (`replica_lags`)."""
    reported = {
        r: ends[(table_id, part.partition, r)] for r in part.replicas if (table_id, part.partition, r) in ends
    }
    in_sync = [end for r, end in reported.items() if r in part.isr]
    top = max(in_sync, default=max(reported.values(), default=0))
    lags = {str(r): 0 for r in part.isr if r in part.replicas}
    for r, end in reported.items():
        if r not in part.isr:
            lags[str(r)] = max(top - end, acceptable_lag + 1)
    return lags


def reassignment_records(image: MetadataImage, desired: Assignment | Desired) -> list[PartitionAssignment]:
    """One record per partition whose replicas or active must change to move towards `desired`."""
    if isinstance(desired, Desired):
        return _changed_records(image, desired)
    records = []
    for table in sorted(image.tables.values(), key=lambda t: t.table_id):
        for part in image.partitions.get(table.table_id, ()):
            placed = desired.partitions.get(PartitionId(table.name, part.partition))
            if placed is None or part.active is None:
                continue  # an offline partition waits for one of its in-sync replicas to return
            record = partition_step(part, placed)
            if record is not None:
                records.append(record)
    return records


def _changed_records(image: MetadataImage, desired: Desired) -> list[PartitionAssignment]:
    """`reassignment_records` reading only the partitions `desired` names, in the same order."""
    ids = {t.name: t.table_id for t in image.tables.values()}
    wanted = sorted(
        (
            (ids[pid.table], pid.partition, placed)
            for pid, placed in desired.partitions.items()
            if pid.table in ids
        ),
        key=lambda item: (item[0], item[1]),
    )
    records = []
    for table_id, partition, placed in wanted:
        parts = image.partitions.get(table_id, ())
        if partition >= len(parts) or parts[partition].active is None:
            continue
        record = partition_step(parts[partition], placed)
        if record is not None:
            records.append(record)
    return records


def partition_step(part: PartitionInfo, placed: Placement) -> PartitionAssignment | None:
    """The next safe step of one partition towards `placed` (None: nothing to do now)."""
    assert part.active is not None
    target = int(placed.active)
    active, epoch = part.active, part.leader_epoch
    if target != active and target in part.isr:
        active, epoch = target, epoch + 1
    wanted = list(dict.fromkeys((active, target, *map(int, placed.standbys), *map(int, placed.warmups))))
    all_in_sync = all(r in part.isr for r in wanted)
    # Old in-sync copies stay until the new ones are in sync; old copies out of sync are no help.
    kept = [r for r in part.replicas if r not in wanted and r in part.isr and not all_in_sync]
    replicas = (*wanted, *kept)
    warmups = tuple(w for w in map(int, placed.warmups) if w != active)
    if active == part.active and set(replicas) == set(part.replicas) and set(warmups) == set(part.warmups):
        return None
    if active == part.active and not set(part.replicas) <= set(replicas):
        # A dropped replica's server learns of it late: until then its old replica fetches in this epoch,
        # and were it added back meanwhile, those fetches could put it in the ISR just before its server
        # deletes its data. A new epoch fences them (as Kafka's controller does when a reassignment ends).
        epoch += 1
    isr = tuple(r for r in part.isr if r in replicas)
    return PartitionAssignment(
        part.table_id, part.partition, replicas, active, warmups, epoch, isr, part.partition_epoch + 1
    )
