"""A member's durable state in the simulator, and how a crash in the middle of a write tears it."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hotstate.raft.quorum_state import QuorumState
from hotstate.raft.ready import AppendEntries, LogOp, Ready, SaveSnapshot, TruncateTo
from hotstate.raft.records import Entry, Snapshot


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
