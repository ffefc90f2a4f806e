"""Recovery on open: bring a log directory to a consistent state, whatever moment a crash hit.

- Leftover `.tmp` / `.swap` files are interrupted atomic writes or batch splits whose rename never
  happened: the old file stands, so they are deleted.
- A pending reset (see `StartOffsetState`) is finished.
- The last segment is validated batch by batch and its index rebuilt; a torn or corrupt tail is cut off
  with a warning. Older segments were durable before the next one was created (fsync="always") or the
  shutdown was clean, so they are trusted, except that an inconsistent index has its segment validated
  and rebuilt. After an unclean stop of an fsync="never" log every segment is validated (the page cache
  may have lost any unsynced part) and the log ends at the first damage, as Kafka's recovery does.
- Damage followed by a valid batch is corruption, not a torn write: CorruptLogError, nothing is cut.
- A caller that fsyncs every write before it tells anyone of it (flushed_by_caller: the Raft storage) can
  only have a torn tail in the last segment: damage in an older segment is CorruptLogError too, rather
  than an end of the log with the later segments dropped (they may hold acknowledged entries).
- Segments wholly below the persisted start offset are deleted (a crash during advance_start_offset);
  a log whose recovered end fell below its start is emptied at the start.
- The epoch file is made to agree with the records: entries past the end are dropped (a crash during a
  truncation), epochs found in the validated batches but missing from the file are added (a crash
  between an append and the epoch file write), and a missing or unreadable file is rebuilt from headers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from hotstate.log.epochs import EPOCH_FILE, NO_EPOCH, EpochIndex, read_checkpoint, write_checkpoint
from hotstate.log.errors import CorruptLogError
from hotstate.log.files import (
    CLEAN_SHUTDOWN_FILE,
    START_OFFSET_FILE,
    StartOffsetState,
    fsync_dir,
    read_start_offset,
    write_start_offset,
)
from hotstate.log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    ScanResult,
    Segment,
    parse_segment_name,
)

_logger = logging.getLogger(__name__)


class RecoveredLog(NamedTuple):
    segments: list[Segment]
    start_offset: int
    end_offset: int
    epochs: EpochIndex


def recover(
    directory: Path, *, always: bool, index_interval_bytes: int, flushed_by_caller: bool = False
) -> RecoveredLog:
    """Recover the log in `directory` (see the module docstring); the caller owns the open segments."""
    recovery = _Recovery(directory, always, index_interval_bytes, flushed_by_caller)
    try:
        return recovery.run()
    except BaseException:
        for segment in recovery.segments:
            segment.close()
        raise


def epochs_from(changes: Sequence[tuple[int, int]], start: int) -> list[tuple[int, int]]:
    """Epoch changes (ascending offsets) as epoch entries for a log starting at `start`.

    Below the start anything goes (an emptied log takes any epoch); from the start on, epochs only rise.
    """
    out: list[tuple[int, int]] = []
    for epoch, offset in changes:
        if offset <= start:
            out = [(epoch, start)]
        elif not out or epoch > out[-1][0]:
            out.append((epoch, offset))
    return out


class _Recovery:
    def __init__(
        self, directory: Path, always: bool, index_interval_bytes: int, flushed_by_caller: bool
    ) -> None:
        self.directory = directory
        self.always = always
        self.flushed_by_caller = flushed_by_caller
        self.index_interval = index_interval_bytes
        self.segments: list[Segment] = []

    def run(self) -> RecoveredLog:
        directory = self.directory
        for path in directory.iterdir():
            if path.name.endswith((".tmp", SWAP_SUFFIX)):
                path.unlink()
        clean = (directory / CLEAN_SHUTDOWN_FILE).exists()
        if clean:
            # Synced whatever the policy: a marker that reappeared after a crash would skip validation.
            (directory / CLEAN_SHUTDOWN_FILE).unlink()
            fsync_dir(directory)
        state = read_start_offset(directory)
        if state is None and (directory / START_OFFSET_FILE).exists():
            _logger.warning("%s: unreadable %s, using the first segment's base", directory, START_OFFSET_FILE)
        names = [path.name for path in directory.iterdir()]
        bases = sorted(base for name in names if (base := parse_segment_name(name, LOG_SUFFIX)) is not None)
        for name in names:
            base = parse_segment_name(name, INDEX_SUFFIX)
            if base is not None and base not in bases:
                (directory / name).unlink()
        if state is not None and state.reset_pending:
            _logger.warning(
                "%s: finishing a reset to %d interrupted by a crash", directory, state.start_offset
            )
            for base in reversed(bases):
                Segment.open(directory, base).delete()
            bases = []
        if not bases:
            return self.empty(state.start_offset if state else 0)

        self.segments = [Segment.open(directory, base) for base in bases]
        scanned = self.scan_all() if not clean and not self.always else self.scan_last()
        end = scanned[-1][1].next_offset
        first_base = self.segments[0].base_offset
        start = state.start_offset if state else first_base
        if start < first_base:
            _logger.warning("%s: log start %d is below the first segment %d", directory, start, first_base)
            start = first_base
        if start > end:
            _logger.warning("%s: recovered end %d is below the log start %d: emptying", directory, end, start)
            self.delete_from(0)
            return self.empty(start)
        while len(self.segments) > 1 and self.segments[1].base_offset <= start:
            self.segments.pop(0).delete()
        epochs = self.recover_epochs(scanned, start, end)
        if state != StartOffsetState(start, False):
            write_start_offset(directory, StartOffsetState(start, False), fsync=self.always)
        return RecoveredLog(self.segments, start, end, epochs)

    def empty(self, start: int) -> RecoveredLog:
        self.segments = [Segment.create(self.directory, start)]
        write_checkpoint(self.directory, [], fsync=self.always)
        write_start_offset(self.directory, StartOffsetState(start, False), fsync=self.always)
        if self.always:
            fsync_dir(self.directory)
        return RecoveredLog(self.segments, start, start, EpochIndex(start_offset=start, start_epoch=NO_EPOCH))

    def scan_last(self) -> list[tuple[Segment, ScanResult]]:
        for segment, following in zip(self.segments, self.segments[1:], strict=False):
            if segment.index_loaded:
                continue
            result = segment.scan(self.index_interval)
            if result.damage is not None or result.next_offset != following.base_offset:
                why = result.damage or f"ends at {result.next_offset}, not {following.base_offset}"
                raise CorruptLogError(segment.path, result.valid_bytes, why)
            segment.index.flush()  # a rebuilt index is trusted on the next open: make it durable
        last = self.segments[-1]
        result = last.scan(self.index_interval)
        self.cut_tail(last, result)
        return [(last, result)]

    def scan_all(self) -> list[tuple[Segment, ScanResult]]:
        scanned: list[tuple[Segment, ScanResult]] = []
        for i, segment in enumerate(self.segments):
            if scanned and segment.base_offset != scanned[-1][1].next_offset:
                why = f"{segment.path.name} does not follow offset {scanned[-1][1].next_offset}"
                if self.flushed_by_caller:
                    raise CorruptLogError(segment.path, 0, why)
                self.drop_from(i, why)
                break
            result = segment.scan(self.index_interval)
            scanned.append((segment, result))
            if result.damage is not None and self.flushed_by_caller and i + 1 < len(self.segments):
                raise CorruptLogError(
                    segment.path, result.valid_bytes, f"{result.damage}, in a segment with others after it"
                )
            if result.damage is not None:
                self.cut_tail(segment, result)
                self.drop_from(i + 1, f"{segment.path.name} has a damaged tail")
                break
            if i + 1 < len(self.segments):
                segment.index.flush()  # as in scan_last; also bounds the open files to the last index
        return scanned

    def cut_tail(self, segment: Segment, result: ScanResult) -> None:
        if result.damage is None:
            return
        _logger.warning(
            "%s: cutting a damaged tail of %d bytes (%s)",
            segment.path,
            segment.size - result.valid_bytes,
            result.damage,
        )
        segment.truncate(result.valid_bytes)
        if self.always:
            segment.sync_data()

    def drop_from(self, first: int, why: str) -> None:
        if first < len(self.segments):
            dropped = len(self.segments) - first
            _logger.warning(
                "%s: dropping %d segments after an unclean stop: %s", self.directory, dropped, why
            )
            self.delete_from(first)

    def delete_from(self, first: int) -> None:
        while len(self.segments) > first:
            self.segments.pop().delete()

    def recover_epochs(self, scanned: list[tuple[Segment, ScanResult]], start: int, end: int) -> EpochIndex:
        entries = read_checkpoint(self.directory)
        scanned_changes = [change for _, result in scanned for change in result.epoch_changes]
        if entries is None:
            _logger.warning("%s: missing or unreadable %s: rebuilding it", self.directory, EPOCH_FILE)
            first_scanned = scanned[0][0].base_offset
            unscanned = [s for s in self.segments if s.base_offset < first_scanned]
            changes = [change for s in unscanned for change in s.scan_epochs()] + scanned_changes
            cache = EpochIndex(epochs_from(changes, start))
        else:
            cache = EpochIndex(entries)
            # Before adding: an entry past the end would hide a lower epoch the records start later.
            cache.truncate_to(end)
            for epoch, offset in epochs_from(scanned_changes, start):
                cache.append(epoch, offset)
        # The checkpoint does not keep the epoch below the start: not vouched for.
        cache.advance_start(start, end, NO_EPOCH)
        cache.truncate_to(end)  # advance_start does it only when the start moves
        if cache.entries() != entries:
            write_checkpoint(self.directory, cache.entries(), fsync=self.always)
        return cache
