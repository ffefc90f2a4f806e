"""The replication core's view of a partition log: the record batches from the log start to the end.

Only the tail lives here: records below the store's position are applied already, so the log start moves up
behind the store (keeping `retention` records for followers), and a follower below the start is rebuilt
from a store snapshot instead. The shell mirrors every change onto the on-disk `hotstate.log`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from hotstate.log.batch import RecordBatch
from hotstate.log.divergence import DivergingEpoch
from hotstate.log.epochs import EpochIndex


class BatchLogError(Exception):
    """A caller asked for something that would break the log (a gap, an older epoch, a read below start)."""


def batch_bytes(batch: RecordBatch) -> int:
    return sum(len(record) for record in batch.records) + 16


class BatchLog:
    def __init__(
        self, start_offset: int = 0, start_epoch: int = 0, batches: Iterable[RecordBatch] = ()
    ) -> None:
        self._batches: list[RecordBatch] = []
        self._bases: list[int] = []
        self._start = start_offset
        # Its start epoch is the record's just below the start (a snapshot's, or the trimmed prefix's), so
        # that a fetcher positioned exactly at the start can still be checked for divergence.
        self._epochs = EpochIndex(start_offset=start_offset, start_epoch=start_epoch)
        self._end = start_offset
        for batch in batches:
            self.append(batch)

    @property
    def start_offset(self) -> int:
        return self._start

    @property
    def start_epoch(self) -> int:
        return self._epochs.start_epoch

    @property
    def end_offset(self) -> int:
        return self._end

    @property
    def last_epoch(self) -> int:
        return self._batches[-1].leader_epoch if self._batches else self._epochs.start_epoch

    @property
    def batch_count(self) -> int:
        return len(self._batches)

    def epoch_at(self, offset: int) -> int:
        """Epoch of the record at `offset`; the pinned start epoch just below the start."""
        if offset != self._start - 1 and not self._start <= offset < self._end:
            raise BatchLogError(f"offset {offset} outside the log [{self._start}, {self._end})")
        return self._epochs.epoch_at(offset)

    def append(self, batch: RecordBatch) -> None:
        if batch.base_offset != self._end:
            raise BatchLogError(f"batch at {batch.base_offset} but the log ends at {self._end}")
        if not batch.records:
            raise BatchLogError("an empty batch")
        if batch.leader_epoch < self.last_epoch:
            raise BatchLogError(f"batch of epoch {batch.leader_epoch} after epoch {self.last_epoch}")
        self._epochs.append(batch.leader_epoch, batch.base_offset)
        self._batches.append(batch)
        self._bases.append(batch.base_offset)
        self._end = batch.next_offset

    def read(self, offset: int, max_bytes: int) -> list[RecordBatch]:
        """Batches from `offset` on (the first cut to start there): at most `max_bytes`, but at least one."""
        if not self._start <= offset <= self._end:
            raise BatchLogError(f"read from {offset} outside the log [{self._start}, {self._end}]")
        out: list[RecordBatch] = []
        if offset == self._end:
            return out
        index = bisect.bisect_right(self._bases, offset) - 1
        budget = max_bytes
        for batch in self._batches[index:]:
            if batch.base_offset < offset:
                batch = RecordBatch(offset, batch.leader_epoch, batch.records[offset - batch.base_offset :])
            budget -= batch_bytes(batch)
            if out and budget < 0:
                break
            out.append(batch)
        return out

    def read_between(self, start: int, end: int) -> list[RecordBatch]:
        """The records in [start, end) as batches, cut at both ends."""
        if not self._start <= start <= self._end:
            raise BatchLogError(f"read from {start} outside the log [{self._start}, {self._end}]")
        out: list[RecordBatch] = []
        if end <= start:
            return out
        # Walks only the batches asked for, with no size counted: the core asks for its committed, unapplied
        # batches at every Ready, and a walk to the log's end (through `read`) cost one len() per record
        # appended behind them (event-loop stalls of 150 ms and more in a bulk load, when applies lag).
        index = max(0, bisect.bisect_right(self._bases, start) - 1)
        for batch in self._batches[index:]:
            if batch.base_offset >= end:
                break
            if batch.next_offset <= start:
                continue
            if batch.base_offset < start or batch.next_offset > end:
                low = max(start, batch.base_offset)
                batch = RecordBatch(
                    low,
                    batch.leader_epoch,
                    batch.records[low - batch.base_offset : min(end, batch.next_offset) - batch.base_offset],
                )
            out.append(batch)
        return out

    def truncate_to(self, offset: int) -> None:
        """Drop every record at or above `offset`."""
        if offset < self._start:
            raise BatchLogError(f"truncate to {offset} below the log start {self._start}")
        if offset >= self._end:
            return
        index = bisect.bisect_right(self._bases, offset) - 1
        if index >= 0 and self._batches[index].base_offset < offset:
            batch = self._batches[index]
            self._batches[index] = RecordBatch(
                batch.base_offset, batch.leader_epoch, batch.records[: offset - batch.base_offset]
            )
            index += 1
        del self._batches[max(index, 0) :]
        del self._bases[max(index, 0) :]
        self._end = offset
        self._epochs.truncate_to(offset)

    def advance_start(self, offset: int) -> int:
        """Forget the batches wholly below `offset` (never past the end); returns the new start."""
        offset = min(offset, self._end)
        index = bisect.bisect_right(self._bases, offset) - 1
        if offset == self._end:
            index = len(self._batches)
        if index <= 0:
            return self._start
        new_start = self._bases[index] if index < len(self._bases) else self._end
        self._epochs.advance_start(new_start, self._end, self._batches[index - 1].leader_epoch)
        del self._batches[:index]
        del self._bases[:index]
        self._start = new_start
        return new_start

    def reset(self, start_offset: int, start_epoch: int) -> None:
        """Empty at `start_offset`: a follower that installed the leader's store snapshot."""
        self._batches = []
        self._bases = []
        self._start = self._end = start_offset
        self._epochs.reset(start_offset, start_epoch)

    def end_offset_for_epoch(self, epoch: int) -> DivergingEpoch | None:
        """The largest epoch <= `epoch` this log knows, and where it ends; None when none is."""
        return self._epochs.end_offset_for_epoch(epoch, self._end)
