"""Moving existing partitions towards the assignor's placement: each step's rules, and whole runs of the
controller with replicas that catch up, checked after every step."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import msgpack
import pytest

from hotstate.assignor import PartitionId, Placement
from hotstate.controller.controller import ControllerConfig, QuorumController
from hotstate.controller.image import PartitionInfo
from hotstate.controller.reassign import (
    ReassignJob,
    decode_desired,
    partition_step,
    reassign_encoded,
    reassignment_records,
    replica_lags,
)
from hotstate.controller.records import KeyColumn, KeyType, PartitionAssignment
from hotstate.controller.requests import (
    AlterPartitionRequest,
    ControllerError,
    CreateTableRequest,
    RegisterWriterRequest,
    ServerHeartbeatRequest,
)

from .test_controller import SESSION, Harness

DEFAULTS = ControllerConfig(SESSION)

KEY = (KeyColumn("user", KeyType.STRING),)


def part(
    replicas: Sequence[int],
    active: int | None,
    isr: Sequence[int],
    warmups: Sequence[int] = (),
    epoch: int = 3,
    partition_epoch: int = 7,
) -> PartitionInfo:
    return PartitionInfo(1, 0, tuple(replicas), active, tuple(warmups), epoch, tuple(isr), partition_epoch)


def placed(active: int, standbys: Sequence[int] = (), warmups: Sequence[int] = ()) -> Placement:
    return Placement(str(active), tuple(map(str, standbys)), tuple(map(str, warmups)))


# ---------------------------------------------------------------------------------------------- one step
def test_the_active_moves_to_an_in_sync_target_with_a_new_leader_epoch() -> None:
    step = partition_step(part((1, 2), 1, (1, 2)), placed(2, (1,)))
    assert step == PartitionAssignment(1, 0, (2, 1), 2, (), 4, (1, 2), 8)


def test_a_target_out_of_sync_gets_a_replica_and_the_active_stays() -> None:
    step = partition_step(part((1, 2), 1, (1, 2)), placed(1, (2,), warmups=(3,)))
    assert step is not None
    assert (step.active, step.leader_epoch, set(step.replicas), step.warmups) == (1, 3, {1, 2, 3}, (3,))
    assert step.isr == (1, 2)
    # The target is already a replica but not in sync: the active still stays.
    later = partition_step(part((1, 2, 3), 1, (1, 2), warmups=(3,)), placed(3, (2,)))
    assert later is not None and later.active == 1 and later.leader_epoch == 3


def test_an_old_in_sync_copy_stays_until_every_wanted_copy_is_in_sync() -> None:
    moving = part((1, 2, 3), 1, (1, 2))  # 3 is the new standby, still catching up; 2 is the old one
    step = partition_step(moving, placed(1, (3,)))
    assert step is None  # nothing can change yet: 2 must stay, 3 is there already
    done = partition_step(part((1, 2, 3), 1, (1, 2, 3)), placed(1, (3,)))
    assert done is not None and done.replicas == (1, 3) and done.isr == (1, 3)
    # Dropping a copy bumps the leader epoch: the dropped replica's late fetches are fenced.
    assert done.active == 1 and done.leader_epoch == 4


def test_an_unwanted_copy_out_of_sync_is_dropped_at_once() -> None:
    step = partition_step(part((1, 2, 3), 1, (1, 3)), placed(1, (3,)))
    assert step is not None and step.replicas == (1, 3) and step.isr == (1, 3)


def test_a_standby_rebuilding_a_lost_copy_joins_at_once_as_a_plain_replica() -> None:
    # 3 held the standby and is gone; the assignor wants it on 2, which has no copy. 2 is added to fetch
    # (not a warmup: no budget applies), and 3's out-of-sync copy goes at once with a new leader epoch.
    step = partition_step(part((1, 3), 1, (1,)), placed(1, (2,)))
    assert step is not None
    assert (step.replicas, step.active, step.warmups, step.isr) == ((1, 2), 1, (), (1,))
    assert step.leader_epoch == 4


def test_a_partition_already_where_the_assignor_wants_it_is_left_alone() -> None:
    assert partition_step(part((1, 2), 1, (1, 2)), placed(1, (2,))) is None


def one_partition(standbys: int) -> tuple[Harness, PartitionInfo]:
    """Three brokers and a table of one partition with `standbys` standbys."""
    h = Harness()
    for node_id in (1, 2, 3):
        h.register(node_id, "az-a")
    h.handle(CreateTableRequest("t", 1, standbys, KEY, None))
    p = h.image.partitions_of("t")[0]
    assert p.active is not None
    return h, p


def test_a_replica_outside_the_isr_never_looks_caught_up_to_the_assignor() -> None:
    h, p = one_partition(1)
    assert p.active is not None
    ends = {(p.table_id, 0, r): 100 for r in p.replicas}
    assert replica_lags(h.image, ends, 10) == {PartitionId("t", 0): {str(r): 0 for r in p.replicas}}
    follower = next(r for r in p.replicas if r != p.active)
    h.handle(AlterPartitionRequest(p.active, p.table_id, 0, p.leader_epoch, p.partition_epoch, (p.active,)))
    lags = replica_lags(h.image, ends, 10)[PartitionId("t", 0)]
    assert lags[str(follower)] == 11 and lags[str(p.active)] == 0


def run_steps(job: ReassignJob) -> bytes:
    steps = job.input_steps(step=2)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return bytes(done.value)


# ---------------------------------------------------------------------------------------------- whole runs
class Cluster(Harness):
    """A controller with servers whose replicas catch up at once: each round every live server reports
    its replicas at the partition's end, and every active asks to add its caught-up followers to the ISR,
    as a real active would. Invariants are checked after every change."""

    def __init__(
        self,
        racks: dict[int, str],
        *,
        split: bool = False,
        in_process: bool = False,
        reassign_interval_ms: int = DEFAULTS.reassign_interval_ms,
        broker_removal_delay_ms: int = DEFAULTS.broker_removal_delay_ms,
    ) -> None:
        super().__init__()
        # in_process: the job's answer as a big cluster's host gets it from its worker process (the inputs
        # encoded in steps, the answer reduced to what changes), run here in this process.
        self.split = split or in_process
        self.in_process = in_process
        self.job: ReassignJob | None = None
        self.controller = QuorumController(
            self.image,
            ControllerConfig(
                SESSION,
                reassign_interval_ms=reassign_interval_ms,
                broker_removal_delay_ms=broker_removal_delay_ms,
            ),
            now=0,
            next_offset=1,
        )
        self.racks = racks
        self.down: set[int] = set()
        self.moves = 0
        for node_id, rack in racks.items():
            self.register(node_id, rack)

    def add(self, node_id: int, rack: str) -> None:
        self.racks[node_id] = rack
        self.register(node_id, rack)

    def round(self) -> None:
        self.now += 250
        for node_id in sorted(self.racks):
            if node_id in self.down:
                continue
            ends = tuple(
                (p.table_id, p.partition, 1000)
                for parts in self.image.partitions.values()
                for p in parts
                if node_id in p.replicas
            )
            request = ServerHeartbeatRequest(node_id, f"a{node_id}", self.next_offset, False, ends)
            self.handle(request)
        before = {(p.table_id, p.partition): p for parts in self.image.partitions.values() for p in parts}
        if self.split:
            # As the server runs it: the assignor on a thread, its answer applied a round later, after the
            # view moved on (heartbeats, ISR changes).
            self.commit(self.controller.tick(self.now, self.next_offset, reassign=False))
            if self.job is not None:
                answer = (
                    decode_desired(reassign_encoded(run_steps(self.job)))
                    if self.in_process
                    else self.job.run()
                )
                batch = self.controller.apply_reassignment(self.job, answer, self.now, self.next_offset)
                self.commit([batch] if batch is not None else [])
            # Lost copies first, alone, as the host runs them (on a thread too; here at once).
            replace = self.controller.replacement_job(self.now)
            if replace is not None:
                batch = self.controller.apply_replacement(replace, replace.run(), self.next_offset)
                self.commit([batch] if batch is not None else [])
                self.job = None
            else:
                self.job = self.controller.reassignment_job(self.now)
        else:
            self.commit(self.controller.tick(self.now, self.next_offset))
        for parts in self.image.partitions.values():
            for p in parts:
                old = before[(p.table_id, p.partition)]
                self.check(old, p)
                if p.active is None:
                    continue
                live = tuple(r for r in p.replicas if r not in self.down)
                if set(live) - set(p.isr):
                    isr = tuple(dict.fromkeys((*p.isr, *live)))
                    reply = self.handle(
                        AlterPartitionRequest(
                            p.active, p.table_id, p.partition, p.leader_epoch, p.partition_epoch, isr
                        )
                    ).reply
                    assert reply.error is ControllerError.NONE, reply

    def check(self, old: PartitionInfo, new: PartitionInfo) -> None:
        assert new.active is not None and new.active in new.isr and set(new.isr) <= set(new.replicas)
        assert new.leader_epoch >= old.leader_epoch and new.partition_epoch >= old.partition_epoch
        if new.active != old.active:
            self.moves += 1
            assert new.leader_epoch > old.leader_epoch
            assert new.active in old.isr, "the active moved to a replica that was not in sync"
        live_in_sync = [r for r in new.isr if r not in self.down]
        old_live_in_sync = [r for r in old.isr if r not in self.down]
        assert len(live_in_sync) >= min(len(old_live_in_sync), 1 + 1), (old, new)

    def settle(self, rounds: int = 80) -> int:
        """Rounds until nothing changes for 20 rounds in a row."""
        quiet = 0
        for n in range(rounds):
            offset = self.image.offset
            self.round()
            changed = any(
                p.warmups or set(p.replicas) - set(p.isr)
                for parts in self.image.partitions.values()
                for p in parts
            )
            quiet = quiet + 1 if not changed and self.image.offset - offset <= len(self.racks) else 0
            if quiet >= 20:
                return n
        raise AssertionError("placement did not settle")

    def actives(self) -> Counter[int]:
        return Counter(p.active for parts in self.image.partitions.values() for p in parts if p.active)


@pytest.mark.parametrize(
    ("split", "in_process"),
    [(False, False), (True, False), (True, True)],
    ids=["inline", "assignor-on-a-thread", "assignor-in-a-process"],
)
def test_a_new_server_gets_its_share_of_actives_and_standbys_without_a_partition_going_offline(
    split: bool, in_process: bool
) -> None:
    cluster = Cluster({1: "az-a", 2: "az-b"}, split=split, in_process=in_process)
    cluster.handle(CreateTableRequest("t", 6, 1, KEY, None))
    cluster.settle()
    assert cluster.actives() == {1: 3, 2: 3}
    cluster.add(3, "az-c")
    cluster.settle()
    assert cluster.actives() == {1: 2, 2: 2, 3: 2}
    for p in cluster.image.partitions_of("t"):
        assert len(p.replicas) == 2 and set(p.isr) == set(p.replicas) and p.warmups == ()
        assert p.active is not None and cluster.racks[p.standbys[0]] != cluster.racks[p.active]
    assert 0 < cluster.moves <= 4


def test_actives_move_near_a_writer_rack_registered_after_the_table_was_created() -> None:
    racks = {1: "az-a", 2: "az-a", 3: "az-b", 4: "az-b", 5: "az-c", 6: "az-c"}
    cluster = Cluster(dict(racks))
    cluster.handle(CreateTableRequest("t", 4, 1, KEY, None))
    cluster.settle()
    per_rack = Counter(racks[p.active] for p in cluster.image.partitions_of("t") if p.active)
    writers = min(("az-a", "az-b", "az-c"), key=lambda rack: per_rack[rack])
    assert per_rack[writers] < 2
    cluster.handle(RegisterWriterRequest("t", writers))
    cluster.settle()
    # 4 actives on 6 servers: one each at most, so two can be in the writers' rack, and both are.
    assert sum(racks[p.active] == writers for p in cluster.image.partitions_of("t") if p.active) == 2
    assert max(cluster.actives().values()) == 1


@pytest.mark.parametrize(
    ("split", "in_process"),
    [(False, False), (True, False), (True, True)],
    ids=["inline", "assignor-on-a-thread", "assignor-in-a-process"],
)
def test_nothing_moves_while_a_broker_is_fenced_and_its_replicas_are_replaced_once_it_is_taken_for_gone(
    split: bool, in_process: bool
) -> None:
    cluster = Cluster(
        {1: "az-a", 2: "az-b", 3: "az-c"}, split=split, in_process=in_process, broker_removal_delay_ms=10_000
    )
    cluster.handle(CreateTableRequest("t", 6, 1, KEY, None))
    cluster.settle()
    cluster.down.add(3)
    for _ in range(12):  # 3 s: fenced (session 2 s), and nothing reassigned
        cluster.round()
    assert cluster.image.servers[3].fenced
    assert any(3 in p.replicas for p in cluster.image.partitions_of("t"))
    before = cluster.image.partitions_of("t")
    for _ in range(8):
        cluster.round()
    assert [p.replicas for p in cluster.image.partitions_of("t")] == [p.replicas for p in before]
    for _ in range(40):  # past the removal delay
        cluster.round()
    parts = cluster.image.partitions_of("t")
    assert all(3 not in p.replicas and len(p.replicas) == 2 and set(p.isr) == {1, 2} for p in parts)
    assert cluster.actives() == {1: 3, 2: 3}


def test_reassignment_can_be_switched_off() -> None:
    cluster = Cluster({1: "az-a", 2: "az-b"}, reassign_interval_ms=0)
    cluster.handle(CreateTableRequest("t", 6, 1, KEY, None))
    cluster.settle()
    cluster.add(3, "az-c")
    cluster.settle()
    assert cluster.actives() == {1: 3, 2: 3}


def test_in_sync_replicas_are_caught_up_whatever_their_reports_say() -> None:
    # Reports are taken at different moments: an active reported 50,000 behind its in-sync follower is not
    # behind (or the assignor would swap actives back and forth under load).
    h, p = one_partition(2)
    assert p.active is not None
    ends = {(p.table_id, 0, r): 100_000 for r in p.replicas}
    ends[(p.table_id, 0, p.active)] = 50_000
    assert replica_lags(h.image, ends, 10_000) == {PartitionId("t", 0): {str(r): 0 for r in p.replicas}}


def test_a_controlled_shutdown_of_a_server_that_never_returns_does_not_stop_reassignment() -> None:
    cluster = Cluster({1: "az-a", 2: "az-b", 3: "az-c"}, broker_removal_delay_ms=5_000)
    cluster.handle(CreateTableRequest("t", 6, 1, KEY, None))
    cluster.settle()
    cluster.heartbeat(3, shutdown=True)
    cluster.down.add(3)
    for _ in range(60):  # 15 s: past the removal delay
        cluster.round()
    parts = cluster.image.partitions_of("t")
    assert all(set(p.replicas) == {1, 2} and set(p.isr) == {1, 2} for p in parts), parts


def test_a_change_committed_while_the_assignor_runs_is_not_lost() -> None:
    racks = {1: "az-a", 2: "az-a", 3: "az-b", 4: "az-b", 5: "az-c", 6: "az-c"}

    def near_writers(split: bool) -> list[int]:
        cluster = Cluster(dict(racks), split=split)
        # A replica on every server: each move is a change of active alone, after which no ISR change
        # follows to make the controller look again.
        cluster.handle(CreateTableRequest("t1", 4, 5, KEY, None))
        cluster.handle(CreateTableRequest("t2", 4, 5, KEY, None))
        cluster.settle()
        cluster.handle(RegisterWriterRequest("t1", "az-a"))
        cluster.round()  # split: a job starts that sees t1's writers only
        cluster.handle(RegisterWriterRequest("t2", "az-b"))
        cluster.settle()
        return [
            sum(racks[p.active] == rack for p in cluster.image.partitions_of(table) if p.active)
            for table, rack in (("t1", "az-a"), ("t2", "az-b"))
        ]

    assert near_writers(split=True) == near_writers(split=False)
    assert min(near_writers(split=True)) >= 2


@pytest.mark.parametrize("split", [False, True], ids=["inline", "assignor-on-a-thread"])
def test_a_gone_brokers_copies_are_re_placed_and_nothing_else_moves(split: bool) -> None:
    # Reassignment off: only the re-placement of lost copies may change anything.
    cluster = Cluster(
        {1: "az-a", 2: "az-b", 3: "az-c", 4: "az-a"},
        split=split,
        reassign_interval_ms=0,
        broker_removal_delay_ms=5_000,
    )
    cluster.handle(CreateTableRequest("t", 12, 1, KEY, None))
    cluster.settle()
    before = cluster.image.partitions_of("t")
    assert any(4 in p.replicas for p in before) and any(4 not in p.replicas for p in before)
    cluster.down.add(4)
    for _ in range(40):  # 10 s: fenced, then past the removal delay
        cluster.round()
    for old, new in zip(before, cluster.image.partitions_of("t"), strict=True):
        if 4 not in old.replicas:
            assert new == old
            continue
        assert 4 not in new.replicas and len(new.replicas) == 2 and set(new.isr) == set(new.replicas)
        assert set(old.replicas) - {4} <= set(new.replicas)
        if old.active != 4:
            assert new.active == old.active  # an active moves only off the gone broker (at its fence)


def test_the_worker_process_answer_gives_the_same_steps_as_the_assignor_run_here() -> None:
    # Mid-move: a third server joined, warmups and moves pending; the reduced answer from encoded inputs
    # must step every partition exactly as the whole answer does, and a limit keeps the first ones.
    cluster = Cluster({1: "az-a", 2: "az-b"})
    cluster.handle(CreateTableRequest("t", 12, 1, KEY, None))
    cluster.handle(CreateTableRequest("u", 5, 1, KEY, None))
    cluster.settle()
    cluster.add(3, "az-c")
    cluster.round()
    ends = {
        (p.table_id, p.partition, r): 900 + r
        for parts in cluster.image.partitions.values()
        for p in parts
        for r in p.replicas
    }
    job = ReassignJob(cluster.image, tuple(cluster.image.placement_brokers()), ends, DEFAULTS.assignor)
    whole = reassignment_records(cluster.image, job.run())
    assert whole, "nothing to move: the test would prove nothing"
    inputs = run_steps(job)
    # Packed a partition at a time, the inputs are the bytes of one whole encode.
    assert msgpack.packb(msgpack.unpackb(inputs), use_bin_type=True) == inputs
    assert len(msgpack.unpackb(inputs)[2]) == sum(len(p) for p in cluster.image.partitions.values())
    reduced = decode_desired(reassign_encoded(inputs))
    assert reassignment_records(cluster.image, reduced) == whole
    # Cut by the worker: the first partitions in (table, partition) order, placed as in the whole answer.
    first = decode_desired(reassign_encoded(run_steps(job), limit=2))
    assert len(first.partitions) == 2
    in_order = sorted(reduced.partitions, key=lambda pid: (pid.table, pid.partition))[:2]
    assert {pid: reduced.partitions[pid] for pid in in_order} == first.partitions
    stepped = reassignment_records(cluster.image, first)
    assert stepped and all(r in whole for r in stepped)
