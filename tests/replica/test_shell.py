"""The replica pump (replica/shell.py) that the server and the replication simulator both run: what it
does with each Ready, in what order, and when it stops."""

from __future__ import annotations

from collections.abc import Sequence

from hotstate.log.batch import RecordBatch
from hotstate.replica.core import AppendBatches, LogOp, ProduceResult, Ready
from hotstate.replica.messages import ReplicaError, ReplicaMessage
from hotstate.replica.shell import APPLY_STEP_RECORDS, Effects, ReplicaShell

BATCH = RecordBatch(0, 1, (b"k=1", b"k=2"))
EMPTY = Ready((), (), (), (), None, None, 0, 0)
MESSAGE: ReplicaMessage = object()  # type: ignore[assignment]  # passed through, never looked at
RESULT = ProduceResult(7, ReplicaError.NONE, 0, 2)


class ScriptedCore:
    """Gives its Readies in turn; a Ready handed back without its committed batches gives them again."""

    def __init__(self, *readies: Ready) -> None:
        self.readies = list(readies)
        self.advanced: list[Ready] = []

    def ready(self) -> Ready:
        return self.readies[0] if self.readies else EMPTY

    def advance(self, ready: Ready) -> None:
        self.advanced.append(ready)
        given = self.readies.pop(0)
        applied = ready.committed[-1].next_offset if ready.committed else 0
        rest = tuple(
            RecordBatch(
                max(b.base_offset, applied), b.leader_epoch, b.records[max(0, applied - b.base_offset) :]
            )
            for b in given.committed
            if b.next_offset > applied
        )
        if rest:
            self.readies.insert(0, Ready((), (), (), rest, None, None, 2, 2))


class Recorder:
    def __init__(self, *, synchronous: bool = True) -> None:
        self.events: list[str] = []
        self.synchronous = synchronous
        self.position = 0
        self.deferred = 0

    def write(self, ops: Sequence[LogOp]) -> bool:
        self.events.append(f"write {len(ops)}")
        return self.synchronous

    def apply(self, batch: RecordBatch) -> None:
        self.events.append(f"apply {batch.base_offset}-{batch.next_offset}")
        self.position = batch.next_offset

    def effects(self) -> Effects:
        def defer() -> None:
            self.events.append("defer")
            self.deferred += 1

        return Effects(
            send=lambda message: self.events.append("send"),
            answer=lambda result: self.events.append(f"answer {result.token}"),
            isr_change=lambda change: self.events.append("isr"),
            snapshot_needed=lambda needed: self.events.append("snapshot"),
            defer=defer,
        )


def shell(core: ScriptedCore, world: Recorder) -> ReplicaShell:
    return ReplicaShell(core, world, world, world.effects())  # type: ignore[arg-type]


def test_writers_and_peers_are_answered_before_the_store_is_written() -> None:
    """A Ready that commits and answers: the log first, then the answers; the store only in a later pump
    (the server's call_soon), once the answers have left."""
    ready = Ready((AppendBatches((BATCH,)),), (MESSAGE,), (RESULT,), (BATCH,), None, None, 2, 2)
    core, world = ScriptedCore(ready), Recorder()
    pump = shell(core, world)
    pump.pump()
    assert world.events == ["write 1", "send", "answer 7", "defer"]
    assert core.advanced[0].committed == ()  # the core still counts the batch as not applied
    pump.pump()  # the deferred turn
    assert world.events[4:] == ["write 0", "apply 0-2"]
    assert world.position == 2 and world.deferred == 1


def test_a_ready_that_answers_nobody_applies_at_once() -> None:
    ready = Ready((), (), (), (BATCH,), None, None, 2, 2)
    core, world = ScriptedCore(ready), Recorder()
    shell(core, world).pump()
    assert world.events == ["write 0", "apply 0-2"]
    assert world.deferred == 0


def test_nothing_is_sent_answered_or_applied_before_the_log_write_is_durable() -> None:
    ready = Ready((AppendBatches((BATCH,)),), (MESSAGE,), (), (), None, None, 2, 0)
    core, world = ScriptedCore(ready), Recorder(synchronous=False)
    pump = shell(core, world)
    pump.pump()
    assert world.events == ["write 1"] and pump.writing is ready and not core.advanced
    pump.pump()  # an input meanwhile: the write under way is not overtaken
    assert world.events == ["write 1"]
    pump.written()
    assert world.events == ["write 1", "send"] and core.advanced == [ready] and pump.writing is None


def test_a_big_apply_runs_in_steps_with_a_turn_of_the_loop_between() -> None:
    """Committed records beyond APPLY_STEP_RECORDS wait for the next pump, a batch cut where a step ends:
    neither a follower's fetch of a bulk load nor one long Produce's batch is applied in one stall."""
    size = APPLY_STEP_RECORDS * 3 // 4
    batches = tuple(RecordBatch(n * size, 1, tuple(b"k=%d" % i for i in range(size))) for n in range(3))
    core, world = ScriptedCore(Ready((), (), (), batches, None, None, 3 * size, 3 * size)), Recorder()
    pump = shell(core, world)
    pump.pump()
    step = APPLY_STEP_RECORDS
    assert world.events == ["write 0", f"apply 0-{size}", f"apply {size}-{step}", "defer"]
    pump.pump()
    pump.pump()
    assert world.events[4:] == [
        "write 0",
        f"apply {step}-{2 * size}",
        f"apply {2 * size}-{2 * step}",
        "defer",
        "write 0",
        f"apply {2 * step}-{3 * size}",
    ]
    assert world.position == 3 * size and world.deferred == 2
    huge = RecordBatch(0, 1, tuple(b"k=%d" % i for i in range(2 * step + 5)))
    core, world = ScriptedCore(Ready((), (), (), (huge,), None, None, 1, 1)), Recorder()
    pump = shell(core, world)
    for _ in range(3):
        pump.pump()
    assert world.events == [
        "write 0",
        f"apply 0-{step}",
        "defer",
        "write 0",
        f"apply {step}-{2 * step}",
        "defer",
        "write 0",
        f"apply {2 * step}-{2 * step + 5}",
    ]
    assert [b.records for b in core.advanced[1].committed] == [huge.records[step : 2 * step]]
