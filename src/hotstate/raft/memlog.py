"""The core's view of the replicated log: entries above the latest snapshot, and where each epoch starts.

The core keeps the metadata log in memory (it is small and bounded by snapshots); the shell mirrors every
change to disk from the operations a `Ready` lists.
"""

from __future__ import annotations

from collections.abc import Iterable

from hotstate.log.divergence import DivergingEpoch
from hotstate.log.epochs import EpochIndex
from hotstate.raft.records import Entry, SnapshotId


class RaftLogError(Exception):
    """A caller asked the log for something that would break it (a gap, a rewrite, a read below the start)."""


class RaftLog:
    def __init__(self, snapshot_id: SnapshotId | None = None, entries: Iterable[Entry] = ()) -> None:
        self._entries: list[Entry] = []
        # The snapshot's epoch is the start epoch, so that divergence checks can reason about the offsets
        # the snapshot replaced.
        self._epochs = EpochIndex()
        self._reset(snapshot_id)
        for entry in entries:
            if entry.offset < self._start:
                continue
            self.append([entry])

    def _reset(self, snapshot_id: SnapshotId | None) -> None:
        self._entries = []
        self._start = 0 if snapshot_id is None else snapshot_id.end_offset
        self._epochs.reset(self._start, 0 if snapshot_id is None else snapshot_id.epoch)

    @property
    def start_offset(self) -> int:
        return self._start

    @property
    def start_epoch(self) -> int:
        """Epoch of the entry just below the log start (the snapshot's), 0 when nothing is below it."""
        return self._epochs.start_epoch

    @property
    def end_offset(self) -> int:
        return self._start + len(self._entries)

    @property
    def last_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else self._epochs.start_epoch

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, offset: int) -> Entry:
        if not self._start <= offset < self.end_offset:
            raise RaftLogError(f"offset {offset} outside the log [{self._start}, {self.end_offset})")
        return self._entries[offset - self._start]

    def epoch_at(self, offset: int) -> int:
        """Epoch of the entry at `offset`; the snapshot's epoch for the offset just below the start."""
        if offset == self._start - 1:
            return self._epochs.start_epoch
        if offset == -1:
            return 0
        return self.entry(offset).epoch

    def read(self, offset: int, max_bytes: int) -> list[Entry]:
        """Entries from `offset` on, at most `max_bytes` of them but always one when any is there."""
        if not self._start <= offset <= self.end_offset:
            raise RaftLogError(f"read from {offset} outside the log [{self._start}, {self.end_offset}]")
        out: list[Entry] = []
        budget = max_bytes
        for entry in self._entries[offset - self._start :]:
            budget -= entry.size()
            if out and budget < 0:
                break
            out.append(entry)
        return out

    def read_between(self, start: int, end: int) -> list[Entry]:
        """The entries in [start, end)."""
        return self._entries[start - self._start : end - self._start]

    def append(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            if entry.offset != self.end_offset:
                raise RaftLogError(f"append at {entry.offset} but the log ends at {self.end_offset}")
            if entry.epoch < self.last_epoch:
                raise RaftLogError(f"append of epoch {entry.epoch} after epoch {self.last_epoch}")
            self._epochs.append(entry.epoch, entry.offset)
            self._entries.append(entry)

    def truncate_to(self, offset: int) -> None:
        """Drop every entry at or above `offset`."""
        if offset < self._start:
            raise RaftLogError(f"truncate to {offset} below the log start {self._start}")
        if offset >= self.end_offset:
            return
        del self._entries[offset - self._start :]
        self._epochs.truncate_to(offset)

    def advance_start(self, snapshot_id: SnapshotId) -> None:
        """Forget the entries a snapshot now covers; a snapshot beyond the log end empties the log."""
        if snapshot_id.end_offset <= self._start:
            return
        if snapshot_id.end_offset >= self.end_offset:
            self._reset(snapshot_id)
            return
        del self._entries[: snapshot_id.end_offset - self._start]
        self._start = snapshot_id.end_offset
        self._epochs.advance_start(self._start, self.end_offset, snapshot_id.epoch)

    def reset(self, snapshot_id: SnapshotId) -> None:
        """Start over, empty, right after a snapshot received from the leader."""
        self._reset(snapshot_id)

    def end_offset_for_epoch(self, epoch: int) -> DivergingEpoch | None:
        """KRaft's divergence answer: the largest epoch <= `epoch` this log knows, and where it ends.

        None when every epoch this log knows is newer (the answer lies inside the snapshot or nowhere).
        """
        return self._epochs.end_offset_for_epoch(epoch, self.end_offset)
