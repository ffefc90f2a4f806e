"""ReplicaCore, one rule per test, driven by hand: a few cores, a list of messages in flight, no clock."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TypeVar

import pytest

from hotstate.log.batch import RecordBatch
from hotstate.replica.batchlog import BatchLog
from hotstate.replica.core import (
    AdvanceStart,
    AppendBatches,
    IsrChange,
    PartitionView,
    ProduceResult,
    Ready,
    ReplicaConfig,
    ReplicaCore,
    ReplicaRole,
    ReplicaSafetyError,
    ResetLog,
    SnapshotNeeded,
    TruncateTo,
)
from hotstate.replica.messages import FetchRequest, FetchResponse, ReplicaError, ReplicaMessage

TABLE, PARTITION = 7, 0
CONFIG = ReplicaConfig(
    fetch_max_wait_ms=200,
    fetch_timeout_ms=1500,
    fetch_backoff_ms=50,
    replica_lag_time_max_ms=1000,
    isr_change_retry_ms=500,
    min_insync_replicas=1,
)

M = TypeVar("M", bound=ReplicaMessage)


def batch(base: int, epoch: int, count: int, tag: bytes = b"r") -> RecordBatch:
    return RecordBatch(base, epoch, tuple(tag + str(base + i).encode() for i in range(count)))


def all_batches(log: BatchLog) -> list[RecordBatch]:
    return log.read(log.start_offset, 1 << 62)


def records_of(log: BatchLog) -> list[tuple[int, int, bytes]]:
    return [(b.base_offset + i, b.leader_epoch, r) for b in all_batches(log) for i, r in enumerate(b.records)]


@dataclasses.dataclass
class Store:
    position: int = 0
    epoch: int = 0
    records: dict[int, bytes] = dataclasses.field(default_factory=dict)


class Harness:
    """Replica cores of one partition, wired by hand.

    `pump` plays the shell: it applies each Ready's log ops to a "disk" copy of the log, puts its messages
    in flight, keeps its produce results, ISR requests and snapshot requests, applies its committed batches
    to a store, then calls `advance`. Messages move only when a test delivers them.
    """

    def __init__(
        self,
        ids: Sequence[int] = (1, 2, 3),
        config: ReplicaConfig = CONFIG,
        *,
        logs: dict[int, BatchLog] | None = None,
        stores: dict[int, Store] | None = None,
    ) -> None:
        self.ids = tuple(ids)
        self.config = config
        self.now = 0
        self.partition_epoch = 0
        self.view: PartitionView | None = None
        self.network: list[ReplicaMessage] = []
        self.cores: dict[int, ReplicaCore] = {}
        self.logs: dict[int, BatchLog] = {}
        self.disks: dict[int, BatchLog] = {}
        self.stores: dict[int, Store] = {}
        self.readys: dict[int, list[Ready]] = {}
        self.results: dict[int, list[ProduceResult]] = {}
        self.isr_changes: dict[int, list[IsrChange]] = {}
        self.snapshots: dict[int, list[SnapshotNeeded]] = {}
        for node in self.ids:
            self.start(node, (logs or {}).get(node), (stores or {}).get(node))

    # -------------------------------------------------------------- the shell
    def start(self, node: int, log: BatchLog | None = None, store: Store | None = None) -> None:
        log = log if log is not None else BatchLog()
        store = store if store is not None else Store()
        self.logs[node] = log
        self.disks[node] = BatchLog(log.start_offset, log.start_epoch, all_batches(log))
        self.stores[node] = store
        self.readys[node], self.results[node] = [], []
        self.isr_changes[node], self.snapshots[node] = [], []
        self.cores[node] = ReplicaCore(
            node,
            TABLE,
            PARTITION,
            self.config,
            log=log,
            store_position=store.position,
            store_epoch=store.epoch,
            now=self.now,
        )
        self.pump(node)

    def pump(self, node: int) -> None:
        core = self.cores[node]
        for _ in range(100):
            ready = core.ready()
            if ready.is_empty():
                # Every log op is on disk now: the disk holds what the core holds in memory.
                assert records_of(self.disks[node]) == records_of(self.logs[node])
                assert self.disks[node].start_offset == self.logs[node].start_offset
                return
            self.readys[node].append(ready)
            disk = self.disks[node]
            for op in ready.log_ops:
                match op:
                    case AppendBatches(batches):
                        for b in batches:
                            disk.append(b)
                    case TruncateTo(offset):
                        disk.truncate_to(offset)
                    case AdvanceStart(offset):
                        disk.advance_start(offset)
                    case ResetLog(offset, epoch):
                        disk.reset(offset, epoch)
            assert disk.end_offset == ready.log_end_offset
            self.network.extend(ready.messages)
            self.results[node].extend(ready.produce_results)
            store = self.stores[node]
            for b in ready.committed:
                # Never a record above the HW, and always contiguous with what the store holds.
                assert b.next_offset <= ready.high_watermark
                assert b.base_offset == store.position, (b, store.position)
                store.records.update((b.base_offset + i, r) for i, r in enumerate(b.records))
                store.position, store.epoch = b.next_offset, b.leader_epoch
            if ready.isr_change is not None:
                self.isr_changes[node].append(ready.isr_change)
            if ready.snapshot_needed is not None:
                self.snapshots[node].append(ready.snapshot_needed)
            core.advance(ready)
        raise AssertionError(f"replica {node} keeps producing Readys")

    def publish(
        self,
        active: int | None,
        epoch: int,
        isr: Iterable[int],
        replicas: Iterable[int] | None = None,
        *,
        to: Iterable[int] | None = None,
    ) -> PartitionView:
        self.partition_epoch += 1
        self.view = PartitionView(
            active, epoch, tuple(isr), tuple(replicas) if replicas else self.ids, self.partition_epoch
        )
        for node in to if to is not None else self.ids:
            self.cores[node].set_metadata(self.view, self.now)
            self.pump(node)
        return self.view

    def deliver(
        self, *, src: int | None = None, dst: int | None = None, hold: Iterable[int] = ()
    ) -> list[ReplicaMessage]:
        """Deliver the messages in flight now that match (replies they cause stay in flight)."""
        held = set(hold)
        chosen: list[ReplicaMessage] = []
        kept: list[ReplicaMessage] = []
        for m in self.network:
            matches = (src is None or m.src == src) and (dst is None or m.dst == dst)
            (chosen if matches and not {m.src, m.dst} & held else kept).append(m)
        self.network = kept
        for m in chosen:
            self.step(m.dst, m)
        return chosen

    def drop(self, *, src: int | None = None, dst: int | None = None) -> None:
        self.network = [
            m for m in self.network if not ((src is None or m.src == src) and (dst is None or m.dst == dst))
        ]

    def step(self, node: int, message: ReplicaMessage) -> None:
        self.cores[node].step(message, self.now)
        self.pump(node)

    def settle(self, hold: Iterable[int] = ()) -> None:
        """Deliver until nothing moves; messages from or to a `hold` node stay in flight."""
        for _ in range(200):
            if not self.deliver(hold=hold):
                return
        raise AssertionError("the replicas keep talking")

    def tick(self, now: int, hold: Iterable[int] = ()) -> None:
        self.now = now
        for node in self.ids:
            self.cores[node].tick(now)
            self.pump(node)
        self.settle(hold)

    def run_until(self, until: int, step: int = 50, hold: Iterable[int] = ()) -> None:
        while self.now + step <= until:
            self.tick(self.now + step, hold)

    def produce(
        self, node: int, records: Sequence[bytes], epoch: int | None = None, timeout_ms: int = 60_000
    ) -> ProduceResult | int:
        core = self.cores[node]
        result = core.produce(records, core.leader_epoch if epoch is None else epoch, self.now, timeout_ms)
        self.pump(node)
        return result

    def write(self, node: int, records: Sequence[bytes], timeout_ms: int = 60_000) -> int:
        """A produce that the active takes: its token."""
        token = self.produce(node, records, timeout_ms=timeout_ms)
        assert isinstance(token, int), token
        return token

    def install_snapshot(self, node: int, source: int) -> None:
        leader = self.stores[source]
        self.stores[node] = Store(leader.position, leader.epoch, dict(leader.records))
        self.cores[node].snapshot_installed(leader.position, leader.epoch, self.now)
        self.pump(node)

    # -------------------------------------------------------------- queries
    def in_flight(self, kind: type[M], *, src: int | None = None, dst: int | None = None) -> list[M]:
        return [
            m
            for m in self.network
            if isinstance(m, kind) and (src is None or m.src == src) and (dst is None or m.dst == dst)
        ]

    def last_fetch(self, node: int) -> FetchRequest:
        sent = [m for r in self.readys[node] for m in r.messages if isinstance(m, FetchRequest)]
        return sent[-1]

    def log_ops(self, node: int) -> list[object]:
        return [op for r in self.readys[node] for op in r.log_ops]


def started(
    ids: Sequence[int] = (1, 2, 3), config: ReplicaConfig = CONFIG, isr: Iterable[int] | None = None
) -> Harness:
    """Replica 1 active at epoch 1; every follower fetched once and waits, parked at the active."""
    h = Harness(ids, config)
    h.publish(1, 1, isr if isr is not None else ids)
    h.settle()
    return h


def awaiting_snapshot(core: ReplicaCore) -> bool:
    return core.awaiting_snapshot


def fetch(
    src: int, epoch: int, offset: int = 0, last_epoch: int = 0, *, hw: int = 0, fetch_id: int = 99
) -> FetchRequest:
    return FetchRequest(src, 1, TABLE, PARTITION, epoch, fetch_id, offset, last_epoch, hw, 1 << 20)


# ---------------------------------------------------------------------- acks=all and the HW


def test_produce_is_acked_only_once_every_isr_member_has_it() -> None:
    h = started()
    token = h.write(1, [b"a", b"b"])
    h.deliver(dst=2)  # follower 2 receives the batch and fetches again
    h.deliver(src=2)
    assert h.cores[1].follower_end_offsets() == {2: 2, 3: 0}
    assert h.cores[1].high_watermark == 0
    assert h.results[1] == []
    h.deliver(dst=3)
    h.deliver(src=3)
    assert h.results[1] == [ProduceResult(token, ReplicaError.NONE, 0, 2)]
    assert h.cores[1].high_watermark == 2
    h.settle()
    assert [h.stores[n].position for n in (1, 2, 3)] == [2, 2, 2]
    assert h.stores[2].records == {0: b"a", 1: b"b"}


def test_the_hw_waits_for_the_actives_own_log_write() -> None:
    h = started()
    token = h.cores[1].produce([b"a"], 1, h.now, 1000)  # appended in memory, not yet through a Ready
    for node in (2, 3):  # both followers already ask for what comes after it
        h.cores[1].step(fetch(node, 1, 1, 1, fetch_id=1000), h.now)
    assert h.cores[1].high_watermark == 0
    h.pump(1)  # the shell writes the append: now the HW passes it
    assert h.cores[1].high_watermark == 1
    assert [r.token for r in h.results[1]] == [token]


def test_hw_is_the_smallest_end_offset_over_the_isr() -> None:
    h = started()
    h.produce(1, [b"a"])
    h.settle()
    h.produce(1, [b"b", b"c"])
    h.settle(hold=[3])  # replica 3 misses the second batch
    assert h.cores[1].follower_end_offsets() == {2: 3, 3: 1}
    assert h.cores[1].high_watermark == 1
    assert len(h.results[1]) == 1
    h.publish(1, 1, (1, 2))  # the controller drops 3 from the ISR: the HW no longer waits for it
    assert h.cores[1].high_watermark == 3
    assert [r.error for r in h.results[1]] == [ReplicaError.NONE, ReplicaError.NONE]


def test_a_new_active_waits_for_every_isr_member_to_fetch_in_its_epoch() -> None:
    h = started()
    h.produce(1, [b"a"])
    h.settle()
    h.publish(2, 2, (1, 2, 3))
    h.settle(hold=[3])  # 1 fetches from the new active in epoch 2; 3's fetch is held back
    assert h.cores[2].role is ReplicaRole.LEADER
    assert h.cores[2].follower_end_offsets() == {1: 1, 3: -1}
    h.produce(2, [b"b"])
    h.settle(hold=[3])
    assert h.cores[2].high_watermark == 1  # 3 has not fetched in epoch 2 yet
    h.settle()
    assert h.cores[2].high_watermark == 2


def test_a_follower_hw_is_the_actives_but_never_above_its_own_log() -> None:
    h = started(ids=(1, 2))
    request = h.last_fetch(2)
    # An answer carrying five records but a HW of 2: only [0, 2) is committed, cut out of the batch.
    h.step(
        2,
        FetchResponse(
            1, 2, TABLE, PARTITION, 1, request.fetch_id, ReplicaError.NONE, 2, 0, 5, (batch(0, 1, 5),)
        ),
    )
    ready = h.readys[2][-1]
    assert ready.high_watermark == 2
    assert ready.committed == (RecordBatch(0, 1, batch(0, 1, 5).records[:2]),)
    assert h.stores[2].position == 2
    # A HW beyond the follower's log is capped at its end.
    request = h.last_fetch(2)
    h.step(2, FetchResponse(1, 2, TABLE, PARTITION, 1, request.fetch_id, ReplicaError.NONE, 9, 0, 9, ()))
    assert h.cores[2].high_watermark == 5
    assert h.stores[2].position == 5


# ---------------------------------------------------------------------- produce errors


def test_produce_on_a_follower_is_not_leader() -> None:
    h = started()
    assert h.produce(2, [b"a"], epoch=1) == ProduceResult(0, ReplicaError.NOT_LEADER, -1, -1)
    assert h.produce(2, [b"a"], epoch=0) == ProduceResult(0, ReplicaError.FENCED_EPOCH, -1, -1)
    assert h.produce(2, [b"a"], epoch=2) == ProduceResult(0, ReplicaError.UNKNOWN_EPOCH, -1, -1)
    assert h.cores[2].log_end_offset == 0


def test_produce_with_an_older_epoch_is_fenced() -> None:
    h = started()
    h.publish(1, 2, (1, 2, 3))
    assert h.produce(1, [b"a"], epoch=1) == ProduceResult(0, ReplicaError.FENCED_EPOCH, -1, -1)
    assert h.cores[1].log_end_offset == 0


def test_produce_with_a_newer_epoch_is_unknown() -> None:
    h = started()
    assert h.produce(1, [b"a"], epoch=2) == ProduceResult(0, ReplicaError.UNKNOWN_EPOCH, -1, -1)
    assert h.cores[1].log_end_offset == 0


def test_produce_with_too_small_an_isr_writes_nothing() -> None:
    h = started(config=dataclasses.replace(CONFIG, min_insync_replicas=2), isr=(1,))
    readys = len(h.readys[1])
    assert h.produce(1, [b"a"]) == ProduceResult(0, ReplicaError.NOT_ENOUGH_REPLICAS, -1, -1)
    assert h.cores[1].log_end_offset == 0
    assert len(h.readys[1]) == readys  # no log op, nothing at all


def test_produce_of_no_records_is_invalid() -> None:
    h = started()
    assert h.produce(1, []) == ProduceResult(0, ReplicaError.INVALID_REQUEST, -1, -1)


def test_isr_shrinking_below_the_minimum_after_the_append_says_so() -> None:
    h = started(config=dataclasses.replace(CONFIG, min_insync_replicas=2))
    token = h.write(1, [b"a"])
    h.settle(hold=[2, 3])
    h.publish(1, 1, (1,))
    assert h.results[1] == [ProduceResult(token, ReplicaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND, 0, 1)]


# ---------------------------------------------------------------------- pending produces


def test_pending_produces_fail_with_not_leader_when_leadership_moves() -> None:
    h = started()
    token = h.write(1, [b"a", b"b"])
    h.settle(hold=[2, 3])
    h.publish(2, 2, (1, 2, 3), to=[1])
    assert h.results[1] == [ProduceResult(token, ReplicaError.NOT_LEADER, 0, 2)]
    assert h.cores[1].role is ReplicaRole.FOLLOWER


def test_parked_fetches_get_not_leader_when_leadership_moves() -> None:
    h = started()
    h.publish(2, 2, (1, 2, 3), to=[1])
    answers = h.in_flight(FetchResponse, src=1)
    assert {m.dst for m in answers} == {2, 3}
    assert all(m.error is ReplicaError.NOT_LEADER for m in answers if isinstance(m, FetchResponse))


def test_pending_produce_times_out_at_its_deadline() -> None:
    h = started()
    token = h.write(1, [b"a"], timeout_ms=300)
    h.tick(299, hold=[2, 3])
    assert h.results[1] == []
    h.tick(300, hold=[2, 3])
    assert h.results[1] == [ProduceResult(token, ReplicaError.TIMEOUT, 0, 1)]
    h.settle()  # it still commits later; the result was given once
    assert h.cores[1].high_watermark == 1
    assert len(h.results[1]) == 1


# ---------------------------------------------------------------------- fetch epochs and fetch ids


def test_a_fetch_with_an_older_epoch_is_fenced() -> None:
    h = started()
    h.publish(1, 2, (1, 2, 3), to=[1])
    h.step(1, fetch(2, 1))
    answers = [a for a in h.in_flight(FetchResponse, dst=2) if a.fetch_id == 99]
    assert len(answers) == 1
    (answer,) = answers
    assert isinstance(answer, FetchResponse)
    assert (answer.error, answer.leader_epoch, answer.fetch_id) == (ReplicaError.FENCED_EPOCH, 2, 99)


def test_a_re_elected_leader_answers_the_fetches_parked_in_its_previous_epoch() -> None:
    h = started()
    parked = h.in_flight(FetchResponse, dst=2)
    h.publish(1, 2, (1, 2, 3), to=[1])
    answers = [a for a in h.in_flight(FetchResponse, dst=2) if a not in parked]
    assert answers and all(a.error is ReplicaError.FENCED_EPOCH and a.leader_epoch == 2 for a in answers)


def test_a_fetch_with_a_newer_epoch_is_unknown_epoch() -> None:
    h = started()
    h.step(1, fetch(2, 5))
    (answer,) = h.in_flight(FetchResponse, dst=2)
    assert isinstance(answer, FetchResponse) and answer.error is ReplicaError.UNKNOWN_EPOCH


def test_a_fetch_from_a_replica_not_in_the_partition_is_refused() -> None:
    h = started()
    h.step(1, fetch(9, 1))
    (answer,) = h.in_flight(FetchResponse, dst=9)
    assert isinstance(answer, FetchResponse) and answer.error is ReplicaError.NOT_REPLICA


def test_a_fenced_follower_backs_off_and_refetches() -> None:
    h = started()
    h.publish(1, 2, (1, 2, 3), to=[1])  # 2 has not heard of epoch 2; its parked fetch gets FENCED_EPOCH
    h.drop(dst=2)  # lost: 2 must find out by timing out
    h.tick(CONFIG.fetch_timeout_ms, hold=[1, 3])  # 2 times out and asks again, in epoch 1
    (request,) = h.in_flight(FetchRequest, src=2)
    assert isinstance(request, FetchRequest) and request.leader_epoch == 1
    h.deliver(src=2)
    h.deliver(dst=2)
    assert h.in_flight(FetchRequest, src=2) == []  # no immediate retry ...
    assert h.cores[2].next_deadline() == h.now + CONFIG.fetch_backoff_ms
    assert h.snapshots[2] == []
    h.tick(h.now + CONFIG.fetch_backoff_ms, hold=[1, 3])
    assert len(h.in_flight(FetchRequest, src=2)) == 1  # ... but one after the backoff


def test_a_late_or_duplicated_fetch_response_is_ignored() -> None:
    h = started()
    h.produce(1, [b"a"])
    (answer,) = h.in_flight(FetchResponse, dst=2)
    h.deliver(dst=2)
    assert h.cores[2].log_end_offset == 1
    readys = len(h.readys[2])
    h.step(2, answer)  # the same answer again
    assert isinstance(answer, FetchResponse)
    h.step(2, dataclasses.replace(answer, fetch_id=answer.fetch_id + 100))  # an answer to no fetch
    assert len(h.readys[2]) == readys
    assert h.cores[2].log_end_offset == 1
    assert len(h.in_flight(FetchRequest, src=2)) == 1


def test_a_lost_fetch_is_sent_again_after_the_fetch_timeout_and_the_old_answer_ignored() -> None:
    h = started(ids=(1, 2))
    h.produce(1, [b"a"])
    (stale,) = h.in_flight(FetchResponse, dst=2)
    h.network.clear()  # the answer is lost
    old_id = h.last_fetch(2).fetch_id
    h.tick(CONFIG.fetch_timeout_ms - 1, hold=[1, 2])
    assert h.in_flight(FetchRequest, src=2) == []
    h.tick(CONFIG.fetch_timeout_ms, hold=[1, 2])
    (again,) = h.in_flight(FetchRequest, src=2)
    assert isinstance(again, FetchRequest) and again.fetch_id != old_id and again.fetch_offset == 0
    h.step(2, stale)  # the lost answer turns up after all: too late
    assert h.cores[2].log_end_offset == 0
    h.settle()
    assert h.cores[2].log_end_offset == 1


# ---------------------------------------------------------------------- long poll


def test_a_parked_fetch_is_answered_when_data_arrives() -> None:
    h = started()
    assert h.network == []  # both followers are parked at the active
    h.produce(1, [b"a"])
    answers = h.in_flight(FetchResponse, src=1)
    assert sorted(m.dst for m in answers) == [2, 3]
    assert all(isinstance(m, FetchResponse) and m.batches[0].records == (b"a",) for m in answers)


def test_a_parked_fetch_is_answered_empty_at_fetch_max_wait() -> None:
    h = started()
    h.tick(CONFIG.fetch_max_wait_ms - 1, hold=[1, 2, 3])
    assert h.network == []
    h.tick(CONFIG.fetch_max_wait_ms, hold=[1, 2, 3])
    answers = h.in_flight(FetchResponse, src=1)
    assert sorted(m.dst for m in answers) == [2, 3]
    assert all(
        isinstance(m, FetchResponse) and m.error is ReplicaError.NONE and not m.batches for m in answers
    )


def test_a_fetch_with_an_older_hw_is_answered_at_once() -> None:
    h = started()
    h.produce(1, [b"a"])
    h.settle()
    assert h.cores[1].high_watermark == 1
    h.network.clear()
    h.step(1, fetch(2, 1, 1, 1, hw=0))  # nothing new to read, but the active's HW is news to it
    (answer,) = h.in_flight(FetchResponse, dst=2)
    assert isinstance(answer, FetchResponse) and answer.high_watermark == 1 and not answer.batches
    h.network.clear()
    h.step(1, fetch(2, 1, 1, 1, hw=1))  # nothing is news: parked
    assert h.network == []


def _count_deliveries(h: Harness) -> list[ReplicaMessage]:
    delivered: list[ReplicaMessage] = []
    step = h.step

    def counting(node: int, message: ReplicaMessage) -> None:
        delivered.append(message)
        step(node, message)

    h.step = counting  # type: ignore[method-assign]
    return delivered


def test_the_answer_to_the_fetch_that_moves_the_hw_carries_the_new_hw() -> None:
    h = started((1, 2))
    delivered = _count_deliveries(h)
    h.write(1, [b"a"])
    h.deliver()  # the data to the follower
    h.deliver()  # its next fetch, which moves the HW to 1
    (answer,) = h.in_flight(FetchResponse, dst=2)
    assert isinstance(answer, FetchResponse) and answer.high_watermark == 1 and not answer.batches
    h.settle()
    assert h.cores[2].high_watermark == 1
    # The data, the fetch that acknowledges it, the HW, the fetch that parks: four messages per write.
    assert len(delivered) == 4


def test_with_a_hw_delay_the_next_write_carries_the_hw_and_a_write_costs_two_messages() -> None:
    h = started((1, 2), dataclasses.replace(CONFIG, fetch_hw_delay_ms=5))
    delivered = _count_deliveries(h)
    for i in range(10):
        h.write(1, [b"r%d" % i])
        h.settle()
        assert h.results[1][-1].error is ReplicaError.NONE  # acknowledged without the HW answer
        # The follower knows every HW but the last write's: that one waits for the next write's data.
        assert h.cores[2].high_watermark == i
    assert len(delivered) == 20
    assert h.cores[1].next_deadline() == h.now + 5  # the held fetch's


def test_a_held_hw_reaches_the_follower_at_the_delay_without_new_data() -> None:
    h = started((1, 2), dataclasses.replace(CONFIG, fetch_hw_delay_ms=5))
    h.write(1, [b"a"])
    h.settle()
    assert (h.cores[1].high_watermark, h.cores[2].high_watermark) == (1, 0)
    h.tick(4)
    assert h.cores[2].high_watermark == 0 and h.stores[2].position == 0
    h.tick(5)
    assert h.cores[2].high_watermark == 1 and h.stores[2].position == 1


def test_a_parked_fetch_has_its_deadline_cut_to_the_delay_when_the_hw_moves() -> None:
    """Three replicas: replica 3's fetch is parked (long poll) when replica 2's fetch moves the HW."""
    h = started((1, 2, 3), dataclasses.replace(CONFIG, fetch_hw_delay_ms=5))
    h.write(1, [b"a"])
    h.deliver(dst=3)  # 3 has the data first
    h.deliver(src=3)  # its fetch: not all of the ISR has it yet, so the HW stays at 0 and 3 parks
    assert h.cores[1].high_watermark == 0
    h.deliver(dst=2)
    h.deliver(src=2)  # 2's fetch moves the HW: both held for the delay, not answered at once
    assert h.cores[1].high_watermark == 1 and h.in_flight(FetchResponse) == []
    h.tick(5)
    assert h.cores[2].high_watermark == 1 and h.cores[3].high_watermark == 1


def test_the_hw_delay_is_never_longer_than_the_long_poll() -> None:
    h = started((1, 2), dataclasses.replace(CONFIG, fetch_max_wait_ms=20, fetch_hw_delay_ms=1000))
    h.write(1, [b"a"])
    h.settle()
    h.tick(19)
    assert h.cores[2].high_watermark == 0
    h.tick(20)
    assert h.cores[2].high_watermark == 1


# ---------------------------------------------------------------------- divergence and snapshots


def test_a_diverged_follower_truncates_its_uncommitted_tail_and_then_matches() -> None:
    leader = BatchLog(batches=[batch(0, 1, 3), batch(3, 3, 2, b"L")])
    follower = BatchLog(batches=[batch(0, 1, 3), batch(3, 2, 3, b"F")])  # a zombie's epoch-2 tail
    h = Harness((1, 2), logs={1: leader, 2: follower}, stores={1: Store(3, 1), 2: Store(3, 1)})
    h.publish(1, 3, (1, 2))
    h.settle()
    ops = h.log_ops(2)
    assert ops[0] == TruncateTo(3)
    assert ops[1] == AppendBatches((batch(3, 3, 2, b"L"),))
    assert records_of(h.logs[2]) == records_of(h.logs[1])
    assert h.cores[1].high_watermark == 5
    assert h.stores[2].position == 5 and h.stores[2].records[3] == b"L3"


def test_a_follower_with_a_tail_of_an_epoch_the_active_never_had_truncates_to_the_last_shared_epoch() -> None:
    leader = BatchLog(batches=[batch(0, 1, 2), batch(2, 2, 2), batch(4, 5, 1, b"L")])
    follower = BatchLog(batches=[batch(0, 1, 2), batch(2, 2, 1), batch(3, 4, 3, b"F")])
    h = Harness((1, 2), logs={1: leader, 2: follower}, stores={1: Store(3, 2), 2: Store(3, 2)})
    h.publish(1, 5, (1, 2))
    h.settle()
    assert h.log_ops(2)[0] == TruncateTo(3)  # the end of epoch 2 in the follower's log, not the active's 4
    assert records_of(h.logs[2]) == records_of(h.logs[1])


def test_a_divergence_below_the_hw_is_a_safety_error() -> None:
    h = started(ids=(1, 2))
    request = h.last_fetch(2)
    h.step(
        2,
        FetchResponse(
            1, 2, TABLE, PARTITION, 1, request.fetch_id, ReplicaError.NONE, 2, 0, 3, (batch(0, 1, 3),)
        ),
    )
    assert h.cores[2].high_watermark == 2
    request = h.last_fetch(2)
    bad = FetchResponse(1, 2, TABLE, PARTITION, 1, request.fetch_id, ReplicaError.NONE, 2, 0, 3, (), 0, 1)
    with pytest.raises(ReplicaSafetyError):
        h.cores[2].step(bad, h.now)


def test_a_follower_below_the_log_start_asks_for_a_snapshot_then_fetches_from_it() -> None:
    leader = BatchLog(10, 1, [batch(10, 2, 3)])
    store = Store(10, 1, {o: b"old%d" % o for o in range(10)})
    h = Harness((1, 2), logs={1: leader}, stores={1: store})
    h.publish(1, 2, (1,))  # alone in the ISR: the active commits [10, 13) at once
    h.settle()
    assert h.snapshots[2] == [SnapshotNeeded(1, 2)]
    assert awaiting_snapshot(h.cores[2])
    assert h.cores[2].next_deadline() is None  # it waits for the snapshot, no fetching meanwhile
    h.tick(5000)
    assert h.network == [] and len(h.snapshots[2]) == 1
    h.install_snapshot(2, source=1)  # the active's store, at 13 and epoch 2
    first = h.readys[2][-1]
    assert first.log_ops[0] == ResetLog(13, 2)
    (request,) = [m for m in first.messages if isinstance(m, FetchRequest)]
    assert (request.fetch_offset, request.last_fetched_epoch) == (13, 2)
    h.settle()
    assert not awaiting_snapshot(h.cores[2])
    h.produce(1, [b"new"])
    h.settle()
    assert h.cores[2].log_start_offset == 13
    assert records_of(h.logs[2]) == [(13, 2, b"new")]
    assert h.stores[2].position == 14
    assert h.stores[2].records == h.stores[1].records and h.stores[2].records[0] == b"old0"


def test_a_follower_at_the_log_start_with_another_epoch_asks_for_a_snapshot() -> None:
    h = Harness((1, 2), logs={1: BatchLog(10, 3, [batch(10, 4, 1)])}, stores={1: Store(10, 3)})
    h.publish(1, 4, (1,))
    h.network.clear()
    h.step(1, fetch(2, 4, 10, 2))
    (answer,) = h.in_flight(FetchResponse, dst=2)
    assert isinstance(answer, FetchResponse) and answer.error is ReplicaError.SNAPSHOT_NEEDED
    h.network.clear()
    h.step(1, fetch(2, 4, 10, 3))
    (answer,) = h.in_flight(FetchResponse, dst=2)
    assert isinstance(answer, FetchResponse) and answer.error is ReplicaError.NONE and answer.batches


def test_a_snapshot_behind_the_store_is_refused() -> None:
    h = started(ids=(1, 2))
    h.produce(1, [b"a", b"b"])
    h.settle()
    with pytest.raises(ReplicaSafetyError):
        h.cores[2].snapshot_installed(1, 1, h.now)


# ---------------------------------------------------------------------- the ISR


def test_the_active_asks_to_drop_a_follower_that_did_not_catch_up_in_time() -> None:
    h = started()
    lag = CONFIG.replica_lag_time_max_ms
    h.run_until(lag, hold=[3])  # 3 fetched at 0, then went silent; 2 keeps fetching
    assert h.isr_changes[1] == []
    h.run_until(lag + 50, hold=[3])
    assert h.isr_changes[1] == [IsrChange(1, h.partition_epoch, (1, 2))]
    assert list(h.cores[1].isr) == [1, 2, 3]  # only the metadata changes it
    h.publish(1, 1, (1, 2))
    assert list(h.cores[1].isr) == [1, 2]


def test_a_follower_that_keeps_fetching_but_stays_behind_is_dropped_too() -> None:
    h = started()
    lag = CONFIG.replica_lag_time_max_ms
    # 3 keeps asking for offset 0 and never gets an answer in, while the active's log grows.
    h.produce(1, [b"a"])
    for now in range(100, lag + 200, 100):
        h.network = [m for m in h.network if m.dst != 3]
        h.step(1, fetch(3, 1, 0, 0, fetch_id=now))
        h.tick(now, hold=[3])
    assert h.isr_changes[1] and h.isr_changes[1][0].isr == (1, 2)


def test_the_active_asks_to_add_a_follower_once_it_reaches_the_hw() -> None:
    h = started(isr=(1, 2))
    assert h.isr_changes[1] == [IsrChange(1, h.partition_epoch, (1, 2, 3))]  # an empty log: 3 is at the HW
    h.publish(1, 1, (1, 2))  # the controller (say) refused: the ISR stays
    h.isr_changes[1].clear()
    h.produce(1, [b"a", b"b"])
    h.settle(hold=[3])
    assert h.cores[1].high_watermark == 2
    h.step(1, fetch(3, 1, 0, 0, hw=0, fetch_id=500))  # behind the HW: not yet
    assert h.isr_changes[1] == []
    h.step(1, fetch(3, 1, 2, 1, hw=0, fetch_id=501))  # at the HW: in
    assert h.isr_changes[1] == [IsrChange(1, h.partition_epoch, (1, 2, 3))]


def lagging_third() -> tuple[Harness, IsrChange, int]:
    """ISR (1, 2); 3 caught up, its addition asked for and not answered; then a write 3 does not get."""
    h = started(isr=(1, 2))
    (change,) = h.isr_changes[1]
    assert change.isr == (1, 2, 3)
    token = h.write(1, [b"a"])
    h.settle(hold=[3])
    return h, change, token


def test_an_outstanding_isr_addition_counts_towards_the_hw() -> None:
    h, _, token = lagging_third()
    assert h.cores[1].follower_end_offsets() == {2: 1, 3: 0}
    assert h.cores[1].high_watermark == 0
    assert h.results[1] == []
    h.settle()
    assert h.cores[1].high_watermark == 1
    assert h.results[1] == [ProduceResult(token, ReplicaError.NONE, 0, 1)]


def test_an_isr_addition_stops_counting_once_the_metadata_answers_without_it() -> None:
    h, _, token = lagging_third()
    h.publish(1, 1, (1, 2))  # the partition changed another way: the request can no longer apply
    assert h.cores[1].high_watermark == 1
    assert h.results[1] == [ProduceResult(token, ReplicaError.NONE, 0, 1)]


def test_an_isr_addition_the_metadata_applied_keeps_counting() -> None:
    h, _, _ = lagging_third()
    h.publish(1, 1, (1, 2, 3))
    assert h.cores[1].high_watermark == 0


def test_a_rejected_isr_change_stops_counting_at_once() -> None:
    h, change, token = lagging_third()
    h.cores[1].isr_change_rejected(dataclasses.replace(change, isr=(1, 3)), h.now)  # not ours: ignored
    h.pump(1)
    assert h.cores[1].high_watermark == 0
    h.cores[1].isr_change_rejected(change, h.now)
    h.pump(1)
    assert h.cores[1].high_watermark == 1
    assert h.results[1] == [ProduceResult(token, ReplicaError.NONE, 0, 1)]


def test_after_a_rejection_the_active_asks_again_only_after_the_retry_interval() -> None:
    h, change, _ = lagging_third()
    h.now = 100
    h.cores[1].isr_change_rejected(change, h.now)
    h.settle()  # 3 catches up and fetches at the HW, which would trigger a request
    h.tick(100 + CONFIG.isr_change_retry_ms - 1)
    assert h.isr_changes[1] == [change]
    h.tick(100 + CONFIG.isr_change_retry_ms)
    assert h.isr_changes[1] == [change, change]


def test_an_unanswered_isr_change_is_sent_again() -> None:
    h, change, _ = lagging_third()
    h.tick(CONFIG.isr_change_retry_ms - 1, hold=[3])
    assert h.isr_changes[1] == [change]
    h.tick(CONFIG.isr_change_retry_ms, hold=[3])
    assert h.isr_changes[1] == [change, change]


# ---------------------------------------------------------------------- restart


def test_a_store_ahead_of_the_log_resets_the_log_to_the_store_position() -> None:
    log = BatchLog(batches=[batch(0, 1, 3)])  # the log lost its tail; the store has [0, 5)
    h = Harness((1, 2), logs={2: log}, stores={2: Store(5, 2)})
    first = h.readys[2][0]
    assert first.log_ops == (ResetLog(5, 2),)
    core = h.cores[2]
    assert (core.log_start_offset, core.log_end_offset, core.position, core.high_watermark) == (5, 5, 5, 5)
    h.publish(1, 3, (1, 2))
    request = h.last_fetch(2)
    assert (request.fetch_offset, request.last_fetched_epoch) == (5, 2)


def test_a_log_starting_above_the_store_resets_to_the_store_position() -> None:
    h = Harness((1,), logs={1: BatchLog(10, 1, [batch(10, 1, 2)])}, stores={1: Store(4, 1)})
    assert h.readys[1][0].log_ops == (ResetLog(4, 1),)
    assert h.cores[1].log_end_offset == 4


def test_a_store_inside_the_log_keeps_the_log_and_commits_nothing_yet() -> None:
    h = Harness((1,), logs={1: BatchLog(batches=[batch(0, 1, 3)])}, stores={1: Store(1, 1)})
    assert h.readys[1] == []
    assert (h.cores[1].log_end_offset, h.cores[1].high_watermark) == (3, 1)
    h.publish(1, 2, (1,))  # alone in the ISR: its log is the committed one
    assert h.cores[1].high_watermark == 3
    assert h.stores[1].position == 3


# ---------------------------------------------------------------------- log trimming


def test_the_log_start_follows_the_store_keeping_the_retention_and_says_so_once() -> None:
    h = started(ids=(1,), config=dataclasses.replace(CONFIG, log_retention_records=2))
    for i in range(4):
        h.produce(1, [b"%d" % i])
    assert h.stores[1].position == 4
    assert h.cores[1].log_start_offset == 2
    starts = [op for op in h.log_ops(1) if isinstance(op, AdvanceStart)]
    assert starts == [AdvanceStart(1), AdvanceStart(2)]
    h.produce(1, [b"x", b"y", b"z"])  # applied 7, target 5: [4, 7) holds 5, so the start moves to 4
    h.produce(1, [b"w"])  # applied 8, target 6: still inside [4, 7), the start stays
    starts = [op for op in h.log_ops(1) if isinstance(op, AdvanceStart)]
    assert starts == [AdvanceStart(1), AdvanceStart(2), AdvanceStart(4)]  # no op when the start stays


def test_records_from_a_store_position_are_what_the_store_does_not_hold_yet() -> None:
    h = started()
    h.write(1, [b"a", b"b"])
    h.settle()
    assert h.stores[1].position == 2 and h.cores[1].records_from(2) == []
    h.write(1, [b"c"])  # appended, not committed: the followers have not fetched it
    assert [b.records for b in h.cores[1].records_from(2)] == [(b"c",)]
    assert [r for b in h.cores[1].records_from(0) for r in b.records] == [b"a", b"b", b"c"]
