"""The simulators' disks: a Raft member's durable state and how a crash in the middle of a write tears it
(`SimDisk`), and a partition replica's log and store (`SimDiskLog`, `SimStore`)."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

from hotstate.log.batch import RecordBatch
from hotstate.raft.quorum_state import QuorumState
from hotstate.raft.ready import AppendEntries, LogOp, Ready, SaveSnapshot, TruncateTo
from hotstate.raft.records import Entry, Snapshot
from hotstate.replica.batchlog import BatchLog
from hotstate.replica.core import AdvanceStart, AppendBatches, ResetLog
from hotstate.replica.core import TruncateTo as TruncateLogTo


@dataclass
class SimDisk:
    quorum_state: QuorumState = field(default_factory=QuorumState)
    snapshot: Snapshot | None = None
    start_offset: int = 0
    entries: list[Entry] = field(default_factory=list)

    @property
    def end_offset(self) -> int:
        return self.start_offset + len(self.entries)

    def entry(self, offset: int) -> Entry:
        return self.entries[offset - self.start_offset]

    def write(self, ready: Ready) -> int:
        """Make all of `ready` durable. Returns the lowest offset whose entry changed (for the checker)."""
        if ready.quorum_state is not None:
            self.quorum_state = ready.quorum_state
        changed = self.end_offset
        for op in ready.log_ops:
            changed = min(changed, self._apply(op))
        return changed

    def write_torn(self, ready: Ready, rng: random.Random) -> int:
        """A crash during the write: the quorum state (renamed into place) is either all there or not; the
        log keeps a prefix of the operations, the last one maybe cut inside its entries."""
        if ready.quorum_state is not None:
            if rng.random() < 0.5:
                return self.end_offset  # nothing written after the state file reached the disk
            self.quorum_state = ready.quorum_state
        changed = self.end_offset
        kept = rng.randrange(len(ready.log_ops) + 1)
        for index, op in enumerate(ready.log_ops[:kept]):
            if index == kept - 1 and isinstance(op, AppendEntries) and op.entries:
                op = AppendEntries(op.entries[: rng.randrange(len(op.entries) + 1)])
            changed = min(changed, self._apply(op))
        return changed

    def _apply(self, op: LogOp) -> int:
        match op:
            case AppendEntries(entries):
                for entry in entries:
                    if entry.offset != self.end_offset:
                        raise AssertionError(f"disk append at {entry.offset}, log ends at {self.end_offset}")
                    self.entries.append(entry)
                return entries[0].offset if entries else self.end_offset
            case TruncateTo(offset):
                if offset < self.start_offset:
                    raise AssertionError(f"disk truncate to {offset} below start {self.start_offset}")
                del self.entries[offset - self.start_offset :]
                return offset
            case SaveSnapshot(snapshot, reset_log):
                self.snapshot = snapshot
                end = snapshot.id.end_offset
                if reset_log or end >= self.end_offset:
                    self.entries = []
                else:
                    self.entries = self.entries[end - self.start_offset :]
                self.start_offset = end
                return end
        raise AssertionError(f"unknown log op {op!r}")


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
    # The log the ops are applied to, kept between writes (`batches` is always all of it): building it
    # again from every batch for each write made a long run's writes quadratic.
    _log: BatchLog | None = field(default=None, repr=False, compare=False)

    def load(self) -> BatchLog:
        return BatchLog(self.start, self.start_epoch, self.batches)

    def apply(self, op: Any) -> None:
        log = self._log
        if log is None:
            log = self._log = self.load()
        match op:
            case AppendBatches(batches):
                for batch in batches:
                    log.append(batch)
                # Whole batches at the end: what reading the log from its start would return.
                self.batches = [*self.batches, *batches]
                return
            case TruncateLogTo(offset):
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
