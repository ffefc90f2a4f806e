"""The replica pump: what is done with each `Ready` of a replica core, in what order, over ports.

A core (replica/core.py) decides; its shell carries out each `Ready` and hands it back (`advance`): log
operations on the partition's log, messages to peers, answers to writers, committed batches into the store,
an ISR change to the controller, a store snapshot to fetch. The server (server/replicas.py, over the
segmented log and RocksDB) and the replication simulator (sim/replication/, over its simulated disk) run
this same pump, so the simulator checks its ordering: a mutation of it fails seeds.

Synchronous: the IO around it is the caller's. A log port may finish its write later (the simulator's disk
takes time): `write` returns False and the caller calls `written()` once the write is durable; nothing of
that Ready is sent, answered or applied before. The deferred apply (below) is scheduled through `defer`,
which the server maps to the event loop's `call_soon` and the simulator to an event at the same time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol

from hotstate.log.batch import RecordBatch
from hotstate.replica.core import IsrChange, LogOp, ProduceResult, Ready, ReplicaCore, SnapshotNeeded
from hotstate.replica.messages import ReplicaMessage

# The records one pump applies to the store (a long batch is cut: the store's position may stop inside a
# batch): more committed at once (a follower's fetch of a bulk load, a Produce of thousands of rows, a page of
# expiry's tombstones behind others) wait for the next turn of the loop, so lookups and heartbeats are served
# between the steps of a big apply. Measured: whole batches of a bulk load's 4 MiB Produces (~27,000 rows)
# held the loop 0.3-0.45 s in one RocksDB write on 2 loaded cores; with 256 records a step (and the
# server's ingest steps of 256 rows) no stall over 100 ms was left during the load.
APPLY_STEP_RECORDS = 256


class LogPort(Protocol):
    def write(self, ops: Sequence[LogOp]) -> bool:
        """Carry out `ops` on the partition's log, durably: True once done, False when the write finishes
        later (the caller then calls `ReplicaShell.written`)."""
        ...


class StorePort(Protocol):
    @property
    def position(self) -> int:
        """Offset of the last record applied + 1."""
        ...

    def apply(self, batch: RecordBatch) -> None:
        """Apply the committed `batch`'s records from `position` on (it ends past `position`)."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class Effects:
    """What the shell asks of the world around it."""

    send: Callable[[ReplicaMessage], object]
    answer: Callable[[ProduceResult], object]  # a writer's result (acks=all: after its records commit)
    isr_change: Callable[[IsrChange], object]  # to the controller
    snapshot_needed: Callable[[SnapshotNeeded], object]
    # Run `pump` again once the answers just handed out have left (server: loop.call_soon).
    defer: Callable[[], object]
    # Shown each Ready once its log write is durable, before the rest of it is carried out (the simulator's
    # invariants watch the HW it carries).
    observe: Callable[[Ready], object] = lambda ready: None


class ReplicaShell:
    def __init__(self, core: ReplicaCore, log: LogPort, store: StorePort, effects: Effects) -> None:
        self.core = core
        self.log = log
        self.store = store
        self.effects = effects
        self.writing: Ready | None = None  # the Ready whose log write is under way
        self._defer_apply = False

    def pump(self) -> None:
        """Carry out the core's Readies until it has none, a log write is under way, or the apply is
        deferred."""
        core = self.core
        while self.writing is None:
            ready = core.ready()
            if ready.is_empty() or not self._carry_out(ready):
                return

    def _carry_out(self, ready: Ready) -> bool:
        """Write the Ready's log operations, then (once they are durable) the rest of it; False when
        pumping stops here (a write under way, or the apply deferred)."""
        # Answer the writers and the peers before writing the store: the answers go out in the tasks the
        # results wake and the connections' end-of-turn flushes, which run before a callback scheduled
        # after them. Handing the core its Ready without the committed batches leaves them committed
        # and not applied, so that later pump applies them.
        defer_apply = bool(ready.committed and (ready.produce_results or ready.messages))
        if defer_apply:
            ready = dataclasses.replace(ready, committed=())
        elif ready.committed:
            step = _apply_step(ready.committed)
            if step[-1].next_offset < ready.committed[-1].next_offset:
                ready = dataclasses.replace(ready, committed=step)
                defer_apply = True
        self.writing = ready
        self._defer_apply = defer_apply
        return self.log.write(ready.log_ops) and self._finish()

    def written(self) -> None:
        """The log write under way is durable: carry out the rest of its Ready, then go on pumping."""
        if self._finish():
            self.pump()

    def _finish(self) -> bool:
        """The rest of the Ready being written; False when the apply was deferred (pumping stops)."""
        ready = self.writing
        assert ready is not None
        effects = self.effects
        effects.observe(ready)
        for message in ready.messages:
            effects.send(message)
        for result in ready.produce_results:
            effects.answer(result)
        store = self.store
        for batch in ready.committed:
            if batch.next_offset > store.position:
                store.apply(batch)
        if ready.isr_change is not None:
            effects.isr_change(ready.isr_change)
        if ready.snapshot_needed is not None:
            effects.snapshot_needed(ready.snapshot_needed)
        self.writing = None
        self.core.advance(ready)
        if self._defer_apply:
            effects.defer()
            return False
        return True


def _apply_step(committed: Sequence[RecordBatch]) -> tuple[RecordBatch, ...]:
    """The first APPLY_STEP_RECORDS committed records, as batches (the last one cut where the step ends)."""
    room = APPLY_STEP_RECORDS
    step = []
    for batch in committed:
        count = batch.next_offset - batch.base_offset
        if count > room:
            if room:
                step.append(RecordBatch(batch.base_offset, batch.leader_epoch, batch.records[:room]))
            break
        step.append(batch)
        room -= count
    return tuple(step)
