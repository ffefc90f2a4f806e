"""Leader-epoch cache: where each leader epoch starts in the log, and its `leader-epoch-checkpoint` file.

Invariant kept by `Log`: entries ascend strictly in epoch and in start offset, and every start offset lies
in [start_offset, end_offset), i.e. each entry names an offset that still holds a record of that epoch.
An empty log therefore has no entry: the epoch of the data below the start belongs to the snapshot that
replaced it (KRaft's `lastFetchedEpoch` answers from the snapshot in that case, too). Keeping a
"phantom" entry at the end offset instead would let a truncated follower claim an epoch it holds no
record of when it votes.
"""

from __future__ import annotations

import bisect
from pathlib import Path

from hotstate.log.files import atomic_write

EPOCH_FILE = "leader-epoch-checkpoint"
_VERSION = 0


class LeaderEpochCache:
    def __init__(self, entries: list[tuple[int, int]] | None = None) -> None:
        self._entries: list[tuple[int, int]] = list(entries or [])

    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1][0] if self._entries else -1

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset` if it is newer than the latest; True if changed."""
        if epoch <= self.latest_epoch:
            return False
        self._entries.append((epoch, start_offset))
        return True

    def truncate_from_end(self, end_offset: int) -> bool:
        """Drop the epochs that start at or after `end_offset` (the records there are gone)."""
        keep = bisect.bisect_left(self._entries, end_offset, key=lambda entry: entry[1])
        changed = keep < len(self._entries)
        del self._entries[keep:]
        return changed

    def truncate_from_start(self, start_offset: int) -> bool:
        """Forget epochs wholly below `start_offset`; the epoch holding it now starts there (Kafka's rule)."""
        floor = bisect.bisect_right(self._entries, start_offset, key=lambda entry: entry[1]) - 1
        if floor < 0 or (floor == 0 and self._entries[0][1] == start_offset):
            return False
        epoch = self._entries[floor][0]
        self._entries[: floor + 1] = [(epoch, start_offset)]
        return True

    def end_offset_for(self, epoch: int, end_offset: int) -> tuple[int, int]:
        """(largest known epoch <= `epoch`, start of the next known epoch or `end_offset`); (-1, -1) if none.

        This is what a KRaft leader answers a follower whose last fetched epoch is `epoch`. It differs
        from Kafka's OffsetsForLeaderEpoch at two edges, as the Raft core expects: an epoch below every
        known one gives (-1, -1) (the answer lies in the snapshot) instead of (epoch, first start), and an
        epoch above every known one gives (latest, end_offset) instead of (-1, -1).
        """
        i = bisect.bisect_right(self._entries, epoch, key=lambda entry: entry[0]) - 1
        if i < 0:
            return (-1, -1)
        if i + 1 < len(self._entries):
            return (self._entries[i][0], self._entries[i + 1][1])
        return (self._entries[i][0], end_offset)


def read_checkpoint(directory: Path) -> list[tuple[int, int]] | None:
    """The entries of the checkpoint file; None when it is missing or not a valid checkpoint."""
    try:
        lines = (directory / EPOCH_FILE).read_text("ascii").split("\n")
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    try:
        if len(lines) < 3 or lines[-1] != "" or int(lines[0]) != _VERSION or int(lines[1]) != len(lines) - 3:
            return None
        entries: list[tuple[int, int]] = []
        for line in lines[2:-1]:
            epoch_text, offset_text = line.split(" ")
            entries.append((int(epoch_text), int(offset_text)))
    except ValueError:
        return None
    for i, (epoch, offset) in enumerate(entries):
        if epoch < 0 or offset < 0:
            return None
        if i > 0 and not (entries[i - 1][0] < epoch and entries[i - 1][1] < offset):
            return None
    return entries


def write_checkpoint(directory: Path, entries: list[tuple[int, int]], *, fsync: bool) -> None:
    # Kafka's text format (version, count, "epoch offset" lines): easy to read when debugging a replica.
    lines = [str(_VERSION), str(len(entries)), *(f"{epoch} {offset}" for epoch, offset in entries), ""]
    atomic_write(directory / EPOCH_FILE, "\n".join(lines).encode("ascii"), fsync=fsync)
