"""Where each leader epoch starts in a log (`EpochIndex`, for all three logs), and its checkpoint file.

The index holds (epoch, first offset) for every epoch with a record in [start_offset, end_offset), ascending
strictly in both, the first at the start offset (Kafka's `truncateFromStart` moves the epoch holding the new
start there). An empty log therefore has no entry, and `latest_epoch` is -1: a truncated follower must not
claim, when it votes, an epoch it holds no record of (KRaft then answers from the snapshot, as the owners'
`last_epoch` do).

Apart from the entries it keeps `start_epoch`, the epoch of the record just below the start (a snapshot's),
when its owner vouches for it. That epoch ends at the start offset or later, and KRaft's
`endOffsetForEpoch` answers with it (the snapshot id) for an epoch below every entry: so does
`end_offset_for_epoch`. Below offset 0 lies the empty prefix every log shares; it counts as epoch 0.
"""

from __future__ import annotations

import bisect
from pathlib import Path

from hotstate.log.divergence import DivergingEpoch
from hotstate.log.files import atomic_write

EPOCH_FILE = "leader-epoch-checkpoint"
_VERSION = 0
NO_EPOCH = -1


class EpochIndex:
    def __init__(
        self, entries: list[tuple[int, int]] | None = None, *, start_offset: int = 0, start_epoch: int = 0
    ) -> None:
        self._entries: list[tuple[int, int]] = list(entries or [])
        self._start = start_offset
        self._start_epoch = start_epoch

    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def start_offset(self) -> int:
        return self._start

    @property
    def start_epoch(self) -> int:
        """Epoch of the record just below the start; NO_EPOCH when the owner does not know it."""
        return self._start_epoch

    @property
    def latest_epoch(self) -> int:
        """Epoch of the latest record; -1 when the log holds none."""
        return self._entries[-1][0] if self._entries else -1

    def epoch_at(self, offset: int) -> int:
        """Epoch of the record at `offset` (the caller checks it is below the end); start_epoch just below."""
        if offset == self._start - 1:
            return self._start_epoch
        i = bisect.bisect_right(self._entries, offset, key=lambda entry: entry[1]) - 1
        if offset < self._start or i < 0:
            raise ValueError(f"no record at offset {offset}: the log starts at {self._start}")
        return self._entries[i][0]

    def append(self, epoch: int, start_offset: int) -> bool:
        """Note a record of `epoch` at `start_offset` (at the log end); True if that started a new epoch."""
        if epoch <= self.latest_epoch:
            return False
        self._entries.append((epoch, start_offset))
        return True

    def truncate_to(self, end_offset: int) -> bool:
        """Drop the epochs that start at or after `end_offset` (the records there are gone); True if any."""
        keep = bisect.bisect_left(self._entries, end_offset, key=lambda entry: entry[1])
        changed = keep < len(self._entries)
        del self._entries[keep:]
        return changed

    def advance_start(self, offset: int, end_offset: int, start_epoch: int) -> bool:
        """Forget the records below `offset` (<= `end_offset`), whose last one is of `start_epoch` (NO_EPOCH:
        the caller does not vouch for it); True if the entries changed.

        The epoch holding `offset` now starts there (Kafka's truncateFromStart); at the end none does.
        """
        if offset <= self._start:
            return False
        self._start = offset
        self._start_epoch = start_epoch
        floor = bisect.bisect_right(self._entries, offset, key=lambda entry: entry[1]) - 1
        changed = False
        if floor >= 0 and not (floor == 0 and self._entries[0][1] == offset):
            self._entries[: floor + 1] = [(self._entries[floor][0], offset)]
            changed = True
        return self.truncate_to(end_offset) or changed

    def reset(self, start_offset: int, start_epoch: int) -> None:
        """Empty at `start_offset`, below which lies a record of `start_epoch` (or NO_EPOCH)."""
        self._entries = []
        self._start = start_offset
        self._start_epoch = start_epoch

    def end_offset_for_epoch(self, epoch: int, end_offset: int) -> DivergingEpoch | None:
        """KRaft's answer to a fetcher whose last epoch is `epoch`: the largest epoch <= `epoch` this log
        knows and where it ends (the next epoch's start, else `end_offset`); None when it knows none.

        An epoch below every entry gets the epoch below the start, which ends at the start (KRaft answers
        with the snapshot id there; Kafka's OffsetsForLeaderEpoch would answer (`epoch`, first start)).
        An epoch above every entry gets (latest, `end_offset`) (KRaft's `lastFetchedEpoch` and log end;
        Kafka's OffsetsForLeaderEpoch would answer "undefined").
        """
        i = bisect.bisect_right(self._entries, epoch, key=lambda entry: entry[0]) - 1
        if i >= 0:
            end = self._entries[i + 1][1] if i + 1 < len(self._entries) else end_offset
            return DivergingEpoch(self._entries[i][0], end)
        below = 0 if self._start == 0 else self._start_epoch
        if below == NO_EPOCH or epoch < below:
            return None
        return DivergingEpoch(below, self._start)


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
